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
blocks of ``b``, and each block's keys split into parts that are each plain attention: the band
of keys within ``W`` of some query of the block, scored at true positions under a band mask
(``0 <= i - j < W``); the keys ``W`` or more before every query, at grouped positions with no
mask; and the ``b`` keys between, at grouped positions under a causal triangle. Each part gives
its output and log-sum-exp, and the parts merge exactly as one softmax over all the keys would
(``lse = logaddexp(lse_1, lse_2)``, outputs weighted by ``exp(lse_k - lse)``), the way
FlashAttention merges key blocks. The backward pass needs no stored scores either: a part's
gradients are the attention backward of that part alone, given the merged output and
log-sum-exp (the row normalisation of the whole softmax), which is how ring attention splits
its backward. On the CPU each part runs PyTorch's fused flash-attention kernel, forward and
backward; on other devices the same parts run as plain tensor algebra. Memory is the inputs,
the output and one log-sum-exp per query, plus at most ``b x (b + W)`` scores at a time:
never ``T x T``, in training too, so tuning SEAL scales through Self-Extend at 9K tokens keeps
nothing quadratic. Padding masks are not supported (right-padded batches are fine under causal
attention; left padding is refused by the models' own mask, which this function does not
receive).

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
from transformers import AttentionInterface

from interp_seal.models.handle import STREAMING_ATTR, ModelHandle

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
        block_size: queries per block in the Self-Extend attention (scores ``block x (block +
            window)`` per head at a time; results do not depend on it).
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
    if handle.family.rope_function is None:
        raise ValueError(
            f"{handle.family.name} has learned absolute position embeddings and no RoPE: NTK "
            "scaling and Self-Extend change how RoPE rotates queries and keys, so neither "
            "applies to it"
        )
    found = [m for m in handle.model.modules() if isinstance(getattr(m, "inv_freq", None), Tensor)]
    if not found:
        raise ValueError(
            f"{handle.name_or_path} has no rotary embedding module with an inv_freq buffer; "
            "NTK scaling and Self-Extend need RoPE attention with one table for every layer "
            "(Gemma 3 rotates its local and global layers with different bases)"
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
    """Rotate channel pairs ``(c, c + r/2)`` of the first ``r = 2 * half`` channels of ``x`` by
    ``angles`` (HF's rotate-half layout); the channels after ``r``, which partial RoPE (Phi-3
    with ``partial_rotary_factor < 1``) leaves unrotated, pass unchanged."""
    r = 2 * angles.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([-x2, x1], dim=-1) * sin, rest], dim=-1)


def grouped_positions(
    q_pos: Tensor, k_pos: Tensor, group: int, window: int
) -> tuple[Tensor, Tensor]:
    """Self-Extend's grouped query and key positions."""
    return q_pos // group + window - window // group, k_pos // group


FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


@dataclass(frozen=True)
class Part:
    """Plain attention of the query ``rows`` over the ``keys`` (index ranges of the block's
    layer inputs): at grouped positions or true ones, under no mask (``"all"``), a top-left
    causal triangle (``"causal"``) or the band ``0 <= i - j < W`` (``"band"``)."""

    rows: slice
    keys: slice
    grouped: bool
    mask: str


def block_parts(start: int, stop: int, offset: int, window: int) -> list[Part]:
    """The parts of the query rows ``start:stop`` (query ``r`` at position ``offset + r``).

    Every key ``j`` of a query at ``i`` is in exactly one part: the band when ``i - j < W``,
    else (``j <= i - W``) the grouped keys before the block's first far key's row position
    ``p0 - W``, or the triangle ``p0 - W .. last - W`` (key ``p0 - W + t`` is far for row
    ``t`` and later: causal). Rows whose position is below ``W`` have no far key.
    """
    first, last = offset + start, offset + stop - 1
    parts = [Part(slice(start, stop), slice(max(0, first - window + 1), last + 1), False, "band")]
    far = max(start, window - offset)  # first row with a far key (position >= W)
    if far < stop:
        p0 = offset + far
        if p0 > window:
            parts.append(Part(slice(far, stop), slice(0, p0 - window), True, "all"))
        parts.append(Part(slice(far, stop), slice(p0 - window, last - window + 1), True, "causal"))
    return parts


def _band_mask(part: Part, offset: int, window: int, like: Tensor) -> Tensor:
    """Additive mask of ``part``: 0 where ``0 <= i - j < window``, -inf elsewhere."""
    rows = torch.arange(part.rows.start, part.rows.stop, device=like.device) + offset
    dist = rows[:, None] - torch.arange(part.keys.start, part.keys.stop, device=like.device)
    keep = (dist >= 0) & (dist < window)
    return torch.zeros(keep.shape, dtype=like.dtype, device=like.device).masked_fill(
        ~keep, float("-inf")
    )


def _scores(q: Tensor, k: Tensor, causal: bool, mask: Tensor | None, scale: float) -> Tensor:
    s = (q @ k.transpose(-1, -2)).float() * scale
    if mask is not None:
        s = s + mask
    if causal:
        upper = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(upper, float("-inf"))
    return s


def _part_inputs(part: Part, q, q_g, k, k_g, v, offset: int, window: int) -> tuple:
    """``(queries, keys, values, causal, mask)`` of ``part``: what its kernel call takes."""
    qq, kk = (q_g, k_g) if part.grouped else (q, k)
    mask = _band_mask(part, offset, window, q) if part.mask == "band" else None
    rows, keys = part.rows, part.keys
    return qq[:, :, rows], kk[:, :, keys], v[:, :, keys], part.mask == "causal", mask


