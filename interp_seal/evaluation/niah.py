"""Needle-in-a-haystack grid scores (gkamradt's NIAH; SEAL Sec. 5).

A NIAH run places the needle at each depth (percent of the context, 0 = start, 100 = end)
for each context length, and judges every (depth, length) cell. The result is the familiar
heatmap: depth on the y axis, context length on the x axis, mean exact match in each cell
(``interp_seal.viz.niah_heatmap`` draws it). Needle samples carry
``meta["depth_percent"]`` and ``meta["context_length"]`` (as ``interp_seal.tasks.needle`` writes them).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from interp_seal.evaluation.teacher_forcing import teacher_force
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Sample


def niah_grid(samples: Sequence[Sample], correct: Sequence[bool]) -> pd.DataFrame:
    """Mean of ``correct`` per cell: index ``depth`` (ascending), columns ``context_length``.

    ``correct[i]`` judges ``samples[i]`` (teacher-forced exact match, or a judgement of
    generated text). A cell with several samples (several needles) holds their mean.
    """
    if len(samples) != len(correct):
        raise ValueError(f"{len(samples)} samples but {len(correct)} judgements")
    if not samples:
        raise ValueError("no samples to put on a NIAH grid")
    rows = []
    for i, (sample, ok) in enumerate(zip(samples, correct, strict=True)):
        missing = {"depth_percent", "context_length"} - set(sample.meta)
        if missing:
            raise ValueError(
                f"sample {i} ({sample.task!r}) lacks meta {sorted(missing)}: NIAH grids need "
                "needle samples with meta['depth_percent'] and meta['context_length']"
            )
        rows.append(
            {
                "depth": sample.meta["depth_percent"],
                "context_length": sample.meta["context_length"],
                "exact_match": float(ok),
            }
        )
    return pd.DataFrame(rows).pivot_table(
        index="depth", columns="context_length", values="exact_match", aggfunc="mean"
    )


def evaluate_niah(
    handle: ModelHandle,
    samples: Sequence[Sample],
    *,
    intervention: HeadIntervention | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> pd.DataFrame:
    """Teacher-forced exact match of needle ``samples`` on the depth x context-length grid."""
    scores = teacher_force(
        handle, samples, intervention=intervention, batch_size=batch_size, progress=progress
    )
    return niah_grid(samples, [s.exact_match for s in scores])
