"""Many head edits in one forward, started from the clean run's cached residual stream.

An ablation sweep (SEAL, Sec. 3.1, Fig. 2b-c) evaluates hundreds of single-head or
single-channel edits on the same prompts. Run naively, each edit costs a full forward and a full
``T x vocab`` unembedding. Three facts make it much cheaper, with the same numbers:

1. **Nothing below the edited layer changes.** An edit of layer ``l``'s head outputs ``z``
   (the ``o_proj`` input) leaves every layer below ``l`` and layer ``l``'s own attention
   untouched. The clean run caches, at each layer ``l``, the residual stream entering it, its
   head outputs ``z`` and its value vectors; an edited forward starts at ``l``'s ``o_proj``:
   ``resid_mid = resid_l + o_proj(edit(z_l))``, then ``l``'s MLP, then the layers above (the
   model's own decoder layers, with the edits of any later layer hooked in).
2. **The last layer is needed only at answer positions.** Greedy exact match and the answer's
   log-probability read the logits at the positions that predict answer tokens (a handful per
   prompt). The last layer's keys and values still need every position, but its queries,
   ``o_proj``, MLP, final norm and unembedding run on those few positions only. Attention is
   computed for those query rows (``Q x T`` scores, never ``T x T``). The clean run stops the
   model's forward at the last layer's input and finishes the same way.
3. **Edits batch.** Each block of ``S`` rows (one per sample) carries its own
   ``HeadIntervention`` (``RowStack``), so the edits of all heads of a layer share one forward.

What remains is the work an exact answer needs: an edit of layer ``l`` runs ``l``'s MLP, the
``L - 2 - l`` full layers in between and the last layer's keys and values. On a 4-layer model
that is 0.75 full layers per head on average instead of 4 plus the ``T x vocab`` unembedding
(``benchmarks/bench_sweep.py`` measures about 4.5x on one CPU thread; attention over every
position of the layers above the edit is most of what is left). In deep models the edits skip
half the layers on average (about 2x), on top of the unembedding saving.

Everything the decoder layers need besides the hidden state (rotary ``position_embeddings``,
``position_ids``, the causal mask) is captured from the model's own clean forward with layer
pre-hooks and passed back unchanged, so the layers above ``l`` run exactly as the model runs
them. Samples are right-padded and no padding mask is passed: causal attention keeps every real
token blind to the padding on its right (as in ``interp_seal.evaluation.teacher_forcing``).

Layer structure assumed (Llama, Mistral and Qwen2 share it): a decoder layer computes
``h = h + attn(input_layernorm(h)); h = h + mlp(post_attention_layernorm(h))`` with rotate-half
RoPE on q and k and GQA query head ``i`` reading KV head ``i // group_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp_seal.interventions import HeadIntervention, hf_hooks
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Encoded


@dataclass(frozen=True, kw_only=True, eq=False)
class AnswerBatch:
    """Right-padded samples and where their answers are.

    Attributes:
        ids: prompt + answer ids, right-padded.
        query: positions whose next token is an answer token, padded by repeating the last one.
        target: the answer token each query position predicts.
        valid: which ``query`` entries are real (answers differ in length).
    """

    ids: Int[Tensor, "sample pos"]
    query: Int[Tensor, "sample answer"]
    target: Int[Tensor, "sample answer"]
    valid: Bool[Tensor, "sample answer"]

    @classmethod
    def from_encoded(cls, batch: Sequence[Encoded], *, pad_id: int) -> AnswerBatch:
        width = max(len(enc) for enc in batch)
        n_answer = max(len(enc) - enc.answer_start for enc in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        query = torch.zeros((len(batch), n_answer), dtype=torch.long)
        valid = torch.zeros((len(batch), n_answer), dtype=torch.bool)
        for row, enc in enumerate(batch):
            ids[row, : len(enc)] = enc.input_ids
            positions = torch.arange(enc.answer_start - 1, len(enc) - 1)
            query[row] = positions[-1]
            query[row, : len(positions)] = positions
            valid[row, : len(positions)] = True
        return cls(ids=ids, query=query, target=ids.gather(1, query + 1), valid=valid)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def score(
        self, logits: Float[Tensor, "row answer vocab"]
    ) -> tuple[Bool[Tensor, " row"], Float[Tensor, " row"]]:
        """Greedy exact match and answer log-probability of each row (rows cycle over samples).

        Exact match by teacher forcing (DESIGN.md Sec. 4): greedy decoding reproduces the answer
        iff the argmax at every answer position is the answer token.
        """
        reps = logits.shape[0] // len(self)
        target = self.target.repeat(reps, 1).to(logits.device)
        valid = self.valid.repeat(reps, 1).to(logits.device)
        logits = logits.float()
        logprob = logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]
        exact = ((logits.argmax(-1) == target) | ~valid).all(-1)
        return exact, torch.where(valid, logprob, 0.0).sum(-1)


@dataclass(frozen=True, kw_only=True, eq=False)
class RowStack:
    """Several interventions side by side: rows ``[a*rows, (a+1)*rows)`` run ``ivs[a]``.

    Each block is edited by its own ``HeadIntervention.edit``, so every ablation mode of the
    primitive batches (mean ablation's per-head offsets and uniform attention's value running
    means included), not only scale tables. Quacks like ``HeadIntervention`` where ``hf_hooks``
    needs it (``check_model``, ``active_layers``, ``uses_values``, ``edit``).
    """

    ivs: tuple[HeadIntervention, ...]
    rows: int

    def __post_init__(self):
        if not self.ivs:
            raise ValueError("RowStack needs at least one intervention")
        if any(iv.batched or iv.spec != self.spec for iv in self.ivs):
            raise ValueError("RowStack stacks unbatched (L, H, D) interventions of one model")

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
    ) -> Float[Tensor, "row pos head d_head"]:
        v_blocks = v.split(self.rows) if v is not None else [None] * len(self.ivs)
        blocks = zip(self.ivs, z.split(self.rows), v_blocks, strict=True)
        return torch.cat([iv.edit(layer, zb, vb) for iv, zb, vb in blocks])


@dataclass(frozen=True, kw_only=True, eq=False)
class CleanRun:
    """What the clean forward leaves behind for edited forwards to start from.

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


