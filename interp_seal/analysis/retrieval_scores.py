"""Which heads retrieve? Two per-head retrieval scores, from attention rows only.

**Passage-level score (MuDAF, Sec. 3.1 and App. A.2).** A multi-document QA prompt mixes
golden passages ``P_G`` with distractors. For head ``h``, the attention ``a_p`` of passage
``p`` is the attention of the *last prompt token* summed over the passage's tokens. Then

- F1: the attended set is ``P_A = {p : a_p > eps}``; precision ``|P_G & P_A| / |P_A|``,
  recall ``|P_G & P_A| / |P_G|``, F1 their harmonic mean (0 when both are 0, and when
  nothing is attended);
- EM: 1 iff the ``|P_G|`` passages with the highest attention are exactly ``P_G`` (ties go to
  the earlier passage);

each averaged over questions. MuDAF's ``R_h`` is the mean F1 (Eq. 1, 15). The paper leaves
``eps`` unspecified; the official code (``eval/retrieval_score.py``) scores with
``eps = 0.3``, our default. With many passages, a head that spreads its attention evenly
attends to none. That code also ranks only the passages above ``eps`` for EM, so its EM
additionally requires every golden passage to be attended; ``em_attended_only=True``
reproduces it (the paper's App. A.2 ranks all passages, our default).

**Copy-paste score (Retrieval Head, Wu et al. 2024).** While the model greedily decodes the
answer to a needle-in-a-haystack question, at every step each head's attention argmax (over
the prompt and the tokens generated so far, from the position being decoded) is looked up: if
it falls inside the needle's tokens and the token there is the token just generated, the head
copied it and scores ``1 / len(needle)``. A sample's score is the sum over steps; the head's
score the mean over samples (a context length x depth grid); heads above 0.1 are *retrieval
heads*. The decoding loop keeps a KV cache and takes one attention row per head and step
(``attention_rows``): never a T x T matrix.

**Peers' conventions.** MuDAF's and Retrieval_Head's own code define both scores slightly
differently (passage spans that include the separators, EM over attended passages only; a
needle located by token overlap, 50 decoded tokens, only samples whose answer recalls the
needle). ``convention="mudaf_code"`` / ``"retrieval_head_code"`` reproduce them; the papers'
definitions are the default. ``interp_seal.analysis.peer_conventions`` states the differences.

``passage_retrieval_scores`` and ``needle_retrieval_scores`` run one sample at a time through
``score_samples``, which appends each sample's result to a JSONL file when asked (``results=``)
and skips samples already there on restart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

import interp_seal.analysis.peer_conventions as peers
from interp_seal.analysis.attention_rows import (
    CAPTURE_BACKENDS,
    attention_row_hooks,
    capture_attention_rows,
)
from interp_seal.engine import greedy_decode
from interp_seal.evaluation import encode_samples
from interp_seal.interventions import HeadEdit
from interp_seal.interventions.hf import edits_manifest
from interp_seal.models import ModelHandle
from interp_seal.records import RecordStore, fingerprint
from interp_seal.shards import Shard
from interp_seal.tasks.sample import Encoded, Sample, Span, check_golden_ids

# -- passage-level (MuDAF) -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PassageScoreConfig:
    """MuDAF passage-level retrieval score.

    Attributes:
        eps: a passage is attended when its summed attention exceeds ``eps`` (official code:
            0.3; the paper does not state it).
        em_attended_only: EM ranks only attended passages (official code) instead of all
            passages (paper, App. A.2).
        backend: attention-row capture route, ``"hf"`` or ``"nnsight"`` (same numbers).
        convention: ``"paper"`` (App. A.2) or ``"mudaf_code"``: passage spans from marker to
            marker and EM over attended passages, as MuDAF's code (``peer_conventions``).
    """

    eps: float = 0.3
    em_attended_only: bool = False
    backend: str = "hf"
    convention: str = "paper"

    def __post_init__(self):
        peers.check_convention(self.convention, peers.PASSAGE_CONVENTIONS)
        if not 0 <= self.eps < 1:
            raise ValueError(f"eps must be in [0, 1) (attention sums to 1), got {self.eps}")
        if self.backend not in CAPTURE_BACKENDS:
            raise ValueError(f"backend must be one of {CAPTURE_BACKENDS}, got {self.backend!r}")


@dataclass(frozen=True, kw_only=True)
class PassageAttention:
    """One question's last-token attention per head and passage (MuDAF Fig. 10's heatmaps).

    Attributes:
        attention: ``(L, H, P)`` attention summed over each passage's tokens.
        prefix: ``(L, H)`` attention on the tokens before the first passage (Fig. 10's "#0").
        golden: ids of the golden passages.
    """

    attention: Float[np.ndarray, "layer head passage"]
    prefix: Float[np.ndarray, "layer head"]
    golden: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class PassageScores:
    """MuDAF retrieval scores.

    Attributes:
        heads: one row per head: ``layer, head, f1, em, rank`` (rank 1 = highest mean F1,
            ties broken by EM, then layer, then head).
        per_sample: ``sample, layer, head, f1, em``.
        attention: per sample, its ``PassageAttention``.
    """

    heads: pd.DataFrame
    per_sample: pd.DataFrame
    attention: list[PassageAttention]


def passage_spans(enc: Encoded) -> tuple[Span, ...]:
    """``enc``'s passage token spans, checked to be non-empty, in order and inside the prompt."""
    if not enc.passages:
        raise ValueError(
            "the sample has no passages; passage retrieval scores need Sample.passages (the "
            "character spans of the passages in the prompt)"
        )
    last_end = 0
    for i, (start, end) in enumerate(enc.passages):
        if not 0 <= start < end <= enc.answer_start - 1:
            raise ValueError(
                f"passage {i} has token span [{start}, {end}) but the prompt before the last "
                f"token (the query) is [0, {enc.answer_start - 1}); every passage must be a "
                "non-empty part of the prompt ahead of its last token"
            )
        if start < last_end:
            raise ValueError(f"passage {i} overlaps the passage before it; spans must be disjoint")
        last_end = end
    return enc.passages


def check_golden(golden: Sequence[int], n_passages: int) -> tuple[int, ...]:
    """Golden ids, checked: at least one, distinct, each in ``0..n_passages-1``."""
    if not golden:
        raise ValueError(
            "the sample has no golden passages; MuDAF scores need the ids of the passages that "
            "hold the answer (Sample.golden, or a golden-id file for LongBench data)"
        )
    return check_golden_ids(golden, n_passages)


def score_passages(
    attention: Float[Tensor, "*head passage"],
    golden: Sequence[int],
    eps: float,
    *,
    em_attended_only: bool = False,
) -> tuple[Float[Tensor, "*head"], Float[Tensor, "*head"]]:
    """Per-question MuDAF F1 and EM of each head from its passage attention (App. A.2).

    With ``em_attended_only`` the EM ranking covers only passages above ``eps`` (the official
    code), which is the paper's EM and every golden passage attended.
    """
    attention = torch.as_tensor(attention)
    golden = check_golden(golden, attention.shape[-1])
    is_golden = torch.zeros(attention.shape[-1], dtype=torch.bool)
    is_golden[list(golden)] = True
    attended = attention > eps
    hits = (attended & is_golden).sum(-1).double()
    precision = hits / attended.sum(-1).clamp(min=1)  # nothing attended: precision 0
    recall = hits / len(golden)
    f1 = torch.where(hits > 0, 2 * precision * recall / (precision + recall), 0.0)
    order = torch.argsort(-attention, dim=-1, stable=True)  # ties: earlier passage first
    em = is_golden[order[..., : len(golden)]].all(-1)
    if em_attended_only:
        em &= attended[..., is_golden].all(-1)
    return f1, em.double()


def passage_attention(
    handle: ModelHandle, sample: Sample, *, backend: str = "hf", convention: str = "paper"
) -> PassageAttention:
    """The last prompt token's attention summed over each passage, for every head.

    With ``convention="mudaf_code"`` passages are cut as MuDAF's code cuts them.
    """
    peers.check_convention(convention, peers.PASSAGE_CONVENTIONS)
    enc = encode_samples(handle, [sample])[0]
    if convention == "mudaf_code":
        enc = dataclasses.replace(enc, passages=peers.mudaf_code_spans(sample, handle.tokenizer))
    spans = passage_spans(enc)
    golden = check_golden(sample.golden, len(spans))
    first = spans[0][0]

    def per_passage(rows: Float[Tensor, "batch head query key"]) -> Tensor:
        sums = [rows[..., s:e].sum(-1) for s, e in ((0, first), *spans)]
        return torch.stack(sums, -1)[0, :, 0]  # (H, 1 + P)

    sums = capture_attention_rows(
        handle, enc.prompt_ids, (-1,), reduce=per_passage, backend=backend
    )
    sums = sums.double().cpu().numpy()  # (L, H, 1 + P)
    return PassageAttention(attention=sums[..., 1:], prefix=sums[..., 0], golden=golden)


# -- copy-paste (Retrieval Head) -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CopyPasteConfig:
    """Retrieval Head copy-paste score.

    Attributes:
        threshold: heads whose mean score exceeds it are retrieval heads (Wu et al.: 0.1).
        max_new_tokens: greedy steps per sample; None = the answer's token count (50 with
            ``"retrieval_head_code"``). Decoding also stops at the tokenizer's EOS.
        convention: ``"paper"`` (Wu et al.) or ``"retrieval_head_code"``: needle located by
            token overlap, decoding to a newline, only samples whose answer recalls the needle
            averaged, as the Retrieval_Head code (``peer_conventions``).
    """

    threshold: float = 0.1
    max_new_tokens: int | None = None
    convention: str = "paper"

    def __post_init__(self):
        peers.check_convention(self.convention, peers.NEEDLE_CONVENTIONS)
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {self.threshold}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True, kw_only=True)
class CopyPaste:
    """One sample's copy-paste score per head and what greedy decoding produced.

    Attributes:
        score: ``(L, H)``, the number of copying steps / needle length.
        generated: the greedily decoded token ids.
    """

    score: Float[np.ndarray, "layer head"]
    generated: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class NeedleScores:
    """Retrieval Head scores.

    Attributes:
        heads: ``layer, head, score, retrieval_head, rank`` (rank 1 = highest mean score).
        per_sample: ``sample, layer, head, score`` plus the sample's NIAH fields
            (``context_length``, ``depth_percent``, ``needle_id`` when the sample has them).
    """

    heads: pd.DataFrame
    per_sample: pd.DataFrame


