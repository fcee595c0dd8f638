"""Context extension without training: NTK-aware RoPE scaling and Self-Extend.

SEAL (Sec. 4.3, Table 2, Fig. 6) shows that its head / channel scales combine with two
training-free ways of reading past the trained context length. Both only change how RoPE
positions enter attention, so both are options of a loaded model (``extend_context``) that
compose with the head-output primitive ``interp_seal.interventions.HeadIntervention`` (which
edits ``o_proj``'s input, downstream of attention).

**NTK-aware scaling** (bloc97, 2023). RoPE rotates channel pair ``i`` of a head of size ``d`` by
``pos * theta_i`` with ``theta_i = base ** (-2i / d)``. Stretching the context ``alpha`` times
by interpolating positions would squeeze the high frequencies that encode local order; the NTK
trick instead raises the base, ``base' = base * alpha ** (d / (d - 2))``, which leaves the
highest frequency (``i = 0``) unchanged and divides the lowest (``i = d/2 - 1``) by exactly
``alpha``. Here the rotary module's ``inv_freq`` buffer is replaced by ``base' ** (-2i / d)``.

**Self-Extend** (Jin et al., 2024, "LLM Maybe LongLM"). A query at position ``i`` attends to a
key at ``j`` with its ordinary relative distance ``i - j`` when the key is inside a neighbour
window (``i - j < W``); beyond it, both positions are grouped by floor division with a group
size ``G``: the key sits at ``j // G`` and the query at ``i // G + W - W // G`` (the shift makes
the two regimes meet at the window's edge). Distances never exceed what the model saw in
training as long as ``T / G + W`` stays inside it.

The implementation is an attention function registered with transformers'
``AttentionInterface``. It receives the layer's queries and keys already rotated at their true
positions; RoPE rotations compose (``R(a) R(b) = R(a + b)``), so rotating them further by
``group(pos) - pos`` gives them exactly at their grouped positions. Queries are processed in
blocks: a block of ``b`` queries scores its keys at grouped positions, and the band of keys
within ``W + b`` of it at true positions too, keeps each entry from the regime its distance
falls in, and takes one softmax. Memory is
``O(b * T)`` per head, never ``T x T``, in training too: under autograd each block is
recomputed in the backward pass (``torch.utils.checkpoint``) instead of keeping its ``b x T``
scores, so tuning SEAL scales through Self-Extend at 9K tokens stores only the blocks' outputs. Padding masks are not supported (right-padded batches
are fine under causal attention; left padding is refused by the models' own mask, which this
function does not receive).

The TransformerLens bridge computes its own eager attention and ignores both options; the
HF model and the nnsight wrapper (same module objects) see them.
"""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface

from interp_seal.models.handle import ModelHandle

ATTENTION_NAME = "interp_seal_self_extend"
_CONFIG_ATTR = "_interp_seal_self_extend"


@dataclass(frozen=True, kw_only=True)
class ContextExtension:
    """How to read past the trained context length (SEAL Table 2); the default changes nothing.

    Attributes:
        ntk_factor: NTK-aware RoPE scaling factor ``alpha`` (1.0: off); the RoPE base becomes
            ``base * alpha ** (d_head / (d_head - 2))``.
        group_size: Self-Extend group size ``G`` (1: off).
        window: Self-Extend neighbour window ``W`` in tokens (keys closer than ``W`` keep their
            true relative position); required when ``group_size > 1``.
        block_size: queries per block in the Self-Extend attention (memory ``block * T`` per
            head; results do not depend on it).
    """

    ntk_factor: float = 1.0
    group_size: int = 1
    window: int = 0
    block_size: int = 256

    def __post_init__(self):
        if not (math.isfinite(self.ntk_factor) and self.ntk_factor >= 1.0):
            raise ValueError(
                f"ntk_factor must be a finite number >= 1 (1 turns NTK scaling off), got "
                f"{self.ntk_factor}"
            )
        if self.group_size < 1 or self.block_size < 1:
            raise ValueError(
                f"group_size and block_size must be >= 1, got {self.group_size} and "
                f"{self.block_size}"
            )
        if self.group_size > 1 and self.window < 1:
            raise ValueError(
                f"Self-Extend with group_size={self.group_size} needs a neighbour window >= 1 "
                "(window=W keeps keys closer than W tokens at their true distance)"
            )

    @property
    def self_extend(self) -> bool:
        return self.group_size > 1

    @property
    def label(self) -> str:
        parts = []
        if self.ntk_factor != 1.0:
            parts.append(f"NTK x{self.ntk_factor:g}")
        if self.self_extend:
            parts.append(f"Self-Extend G={self.group_size} W={self.window}")
        return " + ".join(parts) or "none"


def ntk_inv_freq(base: float, dim: int, factor: float) -> Float[Tensor, " half"]:
    """RoPE inverse frequencies ``base' ** (-2i / dim)`` with the NTK-aware base."""
    scaled = base * factor ** (dim / (dim - 2))
    return 1.0 / scaled ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rotary_modules(handle: ModelHandle) -> list[torch.nn.Module]:
    """The model's rotary-embedding modules (those holding an ``inv_freq`` buffer)."""
    found = [m for m in handle.model.modules() if isinstance(getattr(m, "inv_freq", None), Tensor)]
    if not found:
        raise ValueError(
            f"{handle.name_or_path} has no rotary embedding module with an inv_freq buffer; "
            "NTK scaling and Self-Extend need RoPE attention (llama / mistral / qwen2 families)"
        )
    return found


