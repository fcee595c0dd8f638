"""Ablation sweeps: how retrieval changes when one head, one channel or a scale table is edited.

SEAL's motivation (Sec. 3, Fig. 2) is a set of sweeps on LongEval line retrieval:

- **per-head pruning** (Sec. 3.1, Fig. 2b): zero one head at a time and compare accuracy with
  the unablated model, at a mid and a long context length. Some heads hurt retrieval when
  pruned, others *help* it: the sign of the change sorts heads into quadrants
  (``interp_seal.analysis.quadrants``);
- **multi-head scaling** (Sec. 3.2, Fig. 2d): scale whole groups of heads at once (every Q1 head
  x 0.9, every Q3 head x 1.1) and follow accuracy across lengths;
- **per-channel pruning** (Sec. 3.3, Fig. 2c): zero one channel of a chosen head at a time;
  within a head, a few channels carry most of the effect.

All three are one generic driver, ``run_sweep``: a list of ``SweepUnit`` (labels plus a
``HeadIntervention``, in any ablation mode of the primitive) evaluated on samples grouped by
context length. Metrics per sample are greedy exact match by teacher forcing and the answer's
log-probability; the result is a tidy DataFrame (label columns, ``length``, ``metric``,
``value``, ``baseline``, ``delta = value - baseline``) with per-length means over samples.
``head_sweep``, ``channel_sweep`` and ``scale_table_sweep`` are thin wrappers that build units.

Speed (``interp_seal.engine``): one clean forward per batch of samples caches
the residual stream; each edit starts at its first edited layer, edits with the same start
share a forward (one block of rows per edit), and the last layer and the unembedding run only at
answer positions. Results equal a one-forward-per-edit loop of ``hf_logits``.

Resumable (``interp_seal.records``): with ``SweepOptions(out=...)`` every finished forward
is appended to ``out/records.jsonl``; rerun with ``resume=True`` and the same arguments, the
sweep skips what is on disk and ends with the same table.

Sharded (``interp_seal.shards``): under ``torchrun --nproc_per_node N`` each rank runs every
N-th edited forward of the one-process plan and appends to its own record file; the ranks
exchange their records at the end, so every rank returns the one-process table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp_seal.engine import AnswerBatch, clean_run, pad_id_of, run_from_layer
from interp_seal.evaluation.teacher_forcing import encode_samples
from interp_seal.interventions import (
    Head,
    HeadEdit,
    HeadIntervention,
    ablate,
    capture_head_outputs,
    scale_table,
)
from interp_seal.interventions.hf import edits_manifest
from interp_seal.models import ModelHandle
from interp_seal.records import RecordStore, fingerprint
from interp_seal.shards import Shard
from interp_seal.tasks.sample import Encoded, Sample

METRICS = ("exact_match", "answer_logprob")
BASELINE = -1  # unit index of the unedited model in the records
SamplesByLength = Mapping[int, Sequence[Sample | Encoded]]
ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    """How a sweep runs. Results do not depend on these (batching only groups the work).

    Attributes:
        out: directory for incremental results and the manifest; None keeps them in memory.
        resume: continue the sweep already in ``out`` (it must have the same arguments).
        batch_rows: most rows (edits x samples) in one edited forward. The default suits a
            CPU (small batches stay in cache); raise it on a GPU.
        batch_samples: samples per clean forward (and per block of rows).
        progress: show a tqdm progress bar over forwards.
    """

    out: str | Path | None = None
    resume: bool = False
    batch_rows: int = 8
    batch_samples: int = 4
    progress: bool = True

    def __post_init__(self):
        if self.batch_rows < 1 or self.batch_samples < 1:
            raise ValueError(
                f"batch_rows ({self.batch_rows}) and batch_samples ({self.batch_samples}) "
                "must be >= 1"
            )
        if self.resume and self.out is None:
            raise ValueError("resume=True needs an output directory (out=...) to resume from")


@dataclass(frozen=True, kw_only=True, eq=False)
class SweepUnit:
    """One edit of a sweep.

    Attributes:
        labels: its columns in the result table, e.g. ``{"layer": 1, "head": 3, "channel": None}``.
        intervention: the unbatched ``(L, H, D)`` edit.
    """

    labels: Mapping[str, object]
    intervention: HeadIntervention = field(repr=False)

    def __post_init__(self):
        if self.intervention.batched:
            raise ValueError(f"unit {dict(self.labels)} has a batched intervention; give one table")


@dataclass(frozen=True, kw_only=True)
class _Step:
    """One clean forward over a chunk of samples, then edited forwards ``(start, units)``;
    ``baseline``: the clean forward's own scores are recorded (the unedited model)."""

    length: int
    chunk: tuple[int, ...]
    groups: tuple[tuple[int, tuple[int, ...]], ...]
    baseline: bool = True


