"""Head-level KV compression: full attention for some KV heads, sink + recent window for the rest.

**The method.** DuoAttention (Xiao et al., 2024, "DuoAttention: Efficient Long-Context LLM
Inference with Retrieval and Streaming Heads") and RazorAttention (Tang et al., 2024,
"RazorAttention: Efficient KV Cache Compression Through Retrieval Heads") observe that only a
few heads need the whole context (*retrieval heads*); the others look mostly at the first
tokens (the attention *sinks* of StreamingLLM) and at the last few. Both give each KV head of
each layer one of two modes:

- **full**: ordinary causal attention, query ``i`` over keys ``0 .. i``;
- **streaming**: query ``i`` over the first ``sink`` keys and the ``window`` most recent ones,
  itself included: keys ``j <= i`` with ``j < sink`` or ``i - j < window``.

A streaming head's key/value cache then needs only ``sink + window - 1`` positions whatever the
context length (the next query adds its own key), so the cache shrinks by the share of
streaming heads. DuoAttention learns which heads stream (a gate per KV head, trained on
synthetic passkey data); RazorAttention picks them by a retrieval score (and adds, per
compressed head, one "compensation token" averaging the dropped keys and values: not done
here). Both are *choices of heads*; this module is the attention mode they choose for, and
``StreamingHeads`` takes the set from anywhere (a score, a sweep, a gate).

**How it runs.** ``compress_kv(handle, config)`` (or ``load_model(...,
streaming_heads=config)``) registers ``streaming_attention`` with transformers'
``AttentionInterface``, as Self-Extend does (``interp_seal.models.rope_extension``), so the
model's own forward, the engine's restarted layers, head edits on ``o_proj``'s input and NTK
scaling (which only changes the rotary frequencies) all run through it unchanged. The function
never builds ``T x T``: queries go in blocks of ``block_size`` rows, and each block's keys split
into parts that are each plain attention, merged by their log-sum-exps like FlashAttention's
key blocks (the kernel of ``rope_extension``):

- a full head: the keys before the block (no mask) and the block's own keys (a causal
  triangle);
- a streaming head: the band of the ``window`` keys up to each query (mask ``0 <= i - j <
  window``, at most ``block x (block + window - 1)``) and the sink keys outside that band (mask
  ``i - j >= window``, ``block x sink``), only for rows at positions ``>= window`` (earlier
  rows see every key through the band already).

Grouped-query attention reads each KV head once per query group (no repeated keys).

**The cache.** With ``use_cache`` and no cache given, the model gets a ``streaming_cache`` (a
``DynamicCache`` whose layers with streaming heads are ``StreamingLayer``): full heads keep every position, streaming
heads keep their sinks and their last ``window - 1`` keys and drop the middle. A forward's
queries see the kept keys plus the new ones, so decoding token by token gives exactly the
logits of the full recompute under the same mask. ``kv_budget_bytes`` is what such a cache
holds after a given length.

**With Self-Extend** (``rope_extension``; installed before or after, the attention function
here runs it): full heads run Self-Extend's own blocked kernel; a streaming head's parts split
again at Self-Extend's neighbour window ``W``, keys nearer than ``W`` scored at their true
positions and the others (its sinks, and its window's far end when ``window > W``) at the
grouped positions, so a streaming head sees the same keys with Self-Extend's distances.

**Limits.** Refused: families with a sliding window or attention logit soft-capping, and
padding masks (the attention function gets no mask: right-padded batches are fine, as in the
engine). The TransformerLens bridge computes its own eager attention and ignores the mode.
Uniform-attention edits on a layer with streaming heads are refused (``handle.refuse_uniform_edits``:
uniform attention averages a head's values over its whole causal prefix, which a streaming head
does not see). Row capture (``analysis.attention_rows``) reads a cache's ``keys``, which hold
the full heads only here: run it without streaming heads.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer

from interp_seal.models.handle import STREAMING_ATTR, ModelHandle
from interp_seal.models.kv_cache import CACHE_ARG
from interp_seal.models.rope_extension import _CONFIG_ATTR as _SELF_EXTEND_ATTR
from interp_seal.models.rope_extension import (
    _attend,
    _SelfExtend,
    grouped_positions,
    rotate,
)
from interp_seal.models.spec import ModelSpec

ATTENTION_NAME = "interp_seal_streaming_heads"
_CONFIG_ATTR = STREAMING_ATTR  # Self-Extend's install leaves the attention function to us


@dataclass(frozen=True, kw_only=True)
class StreamingHeads:
    """Which KV heads stream (sink + recent window) instead of attending to the whole prefix.

    Attributes:
        heads: ``(layer, kv_head)`` pairs that stream; every other KV head keeps full attention.
            With grouped-query attention a KV head's mode is that of all its query heads.
        sink: the first ``sink`` positions every streaming query sees (attention sinks).
        window: the ``window`` most recent positions a streaming query sees, itself included
            (>= 1).
        block_size: queries per block in the attention function (results do not depend on it).
    """

    heads: frozenset[tuple[int, int]]
    sink: int = 4
    window: int = 256
    block_size: int = 256

    def __post_init__(self):
        object.__setattr__(self, "heads", frozenset((int(a), int(b)) for a, b in self.heads))
        if self.sink < 0 or self.window < 1 or self.block_size < 1:
            raise ValueError(
                f"streaming heads need sink >= 0, window >= 1 and block_size >= 1, got sink="
                f"{self.sink}, window={self.window}, block_size={self.block_size}"
            )
        if any(layer < 0 or head < 0 for layer, head in self.heads):
            raise ValueError(f"negative layer or KV head in streaming heads {sorted(self.heads)}")

    @classmethod
    def parse(cls, text: str, **sizes) -> StreamingHeads:
        """From ``"L.K,L.K,..."`` (layer . KV head, 0-based) or ``"none"``; every KV head of a
        model is ``all_heads(spec)``."""
        text = text.strip()
        if text in ("", "none"):
            return cls(heads=frozenset(), **sizes)
        pairs = []
        for item in text.split(","):
            layer, dot, head = item.strip().partition(".")
            if not dot or not layer.isdigit() or not head.isdigit():
                raise ValueError(
                    f"streaming head {item.strip()!r}: write layer.kv_head (e.g. 3.1), "
                    "comma-separated"
                )
            pairs.append((int(layer), int(head)))
        return cls(heads=frozenset(pairs), **sizes)

    @classmethod
    def all_heads(cls, spec: ModelSpec, **sizes) -> StreamingHeads:
        """Every KV head streaming (StreamingLLM's setting)."""
        pairs = [(a, b) for a in range(spec.n_layers) for b in range(spec.n_kv_heads)]
        return cls(heads=frozenset(pairs), **sizes)

    def check_model(self, spec: ModelSpec, model_name: str = "the model") -> None:
        """Raise ValueError if a head lies outside ``spec``'s layers and KV heads."""
        bad = [(a, b) for a, b in self.heads if a >= spec.n_layers or b >= spec.n_kv_heads]
        if bad:
            raise ValueError(
                f"streaming heads {sorted(bad)} are outside {model_name}'s {spec.n_layers} "
                f"layers x {spec.n_kv_heads} KV heads"
            )

    def streaming(self, layer: int, n_kv_heads: int) -> list[int]:
        return [h for h in range(n_kv_heads) if (layer, h) in self.heads]

    @property
    def kept(self) -> int:
        """Positions a streaming head's cache keeps between forwards."""
        return self.sink + self.window - 1

    @property
    def label(self) -> str:
        return f"{len(self.heads)} streaming KV heads (sink {self.sink}, window {self.window})"


def kv_budget_bytes(
    config: StreamingHeads | None, spec: ModelSpec, length: int, *, itemsize: int = 4, rows: int = 1
) -> int:
    """Bytes of keys and values a cache keeps after ``length`` tokens: ``2 * D * itemsize`` per
    row, KV head and kept position; a full head keeps ``length`` positions, a streaming head
    ``min(length, sink + window - 1)``. ``config=None``: every head full."""
    streaming = len(config.heads) if config is not None else 0
    full = spec.n_layers * spec.n_kv_heads - streaming
    kept = full * length + streaming * min(length, config.kept if config else 0)
    return 2 * spec.d_head * itemsize * rows * kept


def allowed(q_pos: Tensor, k_pos: Tensor, sink: int, window: int) -> Bool[Tensor, "q k"]:
    """A streaming head's mask: key ``j`` visible to query ``i`` iff ``j <= i`` and (``j < sink``
    or ``i - j < window``). For references and for the engine's few query rows only."""
    dist = q_pos[:, None] - k_pos[None, :]
    return (dist >= 0) & ((k_pos[None, :] < sink) | (dist < window))


@dataclass(frozen=True, eq=False)
class StreamingKV:
    """A ``StreamingLayer``'s keys and values for one forward: the full heads' at every position,
    the streaming heads' at ``positions`` (sorted)."""

    full_keys: Tensor
    full_values: Tensor
    keys: Tensor
    values: Tensor
    positions: Tensor
    length: int


class StreamingLayer(DynamicLayer):
    """One layer's cache: full KV heads keep everything, streaming heads their sinks and last
    ``window - 1`` positions. ``keys`` / ``values`` hold the full heads only."""

    def __init__(self, full: list[int], streaming: list[int], sink: int, window: int):
        super().__init__()
        self.full, self.streaming, self.sink, self.window = full, streaming, sink, window
        self.length = 0
        self.stream_keys = self.stream_values = self.positions = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.stream_keys = key_states.new_empty(
                key_states.shape[0], len(self.streaming), 0, key_states.shape[-1]
            )
            self.stream_values = torch.empty_like(self.stream_keys)
            self.positions = torch.empty(0, dtype=torch.long, device=key_states.device)
        new = key_states.shape[-2]
        full = torch.tensor(self.full, device=key_states.device, dtype=torch.long)
        stream = torch.tensor(self.streaming, device=key_states.device, dtype=torch.long)
        self.keys = torch.cat([self.keys, key_states.index_select(1, full)], dim=-2)
        self.values = torch.cat([self.values, value_states.index_select(1, full)], dim=-2)
        keys = torch.cat([self.stream_keys, key_states.index_select(1, stream)], dim=-2)
        values = torch.cat([self.stream_values, value_states.index_select(1, stream)], dim=-2)
        positions = torch.cat(
            [self.positions, torch.arange(self.length, self.length + new, device=keys.device)]
        )
        self.length += new
        keep = (positions < self.sink) | (positions > self.length - self.window)
        self.stream_keys, self.stream_values = keys[:, :, keep], values[:, :, keep]
        self.positions = positions[keep]
        kv = StreamingKV(self.keys, self.values, keys, values, positions, self.length)
        return kv, kv

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a streaming-heads cache has dropped positions: cannot crop")

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.stream_keys is not None:
            self.stream_keys = self.stream_keys.repeat_interleave(repeats, dim=0)
            self.stream_values = self.stream_values.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: Tensor) -> None:
        super().batch_select_indices(indices)
        if self.stream_keys is not None:
            self.stream_keys, self.stream_values = (
                self.stream_keys[indices],
                self.stream_values[indices],
            )

    def nbytes(self) -> int:
        """Bytes this layer keeps (keys and values, both modes)."""
        tensors = (self.keys, self.values, self.stream_keys, self.stream_values)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def streaming_cache(handle: ModelHandle) -> DynamicCache:
    """A ``DynamicCache`` for ``handle.model`` whose layers with streaming heads (as installed
    now) drop their middle positions."""
    cache = DynamicCache(config=handle.model.config)
    n_kv = handle.spec.n_kv_heads
    for layer in range(handle.spec.n_layers):
        found = getattr(handle.attn(layer), _CONFIG_ATTR, None)
        if found and found[1]:
            cfg, streaming = found
            full = [h for h in range(n_kv) if h not in streaming]
            cache.layers[layer] = StreamingLayer(full, streaming, cfg.sink, cfg.window)
    return cache


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes of keys and values ``cache`` holds (any layer kind)."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, StreamingLayer):
            total += layer.nbytes()
        elif layer.keys is not None:
            total += layer.keys.numel() * layer.keys.element_size() * 2
    return total