def fused(t: Tensor) -> bool:
    """Whether ``t``'s device runs the parts with PyTorch's fused flash kernel (the CPU)."""
    return t.device.type == "cpu"


def _attend(q, k, v, causal, mask, scale) -> tuple[Tensor, Tensor]:
    """One part's output and log-sum-exp (float32)."""
    if fused(q):
        return FLASH(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    s = _scores(q, k, causal, mask, scale)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]).to(v.dtype) @ v, lse


def _attend_backward(grad, q, k, v, out, lse, causal, mask, scale) -> tuple[Tensor, ...]:
    """One part's ``(dq, dk, dv)`` given the merged ``out`` and ``lse`` of its rows."""
    if fused(q):
        return FLASH_BACKWARD(grad, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=scale)
    p = torch.exp(_scores(q, k, causal, mask, scale) - lse[..., None])
    dv = p.to(grad.dtype).transpose(-1, -2) @ grad
    dp = (grad @ v.transpose(-1, -2)).float()
    row = (grad.float() * out.float()).sum(-1, keepdim=True)
    ds = (p * (dp - row) * scale).to(q.dtype)
    return ds @ k, ds.transpose(-1, -2) @ q, dv


class _SelfExtend(torch.autograd.Function):
    """Self-Extend attention of ``(B, H, Tq, D)`` queries over ``Tk`` keys (the queries are
    the last ``Tq`` positions), by merged parts (``block_parts``), forward and backward."""

    @staticmethod
    def forward(ctx, q, q_g, k, k_g, v, window: int, block: int, scale: float):
        B, H, Tq, D = q.shape
        offset = k.shape[2] - Tq
        out = torch.empty_like(q)
        lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
        for s in range(0, Tq, block):
            e = min(s + block, Tq)
            acc = torch.zeros(B, H, e - s, D, dtype=torch.float32, device=q.device)
            acc_lse = torch.full((B, H, e - s), float("-inf"), device=q.device)
            for part in block_parts(s, e, offset, window):
                inputs = _part_inputs(part, q, q_g, k, k_g, v, offset, window)
                o, part_lse = _attend(*inputs, scale)
                r = slice(part.rows.start - s, part.rows.stop - s)
                merged = torch.logaddexp(acc_lse[..., r], part_lse)
                acc[..., r, :] = (
                    acc[..., r, :] * torch.exp(acc_lse[..., r] - merged)[..., None]
                    + o.float() * torch.exp(part_lse - merged)[..., None]
                )
                acc_lse[..., r] = merged
            out[:, :, s:e] = acc.to(q.dtype)
            lse[:, :, s:e] = acc_lse
        ctx.save_for_backward(q, q_g, k, k_g, v, out, lse)
        ctx.options = (window, block, scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, q_g, k, k_g, v, out, lse = ctx.saved_tensors
        window, block, scale = ctx.options
        grad_out = grad_out.contiguous()
        Tq = q.shape[2]
        offset = k.shape[2] - Tq
        dq, dq_g, dk, dk_g, dv = (torch.zeros_like(t) for t in (q, q_g, k, k_g, v))
        for s in range(0, Tq, block):
            for part in block_parts(s, min(s + block, Tq), offset, window):
                gq, gk = (dq_g, dk_g) if part.grouped else (dq, dk)
                rows, keys = part.rows, part.keys
                qq, kk, vv, causal, mask = _part_inputs(part, q, q_g, k, k_g, v, offset, window)
                a, b, c = _attend_backward(
                    grad_out[:, :, rows],
                    qq,
                    kk,
                    vv,
                    out[:, :, rows],
                    lse[:, :, rows],
                    causal,
                    mask,
                    scale,
                )
                gq[:, :, rows] += a
                gk[:, :, keys] += b
                dv[:, :, keys] += c
        return dq, dq_g, dk, dk_g, dv, None, None, None


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
    query_g = rotate(query, ((gq - q_pos)[:, None] * freq).float())
    out = _SelfExtend.apply(
        query.contiguous(), query_g, key, key_g, value, cfg.window, cfg.block_size, scaling
    )
    return out.transpose(1, 2), None


@contextmanager
def extend_context(handle: ModelHandle, extension: ContextExtension):
    """Apply ``extension`` to ``handle.model`` inside the block; restored on exit, error or not.

    Combine with a head edit by nesting: ``with extend_context(h, ext), h.edit(iv): ...``.
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
    if extension.self_extend and any(
        handle.attn_softcap(layer) is not None for layer in range(handle.spec.n_layers)
    ):
        raise ValueError(
            f"Self-Extend attention does not soft-cap attention logits, which "
            f"{handle.family.name} does; use NTK scaling alone on this model"
        )
    if extension.self_extend:
        inv_freq = rotary[0].inv_freq.clone()  # after NTK scaling when both are on
        for layer in range(handle.spec.n_layers):
            attn = handle.attn(layer)
            setattr(attn, _CONFIG_ATTR, (extension, inv_freq))
            restore.callback(delattr, attn, _CONFIG_ATTR)
        if hasattr(handle.attn(0), STREAMING_ATTR):
            return  # streaming heads' attention (models.streaming_heads) runs Self-Extend itself
        old_impl = handle.model.config._attn_implementation
        # registered here, not at import: a copy of this module executed again (nnsight's
        # serialised traces do that) would otherwise leave its own function in the registry
        AttentionInterface.register(ATTENTION_NAME, self_extend_attention)
        handle.model.set_attn_implementation(ATTENTION_NAME)
        restore.callback(handle.model.set_attn_implementation, old_impl)
