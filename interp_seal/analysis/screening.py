"""Screened head sweeps: attribution patching ranks every head, the exact sweep confirms the top.

An exact per-head sweep (SEAL Sec. 3.1, Fig. 2b; ``interp_seal.analysis.sweeps.head_sweep``)
runs one partial forward per head per record. A 135M model has 270 heads: with long prompts on
a CPU that is hours. Most heads barely matter, and what one wants first are the few whose
pruning helps or hurts retrieval most. A screened sweep finds them in two stages:

1. **Screen** (attribution patching, Nanda 2023; Kramar et al. 2024, "AtP"). One forward and
   one backward pass per record give ``g = d M / d z`` for every head output ``z`` at every
   position, ``M`` the answer's log-probability under teacher forcing (the sweep's
   ``answer_logprob``). An edit ``z -> s * z + o`` of head ``(l, h)`` (zero: ``s = 0, o = 0``;
   scale: ``s = factor``; mean: ``s = 0, o = mean z``) changes ``M`` by, to first order::

       delta M[l, h] ~ sum_{t, d} ((s - 1) * z + o)[l, t, h, d] * g[l, t, h, d]

   so one backward pass prices every head at once. Per length, the estimate is the mean over
   records, like the sweep's per-length means.
2. **Confirm.** Heads are ranked by their estimate averaged over lengths; the ``top_k`` most
   negative (pruning lowers the answer's probability: *helpful* heads) and the ``top_k`` most
   positive (*harmful* heads) run through the exact batched sweep at every length.

The result is the sweep's tidy table for every head, with a ``source`` column: ``"exact"`` rows
(confirmed heads, both metrics, the exact sweep's numbers) and ``"estimate"`` rows (the other
heads, ``answer_logprob`` only: ``delta`` is the attribution estimate and ``value`` the exact
baseline plus it). Exact match has no gradient, so unconfirmed heads have no exact-match rows.

The estimate is exact for a metric linear in ``z``; attention and norm nonlinearities make it
drift for heads with large effects, which is why the top of the ranking is confirmed exactly.
``benchmarks/bench_screened_sweep.py`` measures the speed-up and the top-10 overlap with the
full exact sweep on SmolLM2-135M.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp_seal.analysis.attribution_patching import tracked_head_outputs
from interp_seal.analysis.sweeps import (
    Head,
    SamplesByLength,
    SweepOptions,
    all_heads,
    head_sweep,
)
from interp_seal.evaluation.teacher_forcing import encode_samples
from interp_seal.interventions import ablate
from interp_seal.models import ModelHandle
from interp_seal.outputs import write_text
from interp_seal.records import fingerprint
from interp_seal.tasks.sample import Encoded

SCREEN_MODES = ("zero", "scale", "mean")
ESTIMATES = "screen_estimates.json"


@dataclass(frozen=True, kw_only=True)
class ScreenedSweep:
    """A screened head sweep.

    Attributes:
        table: the sweep table of every head (``layer, head, channel, length, metric, value,
            baseline, delta``) plus ``source``: ``"exact"`` or ``"estimate"``.
        estimates: ``layer, head, length, estimate`` (attribution estimate of the change of
            ``answer_logprob``, mean over records) for every head, plus ``rank`` (1 = most
            negative mean estimate over lengths) and ``confirmed``.
        helpful, harmful: the heads confirmed exactly, most negative / most positive first.
    """

    table: pd.DataFrame
    estimates: pd.DataFrame
    helpful: tuple[Head, ...]
    harmful: tuple[Head, ...]


def answer_logprob_gradients(
    handle: ModelHandle, enc: Encoded
) -> tuple[Float[Tensor, "layer pos head d_head"], Float[Tensor, "layer pos head d_head"], float]:
    """One forward and one backward pass: head outputs ``z``, ``d M / d z`` and ``M``.

    ``M`` is the summed log-probability of the answer tokens under teacher forcing; only the
    positions that predict them are unembedded.
    """
    layers = range(handle.spec.n_layers)
    ids = enc.input_ids.to(handle.device)
    target = enc.answer_ids.to(handle.device)
    with tracked_head_outputs(handle) as zs:
        logits = handle.model(ids[None], logits_to_keep=len(target) + 1).logits[0, :-1]
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
) -> pd.DataFrame:
    """Attribution estimate of each head's ablation effect on ``answer_logprob``, per length.

    Returns ``layer, head, length, estimate`` (mean over the length's records).
    """
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
    rows = []
    with tqdm(
        total=sum(map(len, encoded.values())), desc="attribution screen", disable=not progress
    ) as bar:
        for length, batch in encoded.items():
            total = torch.zeros(spec.n_layers, spec.n_heads, dtype=torch.float64)
            for enc in batch:
                z, grad, _ = answer_logprob_gradients(handle, enc)  # (L, T, H, D)
                change = slope[:, None] * z + offset[:, None]
                total += (change * grad).sum((1, 3)).double()
                bar.update(1)
            estimate = (total / len(batch)).double().cpu().numpy()
            rows += [
                {"layer": lay, "head": h, "length": length, "estimate": float(estimate[lay, h])}
                for lay, h in all_heads(handle)
            ]
    return pd.DataFrame(rows)


def screened_head_sweep(
    handle: ModelHandle,
    samples: SamplesByLength,
    *,
    top_k: int,
    mode: str = "zero",
    factor: float | None = None,
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
    options: SweepOptions | None = None,
) -> ScreenedSweep:
    """Screen every head by attribution patching, confirm the top ``top_k`` each way exactly.

    ``options`` as for ``head_sweep``. With ``options.out``, the estimates are saved to
    ``out/screen_estimates.json`` and the exact sweep writes to ``out/exact`` (resumable with
    ``options.resume``).
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1 (heads confirmed in each direction), got {top_k}")
    options = options or SweepOptions()
    estimates = _load_or_estimate(handle, samples, mode, factor, mean_z, options)
    mean = estimates.groupby(["layer", "head"], as_index=False)["estimate"].mean()
    mean = mean.sort_values(["estimate", "layer", "head"]).reset_index(drop=True)
    order = [(int(r.layer), int(r.head)) for r in mean.itertuples()]
    helpful = tuple(order[:top_k])
    harmful = tuple(h for h in reversed(order[-top_k:]) if h not in helpful)
    confirmed = sorted({*helpful, *harmful})
    exact_options = options
    if options.out is not None:
        exact_options = dataclasses.replace(options, out=Path(options.out) / "exact")
    exact = head_sweep(
        handle,
        samples,
        heads=confirmed,
        mode=mode,
        factor=factor,
        mean_z=mean_z,
        options=exact_options,
    ).assign(source="exact")
    rank = {head: i for i, head in enumerate(order, start=1)}
    heads = list(zip(estimates["layer"], estimates["head"], strict=True))
    estimates["rank"] = [rank[head] for head in heads]
    estimates["confirmed"] = [head in set(confirmed) for head in heads]
    table = pd.concat([exact, _estimated_rows(exact, estimates)], ignore_index=True)
    table = table.sort_values(["metric", "length", "layer", "head"], kind="stable")
    return ScreenedSweep(
        table=table.reset_index(drop=True),
        estimates=estimates,
        helpful=helpful,
        harmful=harmful,
    )


def _estimated_rows(exact: pd.DataFrame, estimates: pd.DataFrame) -> pd.DataFrame:
    """``answer_logprob`` rows of the unconfirmed heads: the exact baseline plus the estimate."""
    baseline = (
        exact[exact.metric == "answer_logprob"].groupby("length")["baseline"].first().to_dict()
    )
    rest = estimates[~estimates.confirmed]
    rows = pd.DataFrame(
        {
            "layer": rest.layer.astype("Int64"),
            "head": rest["head"].astype("Int64"),
            "channel": pd.array([pd.NA] * len(rest), dtype="Int64"),
            "length": rest.length,
            "metric": "answer_logprob",
            "baseline": rest.length.map(baseline),
            "delta": rest.estimate,
        }
    )
    rows.insert(5, "value", rows["baseline"] + rows["delta"])
    return rows.assign(source="estimate")


def _load_or_estimate(handle, samples, mode, factor, mean_z, options) -> pd.DataFrame:
    """Attribution estimates, read back from ``out`` when resuming the same screen."""
    key = fingerprint(
        handle.name_or_path,
        {str(n): [[s.prompt, s.answer] for s in batch] for n, batch in samples.items()},
        mode,
        factor,
        None if mean_z is None else mean_z.tolist(),
    )
    path = None if options.out is None else Path(options.out) / ESTIMATES
    if path is not None and path.exists() and not options.resume:
        raise ValueError(
            f"{path} holds a screened sweep already; pass resume=True (--resume) to continue it, "
            "or write to a new output directory"
        )
    if path is not None and options.resume and path.exists():
        saved = json.loads(path.read_text())
        if saved["fingerprint"] != key:
            raise ValueError(
                f"{path} holds estimates for other inputs (model, samples or mode); write to a "
                "new output directory or delete it"
            )
        return pd.DataFrame(saved["estimates"])
    estimates = attribution_estimates(
        handle, samples, mode=mode, factor=factor, mean_z=mean_z, progress=options.progress
    )
    if path is not None:
        record = {"fingerprint": key, "estimates": estimates.to_dict("records")}
        write_text(path, json.dumps(record))
    return estimates


def top_heads(table: pd.DataFrame, k: int, *, metric: str = "answer_logprob") -> dict:
    """The ``k`` heads whose pruning lowers (``helpful``) / raises (``harmful``) ``metric`` most.

    Ranked by ``delta`` averaged over lengths; from a sweep table or a screened one.
    """
    rows = table[(table.metric == metric) & table.channel.isna()]
    mean = rows.groupby(["layer", "head"], as_index=False)["delta"].mean()
    mean = mean.sort_values(["delta", "layer", "head"])
    heads: Sequence[Head] = [(int(r.layer), int(r.head)) for r in mean.itertuples()]
    return {"helpful": list(heads[:k]), "harmful": list(reversed(heads[-k:]))}