def _merge(acc: Tensor, acc_lse: Tensor, rows: slice, out: Tensor, lse: Tensor) -> None:
    """Fold one part's ``(out, lse)`` of ``rows`` into the running block result, in place."""
    merged = torch.logaddexp(acc_lse[..., rows], lse)
    acc[..., rows, :] = (
        acc[..., rows, :] * torch.exp(acc_lse[..., rows] - merged)[..., None]
        + out.to(acc.dtype) * torch.exp(lse - merged)[..., None]
    )
    acc_lse[..., rows] = merged


def _full_block(q, k, v, s, e, offset, scale, acc, acc_lse) -> None:
    """Causal attention of query rows ``s:e`` (positions ``offset + s ..``) over keys at
    positions ``0 .. offset + e - 1``: the keys before the block, then its triangle."""
    first = offset + s
    if first > 0:
        _merge(
            acc,
            acc_lse,
            slice(0, e - s),
            *_attend(q, k[:, :, :first], v[:, :, :first], False, None, scale),
        )
    tri = slice(first, offset + e)
    _merge(
        acc, acc_lse, slice(0, e - s), *_attend(q, k[:, :, tri], v[:, :, tri], True, None, scale)
    )


def _masked_part(q, k, v, keep: Tensor, scale, acc, acc_lse) -> None:
    """Attention of the rows of ``q`` over ``k`` / ``v`` where ``keep`` (rows x keys) allows,
    folded into ``acc``; rows with no key are left out (with this module's distance ranges they
    are the rows before or after a contiguous run, so the run is taken)."""
    some = keep.any(-1).nonzero()
    if not len(some):
        return
    a, b = int(some[0]), int(some[-1]) + 1
    mask = torch.zeros(b - a, keep.shape[1], dtype=q.dtype, device=q.device)
    mask.masked_fill_(~keep[a:b], float("-inf"))
    _merge(acc, acc_lse, slice(a, b), *_attend(q[:, :, a:b], k, v, False, mask, scale))


