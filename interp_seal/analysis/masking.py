"""Are the retrieval heads needed? Mask them and measure the task (MuDAF Sec. 3.1, Fig. 4).

MuDAF ranks heads by their passage-level retrieval score, masks the strongest ones and shows
that multi-document QA collapses, while masking as many random heads, or the NIAH retrieval
heads of Wu et al. (copy-paste score), hurts far less. The conditions here:

- ``"none"``: the unedited model (baseline);
- ``"retrieval"``: the top-``k`` heads of a ranked score table (``rank`` column, e.g.
  ``PassageScores.heads``);
- ``"random"``: ``k`` heads drawn uniformly from the heads *outside* that top set, one draw
  per seed;
- ``"niah"``: the top-``k`` heads by copy-paste score (``NeedleScores.heads``), if given; any
  other ranked table given beside the retrieval scores (``others``: e.g. QRHead's scores, an
  ablation sweep's ranking, ``analysis.head_definitions``) is masked the same way, under its
  name. The random control always avoids the ``retrieval`` table's top set.

MuDAF's Fig. 4 instead draws the ``k`` masked retrieval (and NIAH) heads at random from a
fixed set of retrieval heads (their top 50, about 5% of Llama-3.1-8B's heads) and averages
three runs; ``pool=50`` does that: every seed draws ``k`` of the top-``pool`` heads, and the
random control avoids the whole top-``pool`` set.

each in every masking mode (``interp_seal.interventions.ablate``): ``"zero"`` sets the head's
output to 0 (SEAL's pruning); ``"uniform"`` makes the head attend uniformly to its causal
prefix (what the MuDAF and Retrieval Head code do by zeroing pre-softmax scores).

The task score is greedy exact match by teacher forcing (one forward per sample,
``interp_seal.evaluation.teacher_force``), the first answer token's accuracy and the mean
answer log-probability; with ``qa_f1=True`` also LongBench's QA token F1 of the greedily
decoded answer (decoded without a KV cache, so that uniform attention stays exact).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from interp_seal.engine import greedy_decode
from interp_seal.evaluation import qa_f1, teacher_force
from interp_seal.interventions import Head, HeadEdit, HeadIntervention, ablate
from interp_seal.interventions.hf import edits_manifest
from interp_seal.models import ModelHandle
from interp_seal.records import RecordStore, fingerprint
from interp_seal.shards import Shard
from interp_seal.tasks.sample import Sample

MASK_MODES = ("zero", "uniform")
COLUMNS = [
    "strategy",
    "mode",
    "k",
    "seed",
    "heads",
    "exact_match",
    "first_token",
    "answer_logprob",
    "qa_f1",
    "n_samples",
]


@dataclass(frozen=True, kw_only=True)
class MaskingConfig:
    """The masking experiment's conditions.

    Attributes:
        ks: numbers of heads to mask.
        modes: masking modes, from ``MASK_MODES``.
        seeds: one random-heads draw per seed.
        pool: if set, the retrieval / NIAH heads of each seed are ``k`` heads drawn from the
            top ``pool`` (MuDAF Fig. 4: 50) instead of the top ``k``.
        qa_f1: also decode greedily and score LongBench QA F1 (slower: no KV cache).
        max_new_tokens: greedy decoding budget for ``qa_f1``.
        batch_size: samples per teacher-forced forward.
    """

    ks: tuple[int, ...] = (16,)
    modes: tuple[str, ...] = MASK_MODES
    seeds: tuple[int, ...] = (0, 1, 2)
    pool: int | None = None
    qa_f1: bool = False
    max_new_tokens: int = 32
    batch_size: int = 1

    def __post_init__(self):
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"ks must be positive head counts, got {self.ks}")
        bad = [m for m in self.modes if m not in MASK_MODES]
        if not self.modes or bad:
            raise ValueError(f"modes must be taken from {MASK_MODES}, got {self.modes}")
        if not self.seeds:
            raise ValueError("seeds is empty: the random-heads control needs at least one draw")
        if self.pool is not None and self.pool < max(self.ks):
            raise ValueError(f"pool={self.pool} is smaller than the largest k {max(self.ks)}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be >= 1")


def top_ranked(ranked: pd.DataFrame, k: int) -> list[Head]:
    """The ``k`` best heads of a score table with ``layer``, ``head`` and ``rank`` columns."""
    missing = {"layer", "head", "rank"} - set(ranked.columns)
    if missing:
        raise ValueError(f"the score table lacks columns {sorted(missing)} (use a .heads table)")
    if k > len(ranked):
        raise ValueError(f"cannot take the top {k} heads of a table of {len(ranked)}")
    best = ranked.sort_values("rank").head(k)
    return [
        (int(layer), int(head)) for layer, head in zip(best["layer"], best["head"], strict=True)
    ]


def draw(pool: Sequence[Head], k: int, seed: str) -> list[Head]:
    """``k`` heads drawn without replacement from ``pool``, reproducibly from ``seed``."""
    if k > len(pool):
        raise ValueError(f"only {len(pool)} heads to draw from; cannot draw {k}")
    return sorted(random.Random(seed).sample(list(pool), k))


RESERVED = ("none", "retrieval", "random")  # strategy names ``others`` cannot take


def conditions(
    handle: ModelHandle,
    retrieval: pd.DataFrame,
    others: Mapping[str, pd.DataFrame] | None,
    config: MaskingConfig,
) -> list[dict]:
    """Every (strategy, mode, k, seed, heads) to evaluate, baseline first: the ``retrieval``
    table's top heads, then each of ``others`` under its name, then the random draws."""
    L, H = handle.spec.n_layers, handle.spec.n_heads
    out = [{"strategy": "none", "mode": "none", "k": 0, "seed": -1, "heads": []}]
    taken = sorted(set(others or {}) & set(RESERVED))
    if taken:
        raise ValueError(f"ranked tables cannot be named {taken}: those names are the conditions'")
    tables = {"retrieval": retrieval} | dict(others or {})
    for k in config.ks:
        top = top_ranked(retrieval, config.pool or k)
        outside = [(i, j) for i in range(L) for j in range(H) if (i, j) not in set(top)]
        sets = []
        for name, table in tables.items():
            if config.pool is None:
                sets.append((name, -1, top_ranked(table, k)))
            else:
                best = top_ranked(table, config.pool)
                sets += [(name, s, draw(best, k, f"{name}/{k}/{s}")) for s in config.seeds]
        sets += [("random", s, draw(outside, k, f"random/{k}/{s}")) for s in config.seeds]
        for mode in config.modes:
            for strategy, seed, heads in sets:
                out.append(
                    {"strategy": strategy, "mode": mode, "k": k, "seed": seed, "heads": heads}
                )
    return out


