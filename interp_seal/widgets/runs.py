"""The dashboard's forwards: accuracy per length and channel maps under its current edits.

``EditEvaluator`` (``analysis.live_eval``) answers every edit from one cached *clean* run: an
edit's forward starts at its lowest edited layer. Once a layer-0 head is edited, every later
click starts at layer 0 again and costs a whole forward, whatever layer it edits. ``EditedRuns``
keeps, besides, one cached run of an edited state (the *anchor*): the edits of one layer ``m``,
with the residual stream entering every layer above ``m`` (``engine.clean_run`` under
``handle.edit``). A state that edits layer ``m`` the same way starts at its next edited layer on
the anchor, and a state equal to the anchor costs nothing. The anchor is built by the first
update that changes a layer above layer 0 while layer 0's edits stay as they were (its
forward, one whole forward, costs about one layer more than an update from layer 0; every
later click above layer 0 repays it: on the organism at the dashboard's defaults, 1.0 instead
of 4.9 CPU s per click), chunk by chunk with the update, so the accuracy still fills in
length by length; and before a channel map whose head lies above the edits. A click that
changes layer 0's edits starts at layer 0 on the clean run, as before (building the anchor
there would make every layer-0 click about 45 % slower).

Channel maps (SEAL Fig. 2c) are computed under the current edits: channel ``c`` of head ``(l, h)``
is zeroed on top of the edits (the head's other channels keep its factor), and the baseline is
the edited model. This is ``analysis.channel_sweep(..., intervention=edits)``'s definition, and
its numbers (tested). Units run from layer ``l`` (from the anchor when edits lie below ``l``),
grouped per forward the way ``analysis.run_sweep`` groups them (``SweepOptions``' rows and
samples), and reported group by group so the map fills in as it is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.analysis.sweeps import METRICS, SweepOptions
from interp_seal.engine import AnswerBatch, CleanRun, clean_run, pad_id_of, run_from_layer
from interp_seal.interventions import Head, HeadIntervention, scale_table
from interp_seal.models import StreamingHeads

Table = Mapping[Head, float]
LengthCallback = Callable[[pd.DataFrame], None]
ChannelCallback = Callable[[int, int, pd.DataFrame], None]


def restrict(table: Table, low: int = 0, high: int | None = None) -> dict[Head, float]:
    """The edits of ``table`` on layers ``low <= layer < high``."""
    return {
        (int(a), int(b)): float(f)
        for (a, b), f in table.items()
        if low <= a and (high is None or a < high)
    }


def lowest_layer(table: Table) -> int | None:
    return min((layer for layer, _ in table), default=None)


@dataclass(frozen=True, kw_only=True, eq=False)
class Anchor:
    """A cached run of the edits ``table`` (all on layer ``layer``): per chunk of records, the
    run's cache for starts above ``layer`` and its scores."""

    table: dict[Head, float]
    layer: int
    chunks: tuple[tuple[int, CleanRun], ...]  # (length, run) per chunk of records

    def covers(self, table: Table) -> bool:
        """Whether ``table`` edits layers ``<= layer`` exactly as the anchor does."""
        return restrict(table, 0, self.layer + 1) == self.table


