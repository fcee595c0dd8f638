"""Head-level KV compression chosen by a retrieval-head definition: accuracy against KV budget.

DuoAttention (Xiao et al. 2024) and RazorAttention (Tang et al. 2024) keep a full KV cache for
a few *retrieval* KV heads and give every other KV head a sink + recent window
(``models.streaming_heads``), saving the middle of those heads' caches. Which heads stay full
is the whole method, and each paper picks them its own way (learned gates; a retrieval score).
``compression_curve`` runs that choice for any ranking of heads (``head_definitions``: copy-paste,
MuDAF passage, QRHead, causal ablation, or gates), keeping the best ``m`` KV heads full for
each ``m`` in ``full_counts`` and streaming the rest, and measures teacher-forced exact match
by context length beside the bytes the cache keeps. Two baselines come with every curve:
``"random"`` (KV heads in a seeded random order, one order per seed) and the common end points,
``m = 0`` (every head streaming: StreamingLLM) and all heads full (the unedited model).

Rankings rank *query* heads; the cache is per *KV* head. With grouped-query attention query
head ``i`` reads KV head ``i // group``, so a KV head ranks by the best rank among its query
heads (``kv_head_order``): it stays full as soon as one of its readers is wanted.

The KV budget (``kv_bytes``) is what the cache holds after each record's prompt, in bytes at
the model's parameter precision, averaged over the records of a length
(``streaming_heads.kv_budget_bytes``); ``kv_share`` divides it by the all-full cache's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from interp_seal.evaluation import teacher_force
from interp_seal.models import ModelHandle, StreamingHeads, compress_kv, kv_budget_bytes
from interp_seal.models.spec import ModelSpec
from interp_seal.records import RecordStore, fingerprint
from interp_seal.tasks.sample import Sample

KVHead = tuple[int, int]  # (layer, KV head)


def kv_heads(spec: ModelSpec) -> list[KVHead]:
    """Every ``(layer, KV head)`` of the model, layer-major."""
    return sorted(StreamingHeads.all_heads(spec).heads)


def kv_head_order(ranking: pd.DataFrame, spec: ModelSpec) -> list[KVHead]:
    """Every KV head, best first: ranked by the best (smallest) ``rank`` among the query heads
    that read it (ties: earlier layer, then lower KV head)."""
    missing = {"layer", "head", "rank"} - set(ranking.columns)
    if missing:
        raise ValueError(f"the ranking lacks columns {sorted(missing)}")
    group = spec.n_heads // spec.n_kv_heads
    best: dict[KVHead, float] = {}
    for layer, head, rank in zip(ranking["layer"], ranking["head"], ranking["rank"], strict=True):
        if not (0 <= layer < spec.n_layers and 0 <= head < spec.n_heads):
            raise ValueError(f"the ranking names head L{layer}H{head}, outside the model")
        key = (int(layer), int(head) // group)
        best[key] = min(best.get(key, np.inf), float(rank))
    return sorted(kv_heads(spec), key=lambda kv: (best.get(kv, np.inf), kv))


def kv_tie_at_cut(ranking: pd.DataFrame, group: int, full: int) -> tuple[int, int]:
    """``head_definitions.tie_at_cut`` for KV heads: is the choice of the best ``full`` KV heads
    (``kv_head_order``: a KV head scores what its best reader scores) fixed by the ranking's
    ``score``? ``(inside, tied)``: of the KV heads scoring what the ``full``-th scores, how many
    are kept full and how many there are; ``(0, 0)`` without a ``score`` column. Where
    ``inside < tied`` the full set is layer / head order, not the definition's."""
    from interp_seal.analysis.head_definitions import tie_at_cut

    if "score" not in ranking.columns or full <= 0:
        return (0, 0)
    best = ranking.assign(kv=ranking["head"] // group).groupby(["layer", "kv"])["score"].max()
    order = pd.DataFrame({"score": best.to_numpy(), "rank": (-best).rank(method="first")})
    return tie_at_cut(order, full)


def random_order(spec: ModelSpec, seed: int) -> list[KVHead]:
    """Every KV head in a random order, reproducibly from ``seed``."""
    every = kv_heads(spec)
    return random.Random(f"kv/{seed}").sample(every, len(every))


def streaming_config(order: Sequence[KVHead], full: int, *, sink: int, window: int):
    """The first ``full`` KV heads of ``order`` full, the rest streaming."""
    return StreamingHeads(heads=frozenset(order[full:]), sink=sink, window=window)


def compression_curve(
    handle: ModelHandle,
    samples: Mapping[int, Sequence[Sample]],
    rankings: Mapping[str, pd.DataFrame],
    *,
    full_counts: Sequence[int],
    sink: int = 4,
    window: int = 256,
    random_seeds: Sequence[int] = (0,),
    batch_size: int = 1,
    results: str | Path | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Exact match by length with the top ``m`` KV heads of each ranking full and the others
    streaming, for each ``m`` in ``full_counts`` (module docstring).

    Args:
        handle: the model.
        samples: records by context length (e.g. ``evaluation.line_retrieval_samples``).
        rankings: name -> ranked head table (``layer``, ``head``, ``rank``).
        full_counts: numbers of full KV heads; 0 (all streaming) and all (the unedited model)
            are added.
        sink, window: the streaming heads' attention sinks and recent window.
        random_seeds: one random KV-head order per seed (definition ``"random"``).
        batch_size: records per teacher-forced forward.
        results: JSONL file of finished conditions (a restart skips them).
        progress: show a progress bar over conditions.

    Returns one row per (definition, random_seed, full KV heads, length): ``exact_match``, ``n``,
    ``kv_bytes``, ``kv_share`` and ``correct`` (each record's 0/1 exact match, for paired
    tests); the end points have definition ``"all streaming"`` / ``"all full"``.
    """
    spec = handle.spec
    total = spec.n_layers * spec.n_kv_heads
    bad = [m for m in full_counts if not 0 <= m <= total]
    if bad:
        raise ValueError(
            f"full_counts {bad} outside 0..{total}: the model has {total} KV heads; give counts "
            "up to that"
        )
    taken = sorted(set(rankings) & {"random", "all streaming", "all full"})
    if taken:
        raise ValueError(f"rankings cannot be named {taken}: those names are the baselines'")
    orders = {name: (kv_head_order(table, spec), -1) for name, table in rankings.items()}
    orders |= {f"random/{s}": (random_order(spec, s), s) for s in random_seeds}
    counts = sorted({m for m in full_counts if 0 < m < total})
    conditions = [("all streaming", -1, 0, kv_heads(spec)), ("all full", -1, total, None)]
    for key, (order, seed) in orders.items():
        name = "random" if key.startswith("random/") else key
        conditions += [(name, seed, m, order) for m in counts]
    log = RecordStore(results) if results is not None else None
    data = fingerprint(
        handle.identity,
        {L: [(s.prompt, s.answer) for s in batch] for L, batch in samples.items()},
        sink,
        window,
    )
    itemsize = next(handle.model.parameters()).element_size()
    rows = []
    for name, seed, m, order in tqdm(conditions, desc="KV compression", disable=not progress):
        config = None if order is None else streaming_config(order, m, sink=sink, window=window)
        key = f"{name}/seed={seed}/full={m}"
        stamp = fingerprint(data, sorted(config.heads) if config else None)
        record = log.get(key, stamp) if log else None
        if record is None:
            record = {"key": key, "fingerprint": stamp, "lengths": {}}
            for length, batch in samples.items():
                record["lengths"][str(length)] = _score(handle, batch, config, batch_size)
            if log:
                log.add(record)
        for length in samples:
            correct, tokens = record["lengths"][str(length)]
            kept = np.mean([kv_budget_bytes(config, spec, t, itemsize=itemsize) for t in tokens])
            full = np.mean([kv_budget_bytes(None, spec, t, itemsize=itemsize) for t in tokens])
            rows.append(
                {
                    "definition": name,
                    "random_seed": seed,
                    "full_kv_heads": m,
                    "length": length,
                    "exact_match": float(np.mean(correct)),
                    "n": len(correct),
                    "kv_bytes": float(kept),
                    "kv_share": float(kept / full),
                    "correct": list(correct),
                }
            )
    return pd.DataFrame(rows)


def _score(handle, batch, config, batch_size) -> tuple[list[int], list[int]]:
    """Each record's 0/1 exact match under ``config`` (None: plain attention), and its prompt's
    token count."""
    tokens = [len(s.encode(handle.tokenizer).prompt_ids) for s in batch]
    if config is None:
        scores = teacher_force(handle, batch, batch_size=batch_size)
    else:
        with compress_kv(handle, config):
            scores = teacher_force(handle, batch, batch_size=batch_size)
    return [int(s.exact_match) for s in scores], tokens