def greedy_text(
    handle: ModelHandle,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    intervention: HeadIntervention | None = None,
) -> str:
    """Greedy continuation of ``prompt_ids`` up to EOS or a newline (neither included)."""
    tok = handle.tokenizer

    def newline(token: int) -> bool:
        return "\n" in tok.decode([token])

    new = greedy_decode(handle, prompt_ids, max_new_tokens, intervention=intervention, stop=newline)
    if new[-1] == tok.eos_token_id or newline(new[-1]):
        new = new[:-1]
    return tok.decode(new)


def evaluate_condition(
    handle: ModelHandle, samples: Sequence[Sample], condition: dict, config: MaskingConfig
) -> dict:
    """Task scores of ``samples`` with ``condition``'s heads masked."""
    iv = None
    if condition["heads"]:
        iv = ablate(handle.spec, condition["heads"], condition["mode"])
    scores = teacher_force(handle, samples, intervention=iv, batch_size=config.batch_size)
    row = {
        "exact_match": float(np.mean([s.exact_match for s in scores])),
        "first_token": float(np.mean([s.first_token for s in scores])),
        "answer_logprob": float(np.mean([s.answer_logprob for s in scores])),
        "qa_f1": float("nan"),
        "n_samples": len(scores),
        "correct": [int(s.exact_match) for s in scores],  # per sample, for paired tests
    }
    if config.qa_f1:
        f1s = []
        for sample in samples:
            prompt = sample.encode(handle.tokenizer).prompt_ids
            text = greedy_text(handle, prompt, config.max_new_tokens, iv)
            f1s.append(qa_f1(text, sample.meta.get("answers") or [sample.answer]))
        row["qa_f1"] = float(np.mean(f1s))
    return row


def masking_experiment(
    handle: ModelHandle,
    samples: Sequence[Sample],
    retrieval: pd.DataFrame,
    *,
    others: Mapping[str, pd.DataFrame] | None = None,
    config: MaskingConfig = MaskingConfig(),
    results: str | Path | None = None,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """MuDAF Fig. 4: task scores with top retrieval heads, random heads or other heads masked.

    Args:
        handle: the model.
        samples: task samples with answers (e.g. multi-document QA).
        retrieval: ranked head table (``layer, head, rank``) whose top heads are masked.
        others: more ranked head tables by name, each masked as a strategy of that name
            (MuDAF Fig. 4: ``{"niah": <copy-paste scores>}``).
        config: ks, modes, seeds, metrics.
        results: JSONL file of finished conditions (a restart skips them).
        progress: show a progress bar over conditions.
        intervention: an edit of the model under which every condition (the unmasked one
            included) is evaluated, composed with ``handle.edit``'s; it enters the fingerprint.

    Returns one row per condition with ``COLUMNS`` and ``correct`` (each sample's 0/1 exact
    match, for paired tests between conditions); ``seed`` is -1 for deterministic head sets,
    ``heads`` a string of ``layer.head`` names.
    """
    with handle.edit(intervention):
        if not samples:
            raise ValueError("no samples to evaluate")
        shard = Shard.current()
        log = RecordStore(results, shard) if results is not None else None
        data = fingerprint(
            handle.identity,
            [(s.prompt, s.answer) for s in samples],
            config.qa_f1,
            config.max_new_tokens,
            edits_manifest(handle),
        )
        every = conditions(handle, retrieval, others, config)
        mine = [i for i in range(len(every)) if shard.owns(i)]
        rows = []
        for i in tqdm(mine, desc="masking", disable=not progress):
            cond = every[i]
            key = f"{cond['strategy']}/{cond['mode']}/k={cond['k']}/seed={cond['seed']}"
            print_ = fingerprint(data, cond["heads"])
            record = log.get(key, print_) if log else None
            if record is None:
                record = {"key": key, "fingerprint": print_, **cond}
                record |= evaluate_condition(handle, samples, cond, config)
                if log:
                    log.add(record)
            rows.append((i, {c: record.get(c) for c in (*COLUMNS, "correct")}))
        if shard.world > 1:
            rows = sorted(shard.gather(rows), key=lambda row: row[0])
            if log:
                log.merge()
        rows = [row for _, row in rows]
        frame = pd.DataFrame(rows, columns=[*COLUMNS, "correct"])
        frame["heads"] = frame["heads"].map(
            lambda hs: " ".join(f"{layer}.{head}" for layer, head in hs)
        )
        return frame