class _StopForward(Exception):
    """Raised by ``LayerInputs``'s hook on its ``stop_at`` layer: the forward ends there."""


class LayerInputs:
    """Keeps what enters decoder layers during a forward, for runs that start there.

    A context manager: inside it, each decoder layer in ``layers`` records the hidden state it
    receives (``resid[layer]``) and the keyword arguments the model passes it
    (``kwargs[layer]``: rotary ``position_embeddings``, ``position_ids``, the mask, the cache),
    so that later runs can call the model's own layers exactly as the model does. With
    ``stop_at``, the forward is cut at that layer's input and the block exits normally.
    """

    def __init__(self, handle: ModelHandle, layers: Sequence[int], *, stop_at: int | None = None):
        self.handle, self.layers, self.stop_at = handle, list(layers), stop_at
        self.resid: dict[int, Tensor] = {}
        self.kwargs: dict[int, dict] = {}
        self._hooks = ExitStack()

    def __enter__(self) -> LayerInputs:
        for layer in self.layers:
            module = self.handle.layers()[layer]
            hook = module.register_forward_pre_hook(self._hook(layer), with_kwargs=True)
            self._hooks.enter_context(hook)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._hooks.close()
        return exc_type is _StopForward

    def _hook(self, layer: int):
        def hook(_mod, args, kwargs):
            self.resid[layer] = args[0] if args else kwargs["hidden_states"]
            self.kwargs[layer] = {k: x for k, x in kwargs.items() if k != "hidden_states"}
            if layer == self.stop_at:
                raise _StopForward

        return hook