def _streaming_block(q, k, v, positions, q_pos, cfg: StreamingHeads, scale, acc, acc_lse, se):
    """Sink + window attention of the query rows at ``q_pos`` over keys at ``positions``
    (sorted, containing every position a row may see): the band of distances ``[0, window)``,
    then the sinks at distances ``>= window``. Under Self-Extend (``se = (q_g, k_g, W)``: the
    queries and keys rotated to their grouped positions) each splits again at distance ``W``:
    nearer keys at true positions, farther ones at grouped positions."""
    first, last = int(q_pos[0]), int(q_pos[-1])
    lo = int(torch.searchsorted(positions, first - cfg.window + 1))
    hi = int(torch.searchsorted(positions, last + 1))
    n_sink = int(torch.searchsorted(positions, min(cfg.sink, last - cfg.window + 1)))
    inf = float("inf")
    for near, far, keys in ((0, cfg.window, slice(lo, hi)), (cfg.window, inf, slice(0, n_sink))):
        if keys.stop <= keys.start:
            continue
        ranges = [(near, far, q, k)]
        if se is not None:
            q_g, k_g, window = se
            ranges = [(near, min(far, window), q, k), (max(near, window), far, q_g, k_g)]
        dist = q_pos.int()[:, None] - positions[keys].int()[None, :]
        for low, high, qq, kk in ranges:
            if low < high:
                keep = (dist >= low) & (dist < high)
                _masked_part(qq, kk[:, :, keys], v[:, :, keys], keep, scale, acc, acc_lse)