def _rope_base_and_dim(handle: ModelHandle, rotary: torch.nn.Module) -> tuple[float, int]:
    params = getattr(handle.model.config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(
            f"{handle.name_or_path} already uses RoPE scaling {rope_type!r}; NTK-aware scaling is "
            "defined on plain RoPE only. Load the model without rope scaling to combine them."
        )
    return float(params["rope_theta"]), 2 * rotary.inv_freq.numel()


def rotate(x: Float[Tensor, "*b pos d"], angles: Float[Tensor, "pos half"]) -> Tensor:
    """Rotate channel pairs ``(c, c + d/2)`` of ``x`` by ``angles`` (HF's rotate-half layout)."""
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def grouped_positions(
    q_pos: Tensor, k_pos: Tensor, group: int, window: int
) -> tuple[Tensor, Tensor]:
    """Self-Extend's grouped query and key positions."""
    return q_pos // group + window - window // group, k_pos // group


def _block(
    q: Tensor,
    q_g: Tensor,
    key: Tensor,
    key_g: Tensor,
    value: Tensor,
    first: int,
    window: int,
    scaling: float,
) -> Float[Tensor, "batch head b d"]:
    """One block of queries, the first at position ``first``, over its ``n`` causal keys.

    Keys before ``first - window + 1`` are at least ``window`` away from every query of the
    block, so they are scored at grouped positions only; the band after them (at most
    ``b + window`` keys) is also scored at true positions and each entry taken from its
    distance's regime, then masked causally. One softmax over all keys, then the values.
    """
    near = max(0, first - window + 1)
    scores = (q_g * scaling) @ key_g.transpose(-1, -2)  # (B, H, b, n) grouped
    q_pos = torch.arange(first, first + q.shape[-2], device=q.device)
    dist = q_pos[:, None] - torch.arange(near, key.shape[-2], device=q.device)[None, :]
    normal = (q * scaling) @ key[:, :, near:].transpose(-1, -2)  # (B, H, b, band)
    band = torch.where(dist < window, normal, scores[..., near:])
    scores[..., near:] = band.masked_fill(dist < 0, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    return probs @ value


def self_extend_attention(
    module: torch.nn.Module,
    query: Float[Tensor, "batch head q d"],
    key: Float[Tensor, "batch kv_head k d"],
    value: Float[Tensor, "batch kv_head k d"],
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **_kwargs,
) -> tuple[Float[Tensor, "batch q head d"], None]:
    """Self-Extend attention over post-RoPE ``query`` / ``key`` (see the module docstring)."""
    cfg: ContextExtension
    cfg, inv_freq = getattr(module, _CONFIG_ATTR)
    if attention_mask is not None:
        raise ValueError(
            "Self-Extend attention does not take an attention mask (padding); run unpadded or "
            "right-padded batches"
        )
    B, H, Tq, D = query.shape
    Tk = key.shape[2]
    groups = H // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)  # (B, H, Tk, D): query head h uses KV head h // g
    value = value.repeat_interleave(groups, dim=1)
    scaling = D**-0.5 if scaling is None else scaling
    k_pos = torch.arange(Tk, device=query.device)
    q_pos = k_pos[Tk - Tq :]  # queries are the last Tq positions (prefill or cached decoding)
    gq, gk = grouped_positions(q_pos, k_pos, cfg.group_size, cfg.window)
    freq = inv_freq.to(query.device, torch.float64)
    key_g = rotate(key, ((gk - k_pos)[:, None] * freq).float())
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    blocks = []
    for s in range(0, Tq, cfg.block_size):
        e = min(s + cfg.block_size, Tq)
        n_keys = int(q_pos[e - 1]) + 1  # causal: later keys are never attended
        q = query[:, :, s:e]
        q_g = rotate(q, ((gq[s:e] - q_pos[s:e])[:, None] * freq).float())
        first = int(q_pos[s])
        args = (q, q_g, key[:, :, :n_keys], key_g[:, :, :n_keys], value[:, :, :n_keys], first)
        if recompute:  # recompute in backward: keep only inputs, never b x T
            blocks.append(checkpoint(_block, *args, cfg.window, scaling, use_reentrant=False))
        else:
            blocks.append(_block(*args, cfg.window, scaling))
    out = torch.cat(blocks, dim=2).transpose(1, 2)
    return out, None


AttentionInterface.register(ATTENTION_NAME, self_extend_attention)


@contextmanager
def extend_context(handle: ModelHandle, extension: ContextExtension):
    """Apply ``extension`` to ``handle.model`` inside the block; restored on exit, error or not.

    Combine with a head edit by nesting: ``with extend_context(h, ext), hf_hooks(h, iv): ...``.
    """
    with ExitStack() as restore:
        install(handle, extension, restore)
        yield handle.model


def install(handle: ModelHandle, extension: ContextExtension, restore: ExitStack) -> None:
    """Apply ``extension``, pushing onto ``restore`` what undoes it."""
    rotary = rotary_modules(handle)
    if extension.ntk_factor != 1.0:
        for mod in rotary:
            base, dim = _rope_base_and_dim(handle, mod)
            old = mod.inv_freq.clone()
            mod.inv_freq.copy_(ntk_inv_freq(base, dim, extension.ntk_factor))
            restore.callback(mod.inv_freq.copy_, old)
    if extension.self_extend:
        inv_freq = rotary[0].inv_freq.clone()  # after NTK scaling when both are on
        for layer in range(handle.spec.n_layers):
            attn = handle.attn(layer)
            setattr(attn, _CONFIG_ATTR, (extension, inv_freq))
            restore.callback(delattr, attn, _CONFIG_ATTR)
        old_impl = handle.model.config._attn_implementation
        handle.model.set_attn_implementation(ATTENTION_NAME)
        restore.callback(handle.model.set_attn_implementation, old_impl)