def clean_run(handle: ModelHandle, batch: AnswerBatch, starts: Sequence[int]) -> CleanRun:
    """One unedited forward over ``batch``, caching what edits starting at ``starts`` need.

    The model's own forward runs up to the last layer's input (a pre-hook there stops it);
    the last layer runs at the answer positions only, as in edited forwards.
    """
    spec = handle.spec
    L, H, D, KV = spec.n_layers, spec.n_heads, spec.d_head, spec.n_kv_heads
    first = min([*starts, L - 1])
    z, v = {}, {}

    def keep_z(layer):
        def hook(_mod, args):
            z[layer] = args[0].view(*args[0].shape[:2], H, D)

        return hook

    def keep_v(layer):
        def hook(_mod, _args, out):
            v[layer] = out.view(*out.shape[:2], KV, D)

        return hook

    inputs = LayerInputs(handle, range(first, L), stop_at=L - 1)
    with torch.no_grad(), ExitStack() as hooks:
        for layer in set(starts) - {L - 1}:
            hooks.enter_context(
                handle.proj(layer, "o_proj").register_forward_pre_hook(keep_z(layer))
            )
            hooks.enter_context(handle.proj(layer, "v_proj").register_forward_hook(keep_v(layer)))
        with inputs:  # innermost: the forward it cuts short ends here
            handle.model.base_model(input_ids=batch.ids.to(handle.device), use_cache=False)
    for layer, kwargs in inputs.kwargs.items():
        check_shared_kwargs(kwargs, layer)
    query = batch.query.to(handle.device)
    with torch.no_grad():
        logits = _logits_at(handle, inputs.resid[L - 1], query, inputs.kwargs[L - 1], None)
    return CleanRun(
        batch=batch, resid=inputs.resid, z=z, v=v, layer_kwargs=inputs.kwargs, logits=logits
    )


def run_from_layer(
    handle: ModelHandle, clean: CleanRun, start: int, ivs: Sequence[HeadIntervention]
) -> Float[Tensor, "row answer vocab"]:
    """Logits at the answer positions under each of ``ivs``, rows ablation-major.

    Row ``a * S + s`` is sample ``s`` under ``ivs[a]``. Every intervention must leave the layers
    below ``start`` untouched; ``clean`` must have been made with ``start`` among its starts.
    """
    L = handle.spec.n_layers
    stack = RowStack(ivs=tuple(ivs), rows=len(clean.batch))
    touched = stack.active_layers()
    if not touched or touched[0] < start:
        raise ValueError(
            f"edits touch layers {touched}; an edited forward from layer {start} needs every "
            f"edit to touch layer {start} or above and at least one layer"
        )
    if start < L - 1 and start not in clean.z:
        raise ValueError(f"the clean run cached no head outputs at layer {start}")
    reps = len(ivs)

    def rep(x: Tensor) -> Tensor:
        return x.repeat(reps, *[1] * (x.dim() - 1))

    with torch.no_grad():
        hidden = rep(clean.resid[start])
        if start < L - 1:
            v = rep(clean.v[start]) if stack.uses_values(start) else None
            z = stack.edit(start, rep(clean.z[start]), v)  # (row, pos, head, d_head)
            hidden = mlp_half(handle, start, hidden + handle.proj(start, "o_proj")(z.flatten(-2)))
            with hf_hooks(handle, stack):
                for layer in range(start + 1, L - 1):
                    hidden = layer_output(
                        handle.layers()[layer](hidden, **clean.layer_kwargs[layer])
                    )
        query = rep(clean.batch.query).to(handle.device)
        return _logits_at(handle, hidden, query, clean.layer_kwargs[L - 1], stack)


def _logits_at(
    handle: ModelHandle,
    hidden: Float[Tensor, "row pos d_model"],
    query: Int[Tensor, "row answer"],
    kwargs: dict,
    stack: RowStack | None,
) -> Float[Tensor, "row answer vocab"]:
    """Logits at ``query`` from the residual stream entering the last layer."""
    out = _last_layer_at(handle, hidden, query, kwargs, stack)
    return handle.unembed()(handle.final_norm()(out))


