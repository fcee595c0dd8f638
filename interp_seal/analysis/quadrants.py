"""Head quadrants: sort heads by what pruning them does at a mid and at a long context length.

SEAL (Sec. 3.1-3.2, Fig. 2b) prunes one head at a time and plots the accuracy change at a
mid length (x) against the change at a long length (y). The axes at 0 (the unpruned baseline)
cut the plane into quadrants:

- **Q1** (x > 0, y > 0): pruning the head *helps* retrieval at both lengths;
- **Q2** (x < 0, y > 0) and **Q4** (x > 0, y < 0): mixed;
- **Q3** (x < 0, y < 0): pruning the head *hurts* at both lengths.

Heads on an axis (no change at one of the lengths) are labelled ``"axis"``. SEAL then scales
every Q1 head by 0.9 and every Q3 head by 1.1 (Fig. 2d): ``quadrant_scale_table`` builds that
table for ``interp_seal.analysis.sweeps.scale_table_sweep``. How consistent a head's effect is
across lengths is the Pearson correlation of the two deltas over heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from interp_seal.interventions import Head

QUADRANTS = ("Q1", "Q2", "Q3", "Q4", "axis")


@dataclass(frozen=True, kw_only=True)
class HeadQuadrants:
    """Per-head pruning deltas at two lengths and their quadrants.

    Attributes:
        heads: one row per head: ``layer``, ``head``, ``delta_mid``, ``delta_long``,
            ``quadrant``.
        mid, long: the two lengths compared.
        metric: the metric whose deltas were used.
        pearson: correlation of ``delta_mid`` and ``delta_long`` over heads (NaN when either
            is constant or fewer than two heads).
    """

    heads: pd.DataFrame
    mid: int
    long: int
    metric: str
    pearson: float

    def members(self, quadrant: str) -> list[Head]:
        """The ``(layer, head)`` pairs in ``quadrant``."""
        if quadrant not in QUADRANTS:
            raise ValueError(f"unknown quadrant {quadrant!r}; choose one of {QUADRANTS}")
        rows = self.heads[self.heads.quadrant == quadrant]
        return [
            (int(layer), int(head)) for layer, head in zip(rows["layer"], rows["head"], strict=True)
        ]

    def counts(self) -> dict[str, int]:
        return {q: int((self.heads.quadrant == q).sum()) for q in QUADRANTS}


def quadrant_of(delta_mid: float, delta_long: float) -> str:
    """SEAL Fig. 2b's quadrant of a head with these pruning deltas."""
    if delta_mid > 0 and delta_long > 0:
        return "Q1"
    if delta_mid < 0 and delta_long > 0:
        return "Q2"
    if delta_mid < 0 and delta_long < 0:
        return "Q3"
    if delta_mid > 0 and delta_long < 0:
        return "Q4"
    return "axis"


def head_quadrants(
    table: pd.DataFrame, *, mid: int, long: int, metric: str = "exact_match"
) -> HeadQuadrants:
    """Quadrants from a head sweep table (``head_sweep``'s columns ``layer``, ``head``,
    ``length``, ``metric``, ``delta``), comparing lengths ``mid`` and ``long``."""
    missing = {"layer", "head", "length", "metric", "delta"} - set(table.columns)
    if missing:
        raise ValueError(f"not a head sweep table: columns {sorted(missing)} are missing")
    if "channel" in table and table["channel"].notna().any():
        raise ValueError("this is a channel sweep table; quadrants classify whole heads")
    rows = table[table.metric == metric]
    for length in (mid, long):
        if not (rows.length == length).any():
            raise ValueError(
                f"the table has no {metric!r} results at length {length}; it has lengths "
                f"{sorted(table.length.unique().tolist())} and metrics {sorted(table.metric.unique())}"
            )
    wide = rows.pivot_table(index=["layer", "head"], columns="length", values="delta")
    heads = pd.DataFrame(
        {"delta_mid": wide[mid], "delta_long": wide[long]}, index=wide.index
    ).reset_index()
    heads = heads.dropna(subset=["delta_mid", "delta_long"]).reset_index(drop=True)
    heads["quadrant"] = [
        quadrant_of(x, y) for x, y in zip(heads.delta_mid, heads.delta_long, strict=True)
    ]
    return HeadQuadrants(
        heads=heads,
        mid=mid,
        long=long,
        metric=metric,
        pearson=_pearson(heads.delta_mid, heads.delta_long),
    )


def quadrant_scale_table(
    quadrants: HeadQuadrants, factors: Mapping[str, float]
) -> dict[Head, float]:
    """``{(layer, head): factor}`` scaling every head of each quadrant, e.g. ``{"Q1": 0.9,
    "Q3": 1.1}`` (SEAL Fig. 2d)."""
    return {head: float(f) for q, f in factors.items() for head in quadrants.members(q)}


def _pearson(x: pd.Series, y: pd.Series) -> float:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])
