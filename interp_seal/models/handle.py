"""``ModelHandle``: one loaded model, its tokenizer, geometry and module map.

Every analysis in interp-seal takes a handle. The handle owns the Hugging Face model (the
long-context path: sdpa attention, memory linear in sequence length) and builds the other
backends from it on request: ``handle.nnsight()`` wraps the same weights in
``nnsight.TransformersModel``; ``handle.bridge()`` boots a TransformerLens 4
``TransformerBridge`` on a private copy (the bridge rewires the HF object it is given, so it
never touches ``handle.model``; the copy is a snapshot, so call ``reset_backends()`` after
changing the weights). Analysis code asks for a backend by name; library quirks stay
in ``interp_seal.interventions.backends``.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from interp_seal.models.edits import ComposedEdit
from interp_seal.models.spec import Family, ModelSpec, get_attribute, get_module

BACKENDS = ("hf", "nnsight", "transformer_lens")
NORM_SITES = ("pre_attn", "post_attn", "pre_mlp", "post_mlp")


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(x / cap)`` (Gemma 2's soft-capping of attention scores and logits); ``x``
    itself where ``cap`` is None."""
    return x if cap is None else cap * torch.tanh(x / cap)


STREAMING_ATTR = "_interp_seal_streaming_heads"
"""Set on attention modules by ``models.streaming_heads``: ``(config, streaming KV heads)``."""


def refuse_uniform_edits(handle: ModelHandle, layer: int, edit) -> None:
    """Raise ValueError if ``edit`` uses uniform attention at ``layer`` while that layer has
    streaming heads (``models.streaming_heads``): uniform attention averages a head's values
    over its whole causal prefix, which a streaming head does not see."""
    found = getattr(handle.attn(layer), STREAMING_ATTR, None)
    if found and found[1] and edit.uses_values(layer):
        raise ValueError(
            f"a uniform-attention edit at layer {layer}, which has streaming KV heads: uniform "
            "attention averages over the whole prefix, which a streaming head does not see; "
            "use a zero or scale edit there, or no streaming heads on that layer"
        )