def _run_heads(q, k, v, positions, length, cfg, scale, se) -> Tensor:
    """Streaming attention of ``q`` ``(B, n, Tq, D)`` (the last ``Tq`` positions of
    ``length``) over ``k`` / ``v`` ``(B, n, Tk, D)`` at ``positions``, block by block."""
    B, n, Tq, D = q.shape
    out = torch.empty_like(q)
    offset = length - Tq
    q_all = torch.arange(offset, length, device=q.device)
    acc_dtype = torch.promote_types(q.dtype, torch.float32)  # float64 stays float64
    for s in range(0, Tq, cfg.block_size):
        e = min(s + cfg.block_size, Tq)
        acc = torch.zeros(B, n, e - s, D, dtype=acc_dtype, device=q.device)
        acc_lse = torch.full((B, n, e - s), float("-inf"), dtype=acc_dtype, device=q.device)
        qb = q[:, :, s:e].contiguous()
        if positions is None:  # a full head: every key, at positions 0 .. length - 1
            _full_block(qb, k, v, s, e, offset, scale, acc, acc_lse)
        else:
            block_se = None if se is None else (se[0][:, :, s:e].contiguous(), se[1], se[2])
            _streaming_block(qb, k, v, positions, q_all[s:e], cfg, scale, acc, acc_lse, block_se)
        out[:, :, s:e] = acc.to(q.dtype)
    return out