def needle_span(enc: Encoded) -> Span:
    """``enc``'s needle token span, checked to lie in the prompt."""
    if enc.needle is None:
        raise ValueError(
            "the sample has no needle span; copy-paste scores need Sample.needle (the needle's "
            "character span in the prompt)"
        )
    start, end = enc.needle
    if not 0 <= start < end <= enc.answer_start:
        raise ValueError(
            f"needle token span [{start}, {end}) is not inside the prompt's {enc.answer_start} "
            "tokens; the needle must be part of the prompt"
        )
    return enc.needle


def copy_hits(
    argmax: Int[Tensor, "layer head"], token: int, ids: Int[Tensor, " pos"], needle: Span
) -> Bool[Tensor, "layer head"]:
    """Heads whose attention argmax is a needle token equal to the token just generated.

    ``ids`` must cover the needle (the prompt does); argmaxes past its end are never hits.
    """
    inside = (argmax >= needle[0]) & (argmax < needle[1])
    return inside & (ids[argmax.clamp(max=len(ids) - 1)] == token)


@torch.no_grad()
def copy_paste_score(
    handle: ModelHandle,
    sample: Sample | Encoded,
    *,
    max_new_tokens: int | None = None,
    convention: str = "paper",
) -> CopyPaste:
    """Greedy KV-cache decoding of ``sample``'s answer, scoring copy-paste heads at each step.

    With ``convention="retrieval_head_code"`` (a ``Sample`` only) the needle is located and
    decoding stops as the Retrieval_Head code does (``peer_conventions``).
    """
    peers.check_convention(convention, peers.NEEDLE_CONVENTIONS)
    enc = encode_samples(handle, [sample])[0]
    start, end = needle_span(enc)
    steps = max_new_tokens or len(enc.answer_ids)
    stop = None
    if convention == "retrieval_head_code":
        start, end = peers.locate_needle(handle.tokenizer, sample, enc.prompt_ids)
        steps, stop = max_new_tokens or peers.DECODE_TOKENS, peers.newline_stop(handle.tokenizer)
    ids = enc.prompt_ids
    if len(ids) < 2:
        raise ValueError("the prompt needs at least two tokens (a prefix and a query token)")
    score = torch.zeros(handle.spec.n_layers, handle.spec.n_heads, dtype=torch.float64)

    def argmax_rows(rows: Float[Tensor, "batch head query key"]) -> Tensor:
        return rows[0, :, 0].argmax(-1)  # (H,)

    with attention_row_hooks(handle, (-1,), reduce=argmax_rows) as capture:

        def score_step(token: int) -> None:
            nonlocal score
            hits = copy_hits(capture.take().cpu(), token, ids, (start, end))
            score += hits / (end - start)

        generated = greedy_decode(handle, ids, steps, stop=stop, on_token=score_step)
    return CopyPaste(score=score.cpu().numpy(), generated=tuple(generated))