def _last_layer_at(
    handle: ModelHandle,
    hidden: Float[Tensor, "row pos d_model"],
    query: Int[Tensor, "row answer"],
    kwargs: dict,
    stack: RowStack | None,
) -> Float[Tensor, "row answer d_model"]:
    """The last decoder layer's output at the ``query`` positions only (keys: every position),
    with ``stack``'s edits of the last layer applied (None: unedited)."""
    spec = handle.spec
    layer_idx = spec.n_layers - 1
    layer, attn = handle.layers()[layer_idx], handle.attn(layer_idx)
    B, T, _ = hidden.shape
    H, KV, D, G = spec.n_heads, spec.n_kv_heads, spec.d_head, spec.group_size
    Q = query.shape[1]
    x = layer.input_layernorm(hidden)
    cos, sin = kwargs["position_embeddings"]  # (1, pos, D): shared by every row
    q = handle.proj(layer_idx, "q_proj")(_at(x, query)).view(B, Q, H, D).transpose(1, 2)
    k = handle.proj(layer_idx, "k_proj")(x).view(B, T, KV, D).transpose(1, 2)
    v = handle.proj(layer_idx, "v_proj")(x).view(B, T, KV, D)
    q = _rope(q, cos[0][query], sin[0][query])  # (row, head, answer, D)
    k = _rope(k, cos, sin)  # (row, kv_head, pos, D)
    mask = kwargs.get("attention_mask")
    if mask is None:  # causal: query at position p sees keys 0..p
        allowed = torch.arange(T, device=query.device)[None, None] <= query[..., None]
    else:  # the model's own mask (e.g. a sliding window), rows at the query positions
        allowed = mask[0, 0][query]
    # GQA without copying keys: the G query heads of one KV head become G x Q query rows
    z = F.scaled_dot_product_attention(
        q.reshape(B, KV, G * Q, D),
        k,
        v.transpose(1, 2),
        attn_mask=allowed[:, None, None].expand(B, 1, G, Q, T).reshape(B, 1, G * Q, T),
        scale=attn.scaling,
    )
    z = z.view(B, H, Q, D).transpose(1, 2)  # (row, answer, head, D)
    if stack is not None and layer_idx in stack.active_layers():
        full = hidden.new_zeros(B, T, H, D)  # edit at full length: uniform needs every v
        full[torch.arange(B, device=query.device)[:, None], query] = z
        z = _at(stack.edit(layer_idx, full, v), query)
    resid = _at(hidden, query) + handle.proj(layer_idx, "o_proj")(z.flatten(-2))
    return mlp_half(handle, layer_idx, resid)


def mlp_half(handle: ModelHandle, layer: int, resid: Tensor) -> Tensor:
    """``resid + mlp(post_attention_layernorm(resid))``: the second half of a decoder layer."""
    return resid + handle.mlp(layer)(handle.layers()[layer].post_attention_layernorm(resid))


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE on ``x`` ``(row, head, pos, D)``; ``cos``/``sin`` ``(row or 1, pos, D)``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def _at(x: Tensor, index: Int[Tensor, "row answer"]) -> Tensor:
    """``x[r, index[r, a]]`` for every row ``r`` and answer slot ``a``."""
    rows = torch.arange(x.shape[0], device=index.device)[:, None]
    return x[rows, index]


def layer_output(out) -> Tensor:
    """The hidden state a decoder layer returns (some versions return a tuple)."""
    return out[0] if isinstance(out, tuple) else out


def check_shared_kwargs(kwargs: dict, layer: int) -> None:
    """Runs of more rows reuse one run's layer kwargs: they must not be per-row."""
    for name, value in kwargs.items():
        for t in value if isinstance(value, tuple) else (value,):
            if isinstance(t, Tensor) and t.dim() > 0 and t.shape[0] != 1:
                raise ValueError(
                    f"decoder layer {layer} got a per-row {name!r} of shape {tuple(t.shape)}; "
                    "the cached sweep needs batch-shared positions and masks (right-padded "
                    "samples, no padding mask)"
                )