def streaming_attention(
    module: torch.nn.Module,
    query: Float[Tensor, "batch head q d"],
    key: Float[Tensor, "batch kv_head k d"] | StreamingKV,
    value: Float[Tensor, "batch kv_head k d"] | StreamingKV,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Float[Tensor, "batch q head d"], None]:
    """Attention with ``module``'s streaming KV heads on sink + window (module docstring)."""
    cfg, streaming = getattr(module, _CONFIG_ATTR)
    if attention_mask is not None:
        raise ValueError("streaming-heads attention takes no attention mask (padding)")
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise ValueError("streaming heads do not support sliding windows or soft-capping")
    B, H, Tq, D = query.shape
    scaling = D**-0.5 if scaling is None else scaling
    if isinstance(key, StreamingKV):
        full_k, full_v, s_k, s_v = key.full_keys, key.full_values, key.keys, key.values
        positions, length = key.positions, key.length
        n_kv = full_k.shape[1] + s_k.shape[1]
        full = [h for h in range(n_kv) if h not in streaming]
    else:
        n_kv, length = key.shape[1], key.shape[2]
        full = [h for h in range(n_kv) if h not in streaming]
        full_k, full_v = key[:, full], value[:, full]
        s_k, s_v = key[:, streaming], value[:, streaming]
        positions = torch.arange(length, device=key.device)
    groups = H // n_kv
    se = getattr(module, _SELF_EXTEND_ATTR, None)  # (ContextExtension, inv_freq) or None
    q_pos = torch.arange(length - Tq, length, device=query.device)
    query_g = full_g = stream_g = None
    if se is not None:
        query_g = _grouped(query, q_pos, se, "query")
        full_g = _grouped(full_k, torch.arange(length, device=query.device), se, "key")
        stream_g = _grouped(s_k, positions, se, "key")
    out = query.new_empty(B, H, Tq, D)
    for g in range(groups):  # query heads kv * groups + g read KV head kv: no repeated keys
        for heads, k, v, k_g, pos in (
            (full, full_k, full_v, full_g, None),
            (streaming, s_k, s_v, stream_g, positions),
        ):
            if not heads:
                continue
            rows = torch.tensor([h * groups + g for h in heads], device=query.device)
            q = query.index_select(1, rows)
            if se is None:
                o = _run_heads(q, k, v, pos, length, cfg, scaling, None)
            elif pos is None:  # a full head under Self-Extend: its own blocked kernel
                q_g = query_g.index_select(1, rows)
                window, block = se[0].window, se[0].block_size
                o = _SelfExtend.apply(q, q_g, k, k_g, v, window, block, scaling)
            else:
                q_g = query_g.index_select(1, rows)
                o = _run_heads(q, k, v, pos, length, cfg, scaling, (q_g, k_g, se[0].window))
            out[:, rows] = o
    return out.transpose(1, 2), None


def _grouped(x: Tensor, pos: Tensor, se: tuple, which: str) -> Tensor:
    """Post-RoPE ``x`` at ``pos`` rotated on to Self-Extend's grouped positions."""
    ext, inv_freq = se
    group, window = ext.group_size, ext.window
    gq, gk = grouped_positions(pos, pos, group, window)
    target = gq if which == "query" else gk
    freq = inv_freq.to(x.device, torch.float64)
    return rotate(x, ((target - pos)[:, None] * freq).float()).contiguous()


@contextmanager
def compress_kv(handle: ModelHandle, config: StreamingHeads):
    """Run ``handle.model`` with ``config``'s streaming heads inside the block; restored on exit.

    Combine with head edits and NTK scaling by nesting: ``with extend_context(h,
    ContextExtension(ntk_factor=4)), compress_kv(h, cfg), h.edit(iv): ...``.
    """
    with ExitStack() as restore:
        install(handle, config, restore)
        yield handle.model


def check_supported(handle: ModelHandle, config: StreamingHeads) -> None:
    """Raise ValueError if ``config`` cannot run on ``handle``'s model (a head outside it,
    sliding-window layers, soft-capped attention); changes nothing."""
    spec = handle.spec
    config.check_model(spec, handle.name_or_path)
    windows = [handle.sliding_window(layer) for layer in range(spec.n_layers)]
    if any(w is not None for w in windows):
        raise ValueError(
            f"{handle.name_or_path} has sliding-window layers; streaming heads support models "
            "whose layers attend to the whole causal prefix"
        )
    if any(handle.attn_softcap(layer) is not None for layer in range(spec.n_layers)):
        raise ValueError(
            f"streaming-heads attention does not soft-cap attention logits, which "
            f"{handle.family.name} does"
        )


