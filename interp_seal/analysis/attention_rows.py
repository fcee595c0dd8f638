"""Row-wise attention: the attention weights of a few query positions, never a T x T matrix.

Retrieval scores need the attention of only a handful of query positions: the last prompt
token (MuDAF's passage score, MuDAF Sec. 3.1 / App. A.2) or the token being decoded (the
Retrieval Head copy-paste score, Wu et al. 2024). Materialising the full pattern, as eager
attention and the TransformerLens bridge do, costs ``H x T x T`` floats per layer: ~128 GiB
per layer in fp32 at 32K tokens. A row costs ``H x T``. For each layer we take

- the post-RoPE queries ``q`` of the chosen positions ``(B, H, Q, D)``,
- the post-RoPE keys ``k`` of every position ``(B, KV, T, D)`` (query head ``h`` reads KV
  head ``h // group_size``: grouped-query attention),

and compute ``softmax(q k^T * scaling)`` over the causal prefix of each row (and inside the
layer's sliding window, if it has one), with ``scaling`` read from the attention module
(``module.scaling``: ``1/sqrt(d_head)``, or Gemma's ``query_pre_attn_scalar ** -0.5``) rather
than assumed, and the scores soft-capped first where the family caps them (Gemma 2's
``c * tanh(s / c)``, ``ModelHandle.attn_softcap``): ``layer_rows``.
Memory is linear in ``T``; the model itself runs its usual sdpa attention.

Two capture routes give identical numbers (the same ops on the same tensors):

- ``backend="hf"``: forward hooks on ``q_proj`` / ``k_proj`` keep the projections, split into
  heads with the family's q / k norms where it has them (``ModelHandle.split_heads``: Qwen3's
  per-head norms, OLMo 2's norms over the whole projection), and a hook on the attention
  module (which receives ``position_embeddings = (cos, sin)``) applies the model's own RoPE
  function (``Family.rope_function``; none in GPT-2, ``ModelHandle.rotate``) to them. With a KV cache (decoding) the keys come from
  the cache, which stores them post-RoPE, so each step costs one row per head.
- ``backend="nnsight"``: reads the output of the first call of the family's RoPE function
  (``Family.rope_function``) in the attention module's source inside an nnsight trace, e.g.
  ``self_attn.source.apply_rotary_pos_emb_0.output`` (docs/design.md Sec. 2); in a family
  without RoPE (GPT-2) the projections' outputs, split into heads.

Both are checked against the rows of eager attention (``output_attentions=True``) in the tests.
Rows are computed in float32 whatever the model dtype. A ``reduce`` function applied to each
layer's rows right away (sum over passage spans, argmax) keeps only what an analysis needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from functools import reduce as fold

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.models import ModelHandle, soft_cap
from interp_seal.models.handle import STREAMING_ATTR
from interp_seal.models.kv_cache import layer_keys, received_cache
from interp_seal.models.rope_extension import _CONFIG_ATTR as SELF_EXTEND_ATTR

Rows = Float[Tensor, "batch head query key"]
RowReducer = Callable[[Rows], Tensor]
CAPTURE_BACKENDS = ("hf", "nnsight")


def attention_rows(
    q: Float[Tensor, "batch head query d_head"],
    k: Float[Tensor, "batch kv_head key d_head"],
    query_positions: Int[Tensor, " query"],
    *,
    scaling: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> Rows:
    """Causal softmax attention weights of the given query rows over keys ``0..T-1``.

    Args:
        q: post-RoPE queries of the rows.
        k: post-RoPE keys of every position (``KV`` may divide ``H``: GQA).
        query_positions: absolute position of each row; row ``i`` sees keys
            ``j <= query_positions[i]`` (and ``j > query_positions[i] - sliding_window``).
        scaling: the factor on ``q . k`` (the attention module's ``scaling``).
        sliding_window: the layer's attention window, or None.
        softcap: the layer's attention-logit soft-cap ``c`` (scores ``c * tanh(s / c)``
            before the mask, as Gemma 2 computes them), or None.
    """
    B, H, Q, D = q.shape
    KV, T = k.shape[1], k.shape[2]
    if H % KV:
        raise ValueError(f"{H} query heads cannot share {KV} key heads")
    q = q.float().reshape(B, KV, H // KV, Q, D)  # query head h = kv * group + g
    scores = q @ k.float()[:, :, None].transpose(-1, -2) * scaling  # (B, KV, G, Q, T)
    scores = soft_cap(scores, softcap)
    keys = torch.arange(T, device=k.device)
    pos = query_positions.to(k.device)[:, None]
    visible = keys[None, :] <= pos  # (Q, T)
    if sliding_window is not None:
        visible &= keys[None, :] > pos - sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    return scores.softmax(-1).reshape(B, H, Q, T)


def layer_rows(
    handle: ModelHandle,
    layer: int,
    q: Float[Tensor, "batch head query d_head"],
    k: Float[Tensor, "batch kv_head key d_head"],
    query_positions: Int[Tensor, " query"],
) -> Rows:
    """``attention_rows`` as ``layer`` computes them: its module's ``scaling``, its sliding
    window and its attention-logit soft-cap (``ModelHandle.attn_softcap``).

    Attention modes that change which keys a query sees, or at which positions, are refused
    rather than ignored: under Self-Extend (``models.rope_extension``) or streaming heads
    (``models.streaming_heads``) the plain causal rows computed here would not be the rows
    the model attends with."""
    attn = handle.attn(layer)
    modes = [
        name
        for name, attr in (("Self-Extend", SELF_EXTEND_ATTR), ("streaming heads", STREAMING_ATTR))
        if hasattr(attn, attr)
    ]
    if modes:
        raise ValueError(
            f"attention rows under {' and '.join(modes)} are not computed yet (layer {layer} "
            "attends with other positions or keys than plain causal attention); capture them "
            "outside the extend_context / compress_kv block"
        )
    return attention_rows(
        q,
        k,
        query_positions,
        scaling=handle.attn(layer).scaling,
        sliding_window=handle.sliding_window(layer),
        softcap=handle.attn_softcap(layer),
    )


def _local_positions(positions: Sequence[int], length: int) -> Int[Tensor, " query"]:
    """``positions`` (negative ones count from the end) as indices into a chunk of ``length``."""
    pos = torch.tensor([p + length if p < 0 else p for p in positions], dtype=torch.long)
    if len(pos) == 0 or (pos < 0).any() or (pos >= length).any():
        raise ValueError(
            f"query positions {list(positions)} are not inside a sequence of {length} tokens "
            f"(valid: 0..{length - 1}, or -1..-{length} counting from the end)"
        )
    return pos


class RowCapture:
    """Per-layer reduced attention rows collected by ``attention_row_hooks`` during forwards."""

    def __init__(self, n_layers: int):
        self._rows: list[Tensor | None] = [None] * n_layers

    def put(self, layer: int, rows: Tensor) -> None:
        self._rows[layer] = rows

    def take(self) -> Tensor:
        """``(layer, ...)``: the rows of the last forward, stacked over layers; then cleared."""
        missing = [i for i, r in enumerate(self._rows) if r is None]
        if missing:
            raise RuntimeError(f"no attention rows were captured for layers {missing}")
        rows, self._rows = torch.stack(self._rows), [None] * len(self._rows)
        return rows


QKCallback = Callable[[int, torch.nn.Module, dict, Tensor, Tensor], None]


@contextmanager
def post_rope_qk_hooks(handle: ModelHandle, layers: Sequence[int], on_qk: QKCallback):
    """Call ``on_qk(layer, attn, kwargs, q, k)`` at every forward inside the block.

    ``q`` ``(B, H, T, D)`` and ``k`` ``(B, KV, T, D)`` are the listed layer's queries and keys
    of the positions this forward feeds, after the family's q / k norms and RoPE
    (``ModelHandle.split_heads``, then the family's own RoPE function on the ``(cos, sin)`` its
    attention module receives). ``kwargs`` are
    that module's keyword arguments (the KV cache, ``position_ids``). The tensors stay in the
    autograd graph. All hooks are removed on exit.
    """
    with ExitStack() as hooks:
        for layer in layers:
            attn = handle.attn(layer)
            proj: dict[str, Tensor] = {}

            def keep(name: str, layer=layer, proj=proj):
                def hook(out):
                    proj[name] = handle.split_heads(layer, name, out)  # q/k norm included

                return hook

            def rotate(mod, _args, kwargs, _out, layer=layer, proj=proj):
                tables = handle.rope_tables(kwargs)  # None without RoPE (GPT-2)
                q, k = (handle.rotate(layer, proj.pop(w), tables) for w in "qk")
                on_qk(layer, mod, kwargs, q, k)

            hooks.enter_context(handle.on_projection(layer, "q", keep("q")))
            hooks.enter_context(handle.on_projection(layer, "k", keep("k")))
            hooks.enter_context(attn.register_forward_hook(rotate, with_kwargs=True))
        yield


@contextmanager
def attention_row_hooks(
    handle: ModelHandle,
    query_positions: Sequence[int] = (-1,),
    *,
    reduce: RowReducer | None = None,
):
    """Capture attention rows on the HF model for every forward inside the block.

    ``query_positions`` index the tokens of each forward call (``-1``: its last token), so in
    a KV-cache decoding loop ``(-1,)`` gives the row of the token being fed at each step; its
    keys are the cached ones (every position so far). Yields a ``RowCapture``: call ``take()``
    after each forward for ``(layer, batch, head, query, ...)``. All hooks are removed on exit.
    """
    capture = RowCapture(handle.spec.n_layers)

    def rows(layer: int, mod: torch.nn.Module, kwargs: dict, q_rot: Tensor, k_rot: Tensor):
        cache = received_cache(kwargs, handle.family.layer_cache)  # GPT-NeoX: layer_past
        if cache is not None:
            k_rot = layer_keys(cache, mod.layer_idx)  # post-RoPE, all positions so far
        n_new, n_keys = q_rot.shape[2], k_rot.shape[2]
        position_ids = kwargs.get("position_ids")
        if position_ids is not None and int(position_ids[0, -1]) + 1 != n_keys:
            raise ValueError(
                f"layer {layer} sees {n_keys} keys but its last query is at position "
                f"{int(position_ids[0, -1])}: row capture needs keys for every position "
                "0..t (no left padding, no sliding-window cache that drops old keys)"
            )
        local = _local_positions(query_positions, n_new)
        found = layer_rows(
            handle, layer, q_rot[:, :, local.to(q_rot.device)], k_rot, local + (n_keys - n_new)
        )
        capture.put(layer, found if reduce is None else reduce(found))

    with post_rope_qk_hooks(handle, range(handle.spec.n_layers), rows):
        yield capture


def capture_attention_rows(
    handle: ModelHandle,
    input_ids: Int[Tensor, "*batch pos"],
    query_positions: Sequence[int] = (-1,),
    *,
    reduce: RowReducer | None = None,
    backend: str = "hf",
) -> Tensor:
    """Attention rows of ``query_positions`` in one forward: ``(layer, batch, head, query, key)``.

    With ``reduce`` each layer's ``(batch, head, query, key)`` rows are replaced by
    ``reduce(rows)`` as soon as they exist (e.g. passage sums), and the result is their stack
    over layers. Batch rows share the query positions (use equal lengths, no padding).

    Args:
        handle: the model.
        input_ids: ``(batch, pos)`` or ``(pos,)`` token ids.
        query_positions: positions whose rows to keep (``-1``: the last token).
        reduce: optional per-layer reduction of the rows.
        backend: ``"hf"`` (forward hooks) or ``"nnsight"`` (a trace); identical numbers.
    """
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    input_ids = input_ids.to(handle.device)
    if backend == "hf":
        with torch.no_grad(), attention_row_hooks(handle, query_positions, reduce=reduce) as rows:
            handle.model(input_ids, use_cache=False, logits_to_keep=1)
        return rows.take()
    if backend == "nnsight":
        return _capture_nnsight(handle, input_ids, query_positions, reduce)
    raise ValueError(f"unknown capture backend {backend!r}; choose one of {CAPTURE_BACKENDS}")


def _capture_nnsight(handle, input_ids, query_positions, reduce) -> Tensor:
    """``capture_attention_rows`` through an nnsight trace of the same weights."""
    import nnsight

    model = handle.nnsight()
    local = _local_positions(query_positions, input_ids.shape[1])
    layer_envoys = fold(getattr, handle.family.layers.split("."), model)
    with torch.no_grad(), model.trace(input_ids, use_cache=False, logits_to_keep=1):
        captured = nnsight.save([])
        for layer in range(handle.spec.n_layers):
            attn = fold(getattr, handle.family.attn.split("."), layer_envoys[layer])
            if handle.family.rope_function is None:  # no RoPE (GPT-2): q, k as projected
                q_rot, k_rot = _projected_qk(handle, layer, attn)
            else:
                q_rot, k_rot = getattr(attn.source, f"{handle.family.rope_function}_0").output
            rows = layer_rows(handle, layer, q_rot[:, :, local.to(q_rot.device)], k_rot, local)
            captured.append(rows if reduce is None else reduce(rows))
    return torch.stack(list(captured))


def _projected_qk(handle, layer, attn) -> tuple[Tensor, Tensor]:
    """Inside an nnsight trace, ``layer``'s queries and keys ``(B, n, T, D)`` as its attention
    envoy ``attn`` projects them (each projection module's output read once: a fused one gives
    both), split into heads with the family's q / k norms: a family without RoPE attends with
    these."""
    outputs: dict[str, Tensor] = {}
    found = []
    for which in "qk":
        path, rows = handle.family.projection(which, handle.spec)
        if path not in outputs:
            outputs[path] = fold(getattr, path.split("."), attn).output
        out = outputs[path] if rows is None else outputs[path][..., rows]
        found.append(handle.split_heads(layer, which, out))
    return found[0], found[1]
