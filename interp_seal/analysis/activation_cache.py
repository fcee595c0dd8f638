"""One forward, its logits and a named cache of activations: ``run_with_cache(handle, ids)``.

TransformerLens made ``logits, cache = model.run_with_cache(tokens)`` the first line of most
interpretability notebooks. This is that call on the Hugging Face model (sdpa attention, so
memory stays linear in sequence length), with the handle's active edits applied
(``handle.edit``), keyed by a small vocabulary of TransformerLens's short names:

============  ===========================================  =================================
name          what (per layer unless noted)                TransformerLens 4 bridge hook
============  ===========================================  =================================
resid_pre     residual stream entering the layer            ``blocks.{l}.hook_resid_pre``
resid_mid     ... after its attention                       ``blocks.{l}.hook_resid_mid``
resid_post    ... after its MLP                             ``blocks.{l}.hook_resid_post``
q             post-RoPE queries ``(B, P, H, D)``            ``blocks.{l}.attn.hook_rot_q``
k             post-RoPE keys ``(B, P, KV, D)`` (GQA kept)   ``blocks.{l}.attn.hook_rot_k``
v             values ``(B, P, KV, D)``                      ``blocks.{l}.attn.hook_v``
z             head outputs, the ``o_proj`` input             ``blocks.{l}.attn.hook_z``
              ``(B, P, H, D)``, edits applied
pattern       attention rows of the kept positions over     ``blocks.{l}.attn.hook_pattern``
              every key ``(B, H, P, T)``
attn_out      attention output (``o_proj``'s, through the   ``blocks.{l}.hook_attn_out``
              family's post-attention norm if it has one)
mlp_out       MLP output (through the post-MLP norm if      ``blocks.{l}.hook_mlp_out``
              the family has one)
scale         final norm's RMS ``(B, P, 1)`` (no layer)     ``ln_final.hook_scale``
============  ===========================================  =================================

``positions`` keeps only some positions of every activation (and the logits): at 32K tokens
a full cache of one layer's ``pattern`` would be ``H x T x T`` floats, while the rows of a few
query positions are computed row-wise (``interp_seal.analysis.attention_rows``, never
``T x T``) and every other name costs ``P`` rows instead of ``T``. ``names`` and ``layers``
restrict what is kept; only the hooks those need are installed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.analysis.attention_rows import layer_rows, post_rope_qk_hooks
from interp_seal.engine.layers import layer_output
from interp_seal.interventions import HeadEdit
from interp_seal.models.handle import ModelHandle

# name -> the TransformerLens 4 bridge hook holding the same activation
TL_NAMES = {
    "resid_pre": "blocks.{l}.hook_resid_pre",
    "resid_mid": "blocks.{l}.hook_resid_mid",
    "resid_post": "blocks.{l}.hook_resid_post",
    "q": "blocks.{l}.attn.hook_rot_q",
    "k": "blocks.{l}.attn.hook_rot_k",
    "v": "blocks.{l}.attn.hook_v",
    "z": "blocks.{l}.attn.hook_z",
    "pattern": "blocks.{l}.attn.hook_pattern",
    "attn_out": "blocks.{l}.hook_attn_out",
    "mlp_out": "blocks.{l}.hook_mlp_out",
    "scale": "ln_final.hook_scale",
}
NAMES = tuple(TL_NAMES)
Key = tuple[str, int | None]


@dataclass(frozen=True, eq=False)
class ActivationCache:
    """Activations of one forward, keyed ``(name, layer)`` (``layer`` None for ``"scale"``).

    ``cache["z", 3]`` is layer 3's head outputs; ``cache["scale"]`` the final norm's RMS.

    Attributes:
        acts: the tensors, detached, at the kept positions.
        positions: the absolute positions kept (axis ``P`` of every tensor), or None for all.
    """

    acts: dict[Key, Tensor]
    positions: Int[Tensor, " pos"] | None

    def __getitem__(self, key: str | Key) -> Tensor:
        key = (key, None) if isinstance(key, str) else tuple(key)
        if key not in self.acts:
            raise KeyError(
                f"{key} is not in this cache; it holds {sorted(self.acts, key=str)[:6]}... "
                f"(names: {', '.join(NAMES)}; pass names=/layers= to run_with_cache)"
            )
        return self.acts[key]

    def __contains__(self, key: str | Key) -> bool:
        return ((key, None) if isinstance(key, str) else tuple(key)) in self.acts

    def keys(self) -> list[Key]:
        return list(self.acts)

    @staticmethod
    def tl_name(key: Key) -> str:
        """The TransformerLens 4 bridge hook name of ``key``."""
        name, layer = key
        return TL_NAMES[name].format(l=layer)


def run_with_cache(
    handle: ModelHandle,
    input_ids: Int[Tensor, "batch pos"],
    *,
    names: Iterable[str] | None = None,
    layers: Iterable[int] | None = None,
    positions: Sequence[int] | None = None,
    intervention: HeadEdit | None = None,
) -> tuple[Float[Tensor, "batch kept vocab"], ActivationCache]:
    """Logits and the named activations of one forward of ``input_ids`` (no gradients).

    Args:
        handle: the model; its active edits (``handle.edit``) apply, and so does
            ``intervention`` (innermost).
        input_ids: ``(batch, pos)`` token ids (right-padded rows, if any).
        names: which activations (default all of ``NAMES``).
        layers: which layers (default all).
        positions: keep only these positions (negative ones count from the end) in every
            activation and in the logits; None keeps all.
    """
    parallel = handle.parallel_residual()  # GPT-NeoX: no resid_mid, by default or asked for
    names = [n for n in NAMES if not (parallel and n == "resid_mid")] if names is None else names
    names = list(names)
    if parallel and "resid_mid" in names:
        raise ValueError(
            f"{handle.family.name} runs attention and MLP in parallel (x + attn(ln1(x)) + "
            "mlp(ln2(x))): no stream lies between them, so there is no resid_mid; ask for "
            "resid_pre, attn_out and mlp_out"
        )
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown cache names {unknown}; choose from {', '.join(NAMES)}")
    L = handle.spec.n_layers
    layers = sorted({int(x) for x in (range(L) if layers is None else layers)})
    if any(not 0 <= x < L for x in layers):
        raise ValueError(f"layers must lie in 0..{L - 1}, got {layers}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}; expected (batch, pos)")
    T = input_ids.shape[1]
    keep = (
        None
        if positions is None
        else torch.tensor([p % T if -T <= p < T else T for p in positions])
    )
    if keep is not None and (len(keep) == 0 or (keep >= T).any()):
        raise ValueError(f"positions {list(positions)} must lie in 0..{T - 1} (or -1..-{T})")
    acts: dict[Key, Tensor] = {}

    def at(x: Tensor, axis: int = 1) -> Tensor:  # the kept positions of a (B, T, ...) tensor
        x = x.detach()
        return x if keep is None else x.index_select(axis, keep.to(x.device))

    with torch.no_grad(), handle.edit(intervention), ExitStack() as hooks:
        on = hooks.enter_context
        for layer in layers:
            on(_layer_hooks(handle, layer, names, acts, at))
        if {"q", "k", "pattern"} & set(names):
            on(post_rope_qk_hooks(handle, layers, _qk_keeper(handle, names, acts, at, keep, T)))
        if "scale" in names:

            def keep_scale(_mod, args):  # RMS, or a LayerNorm's std (ModelHandle.norm_scale)
                scale = handle.norm_scale(handle.final_norm(), args[0])
                acts["scale", None] = at(scale.to(torch.float32))

            on(handle.final_norm().register_forward_pre_hook(keep_scale))
        kept = T if keep is None else keep.to(handle.device)
        logits = handle.model(input_ids.to(handle.device), use_cache=False, logits_to_keep=kept)
    return logits.logits, ActivationCache(acts=acts, positions=keep)


def _layer_hooks(handle: ModelHandle, layer: int, names, acts: dict, at) -> ExitStack:
    """Hooks keeping ``layer``'s residual stream, ``v``, ``z`` and attention / MLP outputs."""
    H, KV, D = handle.spec.n_heads, handle.spec.n_kv_heads, handle.spec.d_head
    hooks = ExitStack()
    seen: dict[str, Tensor] = {}

    def resid_pre(_mod, args, kwargs):
        seen["pre"] = args[0] if args else kwargs["hidden_states"]
        if "resid_pre" in names:
            acts["resid_pre", layer] = at(seen["pre"])

    def resid_post(_mod, _args, out):
        acts["resid_post", layer] = at(layer_output(out))

    def attn_out(_mod, _args, out):
        if "attn_out" in names:
            acts["attn_out", layer] = at(out)
        if "resid_mid" in names:  # the layer's own sum: resid_pre + attention output
            acts["resid_mid", layer] = at(seen["pre"] + out)

    def z(_mod, args):  # after the edit hooks: what o_proj receives
        acts["z", layer] = at(args[0].view(*args[0].shape[:2], H, D))

    def v(out):
        acts["v", layer] = at(out.view(*out.shape[:2], KV, D))

    def mlp_out(_mod, _args, out):
        acts["mlp_out", layer] = at(out)

    block, o_proj = handle.layers()[layer], handle.proj(layer, "o_proj")
    # what each sublayer adds to the residual stream: through its post-norm where there is one
    attn_writes = handle.norm(layer, "post_attn") or o_proj
    mlp_writes = handle.norm(layer, "post_mlp") or handle.mlp(layer)
    if {"resid_pre", "resid_mid"} & set(names):
        hooks.enter_context(block.register_forward_pre_hook(resid_pre, with_kwargs=True))
    if "resid_post" in names:
        hooks.enter_context(block.register_forward_hook(resid_post))
    if {"attn_out", "resid_mid"} & set(names):
        hooks.enter_context(attn_writes.register_forward_hook(attn_out))
    if "z" in names:
        hooks.enter_context(o_proj.register_forward_pre_hook(z))
    if "v" in names:
        hooks.enter_context(handle.on_projection(layer, "v", v))
    if "mlp_out" in names:
        hooks.enter_context(mlp_writes.register_forward_hook(mlp_out))
    return hooks


def _qk_keeper(handle: ModelHandle, names, acts: dict, at, keep: Tensor | None, T: int):
    """The ``post_rope_qk_hooks`` callback keeping ``q``, ``k`` and attention rows."""

    def on_qk(layer: int, _mod, _kwargs, q: Tensor, k: Tensor) -> None:
        # q (B, H, T, D), k (B, KV, T, D)
        if "q" in names:
            acts["q", layer] = at(q.transpose(1, 2))
        if "k" in names:
            acts["k", layer] = at(k.transpose(1, 2))
        if "pattern" in names:
            rows = torch.arange(T) if keep is None else keep
            q_rows = q.index_select(2, rows.to(q.device))
            acts["pattern", layer] = layer_rows(handle, layer, q_rows, k, rows).detach()

    return on_qk
