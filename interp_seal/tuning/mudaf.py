"""MuDAF: contrastive attention focusing on chosen heads, plus the LM loss (MuDAF, Sec. 3.2).

Multi-document QA goes wrong when the heads that should attend to the golden passage spread
their attention over distractors. MuDAF trains those heads directly. For a selected head ``h``
the attention from the question's last token ``t`` (here the last prompt token, where the
retrieval score reads attention too) to passage ``P_k`` is approximated by the
attention to the passage's *mean-pooled key* (Eq. 4-6): ``softmax_k(Q_t K_{P_k}^T / sqrt d)``
with ``K_{P_k} = mean_{t' in P_k} K_{t'}``. Raising the golden passage's share is then a
contrastive problem (Eq. 7):

    L_CON = - log  exp(sim(Q_t, K_{P_G}) / tau) / sum_j exp(sim(Q_t, K_{P_j}) / tau)

with cosine similarity ``sim`` and temperature ``tau`` (0.05). Queries and keys are taken
post-RoPE, exactly as attention sees them; under GQA query head ``h`` uses KV head
``h // group_size``. The official code concatenates the selected heads' vectors and takes one
cosine similarity ("more stable", Sec. 4.2; ``concat=True``); ``concat=False`` sums one loss per
head as Eq. 7 writes it. Several golden passages (2-hop questions) each count as a positive
against the distractors, and their losses are averaged. The total loss is
``alpha * L_CON + (1 - alpha) * L_LM`` with the LM loss on the answer tokens; ``alpha = 0`` is
the Vanilla-SFT baseline (same data, same loop, no contrastive term).

Head selection (Sec. 4.2): a fixed list, the top-k heads by retrieval score ``R_h``
(``interp_seal.analysis.retrieval_scores``), or k heads sampled without replacement with
probability ``softmax(R_h / tau)`` (the paper's choice, tau = 0.05, k = 8). Which parameters
train is configurable: the whole model (the paper) or the attention of chosen layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from interp_seal.analysis.attention_rows import post_rope_qk_hooks
from interp_seal.interventions import Head
from interp_seal.models.handle import ModelHandle
from interp_seal.models.spec import ModelSpec
from interp_seal.tuning.data import TrainingBatch, answer_loss
from interp_seal.tuning.loop import Tuner

TRAINABLE = ("all", "attention")


# -- the loss ----------------------------------------------------------------------------------
def contrastive_loss(
    query: Float[Tensor, "head d_head"],
    keys: Float[Tensor, "passage head d_head"],
    golden: Sequence[int],
    *,
    tau: float = 0.05,
    concat: bool = True,
) -> Tensor:
    """MuDAF's InfoNCE loss for one question (Eq. 7).

    Args:
        query: the selected heads' post-RoPE queries at the question's last token.
        keys: each passage's mean-pooled post-RoPE keys for the same heads (GQA-expanded).
        golden: indices of the golden passages (the positives).
        tau: temperature.
        concat: one similarity over the concatenated heads (official code) or one loss per head
            summed over heads (Eq. 7).
    """
    n_passages = keys.shape[0]
    if not golden or not all(0 <= g < n_passages for g in golden):
        raise ValueError(
            f"golden ids {list(golden)} must be a non-empty subset of 0..{n_passages - 1}"
        )
    if len(set(golden)) == n_passages:
        raise ValueError("every passage is golden: the contrastive loss needs a distractor")
    if concat:
        sim = F.cosine_similarity(query.reshape(1, -1), keys.reshape(n_passages, -1), dim=-1)
        logits = (sim / tau)[:, None]  # (P, 1)
    else:
        logits = F.cosine_similarity(query[None], keys, dim=-1) / tau  # (P, S)
    is_golden = torch.zeros(n_passages, dtype=torch.bool, device=keys.device)
    is_golden[list(golden)] = True
    negatives = logits.masked_fill(is_golden[:, None], float("-inf"))  # (P, S)
    losses = []
    for g in sorted(set(golden)):  # each positive against the distractors
        candidates = torch.cat([logits[g : g + 1], negatives])  # positive first
        losses.append(-torch.log_softmax(candidates, dim=0)[0])  # (S,)
    return torch.stack(losses).mean(0).sum()


# -- post-RoPE queries and keys, with gradients ---------------------------------------------------
@contextmanager
def rotary_qk_hooks(handle: ModelHandle, layers: Sequence[int]):
    """Keep each listed layer's post-RoPE ``q`` ``(B, H, T, D)`` and ``k`` ``(B, KV, T, D)``.

    Yields a dict ``{layer: (q, k)}`` filled by every forward inside the block. The tensors stay
    in the autograd graph (no ``no_grad``, no ``detach``): a loss built on them trains
    ``q_proj``/``k_proj`` and everything below (``interp_seal.analysis.attention_rows``'s
    ``post_rope_qk_hooks``: the model family's own RoPE).
    """
    captured: dict[int, tuple[Tensor, Tensor]] = {}

    def keep(layer, _attn, _kwargs, q, k):
        captured[layer] = (q, k)

    with post_rope_qk_hooks(handle, sorted(set(layers)), keep):
        yield captured


def passage_queries_keys(
    captured: dict[int, tuple[Tensor, Tensor]],
    heads: Sequence[Head],
    spec: ModelSpec,
    row: int,
    query_position: int,
    passages: Sequence[tuple[int, int]],
) -> tuple[Float[Tensor, "head d_head"], Float[Tensor, "passage head d_head"]]:
    """The selected heads' query at ``query_position`` and mean-pooled keys of each passage."""
    queries, keys = [], []
    for layer, head in heads:
        q, k = captured[layer]
        kv = head // spec.group_size
        queries.append(q[row, head, query_position])
        keys.append(torch.stack([k[row, kv, s:e].mean(0) for s, e in passages]))
    return torch.stack(queries), torch.stack(keys, dim=1)


# -- head selection -------------------------------------------------------------------------------
def check_heads(spec: ModelSpec, heads: Sequence[Head]) -> tuple[Head, ...]:
    """``heads`` as ``(layer, head)`` tuples, each checked to exist and listed once."""
    out = tuple((int(layer), int(head)) for layer, head in heads)
    for layer, head in out:
        if not (0 <= layer < spec.n_layers and 0 <= head < spec.n_heads):
            raise ValueError(
                f"head {(layer, head)} does not exist: the model has {spec.n_layers} layers x "
                f"{spec.n_heads} heads"
            )
    if len(set(out)) != len(out):
        raise ValueError(f"heads are listed more than once: {list(out)}")
    return out


def score_matrix(heads, spec: ModelSpec, metric: str = "f1") -> Float[Tensor, "layer head"]:
    """Retrieval scores ``R_h`` as an ``(L, H)`` tensor from a DataFrame with ``layer``, ``head``
    and ``metric`` columns (``PassageScores.heads``)."""
    if heads.duplicated(["layer", "head"]).any():
        raise ValueError("the score table lists some heads more than once (several models?)")
    scores = torch.full((spec.n_layers, spec.n_heads), float("nan"))
    layers, index = torch.tensor(heads["layer"].tolist()), torch.tensor(heads["head"].tolist())
    scores[layers, index] = torch.tensor(heads[metric].tolist(), dtype=torch.float32)
    if torch.isnan(scores).any():
        raise ValueError(f"the score table does not cover all {spec.n_layers * spec.n_heads} heads")
    return scores


def top_k_heads(scores: Float[Tensor, "layer head"], k: int) -> tuple[Head, ...]:
    """The ``k`` heads with the highest retrieval score (ties: lower layer, then head, first)."""
    flat = scores.flatten()
    if not 1 <= k <= flat.numel():
        raise ValueError(f"k must be in 1..{flat.numel()}, got {k}")
    order = sorted(range(flat.numel()), key=lambda i: (-float(flat[i]), i))[:k]
    return tuple(divmod(i, scores.shape[1]) for i in order)


def sample_heads(
    scores: Float[Tensor, "layer head"], k: int, *, tau: float = 0.05, seed: int = 0
) -> tuple[Head, ...]:
    """``k`` heads drawn without replacement with ``P(h) = softmax(R_h / tau)`` (MuDAF Sec. 4.2)."""
    flat = scores.flatten().double()
    if not 1 <= k <= flat.numel():
        raise ValueError(f"k must be in 1..{flat.numel()}, got {k}")
    probs = torch.softmax(flat / tau, dim=0)
    picked = torch.multinomial(
        probs, k, replacement=False, generator=torch.Generator().manual_seed(seed)
    )
    return tuple(divmod(int(i), scores.shape[1]) for i in picked)


# -- the tuner ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MudafConfig:
    """MuDAF (or, with ``alpha = 0``, Vanilla SFT).

    Attributes:
        heads: the target heads ``(layer, head)`` of the contrastive loss.
        alpha: weight of the contrastive loss; the LM loss gets ``1 - alpha``.
        tau: temperature of the cosine similarities (0.05).
        concat: one similarity over the concatenated heads (official code) or one loss per head.
        trainable: ``"all"`` (full fine-tuning, the paper) or ``"attention"`` (the attention
            modules of ``layers``).
        layers: layers whose attention trains with ``trainable="attention"`` (default: the
            layers of ``heads``).
    """

    heads: tuple[Head, ...] = ()
    alpha: float = 0.5
    tau: float = 0.05
    concat: bool = True
    trainable: str = "all"
    layers: tuple[int, ...] | None = None

    def __post_init__(self):
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.alpha > 0 and not self.heads:
            raise ValueError("the contrastive loss (alpha > 0) needs target heads")
        if not self.tau > 0:
            raise ValueError(f"tau must be positive, got {self.tau}")
        if self.trainable not in TRAINABLE:
            raise ValueError(f"trainable must be one of {TRAINABLE}, got {self.trainable!r}")
        if self.trainable == "attention" and not (self.layers or self.heads):
            raise ValueError("trainable='attention' needs layers (or heads to take them from)")

    @property
    def train_layers(self) -> tuple[int, ...]:
        return (
            self.layers
            if self.layers is not None
            else tuple(sorted({layer for layer, _ in self.heads}))
        )


class MudafTuner(Tuner):
    """Fine-tunes ``handle.model`` with ``alpha * L_CON + (1 - alpha) * L_LM``."""

    def __init__(self, handle: ModelHandle, cfg: MudafConfig):
        super().__init__(handle.model)
        self.handle = handle
        self.cfg = cfg
        self.heads = check_heads(handle.spec, cfg.heads)
        self.method = "mudaf" if cfg.alpha > 0 else "sft"
        self._captured: dict | None = None
        if cfg.trainable == "all":
            self.model.requires_grad_(True)
        else:
            self.model.requires_grad_(False)
            for layer in cfg.train_layers:
                if not 0 <= layer < handle.spec.n_layers:
                    raise ValueError(
                        f"layer {layer} does not exist (the model has {handle.spec.n_layers})"
                    )
                handle.attn(layer).requires_grad_(True)

    def describe(self) -> dict:
        return {
            **super().describe(),
            "heads": self.heads,
            "alpha": self.cfg.alpha,
            "tau": self.cfg.tau,
            "concat": self.cfg.concat,
        }

    @contextmanager
    def step_context(self):
        """The q/k capture hooks, kept through forward and backward (gradient checkpointing
        re-runs them when it recomputes a layer)."""
        if self.cfg.alpha == 0:
            yield
            return
        with rotary_qk_hooks(self.handle, [layer for layer, _ in self.heads]) as captured:
            self._captured = captured
            try:
                yield
            finally:
                self._captured = None

    def forward(self, batch: TrainingBatch) -> dict:
        """The loss parts (call inside ``step_context``)."""
        if self.cfg.alpha == 0:
            return {"loss": answer_loss(self.model, batch)}
        if self._captured is None:
            raise RuntimeError("MudafTuner.forward runs inside `with tuner.step_context():`")
        lm = answer_loss(self.model, batch)
        rows = range(batch.input_ids.shape[0])
        con = torch.stack([self._contrastive(self._captured, batch, row) for row in rows]).mean()
        loss = self.cfg.alpha * con + (1 - self.cfg.alpha) * lm
        return {"loss": loss, "lm": lm.detach(), "contrastive": con.detach()}

    def _contrastive(self, captured, batch: TrainingBatch, row: int) -> Tensor:
        if not batch.passages[row] or not batch.golden[row]:
            raise ValueError(
                "MuDAF's contrastive loss needs samples with passages and golden ids "
                "(interp_seal.tasks.passages, or tuning.data.with_line_passages for line retrieval)"
            )
        query, keys = passage_queries_keys(
            captured,
            self.heads,
            self.handle.spec,
            row,
            int(batch.answer_start[row]) - 1,  # the last prompt token
            batch.passages[row],
        )
        return contrastive_loss(
            query, keys, batch.golden[row], tau=self.cfg.tau, concat=self.cfg.concat
        )