def install(handle: ModelHandle, config: StreamingHeads, restore: ExitStack) -> None:
    """Apply ``config`` to ``handle``, pushing onto ``restore`` what undoes it."""
    spec = handle.spec
    check_supported(handle, config)
    for layer in range(spec.n_layers):
        attn = handle.attn(layer)
        before = getattr(attn, _CONFIG_ATTR, None)  # an outer compress_kv's, when nested
        setattr(attn, _CONFIG_ATTR, (config, config.streaming(layer, spec.n_kv_heads)))
        if before is None:
            restore.callback(delattr, attn, _CONFIG_ATTR)
        else:
            restore.callback(setattr, attn, _CONFIG_ATTR, before)
    old_impl = handle.model.config._attn_implementation
    AttentionInterface.register(ATTENTION_NAME, streaming_attention)
    handle.model.set_attn_implementation(ATTENTION_NAME)
    restore.callback(handle.model.set_attn_implementation, old_impl)

    def give_cache(_mod, args, kwargs):
        use = kwargs.get("use_cache")
        if use is None:
            use = handle.model.config.use_cache
        if use and kwargs.get(CACHE_ARG) is None:
            return args, kwargs | {CACHE_ARG: streaming_cache(handle)}  # the innermost config
        return None

    hook = handle.model.base_model.register_forward_pre_hook(give_cache, with_kwargs=True)
    restore.callback(hook.remove)


def answer_rows(
    handle: ModelHandle,
    layer: int,
    z: Float[Tensor, "row kv_head group_answer d_head"],
    q: Float[Tensor, "row kv_head group_answer d_head"],
    k: Float[Tensor, "row kv_head pos d_head"],
    v: Float[Tensor, "row kv_head pos d_head"],
    query: Int[Tensor, "row answer"],
    scaling: float,
) -> Float[Tensor, "row kv_head group_answer d_head"]:
    """The engine's last layer at the answer positions ``query`` only (``engine.forward``):
    ``z``, computed there under plain causal attention (the ``G`` query heads of a KV head as
    ``G x answer`` rows), with the rows of the heads ``layer``'s attention mode changes computed
    again: streaming KV heads on their sinks and window, and every head under Self-Extend
    (keys ``W`` or more back scored at grouped positions). ``answer x T`` scores per head, never
    ``T x T``; ``z`` itself where neither mode is on."""
    attn = handle.attn(layer)
    found = getattr(attn, _CONFIG_ATTR, None)
    se = getattr(attn, _SELF_EXTEND_ATTR, None)
    streaming = found[1] if found else []
    if not streaming and se is None:
        return z
    B, KV, GQ, _ = q.shape
    Q, T = query.shape[1], k.shape[2]
    heads = list(range(KV)) if se is not None else streaming
    keys = torch.arange(T, device=query.device)
    dist = (query[..., None] - keys).repeat(1, GQ // Q, 1)[:, None]  # (row, 1, G x answer, T)
    index = torch.tensor(heads, device=q.device)
    qh, kh, vh = q[:, index], k[:, index], v[:, index]
    scores = (qh @ kh.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32))
    if se is not None:
        ext, inv_freq = se
        rows = query.repeat(1, GQ // Q)  # (row, G x answer): positions of q's rows
        gq, gk = grouped_positions(rows, keys, ext.group_size, ext.window)
        freq = inv_freq.to(q.device, torch.float64)
        q_g = rotate(qh, ((gq - rows)[:, None, :, None] * freq).float())
        k_g = rotate(kh, ((gk - keys)[:, None] * freq).float())
        grouped = (q_g @ k_g.transpose(-1, -2)).to(scores.dtype)
        scores = torch.where(dist >= ext.window, grouped, scores)
    visible = (dist >= 0).expand(B, len(heads), GQ, T).clone()
    if streaming:
        cfg = found[0]
        on = torch.tensor([h in streaming for h in heads], device=q.device)
        window = (keys < cfg.sink) | (dist < cfg.window)
        visible[:, on] &= window.expand(B, int(on.sum()), GQ, T)
    weights = (scores * scaling).masked_fill(~visible, float("-inf")).softmax(-1)
    z = z.clone()
    z[:, index] = (weights.to(vh.dtype) @ vh).to(z.dtype)
    return z
