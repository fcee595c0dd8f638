"""Soft-capped attention that never builds ``T x T``: Gemma 2's attention, query rows in blocks.

Gemma 2 soft-caps its attention logits: a head's scores ``s = q k^T * scaling`` become
``c * tanh(s / c)`` before the causal mask (and, on every other layer, the sliding window) and
the softmax. transformers' sdpa path has no such cap, so transformers runs Gemma 2 with eager
attention, which holds every layer's ``(batch, head, T, T)`` scores at once: 1 GiB per layer
at 8K tokens with 4 heads in float32, quadratic in the length, under every analysis and in
training (autograd keeps each layer's pattern for the backward pass).

``capped_attention`` computes what eager attention computes, in blocks of query rows:

- each block's scores are taken over the keys it can see only: from its first row's window
  start (windowed layers; ``sliding_window`` from the layer's keyword arguments: query ``i``
  sees keys ``i - W < j <= i``) or the first key (global layers) to its last row (causal):
  ``rows x T`` at most, ``rows x (rows + W - 1)`` on windowed layers;
- the scores are soft-capped (``softcap`` from the layer's keyword arguments), masked (causal,
  window, padding), soft-maxed in float32 (float64 for float64 models) and multiplied by the
  values;
- grouped-query attention reads each KV head once: the ``G`` query heads of a KV head become
  ``G x rows`` query rows against that head's keys (no repeated keys or values);
- the number of rows per block keeps a block's scores near ``SCORES_PER_BLOCK`` numbers
  (``rows = SCORES_PER_BLOCK // (batch * heads * keys)``, at least one), so a block costs the
  same memory at any length: the function's memory is its inputs, its output and one block.

**Backward.** Each block runs under activation checkpointing (``torch.utils.checkpoint``) when
gradients are needed: the forward keeps no block's scores, and the backward recomputes one
block's scores at a time from its queries, keys and values. The gradients are those of the
same arithmetic (soft-cap, mask, softmax, values), so tuning SEAL scales or MuDAF's q / k
through it stores nothing quadratic, and gives eager attention's gradients.

**Masks.** The model's own causal and sliding-window masks are not built: this function applies
both from the query and key positions. Keys are the layer's cached keys followed by the new
ones and the queries are the last ``Tq`` positions (true of transformers' dynamic caches, whose
sliding layers keep the most recent keys; static caches, whose unfilled slots only a mask
hides, are refused by ``key_padding_mask``). A padding mask reaches the function as a key mask
``(batch, 1, 1, keys)`` (``key_padding_mask``, registered for the same name with transformers'
``AttentionMaskInterface``): linear in the length too; a batch with no padding gets none.
Real tokens' rows equal eager attention's under left and right padding; a padding row with no
visible key (left padding, or right padding longer than a window) gets uniform weights over its
block's keys where eager attention spreads them over every key: no real token reads those rows.

``load_model`` registers both functions under ``ATTENTION_NAME`` before it loads a family whose
row names it (``Family.attn_implementation``), as Self-Extend and the streaming heads register
theirs (``models.rope_extension``, ``models.streaming_heads``): not at import, so that a copy of
this module executed again (nnsight's serialised traces) leaves the registry alone.
"""

from __future__ import annotations

from functools import partial

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

ATTENTION_NAME = "interp_seal_capped"
# scores per block (batch x heads x rows x keys): 4M numbers, 16 MiB in float32
SCORES_PER_BLOCK = 1 << 22


