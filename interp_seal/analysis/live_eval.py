"""Accuracy vs context length under a head edit, fast enough for an interactive dashboard.

The head-pruning dashboard (``interp_seal.widgets.dashboard``) re-evaluates retrieval after every click: prune a head,
scale it, undo. SEAL's Fig. 2d curves (accuracy per length under a multi-head scale table) are
exactly what each click asks for, on a fixed set of records. A full teacher-forced evaluation
(``interp_seal.evaluation.evaluate_lengths``) runs every layer at every position for every
record; most of that work does not depend on the edit:

- the layers below the lowest edited layer compute exactly what the unedited model computes;
- the last layer is needed only at the answer positions.

``EditEvaluator`` therefore runs the clean forward once, when it is built, caching (through the
forward engine, ``interp_seal.engine``) the residual stream entering every layer,
every layer's head outputs and values. Each ``evaluate(edit)`` then starts at the edit's lowest
layer with ``run_from_layer`` and returns the same numbers as ``evaluate_lengths`` under that
edit (greedy exact match by teacher forcing, answer log-probability), as a tidy table shaped like
a scale-table sweep's (``length``, ``metric``, ``value``, ``baseline``, ``delta``). An edit of the
top layer costs a few answer positions of one layer; an edit of layer 0 costs about one forward.

**Streaming KV heads** (``models.streaming_heads``: a KV head on sink + recent-window attention
instead of its whole prefix) change attention itself, not head outputs, so no cached head output
of their layers holds: ``evaluate(edit, streaming=config)`` runs under ``compress_kv`` from the
edit's lowest layer when it lies below every streaming head (the layers above run again, in the
streaming mode), and otherwise from the residual stream entering the lowest streaming layer,
its attention run again (``engine.run_from_input``). ``kv_budget(config)`` gives the bytes of keys and values a cache
keeps after each record's prompt (``streaming_heads.kv_budget_bytes``), per length, as
``analysis.kv_compression`` reports them.

Memory: the cache holds ``(records, tokens, d_model)`` per layer plus the head outputs and values,
a few times the size of one forward's activations: keep the record set dashboard-sized (tens of
records per length). ``batch_samples`` bounds the records per cached forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import pandas as pd
from tqdm.auto import tqdm

from interp_seal.analysis.sweeps import ProgressCallback, SweepUnit
from interp_seal.engine import (
    AnswerBatch,
    AnswerScores,
    CleanRun,
    clean_run,
    pad_id_of,
    run_from_input,
    run_from_layer,
)
from interp_seal.evaluation import encode_samples
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle, StreamingHeads, compress_kv, kv_budget_bytes
from interp_seal.tasks.sample import Encoded, Sample

METRICS = ("exact_match", "answer_logprob")


@dataclass(frozen=True, kw_only=True, eq=False)
class _Chunk:
    """Records of one length that share a cached clean forward."""

    length: int
    clean: CleanRun
    scores: AnswerScores  # of the clean run


class EditEvaluator:
    """Teacher-forced accuracy per length under any head edit, from a cached clean run.

    Args:
        handle: the model.
        samples: records grouped by length (number of lines for LongEval).
        batch_samples: records per cached clean forward.
        progress: show a progress bar while the clean forwards run.
        on_progress: called as ``on_progress(done, total)`` after each clean forward (a page
            shows its own progress this way).
    """

    def __init__(
        self,
        handle: ModelHandle,
        samples: Mapping[int, Sequence[Sample | Encoded]],
        *,
        batch_samples: int = 32,
        progress: bool = True,
        on_progress: ProgressCallback | None = None,
    ):
        if batch_samples < 1:
            raise ValueError(f"batch_samples must be >= 1, got {batch_samples}")
        if not samples or any(len(group) == 0 for group in samples.values()):
            raise ValueError("give at least one record for every length: {length: [samples]}")
        self.handle = handle
        encoded = {int(n): encode_samples(handle, group) for n, group in samples.items()}
        self.lengths = tuple(encoded)
        self.encoded = encoded
        starts = range(handle.spec.n_layers)
        pad_id = pad_id_of(handle.tokenizer)
        plan = [
            (length, group[lo : lo + batch_samples])
            for length, group in encoded.items()
            for lo in range(0, len(group), batch_samples)
        ]
        self._chunks: list[_Chunk] = []
        for done, (length, part) in enumerate(
            tqdm(plan, desc="clean runs", disable=not progress), 1
        ):
            batch = AnswerBatch.from_encoded(part, pad_id=pad_id)
            clean = clean_run(handle, batch, starts)
            self._chunks.append(
                _Chunk(length=length, clean=clean, scores=batch.score(clean.logits))
            )
            if on_progress is not None:
                on_progress(done, len(plan))
        self._base = self.per_sample(None).groupby("length", sort=False)[list(METRICS)].mean()

    def per_sample(
        self,
        intervention: HeadIntervention | None,
        *,
        streaming: StreamingHeads | None = None,
        on_length: Callable[[pd.DataFrame], None] | None = None,
    ) -> pd.DataFrame:
        """One row per record: ``length``, ``sample`` (index within its length), ``exact_match``,
        ``answer_logprob``, under ``intervention`` (None: the unedited model) and the
        ``streaming`` KV heads (None or no heads: every head full; module docstring).

        Lengths are computed in the order given; ``on_length`` receives the rows so far each
        time a length is complete (the dashboard draws them while the next one runs)."""
        if intervention is not None:
            intervention.check_model(self.handle.spec, self.handle.name_or_path)
            if intervention.batched:
                raise ValueError("evaluate one (L, H, D) edit at a time, not a batched one")
        if streaming is not None and not streaming.heads:
            streaming = None
        with compress_kv(self.handle, streaming) if streaming else nullcontext():
            return self._rows(intervention, streaming, on_length)

    def _rows(self, intervention, streaming, on_length) -> pd.DataFrame:
        layers = intervention.active_layers() if intervention is not None else []
        # a streaming head changes its layer's attention: no cached head output there holds
        below = min(layer for layer, _ in streaming.heads) if streaming else None
        rows, seen = [], dict.fromkeys(self.lengths, 0)
        for i, chunk in enumerate(self._chunks):
            scored = chunk.scores
            if layers and (below is None or layers[0] < below):
                logits = run_from_layer(self.handle, chunk.clean, layers[0], [intervention])
                scored = chunk.clean.batch.score(logits)
            elif below is not None:  # from the lowest streaming layer's input
                ivs = [intervention] if layers else []
                logits = run_from_input(self.handle, chunk.clean, below, ivs)
                scored = chunk.clean.batch.score(logits)
            for e, lp in zip(scored.exact.tolist(), scored.logprob.tolist(), strict=True):
                rows.append(
                    {
                        "length": chunk.length,
                        "sample": seen[chunk.length],
                        "exact_match": float(e),
                        "answer_logprob": float(lp),
                    }
                )
                seen[chunk.length] += 1
            last = i + 1 == len(self._chunks) or self._chunks[i + 1].length != chunk.length
            if on_length is not None and last:
                on_length(pd.DataFrame(rows))
        return pd.DataFrame(rows)

    def evaluate(
        self,
        intervention: HeadIntervention | None,
        *,
        streaming: StreamingHeads | None = None,
        on_length: Callable[[pd.DataFrame], None] | None = None,
    ) -> pd.DataFrame:
        """Per-length means under ``intervention`` and the ``streaming`` KV heads against the
        unedited model (every head full).

        Returns:
            Tidy table: ``length``, ``metric`` (``exact_match``, ``answer_logprob``), ``value``,
            ``baseline``, ``delta = value - baseline``; lengths in the order given.
            ``on_length`` receives the same table for the lengths done so far, each time one
            more is complete (the last call's table is the returned one).
        """
        partial = None if on_length is None else (lambda rows: on_length(self._means(rows)))
        return self._means(self.per_sample(intervention, streaming=streaming, on_length=partial))

    def kv_budget(self, streaming: StreamingHeads | None) -> pd.DataFrame:
        """The KV cache after each record's prompt under ``streaming`` (None: every head
        full), averaged per length: ``length``, ``tokens`` (mean prompt tokens), ``kv_bytes``
        (``streaming_heads.kv_budget_bytes`` at the model's precision), ``full_bytes`` (every
        head full) and ``kv_share = kv_bytes / full_bytes``, as ``analysis.kv_compression``
        reports them."""
        spec, itemsize = self.handle.spec, self.handle.dtype.itemsize
        rows = []
        for length, group in self.encoded.items():
            tokens = [len(enc.prompt_ids) for enc in group]
            kept = [kv_budget_bytes(streaming, spec, t, itemsize=itemsize) for t in tokens]
            full = [kv_budget_bytes(None, spec, t, itemsize=itemsize) for t in tokens]
            rows.append(
                {
                    "length": length,
                    "tokens": sum(tokens) / len(tokens),
                    "kv_bytes": sum(kept) / len(kept),
                    "full_bytes": sum(full) / len(full),
                }
            )
        table = pd.DataFrame(rows)
        table["kv_share"] = table["kv_bytes"] / table["full_bytes"]
        return table

    def _means(self, per_sample: pd.DataFrame) -> pd.DataFrame:
        """``evaluate``'s table from ``per_sample``'s rows (the lengths they cover)."""
        edited = per_sample.groupby("length", sort=False)[list(METRICS)].mean()
        base = self._base
        rows = [
            {
                "length": int(length),
                "metric": metric,
                "value": float(edited.loc[length, metric]),
                "baseline": float(base.loc[length, metric]),
            }
            for length in self.lengths
            if length in edited.index
            for metric in METRICS
        ]
        table = pd.DataFrame(rows)
        table["delta"] = table["value"] - table["baseline"]
        return table

    def sweep(
        self, units: Sequence[SweepUnit], *, on_progress: ProgressCallback | None = None
    ) -> pd.DataFrame:
        """``evaluate`` for each unit, stacked under the units' label columns: the layout of
        ``interp_seal.analysis.sweeps.run_sweep`` (e.g. a channel map's table, SEAL Fig. 2c)."""
        parts = []
        for done, unit in enumerate(units, 1):
            table = self.evaluate(unit.intervention)
            labels = pd.DataFrame([dict(unit.labels)] * len(table))
            parts.append(pd.concat([labels, table], axis=1))
            if on_progress is not None:
                on_progress(done, len(units))
        out = pd.concat(parts, ignore_index=True)
        for column in ("layer", "head", "channel"):
            if column in out:
                out[column] = out[column].astype("Int64")
        return out
