"""Query-focused retrieval heads (QRHead, Zhang et al. 2025, arXiv 2506.09944), from attention rows.

**What QRHead defines.** For head ``h``, a query ``q`` and a passage ``d`` of the context, the
query-focused retrieval score is the attention mass that the query's tokens put on the
passage's tokens, averaged over the query tokens:

    QRscore_h(q, d) = 1/|q| * sum_{t_q in q} sum_{t_d in d} A^h[t_q -> t_d]

(post-softmax weights). A head's score for one question sums this over the golden passages
``D*``, and its score on a detection set ``T`` of (question, passages, golden) triples is the
mean over ``T``. The heads with the highest score are the QRHeads. QRRetriever then scores the
passages of a new question by the same mass summed over the selected heads, and ranks them
(a re-ranker, evaluated with recall@k). The authors' code (``princeton-pli/QRHead``,
``src/qrretriever/attn_retriever.py``: ``score_docs``, ``score_docs_per_head_for_detection``,
``score_per_token_attention_to_query``; ``exp_scripts/detection/detect_qrhead_lme.py``) also
*calibrates* every per-token score by subtracting the same per-token score under a null query
(``"N/A"``): the prompt with the query replaced, whose tokens before the query are the same.
It calibrates both in head detection and in retrieval (its README credits OSU-NLP-Group's
In-Context-Reranking for part of the code).

**What is implemented here, and where it differs.**

- Query tokens. The code's query span is everything after the last passage (the closing
  instruction, ``Query: {q}`` and the chat template's suffix), not the bare question. We do the
  same on this project's passage prompts (LongBench format): the query is every token after the
  last passage (``...Question: {input}\\nAnswer:``), and the null prompt replaces the question
  ``meta["input"]`` there by ``null_query``. The two prompts must agree token for token up to
  the query (checked).
- Calibration: ``calibrate=True`` (default) subtracts the null query's per-token mass, as the
  code does; ``calibrate=False`` is the uncalibrated formula above. Both the raw and the
  calibrated mass are kept.
- Outlier tokens. The code also drops, per head and passage, the calibrated per-token scores at
  or below ``mean - 2 * std`` of that passage's tokens (unbiased std) before summing; in
  retrieval it does so *after* summing over the selected heads. ``outlier_std=2.0`` reproduces
  that; the default ``None`` sums every token (the formula above).
- Head score: the mean over questions of the (calibrated) mass on the golden passages, as
  ``lme_eval`` in the detection script; ``qr_score_raw`` is the uncalibrated one.
- Ranking: passages sorted by score, ties to the earlier passage; recall@k = the fraction of a
  question's golden passages among its top k, averaged over questions.
- The code captures full query x context attention with a patched model and FlashAttention.
  Here the rows of the query positions only are recomputed from post-RoPE q and k
  (``attention_rows``): ``|q| x T`` per layer, never T x T. The paper text itself could not be
  read from this environment; its definitions above are from the code and from summaries of
  the paper, so no section numbers are cited.

``qr_scores`` and ``rank_passages`` run one sample at a time through ``score_samples`` (a
progress bar, and resumable on disk with ``results=``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp_seal.analysis.attention_rows import CAPTURE_BACKENDS, capture_attention_rows
from interp_seal.analysis.retrieval_scores import (
    _long,
    check_golden,
    passage_spans,
    rank_heads,
    score_samples,
)
from interp_seal.evaluation import encode_samples
from interp_seal.interventions import HeadEdit
from interp_seal.interventions.hf import edits_manifest
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Sample, Span


@dataclass(frozen=True, kw_only=True)
class QRConfig:
    """QRHead scoring.

    Attributes:
        null_query: the question put in its place for calibration (QRHead's code: ``"N/A"``).
        calibrate: subtract the null query's per-token mass (QRHead's code) or not.
        outlier_std: drop per-token scores at or below ``mean - outlier_std * std`` of their
            passage before summing (QRHead's code: 2.0); None keeps every token.
        backend: attention-row capture route, ``"hf"`` or ``"nnsight"`` (same numbers).
    """

    null_query: str = "N/A"
    calibrate: bool = True
    outlier_std: float | None = None
    backend: str = "hf"

    def __post_init__(self):
        if not self.null_query.strip():
            raise ValueError("null_query must be non-empty text (QRHead's code uses 'N/A')")
        if self.outlier_std is not None and self.outlier_std < 0:
            raise ValueError(f"outlier_std must be >= 0 or None, got {self.outlier_std}")
        if self.backend not in CAPTURE_BACKENDS:
            raise ValueError(f"backend must be one of {CAPTURE_BACKENDS}, got {self.backend!r}")


@dataclass(frozen=True, kw_only=True)
class QueryTokenAttention:
    """One question's query-to-context attention per head and context token.

    Attributes:
        raw: ``(L, H, K)`` attention from the query tokens, averaged over them, on each of
            the ``K`` tokens before the query.
        null: the same under the null query.
        passages: the passages' token spans (all inside ``0..K-1``).
        golden: ids of the golden passages.
    """

    raw: Float[Tensor, "layer head key"]
    null: Float[Tensor, "layer head key"]
    passages: tuple[Span, ...]
    golden: tuple[int, ...]

    def tokens(self, calibrate: bool) -> Float[Tensor, "layer head key"]:
        return self.raw - self.null if calibrate else self.raw


@dataclass(frozen=True, kw_only=True)
class QRScores:
    """QRHead scores.

    Attributes:
        heads: ``layer, head, qr_score, qr_score_raw, rank`` (rank 1 = highest ``qr_score``:
            calibrated when the config calibrates).
        per_sample: ``sample, layer, head, qr_score, qr_score_raw``.
        passages: per sample, ``(L, H, P)`` arrays ``raw`` and ``calibrated`` and ``golden``.
    """

    heads: pd.DataFrame
    per_sample: pd.DataFrame
    passages: list[dict]


def null_prompt(sample: Sample, null_query: str) -> str:
    """``sample``'s prompt with its question (``meta["input"]``, after the last passage) replaced."""
    question = sample.meta.get("input")
    if not question or not sample.passages:
        raise ValueError(
            "QR scores need a passage sample with its question in meta['input'] (LongBench "
            "records and interp_seal.tasks.passages samples have one)"
        )
    tail_start = sample.passages[-1][1]
    tail = sample.prompt[tail_start:]
    at = tail.rfind(question)
    if at < 0:
        raise ValueError("the question meta['input'] does not occur after the last passage")
    tail = tail[:at] + null_query + tail[at + len(question) :]
    return sample.prompt[:tail_start] + tail


def query_token_attention(
    handle: ModelHandle, sample: Sample, config: QRConfig = QRConfig()
) -> QueryTokenAttention:
    """Mean attention of the query tokens on every context token, under the query and the null one.

    The query is every token after the last passage; only its rows are computed.
    """
    null = Sample(
        task=sample.task,
        prompt=null_prompt(sample, config.null_query),
        answer=sample.answer,
        passages=sample.passages,
        golden=sample.golden,
        meta=sample.meta,
    )
    enc, enc_null = encode_samples(handle, [sample, null])
    spans = passage_spans(enc)
    golden = check_golden(sample.golden, len(spans))
    start = spans[-1][1]  # first query token
    if enc_null.passages != spans or not torch.equal(
        enc.prompt_ids[:start], enc_null.prompt_ids[:start]
    ):
        raise ValueError(
            "the prompt and its null-query prompt tokenise differently before the query; "
            "calibration needs the same context tokens in both"
        )

    def mass(ids: Tensor) -> Tensor:
        def mean_row(rows: Float[Tensor, "batch head query key"]) -> Tensor:
            return rows[0, :, :, :start].double().mean(1)  # (H, K)

        positions = tuple(range(start, len(ids)))
        return capture_attention_rows(
            handle, ids, positions, reduce=mean_row, backend=config.backend
        ).cpu()  # (L, H, K)

    return QueryTokenAttention(
        raw=mass(enc.prompt_ids),
        null=mass(enc_null.prompt_ids),
        passages=spans,
        golden=golden,
    )


def passage_mass(
    tokens: Float[Tensor, "*head key"], spans: Sequence[Span], outlier_std: float | None = None
) -> Float[Tensor, "*head passage"]:
    """Per-token scores summed over each passage; with ``outlier_std`` QRHead's code's filter.

    The filter zeroes, per row and passage, the scores at or below ``mean - outlier_std * std``
    of that passage's scores (unbiased std, as ``torch.std``).
    """
    sums = []
    for start, end in spans:
        part = tokens[..., start:end]
        if outlier_std is not None:
            threshold = part.mean(-1, keepdim=True) - outlier_std * part.std(-1, keepdim=True)
            part = part.masked_fill(~(part > threshold), 0.0)
        sums.append(part.sum(-1))
    return torch.stack(sums, -1)


def qr_scores(
    handle: ModelHandle,
    samples: Sequence[Sample],
    config: QRConfig = QRConfig(),
    *,
    results: str | Path | None = None,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> QRScores:
    """QRHead detection: every head's query-focused mass on the golden passages, over ``samples``.

    Args:
        handle: the model.
        samples: passage samples with golden ids and their question in ``meta["input"]``.
        config: null query, calibration, outlier filter, capture backend.
        results: JSONL file for per-sample results (resumes from it).
        progress: show a progress bar.
        intervention: an edit of the model scored (composed with ``handle.edit``'s).
    """
    with handle.edit(intervention):
        if not samples:
            raise ValueError("no samples to score")

        def compute(sample: Sample) -> dict:
            qa = query_token_attention(handle, sample, config)
            raw = passage_mass(qa.tokens(False), qa.passages, config.outlier_std)
            cal = passage_mass(qa.tokens(config.calibrate), qa.passages, config.outlier_std)
            return {"golden": list(qa.golden), "raw": raw.tolist(), "calibrated": cal.tolist()}

        setting = {"model": handle.identity, "score": "qr", "null_query": config.null_query}
        setting |= {"calibrate": config.calibrate, "outlier_std": config.outlier_std}
        setting |= edits_manifest(handle)
        records = score_samples(
            samples, compute, setting=setting, results=results, desc="QR scores", progress=progress
        )
        passages, scored = [], []
        for r in records:
            raw, cal, golden = np.asarray(r["raw"]), np.asarray(r["calibrated"]), r["golden"]
            passages.append({"raw": raw, "calibrated": cal, "golden": tuple(golden)})
            values = {
                "qr_score": cal[..., golden].sum(-1),
                "qr_score_raw": raw[..., golden].sum(-1),
            }
            scored.append((r["sample"], values))
        per_sample = _long(scored)
        heads = per_sample.groupby(["layer", "head"], as_index=False)[
            ["qr_score", "qr_score_raw"]
        ].mean()
        return QRScores(
            heads=rank_heads(heads, ["qr_score"]), per_sample=per_sample, passages=passages
        )


def top_heads(heads: pd.DataFrame, n: int) -> list[tuple[int, int]]:
    """The ``n`` best ``(layer, head)`` of a ranked head table (``QRScores.heads``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    best = heads.sort_values("rank").head(n)
    return [
        (int(layer), int(head)) for layer, head in zip(best["layer"], best["head"], strict=True)
    ]


def rank_passages(
    handle: ModelHandle,
    samples: Sequence[Sample],
    heads: Sequence[tuple[int, int]],
    config: QRConfig = QRConfig(),
    *,
    results: str | Path | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """QRRetriever: each question's passages ranked by the summed scores of ``heads``.

    Per-token scores are summed over ``heads`` first, then over each passage (with the outlier
    filter, if any, on the head sum: QRHead's ``score_docs``).

    Returns:
        ``sample, passage, score, rank, golden`` (rank 1 = highest score; ties go to the
        earlier passage).
    """
    heads = [(int(layer), int(head)) for layer, head in heads]
    if not heads:
        raise ValueError("no heads to rank passages with")
    n_layers, n_heads = handle.spec.n_layers, handle.spec.n_heads
    for layer, head in heads:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"head ({layer}, {head}) is not in a {n_layers} x {n_heads} model")
    if not samples:
        raise ValueError("no samples to rank")
    index = torch.tensor(heads)

    def compute(sample: Sample) -> dict:
        qa = query_token_attention(handle, sample, config)
        summed = qa.tokens(config.calibrate)[index[:, 0], index[:, 1]].sum(0)  # (K,)
        scores = passage_mass(summed, qa.passages, config.outlier_std)
        return {"golden": list(qa.golden), "scores": scores.tolist()}

    setting = {"model": handle.identity, "score": "qr ranking", "heads": heads}
    setting |= {"null_query": config.null_query, "calibrate": config.calibrate}
    setting |= {"outlier_std": config.outlier_std} | edits_manifest(handle)
    records = score_samples(
        samples, compute, setting=setting, results=results, desc="QR ranking", progress=progress
    )
    frames = []
    for r in records:
        scores = np.asarray(r["scores"])
        order = np.argsort(-scores, kind="stable")
        rank = np.empty(len(scores), dtype=int)
        rank[order] = np.arange(1, len(scores) + 1)
        frames.append(
            pd.DataFrame(
                {
                    "sample": r["sample"],
                    "passage": np.arange(len(scores)),
                    "score": scores,
                    "rank": rank,
                    "golden": np.isin(np.arange(len(scores)), r["golden"]),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def recall_at_k(ranking: pd.DataFrame, k: int) -> float:
    """Mean over questions of the fraction of golden passages ranked in the top ``k``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    per_question = ranking.groupby("sample").apply(
        lambda q: (q["golden"] & (q["rank"] <= k)).sum() / q["golden"].sum(),
        include_groups=False,
    )
    return float(per_question.mean())