# -- running over samples, resumably -----------------------------------------------------------


def score_samples(
    samples: Sequence[Sample],
    compute: Callable[[Sample], dict],
    *,
    setting: object,
    results: str | Path | None = None,
    desc: str,
    progress: bool = True,
) -> list[dict]:
    """``compute(sample)`` for every sample, in order; with ``results``, resumable on disk.

    Under torchrun each rank computes every N-th sample (``interp_seal.shards``) and all ranks
    return every record.

    ``setting`` (JSON-able: the model, options that change the result) enters each record's
    fingerprint with the sample's prompt, answer, spans and golden ids.
    """
    shard = Shard.current()
    log = RecordStore(results, shard) if results is not None else None
    mine = [i for i in range(len(samples)) if shard.owns(i)]
    records = []
    for i in tqdm(mine, desc=desc, disable=not progress):
        sample = samples[i]
        key = f"sample-{i}"
        print_ = fingerprint(
            setting, sample.prompt, sample.answer, sample.passages, sample.golden, sample.needle
        )
        record = log.get(key, print_) if log else None
        if record is None:
            record = {"key": key, "fingerprint": print_, "sample": i, **compute(sample)}
            if log:
                log.add(record)
        records.append(record)
    if shard.world == 1:
        return records
    records = sorted(shard.gather(records), key=lambda record: record["sample"])
    if log:
        log.merge()
    return records