@dataclass(kw_only=True, eq=False)
class ModelHandle:
    """A loaded causal LM.

    Attributes:
        model: the ``*ForCausalLM`` module (eval mode).
        tokenizer: its tokenizer.
        spec: geometry (layers, heads, KV heads, d_head, ...).
        family: module paths for the model's family.
        name_or_path: what it was loaded from.
        backend: default backend for ``interp_seal.interventions`` (``"hf"``, ``"nnsight"`` or
            ``"transformer_lens"``).
    """

    model: nn.Module
    tokenizer: object
    spec: ModelSpec
    family: Family
    name_or_path: str
    backend: str = "hf"
    _nnsight: object = field(default=None, repr=False)
    _bridge: object = field(default=None, repr=False)
    # the active edits (``edit``), innermost last, their composition and its layers (made when
    # the stack changes, not per forward), and the hooks applying them
    _edits: dict = field(default_factory=dict, init=False, repr=False)
    _active: object = field(default=None, init=False, repr=False)
    _active_layers: frozenset = field(default=frozenset(), init=False, repr=False)
    _edit_hooks: object = field(default=None, init=False, repr=False)
    _hook_ids: set = field(default_factory=set, init=False, repr=False)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {BACKENDS}")

    def __repr__(self) -> str:
        """One line: what was loaded, its geometry, where it runs, how many edits are active."""
        s = self.spec
        edits = f", {len(self._edits)} active edit(s)" if self._edits else ""
        return (
            f"ModelHandle({self.name_or_path!r}, {self.family.name}: {s.n_layers} layers x "
            f"{s.n_heads} heads ({s.n_kv_heads} KV), d_head {s.d_head}, {self.dtype} on "
            f"{self.device}{edits})"
        )

    # -- module map ------------------------------------------------------------------------
    def layers(self) -> nn.ModuleList:
        return get_module(self.model, self.family.layers)

    def attn(self, layer: int) -> nn.Module:
        return get_module(self.layers()[layer], self.family.attn)

    def proj(self, layer: int, which: str) -> nn.Linear:
        """One of ``"q_proj"``, ``"k_proj"``, ``"v_proj"``, ``"o_proj"`` of ``layer`` (or
        ``"qkv_proj"``, the fused projection of families that have one, ``Family.qkv_proj``).
        Queries, keys and values are read through ``project``, ``projection_weights`` and
        ``on_projection``, which work on separate and fused projections alike."""
        if which in ("q_proj", "k_proj", "v_proj") and self.family.qkv_proj is not None:
            raise ValueError(
                f"{self.family.name} computes q, k and v in one fused {self.family.qkv_proj!r}; "
                f"read {which[0]} through project / projection_weights / on_projection"
            )
        return get_module(self.attn(layer), getattr(self.family, which))

    def _projection(self, layer: int, which: str) -> tuple[nn.Linear, slice | torch.Tensor | None]:
        """The module computing ``which`` (``"q"``, ``"k"`` or ``"v"``) at ``layer`` and its
        output rows (None: all of them; a fused projection's output is ``[q | k | v]``, or
        interleaved per head: an index tensor, ``Family.projection``)."""
        path, rows = self.family.projection(which, self.spec)
        return get_module(self.attn(layer), path), rows

    def project(self, layer: int, x: torch.Tensor, *which: str) -> tuple[torch.Tensor, ...]:
        """``layer``'s ``which`` projections (``"q"``, ``"k"``, ``"v"``) of ``x``, computed by the
        model's own modules (a fused projection runs once and is sliced), ``(..., n*D)`` each."""
        outputs: dict[int, torch.Tensor] = {}
        found = []
        for name in which:
            module, rows = self._projection(layer, name)
            if id(module) not in outputs:
                outputs[id(module)] = module(x)
            found.append(outputs[id(module)] if rows is None else outputs[id(module)][..., rows])
        return tuple(found)

    def linear_weight(self, module: nn.Module) -> torch.Tensor:
        """A projection's weight as ``nn.Linear`` holds it, ``(out, in)``: ``module.weight``, or
        its transpose where the family's projections are ``Conv1D`` (GPT-2, ``Family.conv1d``,
        which stores ``(in, out)``). A view either way: editing it in place edits the model."""
        return module.weight.T if self.family.conv1d else module.weight

    def projection_weights(
        self, layer: int, which: str
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight rows ``(n*D, d_model)`` and bias ``(n*D,)`` (None without one) computing
        ``which`` at ``layer``: views (editing them in place edits the model) where the rows are
        one block, copies where a fused projection interleaves them per head (GPT-NeoX; edit
        through ``scale_projection``)."""
        module, rows = self._projection(layer, which)
        rows = slice(None) if rows is None else rows
        bias = None if module.bias is None else module.bias[rows]
        return self.linear_weight(module)[rows], bias

    @torch.no_grad()
    def scale_projection(self, layer: int, which: str, factor: torch.Tensor) -> None:
        """Multiply the ``(n*D,)`` output rows (weight and bias) computing ``which`` at ``layer``
        by ``factor``, in place, whatever the layout of a fused projection (a ``Conv1D``'s
        output rows are its weight's columns)."""
        module, rows = self._projection(layer, which)
        rows = slice(None) if rows is None else rows
        weight = self.linear_weight(module)  # (out, in), a view
        weight[rows] = weight[rows] * factor.to(weight)[:, None]
        if module.bias is not None:
            module.bias[rows] = module.bias[rows] * factor.to(module.bias)

    def on_projection(self, layer: int, which: str, fn: Callable) -> object:
        """Call ``fn(out)`` with ``layer``'s ``which`` projection ``(B, T, n*D)`` whenever the
        model computes it; returns the removable hook handle."""
        module, rows = self._projection(layer, which)

        def hook(_mod, _args, out):
            fn(out if rows is None else out[..., rows])

        return module.register_forward_hook(hook)

    def split_heads(self, layer: int, which: str, out: torch.Tensor) -> torch.Tensor:
        """``layer``'s ``q_proj`` (``which="q"``) or ``k_proj`` (``"k"``) output ``(B, T, n*D)``
        as the attention reads it before RoPE, ``(B, n, T, D)``: split into heads, with the
        family's q / k norm applied where its row names one (``Family.q_norm``, over each head
        or the whole projection). Every place that recomputes queries or keys goes through here.
        """
        n = {"q": self.spec.n_heads, "k": self.spec.n_kv_heads}[which]
        path = self.family.q_norm if which == "q" else self.family.k_norm
        norm = None if path is None else get_module(self.attn(layer), path)
        if norm is not None and self.family.qk_norm_over == "projection":
            out = norm(out)
        heads = out.view(*out.shape[:-1], n, self.spec.d_head)  # (B, T, n, D)
        if norm is not None and self.family.qk_norm_over == "head":
            heads = norm(heads)
        return heads.transpose(1, 2)

    def mlp(self, layer: int) -> nn.Module:
        return get_module(self.layers()[layer], self.family.mlp)

    def norm(self, layer: int, which: str) -> nn.Module | None:
        """A decoder layer's ``"pre_attn"``, ``"post_attn"``, ``"pre_mlp"`` or ``"post_mlp"``
        norm (``Family.pre_attn_norm``, ...), or None where the family has none there."""
        if which not in NORM_SITES:
            raise ValueError(f"unknown norm site {which!r}; choose one of {NORM_SITES}")
        path = getattr(self.family, f"{which}_norm")
        return None if path is None else get_module(self.layers()[layer], path)

    def parallel_residual(self) -> bool:
        """Whether a decoder layer's MLP reads the stream entering the layer (GPT-NeoX's
        ``x + attn(pre_attn(x)) + mlp(pre_mlp(x))``, ``Family.parallel_residual``) instead of
        the stream after attention."""
        path = self.family.parallel_residual
        return path is not None and bool(get_attribute(self.model, path))

    def layer_cache_arg(self, cache) -> dict:
        """``{keyword: cache}`` to pass a KV cache to one decoder layer (``Family.layer_cache``:
        GPT-NeoX's layers take ``layer_past``, not the model's keyword)."""
        from interp_seal.models.kv_cache import cache_arg

        if self.family.layer_cache is None:
            return cache_arg(cache)
        return {self.family.layer_cache: cache}

    def apply_norm(self, layer: int, which: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` through ``norm(layer, which)``; unchanged where the family has no norm there."""
        norm = self.norm(layer, which)
        return x if norm is None else norm(x)

    def norm_terms(self, norm: nn.Module) -> tuple[torch.Tensor, float]:
        """An RMSNorm of this family as ``(w, eps)``, ``norm(x) = w * x / sqrt(mean(x^2) + eps)``:
        its weight with the family's offset added (Gemma's ``1 + w``, ``Family.norm_offset``),
        detached, float64."""
        weight = norm.weight.detach().double() + self.family.norm_offset
        return weight, float(getattr(norm, self.family.norm_eps))

    def norm_scale(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The denominator ``norm`` divides ``x`` (``(..., d_model)``) by, ``(..., 1)`` float64:
        ``sqrt(mean(x^2) + eps)`` for an RMSNorm, ``sqrt(var(x) + eps)`` for a LayerNorm
        (``Family.layer_norm``, which also subtracts the mean: ``center``)."""
        _, eps = self.norm_terms(norm)
        return torch.sqrt(self.center(x.double()).pow(2).mean(-1, keepdim=True) + eps)

    def center(self, x: torch.Tensor) -> torch.Tensor:
        """``x - mean(x)`` over the last axis where the family's norms are LayerNorms (a linear
        map: the parts of a stream centre to the parts of the centred stream); else ``x``."""
        return x - x.mean(-1, keepdim=True) if self.family.layer_norm else x

    def attn_softcap(self, layer: int) -> float | None:
        """The attention-logit soft-cap of ``layer`` (None: the family has none)."""
        if self.family.attn_softcap is None:
            return None
        return get_attribute(self.attn(layer), self.family.attn_softcap)

    def cap_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (``lm_head``'s output) through the family's final soft-cap, if any: what
        the model returns as its logits."""
        path = self.family.final_softcap
        return soft_cap(logits, None if path is None else get_attribute(self.model, path))

    def sliding_window(self, layer: int) -> int | None:
        """The attention window of ``layer`` (None: the whole causal prefix)."""
        if self.family.sliding_window is None:
            return None
        return get_attribute(self.attn(layer), self.family.sliding_window)

    def rope_tables(self, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The RoPE ``(cos, sin)`` (``(1, pos, D)`` each) a decoder layer or its attention module
        received as ``position_embeddings`` (``kwargs``: its keyword arguments); None for a
        family without RoPE (GPT-2, ``Family.rope_function=None``)."""
        if self.family.rope_function is None:
            return None
        if kwargs.get("position_embeddings") is None:
            raise ValueError(
                f"{self.family.name} rotates q and k with RoPE, but its attention received no "
                "position_embeddings (cos, sin)"
            )
        return kwargs["position_embeddings"]

    def rotate(
        self,
        layer: int,
        x: torch.Tensor,
        tables: tuple[torch.Tensor, torch.Tensor] | None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Queries or keys ``x`` ``(B, n, T, D)`` of ``layer`` rotated by the family's own RoPE
        function with ``tables`` (``rope_tables``), taken at ``positions`` (an index of the
        tables' position axis, any shape: ``cos[0][positions]``; None: all of them). ``x``
        itself in a family without RoPE (GPT-2: its positions entered the stream as embeddings
        before the first layer)."""
        if self.family.rope_function is None:
            return x
        cos, sin = tables
        if positions is not None:
            cos, sin = cos[0][positions], sin[0][positions]
        return self.rope(layer)(x, x[:, :0], cos, sin)[0]  # an empty second operand

    def rope(self, layer: int) -> Callable:
        """The family's RoPE function (``Family.rope_function``, e.g. ``apply_rotary_pos_emb(q,
        k, cos, sin)``) from the layer's own modeling file."""
        attn = self.attn(layer)
        name = self.family.rope_function
        if name is None:
            raise ValueError(
                f"{self.family.name} has no RoPE (learned absolute position embeddings, added "
                "to the token embeddings); its queries and keys are not rotated"
            )
        rope = getattr(sys.modules[type(attn).__module__], name, None)
        if rope is None:
            raise ValueError(
                f"{type(attn).__name__} has no {name} in {type(attn).__module__}; interp-seal "
                "supports RoPE attention (see interp_seal/models/spec.py)"
            )
        return rope

    def final_norm(self) -> nn.Module:
        return get_module(self.model, self.family.final_norm)

    def unembed(self) -> nn.Linear:
        return get_module(self.model, self.family.unembed)

    def embed(self) -> nn.Embedding:
        return get_module(self.model, self.family.embed)

    def pos_embed(self) -> nn.Embedding | None:
        """The learned absolute position embeddings (GPT-2's ``wpe``, ``Family.pos_embed``),
        added to the token embeddings before the first layer; None where positions enter
        through RoPE."""
        path = self.family.pos_embed
        return None if path is None else get_module(self.model, path)

    @property
    def identity(self) -> str:
        """What was loaded, named the same on every machine (the manifests of resumable runs
        record it): a GGUF conversion by its cache entry, whose name carries the file's
        content digest (``gguf.cache_dir``), not by where the cache lives; anything else by
        ``name_or_path``. A run resumed on another machine then meets the same identity."""
        from interp_seal.models.gguf import cache_root

        path = Path(self.name_or_path)
        root = cache_root()
        if path.parent == root or (path.is_dir() and path.resolve().parent == root.resolve()):
            return f"gguf-conversion:{path.name}"
        return str(self.name_or_path)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # -- edits ---------------------------------------------------------------------------
    @contextmanager
    def edit(self, intervention):
        """Apply ``intervention`` (a ``HeadIntervention``, or any ``HeadEdit``) to everything
        run on this handle inside a ``with`` block: a forward of ``handle.model``,
        ``generate()``, a training step, and every analysis and evaluation of the library.
        Yields the model. ``None`` applies nothing.

        The handle owns its active edits. Blocks nest, and an inner block removes only its own
        edit; the outer edit acts last, as if merged into ``o_proj``'s weights, and an
        analysis's own edits act before it (``ComposedEdit``). One hook per layer (on
        ``o_proj``'s input, and on ``v_proj`` for uniform attention), installed while any edit
        is active, applies the composition once per forward; the engine's runs restarted
        mid-model apply ``active_edit()`` themselves, so each edit acts exactly once on every
        path. Removed on exit, exception or not::

            with handle.edit(ablate(handle.spec, [(2, 1)], "scale", factor=0.5)):
                table = head_sweep(handle, samples)  # the sweep of the edited model
        """
        if intervention is None:
            yield self.model
            return
        intervention.check_model(self.spec, self.name_or_path)
        key = object()
        self._edits[key] = intervention
        try:
            self._compose()
            if self._edit_hooks is None:
                self._edit_hooks = self._install_edit_hooks()
            yield self.model
        finally:
            del self._edits[key]
            self._compose()
            if not self._edits and self._edit_hooks is not None:
                self._edit_hooks.close()
                self._edit_hooks = None

    def _compose(self) -> None:
        """The active edits' composition (outermost last) and the layers it changes."""
        edits = tuple(self._edits.values())
        self._active = None if not edits else edits[0] if len(edits) == 1 else ComposedEdit(edits)
        self._active_layers = frozenset(self._active.active_layers() if edits else ())

    def active_edit(self):
        """The composition of the active edits (outermost last), or None without edits."""
        return self._active

    def edits_use_values(self) -> bool:
        """Whether an active edit uses uniform attention anywhere (its running mean of value
        vectors needs every position in one run: no KV cache, no shared prefix)."""
        return any(self._active.uses_values(layer) for layer in self._active_layers)

    def check_own_hooks(self, layer: int) -> None:
        """Refuse ``o_proj`` hooks this handle did not install at ``layer``: a run restarted
        from cached head outputs calls ``o_proj`` itself and cannot apply them exactly once."""
        o_proj = self.proj(layer, "o_proj")
        if any(
            i not in self._hook_ids for i in (*o_proj._forward_pre_hooks, *o_proj._forward_hooks)
        ):
            raise RuntimeError(
                f"layer {layer}'s o_proj carries a hook interp-seal did not install; runs "
                "restarted mid-model would apply it twice or not at all. Remove it and apply "
                "the edit with `with handle.edit(intervention):` (or pass intervention=...)."
            )

    def _install_edit_hooks(self) -> ExitStack:
        """Per layer, an ``o_proj`` pre-hook applying ``active_edit()`` (and a ``v_proj`` hook
        handing it the values where it uses uniform attention)."""
        H, D, KV = self.spec.n_heads, self.spec.d_head, self.spec.n_kv_heads
        hooks = ExitStack()
        values: dict[int, torch.Tensor] = {}

        def keep_v(layer):
            def hook(out):
                if layer in self._active_layers and self._active.uses_values(layer):
                    values[layer] = out.view(*out.shape[:2], KV, D)

            return hook

        def edit_o_input(layer):
            def hook(_mod, args):
                v = values.pop(layer, None)
                if layer not in self._active_layers:
                    return None
                x = args[0]  # (B, T, H*D)
                if v is not None:  # uniform attention: refused on streaming heads
                    refuse_uniform_edits(self, layer, self._active)
                z = self._active.edit(
                    layer, x.view(*x.shape[:2], H, D), v, window=self.sliding_window(layer)
                )
                return (z.reshape(x.shape), *args[1:])

            return hook

        for layer in range(self.spec.n_layers):
            v_hook = self.on_projection(layer, "v", keep_v(layer))
            o_hook = self.proj(layer, "o_proj").register_forward_pre_hook(edit_o_input(layer))
            for removable in (v_hook, o_hook):
                self._hook_ids.add(removable.id)
                hooks.callback(self._hook_ids.discard, removable.id)
                hooks.enter_context(removable)
        return hooks

    # -- other backends --------------------------------------------------------------------
    def nnsight(self):
        """``nnsight.TransformersModel`` over the same weights (built once)."""
        if self._nnsight is None:
            import nnsight

            self._nnsight = nnsight.TransformersModel(self.model, tokenizer=self.tokenizer)
        return self._nnsight

    def bridge(self):
        """A TransformerLens 4 ``TransformerBridge`` on a private copy of the weights (built once).

        The bridge computes eager attention (a T x T pattern per head), so use it for short
        contexts and cross-checks; ``set_use_attn_result(True)`` is on so ``hook_result`` exists.
        """
        if self._bridge is None:
            from transformer_lens.model_bridge import TransformerBridge

            hf_copy = copy.deepcopy(self.model)
            bridge = TransformerBridge.boot_transformers(
                self.name_or_path, hf_model=hf_copy, tokenizer=self.tokenizer
            )
            bridge.set_use_attn_result(True)
            bridge.eval()
            self._bridge = bridge
        return self._bridge

    def reset_backends(self) -> None:
        """Forget the nnsight wrapper and the bridge's weight snapshot (call after editing weights)."""
        self._nnsight = None
        self._bridge = None

    # -- tokenisation ----------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
