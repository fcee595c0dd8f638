"""The forward engine: answer logits from the positions that need them, edits batched, runs
started at the edited layer.

Every analysis that asks "what does the model answer, with or without this edit?" runs here:
teacher-forced evaluation, ablation sweeps (SEAL Sec. 3.1, Fig. 2b-c), exact ablation under
attribution patching, masking experiments and the dashboard. Three facts make it cheap, with
the numbers of a plain forward:

1. **The last layer is needed only at answer positions.** Greedy exact match and the answer's
   log-probability read the logits at the positions that predict answer tokens (a handful per
   prompt). The last layer's keys and values still need every position, but its queries,
   ``o_proj``, MLP, final norm and unembedding run on those few positions only: attention for
   ``Q`` query rows (``Q x T`` scores, never ``T x T``), no ``T x vocab`` logits.
2. **Nothing below an edited layer changes.** An edit of layer ``l``'s head outputs ``z`` (the
   ``o_proj`` input) leaves every layer below ``l`` and ``l``'s own attention untouched. The
   clean run (``clean_run``) caches, at each layer ``l`` an edit may start at, the residual
   stream entering it, its head outputs and its value vectors; an edited run
   (``run_from_layer``) starts at ``l``'s ``o_proj``: ``resid_mid = resid_l + o_proj(edit(z_l))``,
   then ``l``'s MLP, then the layers above as the model runs them (``engine.layers``).
3. **Edits batch.** Each block of ``S`` rows (one per sample) carries its own edit
   (``EditStack``), so the edits of all heads of a layer share one forward.

On a 4-layer model an edited run costs 0.75 full layers per head on average instead of 4 plus
the ``T x vocab`` unembedding (``benchmarks/bench_sweep.py``); in deep models the edits skip
half the layers on average, on top of the unembedding saving.

Everything the decoder layers need besides the hidden state is captured from the model's own
forward (``LayerInputs``) and passed back unchanged; the last layer uses the model's own norms,
projections, ``apply_rotary_pos_emb`` and attention mask (a sliding window included), through
the family row of ``interp_seal.models.spec``. Samples are right-padded (``engine.batch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.engine.batch import AnswerBatch
from interp_seal.engine.layers import LayerInputs, attn_half, mlp_half, run_layers
from interp_seal.interventions import HeadEdit, HeadIntervention
from interp_seal.models import ModelHandle, soft_cap
from interp_seal.models.streaming_heads import answer_rows


@dataclass(frozen=True, kw_only=True, eq=False)
class EditStack:
    """Several interventions side by side: rows ``[a*rows, (a+1)*rows)`` run ``ivs[a]``.

    Each block is edited by its own ``HeadIntervention.edit``, so every ablation mode of the
    primitive batches (mean ablation's per-head offsets and uniform attention's value running
    means included), not only scale tables. A ``HeadEdit``, like ``HeadIntervention``.
    """

    ivs: tuple[HeadIntervention, ...]
    rows: int

    def __post_init__(self):
        if not self.ivs:
            raise ValueError("EditStack needs at least one intervention")
        if any(iv.batched or iv.spec != self.spec for iv in self.ivs):
            raise ValueError("EditStack stacks unbatched (L, H, D) interventions of one model")

    @property
    def spec(self):
        return self.ivs[0].spec

    def check_model(self, spec, model_name: str) -> None:
        self.ivs[0].check_model(spec, model_name)

    def active_layers(self) -> list[int]:
        return sorted({layer for iv in self.ivs for layer in iv.active_layers()})

    def uses_values(self, layer: int) -> bool:
        return any(iv.uses_values(layer) for iv in self.ivs)

    def edit(
        self,
        layer: int,
        z: Float[Tensor, "row pos head d_head"],
        v: Float[Tensor, "row pos kv_head d_head"] | None = None,
        *,
        window: int | None = None,
    ) -> Float[Tensor, "row pos head d_head"]:
        v_blocks = v.split(self.rows) if v is not None else [None] * len(self.ivs)
        blocks = zip(self.ivs, z.split(self.rows), v_blocks, strict=True)
        return torch.cat([iv.edit(layer, zb, vb, window=window) for iv, zb, vb in blocks])


@dataclass(frozen=True, kw_only=True, eq=False)
class CleanRun:
    """What the clean forward leaves behind for edited runs to start from.

    Attributes:
        batch: the samples.
        resid: residual stream entering layer ``l`` ``(sample, pos, d_model)``, for every layer
            from the lowest start layer up to the last.
        z: head outputs (``o_proj`` input) of layer ``l``, per start layer below the last.
        v: value vectors of layer ``l``, per start layer below the last (uniform attention).
        layer_kwargs: the keyword arguments the model passed to each of those decoder layers.
        logits: clean logits at the answer positions ``(sample, answer, vocab)``.
    """

    batch: AnswerBatch
    resid: dict[int, Float[Tensor, "sample pos d_model"]]
    z: dict[int, Float[Tensor, "sample pos head d_head"]]
    v: dict[int, Float[Tensor, "sample pos kv_head d_head"]]
    layer_kwargs: dict[int, dict]
    logits: Float[Tensor, "sample answer vocab"]


@torch.no_grad()
def answer_logits(
    handle: ModelHandle, batch: AnswerBatch, intervention: HeadEdit | None = None
) -> Float[Tensor, "sample answer vocab"]:
    """Logits at ``batch``'s answer positions, with ``intervention`` on every layer it edits.

    The model's own forward (with the edit hooked in) runs up to the last layer's input; the
    last layer runs at the answer positions only. Teacher-forced evaluation is this function
    plus ``AnswerBatch.score``.
    """
    return clean_run(handle, batch, (), intervention=intervention).logits


def clean_run(
    handle: ModelHandle,
    batch: AnswerBatch,
    starts: Sequence[int],
    *,
    intervention: HeadEdit | None = None,
) -> CleanRun:
    """One forward over ``batch``, caching what edited runs starting at ``starts`` need.

    The run applies the handle's active edits (``handle.edit``) and ``intervention`` (only
    without ``starts``: ``answer_logits``). The cached head outputs are those the heads
    computed, before any edit: runs from a layer apply the edits themselves.
    """
    spec = handle.spec
    L, H, D, KV = spec.n_layers, spec.n_heads, spec.d_head, spec.n_kv_heads
    if intervention is not None and starts:
        raise ValueError("an edited run cannot serve as the clean run of further edits")
    first = min([*starts, L - 1])
    z, v = {}, {}

    def keep_z(layer):
        def hook(_mod, args):
            z[layer] = args[0].view(*args[0].shape[:2], H, D)

        return hook

    def keep_v(layer):
        def hook(out):
            v[layer] = out.view(*out.shape[:2], KV, D)

        return hook

    inputs = LayerInputs(handle, range(first, L), stop_at=L - 1)
    with torch.no_grad(), handle.edit(intervention):
        with ExitStack() as hooks:
            for layer in set(starts) - {L - 1}:
                o_proj = handle.proj(layer, "o_proj")  # prepend: before the edit hooks
                hooks.enter_context(o_proj.register_forward_pre_hook(keep_z(layer), prepend=True))
                hooks.enter_context(handle.on_projection(layer, "v", keep_v(layer)))
            with inputs:  # innermost: the forward it cuts short ends here
                handle.model.base_model(input_ids=batch.ids.to(handle.device), use_cache=False)
        inputs.check_shared()
        query = batch.query.to(handle.device)
        logits = _logits_at(handle, inputs.resid[L - 1], query, inputs.kwargs[L - 1])
    return CleanRun(
        batch=batch, resid=inputs.resid, z=z, v=v, layer_kwargs=inputs.kwargs, logits=logits
    )


def run_from_layer(
    handle: ModelHandle, clean: CleanRun, start: int, ivs: Sequence[HeadIntervention]
) -> Float[Tensor, "row answer vocab"]:
    """Logits at the answer positions under each of ``ivs``, rows edit-major.

    Row ``a * S + s`` is sample ``s`` under ``ivs[a]``, composed with the handle's active edits
    (those of the clean run). Every intervention must leave the layers below ``start``
    untouched; ``clean`` must have been made with ``start`` among its starts.
    """
    L = handle.spec.n_layers
    stack = EditStack(ivs=tuple(ivs), rows=len(clean.batch))
    touched = stack.active_layers()
    if not touched or touched[0] < start:
        raise ValueError(
            f"edits touch layers {touched}; an edited run from layer {start} needs every "
            f"edit to touch layer {start} or above and at least one layer"
        )
    if start < L - 1 and start not in clean.z:
        raise ValueError(f"the clean run cached no head outputs at layer {start}")
    reps = len(ivs)

    def rep(x: Tensor) -> Tensor:
        return x.repeat(reps, *[1] * (x.dim() - 1))

    with torch.no_grad(), handle.edit(stack):
        hidden = rep(clean.resid[start])
        if start < L - 1:
            v = rep(clean.v[start]) if handle.active_edit().uses_values(start) else None
            resid = attn_half(handle, start, hidden, rep(clean.z[start]), v)
            hidden = mlp_half(handle, start, resid, hidden)
            hidden = run_layers(handle, hidden, range(start + 1, L - 1), clean.layer_kwargs)
        query = rep(clean.batch.query).to(handle.device)
        return _logits_at(handle, hidden, query, clean.layer_kwargs[L - 1])


def run_from_input(
    handle: ModelHandle,
    clean: CleanRun,
    start: int,
    ivs: Sequence[HeadIntervention] = (),
) -> Float[Tensor, "row answer vocab"]:
    """Logits at the answer positions from the residual stream entering layer ``start``, with
    that layer's attention run again (``run_from_layer`` starts after it, at its ``o_proj``):
    for changes of attention itself, such as streaming KV heads (``compress_kv``) installed
    now, whose layers no cached head output holds for.

    Rows edit-major under each of ``ivs`` (none: one block, under the handle's active edits
    only); every intervention must leave the layers below ``start`` untouched, and ``clean``
    must have cached the residual stream entering ``start`` (``start`` among its starts).
    """
    L = handle.spec.n_layers
    if start not in clean.resid:
        raise ValueError(f"the clean run cached no residual stream entering layer {start}")
    stack = EditStack(ivs=tuple(ivs), rows=len(clean.batch)) if ivs else None
    touched = stack.active_layers() if stack is not None else []
    if touched and touched[0] < start:
        raise ValueError(
            f"edits touch layers {touched}; a run from the input of layer {start} needs every "
            f"edit to touch layer {start} or above"
        )
    reps = max(len(ivs), 1)
    with torch.no_grad(), handle.edit(stack):
        hidden = clean.resid[start].repeat(reps, 1, 1)
        hidden = run_layers(handle, hidden, range(start, L - 1), clean.layer_kwargs)
        query = clean.batch.query.repeat(reps, 1).to(handle.device)
        return _logits_at(handle, hidden, query, clean.layer_kwargs[L - 1])


def _logits_at(
    handle: ModelHandle,
    hidden: Float[Tensor, "row pos d_model"],
    query: Int[Tensor, "row answer"],
    kwargs: dict,
) -> Float[Tensor, "row answer vocab"]:
    """Logits at ``query`` from the residual stream entering the last layer."""
    out = _last_layer_at(handle, hidden, query, kwargs)
    return handle.cap_logits(handle.unembed()(handle.final_norm()(out)))


def _last_layer_at(
    handle: ModelHandle,
    hidden: Float[Tensor, "row pos d_model"],
    query: Int[Tensor, "row answer"],
    kwargs: dict,
) -> Float[Tensor, "row answer d_model"]:
    """The last decoder layer's output at the ``query`` positions only (keys: every position),
    with the handle's active edits of the last layer applied."""
    spec = handle.spec
    last = spec.n_layers - 1
    attn = handle.attn(last)
    B, T, _ = hidden.shape
    H, KV, D, G = spec.n_heads, spec.n_kv_heads, spec.d_head, spec.group_size
    Q = query.shape[1]
    x = handle.apply_norm(last, "pre_attn", hidden)
    tables = handle.rope_tables(kwargs)  # (cos, sin), (1, pos, D): shared by every row
    (q,) = handle.project(last, _at(x, query), "q")
    k, v = handle.project(last, x, "k", "v")
    q = handle.split_heads(last, "q", q)  # (B, H, Q, D)
    k = handle.split_heads(last, "k", k)  # (B, KV, T, D)
    v = v.view(B, T, KV, D)
    # the family's own RoPE (none in GPT-2)
    q = handle.rotate(last, q, tables, query)  # (row, head, answer, D)
    k = handle.rotate(last, k, tables)  # (row, kv_head, pos, D)
    mask = kwargs.get("attention_mask")
    if mask is None:  # causal: query at position p sees keys 0..p (and p - W < j on a window)
        keys = torch.arange(T, device=query.device)[None, None]
        allowed = keys <= query[..., None]
        window = handle.sliding_window(last)  # sdpa passes None below the window's length;
        if window is not None:  # capped attention (Gemma 2) always: it applies the window itself
            allowed &= keys > query[..., None] - window
    else:  # the model's own mask (e.g. a sliding window), rows at the query positions
        allowed = mask[0, 0][query]
        if allowed.dtype != torch.bool:  # eager attention's additive mask: 0 where allowed
            allowed = allowed == 0
    # GQA without copying keys: the G query heads of one KV head become G x Q query rows
    q, allowed = q.reshape(B, KV, G * Q, D), allowed[:, None, None].expand(B, 1, G, Q, T)
    allowed = allowed.reshape(B, 1, G * Q, T)
    cap = handle.attn_softcap(last)
    if cap is None:
        z = F.scaled_dot_product_attention(
            q, k, v.transpose(1, 2), attn_mask=allowed, scale=attn.scaling
        )
    else:  # soft-capped scores (Gemma 2), which sdpa cannot compute: Q x T per head still
        scores = soft_cap(q @ k.transpose(-1, -2) * attn.scaling, cap)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        z = weights @ v.transpose(1, 2)
    # heads whose attention mode changes their rows (streaming heads, Self-Extend) again
    q = q.reshape(B, KV, G * Q, D)
    z = answer_rows(handle, last, z, q, k, v.transpose(1, 2), query, attn.scaling)
    # reshape, not view: CUDA kernels may return these rows in another memory order
    z = z.reshape(B, H, Q, D).transpose(1, 2)  # (row, answer, head, D)
    entering = _at(hidden, query)
    resid = attn_half(handle, last, entering, z, v, query=query)
    return mlp_half(handle, last, resid, entering)


def _at(x: Tensor, index: Int[Tensor, "row answer"]) -> Tensor:
    """``x[r, index[r, a]]`` for every row ``r`` and answer slot ``a``."""
    rows = torch.arange(x.shape[0], device=index.device)[:, None]
    return x[rows, index]
