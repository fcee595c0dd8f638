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
from dataclasses import dataclass, field

import torch
from torch import nn

from interp_seal.models.spec import Family, ModelSpec, get_attribute, get_module

BACKENDS = ("hf", "nnsight", "transformer_lens")


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
    # the active edits (``edit``), innermost last, and the hooks applying them
    _edits: dict = field(default_factory=dict, init=False, repr=False)
    _edit_hooks: object = field(default=None, init=False, repr=False)
    _hook_ids: set = field(default_factory=set, init=False, repr=False)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {BACKENDS}")

    # -- module map ------------------------------------------------------------------------
    def layers(self) -> nn.ModuleList:
        return get_module(self.model, self.family.layers)

    def attn(self, layer: int) -> nn.Module:
        return get_module(self.layers()[layer], self.family.attn)

    def proj(self, layer: int, which: str) -> nn.Linear:
        """One of ``"q_proj"``, ``"k_proj"``, ``"v_proj"``, ``"o_proj"`` of ``layer``."""
        return get_module(self.attn(layer), getattr(self.family, which))

    def mlp(self, layer: int) -> nn.Module:
        return get_module(self.layers()[layer], self.family.mlp)

    def norm(self, layer: int, which: str) -> nn.Module:
        """A decoder layer's ``"input"`` (pre-attention) or ``"post_attention"`` (pre-MLP) norm."""
        names = {"input": self.family.input_norm, "post_attention": self.family.post_attention_norm}
        return get_module(self.layers()[layer], names[which])

    def sliding_window(self, layer: int) -> int | None:
        """The attention window of ``layer`` (None: the whole causal prefix)."""
        if self.family.sliding_window is None:
            return None
        return get_attribute(self.attn(layer), self.family.sliding_window)

    def rope(self, layer: int) -> Callable:
        """The family's RoPE function (``Family.rope_function``, e.g. ``apply_rotary_pos_emb(q,
        k, cos, sin)``) from the layer's own modeling file."""
        attn = self.attn(layer)
        name = self.family.rope_function
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

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # -- edits ---------------------------------------------------------------------------
    def edit(self, intervention):
        """Apply ``intervention`` (a ``HeadIntervention``, or any ``HeadEdit``) to everything
        run on this handle inside a ``with`` block: a forward of ``handle.model``,
        ``generate()``, a training step, and every analysis and evaluation of the library.

        Blocks nest; the outer edit acts last, as if merged into ``o_proj``'s weights, and an
        analysis's own edits act before it. Each forward applies each active edit exactly once,
        also in the engine's runs restarted mid-model. Removed on exit, exception or not::

            with handle.edit(ablate(handle.spec, [(2, 1)], "scale", factor=0.5)):
                table = head_sweep(handle, samples)  # the sweep of the edited model
        """
        from interp_seal.interventions.hf import hf_hooks

        return hf_hooks(self, intervention)

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