class EditedRuns:
    """Accuracy per length and channel maps under any scale table, from ``evaluator``'s clean
    run and one anchor (module docstring).

    Args:
        evaluator: the records and their cached clean run.
        batch_samples: records per forward of the anchor and of channel maps.
        batch_rows: most rows (units x records) per forward of a channel map.
    """

    def __init__(
        self,
        evaluator: EditEvaluator,
        *,
        batch_samples: int = SweepOptions().batch_samples,
        batch_rows: int = SweepOptions().batch_rows,
    ):
        self.evaluator, self.handle = evaluator, evaluator.handle
        self.batch_samples, self.batch_rows = batch_samples, batch_rows
        self.unedited = evaluator.evaluate(None)
        self.anchor: Anchor | None = None
        self._last: dict[Head, float] = {}  # the table evaluated last
        pad_id = pad_id_of(self.handle.tokenizer)
        self._batches = [
            (length, AnswerBatch.from_encoded(group[lo : lo + batch_samples], pad_id=pad_id))
            for length, group in evaluator.encoded.items()
            for lo in range(0, len(group), batch_samples)
        ]

    # -- accuracy per length ---------------------------------------------------------------
    def evaluate(
        self,
        table: Table,
        *,
        streaming: StreamingHeads | None = None,
        on_length: LengthCallback | None = None,
    ) -> pd.DataFrame:
        """``EditEvaluator.evaluate``'s table for the scale table ``table`` (``{head: factor}``)
        and the ``streaming`` KV heads, lengths in order; ``on_length`` receives the lengths
        done so far after each one. With streaming heads the evaluator's own route runs (no
        anchor: its cached run holds full attention)."""
        table = restrict(table)
        last, self._last = self._last, table
        if streaming is not None and streaming.heads:
            iv = self._iv(table) if table else None
            return self.evaluator.evaluate(iv, streaming=streaming, on_length=on_length)
        if not table:
            if on_length is not None:
                on_length(self.unedited)
            return self.unedited
        if self.anchor is not None and self.anchor.covers(table):
            return self._means(self._rows_under(table, on_length=on_length))
        base = restrict(table, 0, 1)
        if base and base != table and base == restrict(last, 0, 1):
            # a change above layer 0's unchanged edits: cache their run on the way
            return self._means(self._set_anchor(base, then=table, on_length=on_length))
        # from the clean run at its lowest layer: the cheapest single update
        return self.evaluator.evaluate(self._iv(table), on_length=on_length)

    def _iv(self, table: Table) -> HeadIntervention:
        return scale_table(self.handle.spec, table)

    def _set_anchor(
        self,
        table: dict,
        *,
        then: dict | None = None,
        on_length: LengthCallback | None = None,
    ) -> list[dict]:
        """Run ``table`` (the edits of one layer) over every chunk of records, caching the
        layers above it: the new anchor (the old one is freed first). With ``then`` (covered
        by it), also its per-record rows, each chunk's right after its run (``on_length``
        after each length)."""
        self.anchor = None
        layer = lowest_layer(table)
        starts = range(layer + 1, self.handle.spec.n_layers)
        chunks, rows = [], []
        above = restrict(then or {}, layer + 1)
        for i, (length, batch) in enumerate(self._batches):
            with self.handle.edit(self._iv(table)):
                run = clean_run(self.handle, batch, starts)
            chunks.append((length, run))
            if then is not None:
                rows += self._rows_from(run, length, above, _count(rows, length))
                self._length_done(i, rows, on_length)
        self.anchor = Anchor(table=table, layer=layer, chunks=tuple(chunks))
        return rows

    def _rows_from(self, run: CleanRun, length: int, above: dict, offset: int) -> list[dict]:
        """Rows of ``run``'s records under ``above`` (edits above the run's own) from their
        lowest layer; ``run``'s own scores when there are none."""
        if above:
            logits = run_from_layer(self.handle, run, lowest_layer(above), [self._iv(above)])
        else:
            logits = run.logits
        scores = run.batch.score(logits)
        return _rows(length, scores.exact, scores.logprob, offset)

    def _rows_under(self, table: dict, *, on_length: LengthCallback | None = None) -> list:
        """Per-record rows of ``table`` (covered by the anchor): the anchor's own scores, or
        a run from ``table``'s next edited layer above the anchor's."""
        above = restrict(table, self.anchor.layer + 1)
        rows = []
        for i, (length, run) in enumerate(self.anchor.chunks):
            rows += self._rows_from(run, length, above, _count(rows, length))
            self._length_done(i, rows, on_length)
        return rows

    def _length_done(self, i: int, rows: list, on_length: LengthCallback | None) -> None:
        """Call ``on_length`` when chunk ``i`` was the last of its length."""
        last = i + 1 == len(self._batches) or self._batches[i + 1][0] != self._batches[i][0]
        if on_length is not None and last:
            on_length(self._means(rows))

    def _means(self, rows: list[dict]) -> pd.DataFrame:
        """``EditEvaluator.evaluate``'s table from per-record rows (the lengths they cover)."""
        edited = pd.DataFrame(rows).groupby("length", sort=False)[list(METRICS)].mean()
        base = self.unedited.set_index(["length", "metric"]).baseline
        out = pd.DataFrame(
            [
                {
                    "length": int(length),
                    "metric": metric,
                    "value": float(edited.loc[length, metric]),
                    "baseline": float(base.loc[(length, metric)]),
                }
                for length in self.evaluator.lengths
                if length in edited.index
                for metric in METRICS
            ]
        )
        out["delta"] = out["value"] - out["baseline"]
        return out

    # -- channel maps ----------------------------------------------------------------------
    def channel_table(
        self,
        head: Head,
        table: Table,
        *,
        channels: Sequence[int] | None = None,
        on_progress: ChannelCallback | None = None,
        on_forward: Callable[[int, int], None] | None = None,
        on_prepare: Callable[[], None] | None = None,
    ) -> pd.DataFrame:
        """Channel ``c`` of ``head`` zeroed on top of the edits ``table``, for each channel.

        Args:
            head: ``(layer, head)``.
            table: the edits every unit carries (``{head: factor}``); ``head``'s own factor
                stays on its other channels. The baseline is ``table`` itself, computed on
                the same path as the units (a channel that changes nothing has delta 0).
            channels: default all ``d_head``.
            on_progress: ``on_progress(done, total, table so far)`` after each group of
                channels.
            on_forward: ``on_forward(done, total)`` after each forward (finer progress).
            on_prepare: called before an anchor is built for edits below ``head``.

        Returns:
            ``channel_sweep``'s table: ``layer``, ``head``, ``channel``, ``length``, ``metric``,
            ``value``, ``baseline`` (the edited model), ``delta``.
        """
        layer, index = head
        channels = list(range(self.handle.spec.d_head) if channels is None else channels)
        table = restrict(table)
        below = restrict(table, 0, layer)
        if below:  # run from the anchor of the lowest edited layer
            low = lowest_layer(below)
            if self.anchor is None or not self.anchor.covers(below):
                if on_prepare is not None:
                    on_prepare()
                self._set_anchor(restrict(below, low, low + 1))
            between = lowest_layer(restrict(table, low + 1, layer))  # edited layers in between
            start = layer if between is None else between
            carried, group = restrict(table, start), max(1, self.batch_rows // self.batch_samples)
            baseline = self._means(self._rows_under(table))
        else:  # from the clean run, through the evaluator
            start, carried, group = layer, table, 1
            baseline = self.evaluator.evaluate(self._iv(table) if table else None)

        def unit(c: int) -> HeadIntervention:
            iv = self._iv(carried)
            iv.scale[layer, index, c] = 0.0
            return iv

        done: list[dict] = []
        if below:  # forwards: one per group of channels and chunk of records
            total = -(-len(channels) // group) * len(self.anchor.chunks)
        else:  # the evaluator's: one per channel and length
            total = len(channels) * len(self.evaluator.lengths)
        forwards = 0

        def step(*_) -> None:
            nonlocal forwards
            forwards += 1
            if on_forward is not None:
                on_forward(forwards, total)

        for lo in range(0, len(channels), group):
            part = channels[lo : lo + group]
            ivs = [unit(c) for c in part]
            if below:
                per_unit: list[list[dict]] = [[] for _ in part]
                for length, run in self.anchor.chunks:
                    scores = run.batch.score(run_from_layer(self.handle, run, start, ivs))
                    n = len(run.batch)
                    for a, rows in enumerate(per_unit):
                        exact = scores.exact[a * n : (a + 1) * n]
                        logprob = scores.logprob[a * n : (a + 1) * n]
                        rows += _rows(length, exact, logprob, _count(rows, length))
                    step()
            else:  # the evaluator reports each length
                per_unit = [
                    self.evaluator.per_sample(iv, on_length=step).to_dict("records") for iv in ivs
                ]
            for c, rows in zip(part, per_unit, strict=True):
                means = self._means(rows)[["length", "metric", "value"]]
                done += [
                    {"layer": layer, "head": index, "channel": c, **row}
                    for row in means.to_dict("records")
                ]
            if on_progress is not None:
                on_progress(lo + len(part), len(channels), _channel_table(done, baseline))
        return _channel_table(done, baseline)


def _channel_table(rows: list[dict], baseline: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(rows).merge(
        baseline[["length", "metric", "value"]].rename(columns={"value": "baseline"}),
        on=["length", "metric"],
        how="left",
    )
    out["delta"] = out["value"] - out["baseline"]
    for column in ("layer", "head", "channel"):
        out[column] = out[column].astype("Int64")
    return out


def _rows(length: int, exact, logprob, offset: int) -> list[dict]:
    """Per-record rows: ``length``, ``sample`` (from ``offset``), ``exact_match``,
    ``answer_logprob``."""
    return [
        {"length": length, "sample": offset + i, "exact_match": float(e), "answer_logprob": lp}
        for i, (e, lp) in enumerate(zip(exact.tolist(), logprob.tolist(), strict=True))
    ]


def _count(rows: list[dict], length: int) -> int:
    return sum(row["length"] == length for row in rows)