def rank_heads(heads: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """``heads`` sorted best first by the columns ``by`` (descending), with a 1-based ``rank``."""
    ranked = heads.sort_values([*by, "layer", "head"], ascending=[False] * len(by) + [True, True])
    return ranked.assign(rank=np.arange(1, len(ranked) + 1)).reset_index(drop=True)


def _long(per_sample: Sequence[tuple[int, dict[str, np.ndarray]]]) -> pd.DataFrame:
    """Tidy ``sample, layer, head, <value>...`` rows from per-sample ``(L, H)`` arrays."""
    frames = []
    for sample, values in per_sample:
        L, H = next(iter(values.values())).shape
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        frames.append(
            pd.DataFrame(
                {"sample": sample, "layer": layer.ravel(), "head": head.ravel()}
                | {name: np.asarray(v).ravel() for name, v in values.items()}
            )
        )
    return pd.concat(frames, ignore_index=True)


def passage_retrieval_scores(
    handle: ModelHandle,
    samples: Sequence[Sample],
    config: PassageScoreConfig = PassageScoreConfig(),
    *,
    results: str | Path | None = None,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> PassageScores:
    """MuDAF retrieval scores of every head over multi-document QA ``samples``.

    Args:
        handle: the model.
        samples: samples with passages and golden ids (``interp_seal.tasks.passages`` or
            LongBench files with golden ids).
        config: threshold and capture backend.
        results: JSONL file for per-sample results (resumes from it).
        progress: show a progress bar.
        intervention: an edit of the model scored (composed with ``handle.edit``'s); it
            enters the results' fingerprint.
    """
    with handle.edit(intervention):
        if not samples:
            raise ValueError("no samples to score")

        def compute(sample: Sample) -> dict:
            pa = passage_attention(
                handle, sample, backend=config.backend, convention=config.convention
            )
            return {
                "golden": list(pa.golden),
                "attention": pa.attention.tolist(),
                "prefix": pa.prefix.tolist(),
            }

        setting = {"model": handle.identity, "score": "passage attention"}
        setting |= edits_manifest(handle)
        if config.convention != "paper":
            setting["convention"] = config.convention
        records = score_samples(
            samples,
            compute,
            setting=setting,
            results=results,
            desc="passage scores",
            progress=progress,
        )
        attention = [
            PassageAttention(
                attention=np.asarray(r["attention"]),
                prefix=np.asarray(r["prefix"]),
                golden=tuple(r["golden"]),
            )
            for r in records
        ]
        scored = []
        for record, pa in zip(records, attention, strict=True):
            f1, em = score_passages(
                torch.from_numpy(pa.attention),
                pa.golden,
                config.eps,
                em_attended_only=config.em_attended_only or config.convention == "mudaf_code",
            )
            scored.append((record["sample"], {"f1": f1.cpu().numpy(), "em": em.cpu().numpy()}))
        per_sample = _long(scored)
        heads = per_sample.groupby(["layer", "head"], as_index=False)[["f1", "em"]].mean()
        return PassageScores(
            heads=rank_heads(heads, ["f1", "em"]), per_sample=per_sample, attention=attention
        )


NIAH_FIELDS = ("context_length", "depth_percent", "needle_id")


def needle_retrieval_scores(
    handle: ModelHandle,
    samples: Sequence[Sample],
    config: CopyPasteConfig = CopyPasteConfig(),
    *,
    results: str | Path | None = None,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> NeedleScores:
    """Retrieval Head copy-paste scores of every head over needle ``samples`` (a NIAH grid).

    With ``convention="retrieval_head_code"``, ``per_sample`` also has ``rouge1_recall`` (of
    the needle by the decoded text) and ``kept`` (above 50%); heads average kept samples only.
        intervention: an edit of the model scored (composed with ``handle.edit``'s); it
            enters the results' fingerprint.
    """
    with handle.edit(intervention):
        if not samples:
            raise ValueError("no samples to score")
        peer = config.convention == "retrieval_head_code"

        def compute(sample: Sample) -> dict:
            cp = copy_paste_score(
                handle, sample, max_new_tokens=config.max_new_tokens, convention=config.convention
            )
            niah = {k: sample.meta[k] for k in NIAH_FIELDS if k in sample.meta}
            if peer:
                text = handle.tokenizer.decode(list(cp.generated), skip_special_tokens=True)
                recall = peers.rouge1_recall(sample.prompt[slice(*sample.needle)], text.strip())
                niah |= {"rouge1_recall": recall, "kept": recall > peers.ROUGE_RECALL}
            return {"score": cp.score.tolist(), "generated": list(cp.generated), "niah": niah}

        setting = {"model": handle.identity, "max_new_tokens": config.max_new_tokens}
        setting |= edits_manifest(handle)
        if peer:
            setting["convention"] = config.convention
        records = score_samples(
            samples,
            compute,
            setting=setting,
            results=results,
            desc="copy-paste scores",
            progress=progress,
        )
        per_sample = _long([(r["sample"], {"score": np.asarray(r["score"])}) for r in records])
        niah = pd.DataFrame([{"sample": r["sample"], **r["niah"]} for r in records])
        per_sample = per_sample.merge(niah, on="sample")
        kept = per_sample[per_sample["kept"]] if peer else per_sample
        heads = (
            per_sample[["layer", "head"]]
            .drop_duplicates()
            .merge(kept.groupby(["layer", "head"], as_index=False)["score"].mean(), how="left")
        )  # NaN for every head when no sample is kept
        heads["retrieval_head"] = heads["score"] > config.threshold
        return NeedleScores(heads=rank_heads(heads, ["score"]), per_sample=per_sample)
