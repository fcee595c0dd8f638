"""Screened head sweeps: attribution patching ranks every head, the exact sweep confirms the top.

An exact per-head sweep (SEAL Sec. 3.1, Fig. 2b; ``interp_seal.analysis.sweeps.head_sweep``)
runs one partial forward per head per record. A 135M model has 270 heads: with long prompts on
a CPU that is hours. Most heads barely matter, and what one wants first are the few whose
pruning helps or hurts retrieval most. A screened sweep finds them in three stages:

1. **Screen** (attribution patching, Nanda 2023; Kramar et al. 2024, "AtP"). One forward and
   one backward pass per record give ``g = d M / d z`` for every head output ``z`` at every
   position, ``M`` the answer's log-probability under teacher forcing (the sweep's
   ``answer_logprob``). An edit ``z -> s * z + o`` of head ``(l, h)`` (zero: ``s = 0, o = 0``;
   scale: ``s = factor``; mean: ``s = 0, o = mean z``) changes ``M`` by, to first order::

       delta M[l, h] ~ sum_{t, d} ((s - 1) * z + o)[l, t, h, d] * g[l, t, h, d]

   so one backward pass prices every head at once. Per length, the estimate is the mean over
   records, like the sweep's per-length means.
   Two options apply AtP*'s corrections (Kramar et al. 2024; ``interp_seal.analysis.atp_star``
   teaches both): ``qk_fix=True`` recomputes later heads' attention softmax exactly at the
   answer rows instead of linearising it (the signed estimate changes); ``grad_drop=True``
   adds GradDrop's magnitude score ``c_GD`` (the mean ``|estimate|`` over ``L`` backward
   passes, each with one layer's residual contributions dropped), which then chooses the
   candidates below instead of ``|mean| + 2 SE``.
2. **Confirm.** First-order estimates misjudge heads whose effect is far from linear: on
   SmolLM2-135M the head whose pruning costs most (L16H0, -7 nats) is estimated at +0.7, the
   wrong sign. Its estimate is still large. So the heads swept exactly (``candidates``) are the
   largest estimated *magnitudes*, widened by their uncertainty: ``|mean| + 2 SE``, the mean
   and standard error of the per-record estimates, whatever sign the estimate has. They run
   through the exact batched sweep, on every record or on the first ``confirm_records`` of
   each length (cheaper, noisier).
3. **Rank.** The ``top_k`` most helpful (pruning lowers the answer's probability most) and most
   harmful heads are read off the combined table: exact values where confirmed, estimates
   elsewhere. A head confirmed on ``R`` of a length's ``N`` records gets the *difference
   estimator* of its mean over all ``N`` (a control variate with coefficient 1, Cochran's
   "difference estimation"): ``exact_R + (estimate_N - estimate_R)``. The exact mean over the
   ``R`` records fixes the estimate's bias (its non-linearity, the same on every record to a
   good approximation), and the estimates of the other ``N - R`` records, which cost nothing
   more, carry the record-to-record variation the ``R`` records alone would miss. With ``R =
   N`` it is the exact mean. On SmolLM2 (``bench_screened_sweep.py``) it lifts the top-10
   overlap with the exact sweep at the same cost (the benchmark prints both).

The result is the sweep's tidy table for every head, with a ``source`` column: ``"exact"`` rows
(confirmed heads, both metrics, the exact sweep's numbers; ``"corrected"`` for the
``answer_logprob`` rows of heads confirmed on fewer than all records: the difference
estimator, whose ``baseline`` is the mean over all records) and ``"estimate"`` rows (the other
heads, ``answer_logprob`` only: ``delta`` is the attribution estimate, ``baseline`` the mean of
the records' own log-probabilities from the screen's forwards, ``value`` their sum). Exact match
has no gradient, so unconfirmed heads have no exact-match rows.

Resumable and sharded like the sweeps: the per-record estimates are records of the run store
(``out/screen``), the confirmation an ordinary sweep (``out/exact``).
``benchmarks/bench_screened_sweep.py`` measures the speed-up and the top-10 overlap against the
exact sweep of all 270 heads of SmolLM2-135M (its table is kept in ``tests/data``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm
from transformers.modeling_layers import GradientCheckpointingLayer

from interp_seal.analysis.atp_star import (
    captured_stream,
    grad_drop_magnitude,
    grad_drop_scores,
    qk_fix_corrections,
)
from interp_seal.analysis.attribution_patching import tracked_head_outputs
from interp_seal.analysis.sweeps import (
    Head,
    SamplesByLength,
    SweepOptions,
    all_heads,
    head_sweep,
)
from interp_seal.evaluation.teacher_forcing import encode_samples
from interp_seal.interventions import HeadEdit, ablate
from interp_seal.interventions.hf import edits_manifest
from interp_seal.models import ModelHandle
from interp_seal.records import RecordStore, fingerprint
from interp_seal.shards import Shard
from interp_seal.tasks.sample import Encoded

SCREEN_MODES = ("zero", "scale", "mean")


@dataclass(frozen=True, kw_only=True)
class ScreenedSweep:
    """A screened head sweep.

    Attributes:
        table: the sweep table of every head (``layer, head, channel, length, metric, value,
            baseline, delta``) plus ``source``: ``"exact"``, ``"corrected"`` or ``"estimate"``.
        estimates: ``layer, head, length, estimate, se, baseline, confirmed`` for every head:
            the attribution estimate of the change of ``answer_logprob`` (mean over the
            length's records) and its standard error, the records' mean ``answer_logprob``,
            and whether the head was swept exactly. With ``qk_fix``, ``estimate`` is the
            QK-fixed one and ``atp`` (``atp_se``) the plain one; with ``grad_drop``, ``grad_drop`` and
            ``grad_drop_se`` are GradDrop's score ``c_GD`` (mean over records) and its SE.
        helpful, harmful: the ``top_k`` heads whose pruning lowers / raises ``answer_logprob``
            most (mean over lengths), most extreme first.
    """

    table: pd.DataFrame
    estimates: pd.DataFrame
    helpful: tuple[Head, ...]
    harmful: tuple[Head, ...]


@contextmanager
def recomputed_layers(handle: ModelHandle) -> Iterator[None]:
    """Inside the block, a backward pass recomputes each decoder layer from its input instead
    of keeping the layer's activations from the forward (activation checkpointing, torch's
    non-reentrant ``checkpoint`` through transformers' ``GradientCheckpointingLayer``).

    Autograd otherwise keeps every layer's attention and MLP intermediates until the backward
    reaches it: 112 GiB for LongChat-7B at 31K tokens in bf16 (``analysis.plan``). Recomputing
    keeps one residual-stream input per layer and one layer's intermediates at a time, for one
    extra forward. Only the decoder layers switch to training mode (that is what enables the
    recomputation); their attention and dropout modules stay in evaluation mode, so the
    numbers are the same. Runs must not use a KV cache (the recomputation would append to it
    again)."""
    layers = list(handle.layers())
    if not all(isinstance(m, GradientCheckpointingLayer) for m in layers):
        raise TypeError(
            f"{type(layers[0]).__name__} ({handle.family.name}) cannot recompute itself in the "
            "backward pass (not a transformers GradientCheckpointingLayer)"
        )
    saved = [
        (m.training, m.gradient_checkpointing, m.__dict__.get("_gradient_checkpointing_func"))
        for m in layers
    ]
    for m in layers:
        m.training = True  # this module only: not .train(), which would reach its dropouts
        m.gradient_checkpointing = True
        m._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
    try:
        yield
    finally:
        for m, (training, enabled, func) in zip(layers, saved, strict=True):
            m.training, m.gradient_checkpointing = training, enabled
            if func is None:
                del m._gradient_checkpointing_func
            else:
                m._gradient_checkpointing_func = func


def answer_logprob_gradients(
    handle: ModelHandle, enc: Encoded
) -> tuple[Float[Tensor, "layer pos head d_head"], Float[Tensor, "layer pos head d_head"], float]:
    """One forward and one backward pass: head outputs ``z``, ``d M / d z`` and ``M``.

    ``M`` is the summed log-probability of the answer tokens under teacher forcing; only the
    positions that predict them are unembedded. The backward recomputes each layer
    (``recomputed_layers``) and no KV cache is kept: the pass holds the layers' inputs and head
    outputs, not their activations.
    """
    layers = range(handle.spec.n_layers)
    ids = enc.input_ids.to(handle.device)
    target = enc.answer_ids.to(handle.device)
    with tracked_head_outputs(handle) as zs, recomputed_layers(handle):
        keep = len(target) + 1
        logits = handle.model(ids[None], logits_to_keep=keep, use_cache=False).logits[0, :-1]
        metric = logits.float().log_softmax(-1).gather(-1, target[:, None]).sum()
        grads = torch.autograd.grad(metric, [zs[layer] for layer in layers])
    z = torch.stack([zs[layer][0].detach().float().cpu() for layer in layers])
    grad = torch.stack([g[0].float().cpu() for g in grads])
    return z, grad, float(metric.detach())


def attribution_estimates(
    handle: ModelHandle,
    samples: SamplesByLength,
    *,
    mode: str = "zero",
    factor: float | None = None,
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
    progress: bool = True,
    intervention: HeadEdit | None = None,
    qk_fix: bool = False,
    grad_drop: bool = False,
) -> pd.DataFrame:
    """Attribution estimate of each head's ablation effect on ``answer_logprob``, per length.

    Returns ``layer, head, length, estimate`` (mean over the length's records), plus ``atp``
    (the plain estimate) with ``qk_fix`` and ``grad_drop`` (GradDrop's score) with
    ``grad_drop`` (``interp_seal.analysis.atp_star``).
    ``intervention`` edits the model screened (composed with ``handle.edit``'s).
    """
    fixes = Fixes(qk_fix=qk_fix, grad_drop=grad_drop)
    with handle.edit(intervention):
        per_record = _record_estimates(handle, samples, mode, factor, mean_z, None, progress, fixes)
        table = _per_length(handle, per_record)
        extra = [c for c in ("atp", "grad_drop") if c in table]
        return table[["layer", "head", "length", "estimate", *extra]]


def screened_head_sweep(
    handle: ModelHandle,
    samples: SamplesByLength,
    *,
    top_k: int,
    candidates: int | None = None,
    confirm_records: int | None = None,
    mode: str = "zero",
    factor: float | None = None,
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
    options: SweepOptions | None = None,
    intervention: HeadEdit | None = None,
    qk_fix: bool = False,
    grad_drop: bool = False,
) -> ScreenedSweep:
    """Screen every head by attribution patching, confirm the likeliest movers exactly, rank.

    Args:
        top_k: heads reported each way (``helpful``, ``harmful``).
        candidates: heads confirmed exactly (default ``2 * top_k``): the largest estimated
            magnitudes, ``|mean| + 2 SE`` over records, whatever their estimated sign.
        confirm_records: records per length the candidates are confirmed on (default all):
            fewer trade the confirmed means' precision for time.
        options: as for ``head_sweep``. With ``options.out``, the per-record estimates go to
            ``out/screen`` and the exact sweep to ``out/exact`` (both resumable with
            ``options.resume``, both split over torchrun's processes).
        qk_fix: AtP*'s QK fix: later heads' softmax recomputed exactly at the answer rows for
            each head's direct path (``atp_star``; about one extra forward per source layer).
        grad_drop: AtP*'s GradDrop: candidates chosen by ``c_GD + 2 SE`` (``atp_star``; about
            ``L / 2`` extra backward passes per record).
    ``intervention`` edits the model screened (composed with ``handle.edit``'s).
    """
    fixes = Fixes(qk_fix=qk_fix, grad_drop=grad_drop)
    with handle.edit(intervention):
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1 (heads reported in each direction), got {top_k}")
        candidates = 2 * top_k if candidates is None else candidates
        if candidates < 1:
            raise ValueError(f"candidates must be >= 1 (heads confirmed exactly), got {candidates}")
        if confirm_records is not None and confirm_records < 1:
            raise ValueError(f"confirm_records must be >= 1 (or None: all), got {confirm_records}")
        options = options or SweepOptions()
        out = None if options.out is None else Path(options.out)
        store = None
        if out is not None:
            manifest = _screen_manifest(handle, samples, mode, factor, mean_z, fixes)
            store = RecordStore.open(out / "screen", manifest, resume=options.resume)
        per_record = _record_estimates(
            handle, samples, mode, factor, mean_z, store, options.progress, fixes
        )
        estimates = _per_length(handle, per_record)
        confirmed = screen_candidates(estimates, candidates)
        subset = {n: list(batch)[:confirm_records] for n, batch in samples.items()}
        exact_options = options
        if out is not None:
            exact_options = dataclasses.replace(options, out=out / "exact")
        exact = head_sweep(
            handle,
            subset,
            heads=confirmed,
            mode=mode,
            factor=factor,
            mean_z=mean_z,
            options=exact_options,
        ).assign(source="exact")
        if confirm_records is not None:
            exact = _corrected(exact, per_record, confirm_records)
        chosen = set(confirmed)
        heads = zip(estimates["layer"], estimates["head"], strict=True)
        estimates["confirmed"] = [head in chosen for head in heads]
        table = pd.concat([exact, _estimated_rows(estimates)], ignore_index=True)
        table = table.sort_values(["metric", "length", "layer", "head"], kind="stable")
        ranked = top_heads(table, top_k)
        return ScreenedSweep(
            table=table.reset_index(drop=True),
            estimates=estimates,
            helpful=tuple(ranked["helpful"]),
            harmful=tuple(ranked["harmful"]),
        )


@dataclass(frozen=True, kw_only=True)
class Fixes:
    """AtP*'s corrections switched on for a screen (``interp_seal.analysis.atp_star``)."""

    qk_fix: bool = False
    grad_drop: bool = False

    @property
    def any(self) -> bool:
        return self.qk_fix or self.grad_drop


def screen_record(
    handle: ModelHandle,
    enc: Encoded,
    slope: Float[Tensor, "layer head d_head"],
    offset: Float[Tensor, "layer head d_head"],
    fixes: Fixes,
) -> dict:
    """One record's forward and backward pass(es) with AtP*'s fixes: ``metric`` and ``atp``
    (``(L, H)``, plain AtP), with ``qk_fix`` ``qk`` (the QK-fixed estimates) and with
    ``grad_drop`` ``grad_drop`` (GradDrop's ``c_GD``). Activation checkpointing as for
    ``answer_logprob_gradients``, except with ``grad_drop``: its ``L - 1`` partial backward
    passes would each recompute the layers they cross (twice the time on SmolLM2), so the
    forward keeps every layer's activations, as an uncheckpointed backward does."""
    if fixes.qk_fix and handle.active_edit() is not None:
        raise ValueError(
            "the QK fix reads later heads' attention as z = A v: screen the unedited model "
            "(merge the edit into the weights first)"
        )
    L = handle.spec.n_layers
    ids = enc.input_ids.to(handle.device)
    target = enc.answer_ids.to(handle.device)
    keep = len(target) + 1
    with (
        tracked_head_outputs(handle) as zs,
        captured_stream(handle, values=fixes.qk_fix) as captured,
        nullcontext() if fixes.grad_drop else recomputed_layers(handle),
    ):
        logits = handle.model(ids[None], logits_to_keep=keep, use_cache=False).logits[0, :-1]
        metric = logits.float().log_softmax(-1).gather(-1, target[:, None]).sum()
        z = torch.stack([zs[layer][0].detach().float().cpu() for layer in range(L)])
        change = slope[:, None] * z + offset[:, None]  # (L, T, H, D)
        record = {"metric": float(metric.detach())}
        if fixes.grad_drop:
            grad, per_layer = grad_drop_scores(handle, metric, zs, captured.resid(), change)
            record["grad_drop"] = grad_drop_magnitude(per_layer).double().cpu().numpy()
        else:
            grads = torch.autograd.grad(metric, [zs[layer] for layer in range(L)])
            grad = torch.stack([g[0].float() for g in grads])
        grad = grad.cpu()
        atp = (change * grad).sum((1, 3)).double()
        record["atp"] = atp.cpu().numpy()
        if fixes.qk_fix:
            T = ids.shape[0]
            rows = torch.arange(T - keep, T - 1)  # the positions predicting the answer
            qk = atp + qk_fix_corrections(handle, captured, grad, change, rows)
            record["qk"] = qk.cpu().numpy()
        del metric, logits
    return record


def _record_estimates(
    handle, samples, mode, factor, mean_z, store, progress, fixes=Fixes()
) -> list[dict]:
    """Per record: ``length``, ``sample``, ``metric`` (M) and ``estimate`` (``(L, H)``, the
    first-order change of M per ablated head; QK-fixed with ``fixes.qk_fix``, then ``atp`` holds
    the plain one), and ``grad_drop`` with ``fixes.grad_drop``. With a ``store``, finished
    records are read back; under torchrun each rank estimates every N-th record."""
    if mode not in SCREEN_MODES:
        raise ValueError(
            f"screening estimates edits affine in the head output, modes {SCREEN_MODES}; got "
            f"{mode!r} (uniform attention changes the attention itself: sweep it exactly)"
        )
    if not samples or any(len(batch) == 0 for batch in samples.values()):
        raise ValueError("give at least one sample for every length: {length: [samples]}")
    spec = handle.spec
    every = ablate(spec, all_heads(handle), mode, factor=factor, mean_z=mean_z)
    slope = (every.scale - 1).float()  # (L, H, D)
    offset = torch.zeros(spec.shape) if every.offset is None else every.offset.float()
    encoded = {int(n): encode_samples(handle, batch) for n, batch in samples.items()}
    units = [(n, i) for n, batch in encoded.items() for i in range(len(batch))]
    shard = Shard.current()
    done = {}
    if store is not None:
        fields = ("length", "sample", "metric", "estimate")
        fields += ("atp",) * fixes.qk_fix + ("grad_drop",) * fixes.grad_drop
        done = {(r["length"], r["sample"]): r for r in store.load(fields)}
    mine = [u for index, u in enumerate(units) if shard.owns(index) and u not in done]
    new = []
    for length, i in tqdm(mine, desc="attribution screen", disable=not progress):
        record = {"length": length, "sample": i}
        if fixes.any:
            found = screen_record(handle, encoded[length][i], slope, offset, fixes)
            record["metric"] = found["metric"]
            record["estimate"] = found["qk" if fixes.qk_fix else "atp"].tolist()
            if fixes.qk_fix:
                record["atp"] = found["atp"].tolist()
            if fixes.grad_drop:
                record["grad_drop"] = found["grad_drop"].tolist()
        else:
            z, grad, metric = answer_logprob_gradients(handle, encoded[length][i])  # (L,T,H,D)
            change = slope[:, None] * z + offset[:, None]
            estimate = (change * grad).sum((1, 3)).double().cpu().numpy()
            record |= {"metric": metric, "estimate": estimate.tolist()}
        new.append(record)
        if store is not None:
            store.append([record])
    done |= {(r["length"], r["sample"]): r for r in shard.gather(new)}
    if store is not None:
        store.merge()
    return [done[u] for u in units]


def _per_length(handle: ModelHandle, per_record: list[dict]) -> pd.DataFrame:
    """``layer, head, length, estimate, se, baseline``: per length, the mean estimate over
    records, its standard error (0 with one record) and the mean of M (the baseline)."""
    heads = all_heads(handle)  # layer-major, as an (L, H) array ravels
    frames = []
    for length in dict.fromkeys(r["length"] for r in per_record):
        records = [r for r in per_record if r["length"] == length]
        values = np.array([r["estimate"] for r in records])  # (records, L, H)
        frame = pd.DataFrame(
            {
                "layer": [lay for lay, _ in heads],
                "head": [h for _, h in heads],
                "length": length,
                "estimate": values.mean(0).ravel(),
                "se": _standard_error(values).ravel(),
                "baseline": float(np.mean([r["metric"] for r in records])),
            }
        )
        if "atp" in records[0]:
            plain = np.array([r["atp"] for r in records])
            frame["atp"] = plain.mean(0).ravel()
            frame["atp_se"] = _standard_error(plain).ravel()
        if "grad_drop" in records[0]:
            scores = np.array([r["grad_drop"] for r in records])
            frame["grad_drop"] = scores.mean(0).ravel()
            frame["grad_drop_se"] = _standard_error(scores).ravel()
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _standard_error(values: np.ndarray) -> np.ndarray:
    """Standard error of the mean over the first axis (0 with one record)."""
    if len(values) < 2:
        return 0 * values[0]
    return values.std(0, ddof=1) / np.sqrt(len(values))


def screen_candidates(estimates: pd.DataFrame, k: int) -> list[Head]:
    """The ``k`` heads with the largest ``|mean estimate| + 2 SE`` over lengths: large effects
    of either sign, and uncertain ones, whatever the first-order sign says. Where the
    estimates carry GradDrop's score (``grad_drop``), the bound is ``c_GD + 2 SE`` instead
    (AtP*'s ranking, Kramar et al. 2024)."""
    rms = ("se", lambda se: float(np.sqrt((se**2).mean())))
    if "grad_drop" in estimates:
        per_head = estimates.groupby(["layer", "head"], as_index=False).agg(
            estimate=("grad_drop", "mean"),
            se=("grad_drop_se", lambda se: float(np.sqrt((se**2).mean()))),
        )
    else:
        per_head = estimates.groupby(["layer", "head"], as_index=False).agg(
            estimate=("estimate", "mean"), se=rms
        )
    per_head["bound"] = per_head["estimate"].abs() + 2 * per_head["se"]
    best = per_head.sort_values(["bound", "layer", "head"], ascending=[False, True, True])
    return sorted((int(r.layer), int(r.head)) for r in best.head(k).itertuples())


def _corrected(exact: pd.DataFrame, per_record: list[dict], confirm: int) -> pd.DataFrame:
    """The confirmed heads' ``answer_logprob`` rows as the difference estimator of their mean
    over *all* the length's records: ``exact_R + (estimate_all - estimate_R)``, the exact mean
    over the first ``confirm`` records plus how far the attribution estimates of all records
    lie from those of the confirmed ones (module docstring, stage 3). Lengths whose records
    were all confirmed keep their exact rows."""
    spec_heads = len(per_record[0]["estimate"][0])
    rows = exact.metric == "answer_logprob"
    exact = exact.copy()
    for length in exact.loc[rows, "length"].unique():
        records = [r for r in per_record if r["length"] == length]
        if len(records) <= confirm:
            continue
        values = np.array([r["estimate"] for r in records])  # (records, L, H)
        shift = values.mean(0) - values[:confirm].mean(0)
        metric = float(np.mean([r["metric"] for r in records]))
        at = rows & (exact.length == length) & exact.channel.isna()
        layer, head = exact.loc[at, "layer"].astype(int), exact.loc[at, "head"].astype(int)
        delta = exact.loc[at, "delta"].to_numpy() + shift.reshape(-1)[layer * spec_heads + head]
        exact.loc[at, "delta"] = delta
        exact.loc[at, "baseline"] = metric
        exact.loc[at, "value"] = metric + delta
        exact.loc[at, "source"] = "corrected"
    return exact


def _estimated_rows(estimates: pd.DataFrame) -> pd.DataFrame:
    """``answer_logprob`` rows of the unconfirmed heads: the screen's baseline (the mean M of
    the length's records) plus the estimate."""
    rest = estimates[~estimates.confirmed]
    rows = pd.DataFrame(
        {
            "layer": rest.layer.astype("Int64"),
            "head": rest["head"].astype("Int64"),
            "channel": pd.array([pd.NA] * len(rest), dtype="Int64"),
            "length": rest.length,
            "metric": "answer_logprob",
            "value": rest.baseline + rest.estimate,
            "baseline": rest.baseline,
            "delta": rest.estimate,
        }
    )
    return rows.assign(source="estimate")


def _screen_manifest(handle, samples, mode, factor, mean_z, fixes=Fixes()) -> dict:
    """What a screen is: the model, the records, the edit (and AtP*'s fixes, where on)."""
    extra = {"fixes": dataclasses.asdict(fixes)} if fixes.any else {}
    return {
        **extra,
        "model": handle.identity,
        "geometry": handle.spec.as_dict(),
        "dtype": str(handle.dtype),
        "samples": fingerprint(
            {str(n): [[s.prompt, s.answer] for s in batch] for n, batch in samples.items()}
        ),
        "edit": fingerprint(mode, factor, None if mean_z is None else mean_z.tolist()),
        **edits_manifest(handle),
    }


def top_heads(table: pd.DataFrame, k: int, *, metric: str = "answer_logprob") -> dict:
    """The ``k`` heads whose pruning lowers (``helpful``) / raises (``harmful``) ``metric`` most.

    Ranked by ``delta`` averaged over lengths; from a sweep table or a screened one.
    """
    rows = table[(table.metric == metric) & table.channel.isna()]
    mean = rows.groupby(["layer", "head"], as_index=False)["delta"].mean()
    mean = mean.sort_values(["delta", "layer", "head"])
    heads: Sequence[Head] = [(int(r.layer), int(r.head)) for r in mean.itertuples()]
    return {"helpful": list(heads[:k]), "harmful": list(reversed(heads[-k:]))}
