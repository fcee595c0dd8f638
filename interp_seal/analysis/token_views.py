"""Numbers for token-level views: one head's direct effect split by source token, and the token
spans of a line-retrieval prompt that a long prompt is windowed around.

**Per-source-token DLA.** Head ``h`` of layer ``l`` writes ``W_O[:, h] z`` into the residual
stream at position ``p`` (``interp_seal.analysis.logit_attribution``), and its output ``z`` is an
attention-weighted sum of value vectors over the causal prefix::

    z = sum_j a_{p,j} v_j        (v_j: the value vector of KV head h // group at position j)

so the head's direct effect on a logit direction ``d`` (``W_U[correct] - W_U[wrong]``) splits
exactly into one term per source token (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits": the OV circuit read per source position)::

    DLA_h = sum_j a_{p,j} * (v_j . u),   u = W_O[:, h]^T (w * d) / rms(x)

with ``w`` the final RMSNorm weight and ``rms(x)`` frozen from the clean run (``"frozen_norm"``;
``"seal"`` drops the ``1/rms(x)`` factor, as in ``logit_attribution``), and, in families with a
norm on the attention output (OLMo 2), that norm frozen too (``logit_attribution.frozen_norm``). The terms sum to the
head's row of ``logit_attribution`` to float precision. One forward on the Hugging Face model
records the layer's values at every position, the head's attention row at ``p`` (row-wise:
``attention_rows.post_rope_qk_hooks``, never ``T x T``) and ``z`` at ``p``, and checks that the
weighted sum of values is ``z`` (an attention variant this split does not know about, such as
logit soft-capping with sinks, would break it, and the function says so).

**Focus spans.** ``line_retrieval_focus`` finds, in token positions, the queried line of a
LongEval record (the answer's source) and the question at the end, the two places a
line-retrieval circuit connects.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.analysis.attention_rows import layer_rows, post_rope_qk_hooks
from interp_seal.analysis.logit_attribution import (
    VARIANTS,
    Token,
    frozen_norm,
    token_id,
    token_label,
)
from interp_seal.models.handle import ModelHandle
from interp_seal.tasks import line_retrieval
from interp_seal.tasks.sample import Sample, Span


@dataclass(frozen=True, kw_only=True)
class SourceAttribution:
    """One head's direct effect at ``position``, split over the source tokens it reads.

    Attributes:
        values: ``(pos,)`` the direct effect carried from each source token (0 after
            ``position``: causal attention reads nothing there); sums to ``total``.
        attention: ``(pos,)`` the head's attention row at ``position``.
        total: the head's direct effect (its row of ``logit_attribution`` / ``attribute``).
        target: the logit (``"tok"``) or logit difference (``"a - b"``) attributed.
        layer: the head's layer.
        head: the query head.
        position: the (non-negative) position attributed.
        variant: ``"frozen_norm"`` or ``"seal"``.
    """

    values: Float[Tensor, " pos"]
    attention: Float[Tensor, " pos"]
    total: float
    target: str
    layer: int
    head: int
    position: int
    variant: str


def source_token_attribution(
    handle: ModelHandle,
    input_ids: Int[Tensor, " pos"],
    layer: int,
    head: int,
    correct: Token,
    wrong: Token | None = None,
    *,
    position: int = -1,
    variant: str = "frozen_norm",
) -> SourceAttribution:
    """Head ``(layer, head)``'s direct effect on ``logit[correct]`` (minus ``logit[wrong]``, if
    given) at ``position``, per source token.

    Tokens are ids or single-token strings (``logit_attribution.token_id``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown DLA variant {variant!r}; choose one of {VARIANTS}")
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be one prompt (1-D), got shape {tuple(input_ids.shape)}")
    L, H, KV, D = (
        handle.spec.n_layers,
        handle.spec.n_heads,
        handle.spec.n_kv_heads,
        handle.spec.d_head,
    )
    if not 0 <= layer < L or not 0 <= head < H:
        raise ValueError(f"head L{layer}H{head} is not in this model ({L} layers x {H} heads)")
    T = input_ids.shape[0]
    if not -T <= position < T:
        raise ValueError(f"position {position} is outside the prompt (length {T})")
    position %= T
    a = token_id(handle.tokenizer, correct)
    b = None if wrong is None else token_id(handle.tokenizer, wrong)
    target = token_label(handle.tokenizer, a)
    if b is not None:
        target = f"{target} - {token_label(handle.tokenizer, b)}"

    seen: dict[str, Tensor] = {}

    def keep_row(_layer, _mod, _kwargs, q, k):
        query = torch.tensor([position])
        rows = layer_rows(
            handle,
            layer,
            q[:, head : head + 1, position : position + 1],
            k[:, head // (H // KV) : head // (H // KV) + 1],
            query,
        )  # (1, 1, 1, T)
        seen["a"] = rows[0, 0, 0].detach().double()

    def keep_values(out):
        seen["v"] = out[0].detach().double().view(T, KV, D)[:, head // (H // KV)]  # (T, D)

    def keep_z(_mod, args):
        seen["z"] = args[0][0, position].detach().double().view(H, D)[head]  # (D,)

    def keep_x(_mod, args):
        seen["x"] = args[0][0, position].detach().double()  # (d_model,)

    def keep_attn_out(_mod, args):
        seen["attn_out"] = args[0][0, position].detach().double()  # o_proj's output

    with torch.no_grad(), ExitStack() as hooks:
        hooks.enter_context(post_rope_qk_hooks(handle, [layer], keep_row))
        o_proj = handle.proj(layer, "o_proj")
        hooks.enter_context(handle.on_projection(layer, "v", keep_values))
        hooks.enter_context(o_proj.register_forward_pre_hook(keep_z))
        hooks.enter_context(handle.final_norm().register_forward_pre_hook(keep_x))
        post_attn = handle.norm(layer, "post_attn")
        if post_attn is not None:
            hooks.enter_context(post_attn.register_forward_pre_hook(keep_attn_out))
        handle.model(input_ids[None].to(handle.device), logits_to_keep=1)

    attention, v, z = seen["a"].cpu(), seen["v"].cpu(), seen["z"].cpu()
    if handle.dtype in (torch.float32, torch.float64):
        gap = float((attention @ v - z).abs().max())
        if gap > 1e-4 * (1 + float(z.abs().max())):
            raise ValueError(
                f"L{layer}H{head}'s output is not its attention-weighted sum of value vectors "
                f"(max gap {gap:.3g}); this attention variant cannot be split by source token"
            )

    weight, _ = handle.norm_terms(handle.final_norm())
    x = seen["x"].cpu()
    rms = handle.norm_scale(handle.final_norm(), x)  # a LayerNorm's std (GPT-NeoX)
    scale = 1 / rms if variant == "frozen_norm" else torch.ones((), dtype=torch.float64)
    w_u = handle.unembed().weight.detach().double().cpu()  # (vocab, d_model)
    direction = w_u[a] - (w_u[b] if b is not None else 0)  # (d_model,)
    w_o = handle.linear_weight(o_proj).detach().double().cpu()  # (d_model, H*D)
    w_o = w_o[:, head * D : (head + 1) * D]  # (d_model, D)
    # (d_model,); a LayerNorm centres what it reads: c . center(r) == center(c) . r
    read = handle.center(weight.cpu() * direction * scale)
    if post_attn is not None:  # the layer's post-attention norm, its RMS frozen
        read = read * frozen_norm(handle, post_attn, seen["attn_out"]).cpu()
    u = w_o.T @ read  # (D,)
    return SourceAttribution(
        values=attention * (v @ u),
        attention=attention,
        total=float(z @ u),
        target=target,
        layer=layer,
        head=head,
        position=position,
        variant=variant,
    )


def _token_span(offsets, start: int, end: int) -> Span:
    """Half-open token span of the tokens whose characters overlap ``[start, end)``."""
    inside = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    if not inside:
        raise ValueError(f"character span ({start}, {end}) covers no token of the prompt")
    return inside[0], inside[-1] + 1


def line_retrieval_focus(sample: Sample, tokenizer) -> dict[str, Span]:
    """Token spans ``{"source": the queried record line, "question": the question through the
    end of the prompt}`` of a line-retrieval sample, as positions of ``sample.encode``'s ids."""
    if sample.task != "line_retrieval":
        raise ValueError(f"line_retrieval_focus needs a line-retrieval sample, got {sample.task!r}")
    index = sample.meta["random_idx"][0]
    lines = [r for r in line_retrieval.parse_record(sample.prompt) if r.index == str(index)]
    if len(lines) != 1:
        raise ValueError(f"the record holds {len(lines)} lines with index {index!r}, expected 1")
    question = sample.prompt.rfind(line_retrieval.FOOTER.split("{idx}")[0])
    if question < 0:
        raise ValueError("the prompt has no LongEval question ('Now the record is over. ...')")
    offsets = tokenizer(sample.prompt, return_offsets_mapping=True)["offset_mapping"]
    return {
        "source": _token_span(offsets, lines[0].start, lines[0].end),
        "question": _token_span(offsets, question, len(sample.prompt)),
    }