def run_sweep(
    handle: ModelHandle,
    samples: SamplesByLength,
    units: Sequence[SweepUnit],
    *,
    options: SweepOptions = SweepOptions(),
    args: Mapping | None = None,
    on_progress: ProgressCallback | None = None,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """Evaluate every unit on every sample; per-length means and deltas against the baseline.

    Args:
        handle: the model.
        samples: samples grouped by context length (the key labels the ``length`` column).
        units: the edits.
        options: output directory, resumption, batch sizes, progress bar.
        args: human-readable description of the sweep, stored in the manifest.
        on_progress: called as ``on_progress(done, total)`` after each forward is saved.

    Returns:
        Tidy DataFrame: the units' label columns, ``length``, ``metric`` (``exact_match``: the
        fraction of samples whose answer greedy decoding reproduces; ``answer_logprob``: mean
        natural-log probability of the answer), ``value``, ``baseline`` (unedited model) and
        ``delta = value - baseline``.
        intervention: an edit of the model every run of the sweep sees, the baseline
            included, composed with the handle's active edits (``handle.edit``): the sweep of
            the edited model. It enters the manifest.
    """
    with handle.edit(intervention):
        if not units:
            raise ValueError("a sweep needs at least one unit (head, channel or scale table)")
        if not samples or any(len(batch) == 0 for batch in samples.values()):
            raise ValueError("give at least one sample for every length: {length: [samples]}")
        encoded = {int(length): encode_samples(handle, batch) for length, batch in samples.items()}
        shard = Shard.current()
        store = None
        done: dict = {}
        if options.out is not None:
            manifest = sweep_manifest(
                handle,
                encoded,
                [u.intervention for u in units],
                [u.labels for u in units],
                args or {},
            )
            store = RecordStore.open(options.out, manifest, resume=options.resume)
            fields = ("length", "sample", "unit", "exact_match", "answer_logprob")
            done = {(rec["length"], rec["sample"], rec["unit"]): rec for rec in store.load(fields)}
            shard.barrier()  # every rank plans from the same finished records
        starts = [min(u.intervention.active_layers(), default=handle.spec.n_layers) for u in units]
        steps = _share(_plan(encoded, starts, done, options, handle.spec.n_layers), shard)
        total = sum(step.baseline + len(step.groups) for step in steps)
        pad_id = pad_id_of(handle.tokenizer)
        finished = 0
        new: list[dict] = []
        with tqdm(total=total, desc="ablation sweep", disable=not options.progress) as bar:

            def save(length: int, chunk: tuple[int, ...], unit_ids, exact, logprob) -> None:
                """Record rows ``a * len(chunk) + i`` as sample ``chunk[i]`` under ``unit_ids[a]``."""
                nonlocal finished
                exact, logprob = exact.tolist(), logprob.tolist()
                records = [
                    {
                        "length": length,
                        "sample": s,
                        "unit": u,
                        "exact_match": exact[a * len(chunk) + i],
                        "answer_logprob": logprob[a * len(chunk) + i],
                    }
                    for a, u in enumerate(unit_ids)
                    for i, s in enumerate(chunk)
                ]
                records = [r for r in records if (length, r["sample"], r["unit"]) not in done]
                new.extend(records)
                if store is not None:
                    store.append(records)
                bar.update(1)
                finished += 1
                if on_progress is not None:
                    on_progress(finished, total)

            for step in steps:
                batch = AnswerBatch.from_encoded(
                    [encoded[step.length][s] for s in step.chunk], pad_id=pad_id
                )
                clean = clean_run(handle, batch, [start for start, _ in step.groups])
                if step.baseline:
                    scored = batch.score(clean.logits)
                    unedited = [BASELINE] + [
                        u for u, s in enumerate(starts) if s == handle.spec.n_layers
                    ]
                    n = len(unedited)  # the baseline, and units that edit nothing
                    save(
                        step.length,
                        step.chunk,
                        unedited,
                        scored.exact.repeat(n),
                        scored.logprob.repeat(n),
                    )
                for start, unit_ids in step.groups:
                    ivs = [units[u].intervention for u in unit_ids]
                    scored = batch.score(run_from_layer(handle, clean, start, ivs))
                    save(step.length, step.chunk, unit_ids, scored.exact, scored.logprob)
        done.update({(r["length"], r["sample"], r["unit"]): r for r in shard.gather(new)})
        if store is not None:
            store.merge()
        return _summarise(done, encoded, units)


def sweep_manifest(
    handle: ModelHandle,
    encoded: Mapping[int, Sequence[Encoded]],
    interventions: Sequence[HeadIntervention],
    labels: Sequence[Mapping],
    args: Mapping,
) -> dict:
    """The identity of a sweep: same manifest, same results.

    Batch sizes are not part of it: they change how work is grouped, not the results. The
    handle's active edits are (``edits``, only when there are some).
    """
    samples = {
        str(length): f"{len(batch)} samples, "
        + fingerprint([[enc.input_ids, enc.answer_start] for enc in batch])
        for length, batch in encoded.items()
    }
    tables = [[iv.scale, iv.offset, iv.uniform] for iv in interventions]
    return {
        "model": handle.identity,
        "geometry": handle.spec.as_dict(),
        "dtype": str(handle.dtype),
        "samples": samples,
        "units": f"{len(interventions)} interventions, "
        + fingerprint([dict(x) for x in labels], tables),
        "args": dict(args),
        **edits_manifest(handle),
    }


def _plan(encoded, starts, done, options: SweepOptions, n_layers: int) -> list[_Step]:
    """The forwards still to run: per chunk of samples, edits grouped by start layer."""
    steps = []
    for length, batch in encoded.items():
        for lo in range(0, len(batch), options.batch_samples):
            chunk = tuple(range(lo, min(lo + options.batch_samples, len(batch))))
            pending = [
                u
                for u in range(BASELINE, len(starts))
                if any((length, s, u) not in done for s in chunk)
            ]
            if not pending:
                continue
            per_forward = max(1, options.batch_rows // len(chunk))
            groups = []
            for start in sorted({starts[u] for u in pending if u != BASELINE} - {n_layers}):
                ids = [u for u in pending if u != BASELINE and starts[u] == start]
                groups += [
                    (start, tuple(ids[i : i + per_forward]))
                    for i in range(0, len(ids), per_forward)
                ]
            steps.append(_Step(length=length, chunk=chunk, groups=tuple(groups)))
    return steps


def _share(steps: list[_Step], shard: Shard) -> list[_Step]:
    """This rank's part of the plan: every ``world``-th edited forward, and the baselines of
    every ``world``-th chunk. The forwards themselves are the one-process plan's, row for row,
    so N processes give the one-process table exactly."""
    if shard.world == 1:
        return steps
    mine, index = [], 0
    for number, step in enumerate(steps):
        groups = []
        for group in step.groups:
            if shard.owns(index):
                groups.append(group)
            index += 1
        baseline = shard.owns(number)
        if baseline or groups:
            mine.append(dataclasses.replace(step, groups=tuple(groups), baseline=baseline))
    return mine


def _summarise(done: dict, encoded, units: Sequence[SweepUnit]) -> pd.DataFrame:
    """Per-length means over samples, tidy, with the baseline and the delta."""
    keys = [
        (length, s, u)
        for length, batch in encoded.items()
        for s in range(len(batch))
        for u in range(BASELINE, len(units))
    ]
    per_sample = pd.DataFrame([done[key] for key in keys])
    means = per_sample.groupby(["unit", "length"], sort=False)[list(METRICS)].mean().astype(float)
    means.columns.name = "metric"
    tidy = means.stack().rename("value").reset_index()
    baseline = (
        tidy[tidy.unit == BASELINE].drop(columns="unit").rename(columns={"value": "baseline"})
    )
    tidy = tidy[tidy.unit != BASELINE].merge(baseline, on=["length", "metric"])
    tidy["delta"] = tidy["value"] - tidy["baseline"]
    labels = pd.DataFrame([dict(u.labels) for u in units])
    for column in ("layer", "head", "channel"):
        if column in labels:
            labels[column] = labels[column].astype("Int64")
    labels["unit"] = range(len(units))
    table = labels.merge(tidy, on="unit").drop(columns="unit")
    return table.reset_index(drop=True)


def mean_head_outputs(
    handle: ModelHandle, samples: Sequence[Sample | Encoded]
) -> Float[Tensor, "layer head d_head"]:
    """Mean head output ``z`` over every token of ``samples``: the reference for mode ``"mean"``."""
    total = torch.zeros(handle.spec.shape, dtype=torch.float64)
    count = 0
    for enc in encode_samples(handle, samples):
        zs = capture_head_outputs(handle, enc.input_ids[None].to(handle.device))
        total += torch.stack([z[0].sum(0) for z in zs]).double().cpu()
        count += len(enc)
    return (total / count).float()


# -- thin wrappers -------------------------------------------------------------------------


def all_heads(handle: ModelHandle) -> list[Head]:
    """Every ``(layer, head)`` of the model, layer-major."""
    return [
        (layer, head)
        for layer in range(handle.spec.n_layers)
        for head in range(handle.spec.n_heads)
    ]


def head_sweep(
    handle: ModelHandle,
    samples: SamplesByLength,
    *,
    heads: Sequence[Head] | None = None,
    mode: str = "zero",
    factor: float | None = None,
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
    options: SweepOptions = SweepOptions(),
    on_progress: ProgressCallback | None = None,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """Ablate one head at a time (SEAL Fig. 2b); ``channel`` is ``<NA>`` in the table.

    ``mode`` is any ablation mode of ``interp_seal.interventions.ablate`` (``factor`` for
    ``"scale"``, ``mean_z`` for ``"mean"``); ``heads`` defaults to every head.
    """
    heads = [(int(lay), int(h)) for lay, h in (heads if heads is not None else all_heads(handle))]
    units = [
        SweepUnit(
            labels={"layer": lay, "head": h, "channel": None},
            intervention=ablate(handle.spec, [(lay, h)], mode, factor=factor, mean_z=mean_z),
        )
        for lay, h in heads
    ]
    args = {"sweep": "head", "mode": mode, "factor": factor, "heads": heads}
    return run_sweep(
        handle,
        samples,
        units,
        options=options,
        args=args,
        on_progress=on_progress,
        intervention=intervention,
    )


def channel_sweep(
    handle: ModelHandle,
    samples: SamplesByLength,
    *,
    heads: Sequence[Head],
    channels: Sequence[int] | None = None,
    mode: str = "zero",
    factor: float | None = None,
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
    options: SweepOptions = SweepOptions(),
    on_progress: ProgressCallback | None = None,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """Ablate one channel of each of ``heads`` at a time (SEAL Fig. 2c).

    ``channels`` defaults to all ``d_head`` channels. Uniform attention replaces whole heads,
    so it is refused here.
    """
    if mode == "uniform":
        raise ValueError(
            "uniform attention replaces a whole head's output; channel sweeps need mode "
            "'zero', 'scale' or 'mean'"
        )
    if not heads:
        raise ValueError("channel_sweep needs the heads to open, e.g. heads=[(1, 3)]")
    channels = list(range(handle.spec.d_head)) if channels is None else [int(c) for c in channels]
    units = [
        SweepUnit(
            labels={"layer": int(lay), "head": int(h), "channel": c},
            intervention=ablate(handle.spec, [(lay, h, c)], mode, factor=factor, mean_z=mean_z),
        )
        for lay, h in heads
        for c in channels
    ]
    args = {
        "sweep": "channel",
        "mode": mode,
        "factor": factor,
        "heads": list(heads),
        "channels": channels,
    }
    return run_sweep(
        handle,
        samples,
        units,
        options=options,
        args=args,
        on_progress=on_progress,
        intervention=intervention,
    )


def scale_table_sweep(
    handle: ModelHandle,
    samples: SamplesByLength,
    tables: Mapping[str, Mapping[Head, float] | HeadIntervention],
    *,
    options: SweepOptions = SweepOptions(),
    on_progress: ProgressCallback | None = None,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """Evaluate named multi-head edits across lengths (SEAL Fig. 2d), one row per table.

    A table is ``{(layer, head): factor}`` (e.g. from ``quadrant_scale_table``) or any
    ``HeadIntervention``.
    """
    if not tables:
        raise ValueError("give at least one table: {'Q1 x 0.9': {(0, 1): 0.9, ...}}")
    units = [
        SweepUnit(
            labels={"table": name},
            intervention=t if isinstance(t, HeadIntervention) else scale_table(handle.spec, t),
        )
        for name, t in tables.items()
    ]
    args = {"sweep": "scale_tables", "tables": list(tables)}
    return run_sweep(
        handle,
        samples,
        units,
        options=options,
        args=args,
        on_progress=on_progress,
        intervention=intervention,
    )