def block_bytes(batch: int, heads: int, queries: int, keys: int, *, backward: bool = False) -> int:
    """Bytes one block of ``capped_attention`` holds beyond its inputs and output, for
    ``queries`` query rows of ``batch x heads`` against ``keys`` keys (a global layer's: every
    key), float32: without gradients its scores, soft-capped in place, and their softmax; in
    the backward pass (``backward``) the recomputed block's ``tanh`` and softmax, which autograd
    keeps, and two gradients of their size. The memory planner (``analysis.plan``) counts this
    on top of a layer's per-token step."""
    rows = max(1, min(queries, SCORES_PER_BLOCK // (batch * heads * keys)))
    return (4 if backward else 2) * 4 * batch * heads * rows * keys


def register() -> None:
    """Register ``capped_attention`` and its mask function under ``ATTENTION_NAME``."""
    AttentionInterface.register(ATTENTION_NAME, capped_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, key_padding_mask)


def key_padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: Tensor | None = None,
    **_kwargs,
) -> Bool[Tensor, "batch 1 1 key"] | None:
    """The mask ``capped_attention`` takes: None without padding, else the keys' padding mask
    (True: a real token). The causal and window masks (``mask_function``) are not built: the
    attention function applies them from positions."""
    if kv_offset + kv_length != int(q_offset) + q_length:
        raise ValueError(
            "soft-capped attention needs the keys to end at the last query (a dynamic cache); "
            "a static cache's unfilled slots are not masked: use a DynamicCache"
        )
    if attention_mask is None:
        return None
    keys = attention_mask[:, kv_offset : kv_offset + kv_length].bool()
    if keys.shape[-1] != kv_length:
        raise ValueError(
            f"the padding mask covers {attention_mask.shape[-1]} positions, fewer than the "
            f"{kv_offset + kv_length} the keys reach"
        )
    return None if bool(keys.all()) else keys[:, None, None, :]


def _block(
    q: Float[Tensor, "batch kv group rows d"],
    k: Float[Tensor, "batch kv keys d"],
    v: Float[Tensor, "batch kv keys d"],
    keep: Bool[Tensor, "*b rows keys"],
    scaling: float,
    softcap: float | None,
    dropout: float,
) -> Float[Tensor, "batch kv group rows d"]:
    """One block of query rows over its keys: eager attention's arithmetic."""
    B, KV, G, R, D = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)  # eager's float32 softmax, or float64
    scores = (q.reshape(B, KV, G * R, D) @ k.transpose(-1, -2)).to(acc).view(B, KV, G, R, -1)
    if not torch.is_grad_enabled():  # in place: one block's scores held once
        scores.mul_(scaling)
        if softcap is not None:
            scores.div_(softcap).tanh_().mul_(softcap)
        weights = scores.masked_fill_(~keep, torch.finfo(acc).min).softmax(-1)
    else:
        scores = scores * scaling
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        weights = scores.masked_fill(~keep, torch.finfo(acc).min).softmax(-1)
    if dropout:
        weights = torch.nn.functional.dropout(weights, p=dropout, training=True)
    out = weights.to(v.dtype).view(B, KV, G * R, -1) @ v
    return out.view(B, KV, G, R, D)


def capped_attention(
    module: torch.nn.Module,
    query: Float[Tensor, "batch head q d"],
    key: Float[Tensor, "batch kv_head k d"],
    value: Float[Tensor, "batch kv_head k d"],
    attention_mask: Bool[Tensor, "batch 1 1 k"] | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **_kwargs,
) -> tuple[Float[Tensor, "batch q head d"], None]:
    """Soft-capped, causal, optionally windowed attention by blocks of query rows (module
    docstring); returns ``(output, None)`` as transformers' attention functions do (no weights:
    ``analysis.attention_rows`` captures the rows an analysis needs)."""
    if attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[-2] != 1):
        raise ValueError(
            "soft-capped attention takes a key padding mask of shape (batch, 1, 1, keys) "
            f"(key_padding_mask), got {tuple(attention_mask.shape)}"
        )
    B, H, Tq, D = query.shape
    KV, Tk = key.shape[1], key.shape[2]
    G = H // KV
    scaling = D**-0.5 if scaling is None else scaling
    offset = Tk - Tq  # query r is at key index offset + r
    rows = max(1, min(Tq, SCORES_PER_BLOCK // (B * H * Tk)))
    q = query.view(B, KV, G, Tq, D)  # query head h = kv * G + g reads KV head h // G
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    run = partial(_block, scaling=scaling, softcap=softcap, dropout=dropout)
    out = None if grad else query.new_empty(B, KV, G, Tq, D)  # without autograd: written in place
    outs = []
    for s in range(0, Tq, rows):
        e = min(s + rows, Tq)
        first = 0 if sliding_window is None else max(0, offset + s - sliding_window + 1)
        last = offset + e  # keys first .. last - 1: what rows s .. e - 1 can see
        pos = torch.arange(offset + s, offset + e, device=query.device)[:, None]
        keys = torch.arange(first, last, device=query.device)[None, :]
        keep = keys <= pos
        if sliding_window is not None:
            keep = keep & (pos - keys < sliding_window)
        if attention_mask is not None:
            keep = keep & attention_mask[:, None, :, :, first:last]  # (B, 1, 1, rows, keys)
        inputs = (q[:, :, :, s:e], key[:, :, first:last], value[:, :, first:last], keep)
        if grad:
            outs.append(checkpoint(run, *inputs, use_reentrant=False))
        else:
            out[:, :, :, s:e] = run(*inputs)
    out = torch.cat(outs, dim=3) if grad else out
    return out.view(B, H, Tq, D).transpose(1, 2), None
