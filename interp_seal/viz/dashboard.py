"""Figures of the head-pruning dashboard and the quadrant explorer (SEAL Fig. 2b, 2d).

Pure functions: data in, a plotly ``Figure`` out. Widgets (``interp_seal.widgets``) wrap them in
``FigureWidget``s built complete and change them only inside ``batch_update()``.

- ``edit_grid``: the layers x heads grid of the current edits, coloured by ``factor - 1`` on the
  diverging scale centred on 0 that every delta panel uses (pruned heads at -1, kept heads white,
  amplified heads red), each cell labelled with its factor.
- ``quadrant_map``: SEAL Fig. 2b with the quadrants shaded and every head's layer, head, both
  deltas and quadrant in its hover text; ``customdata`` carries ``(layer, head)`` for clicks.
- ``accuracy_curves``: accuracy against length, baseline and edited (SEAL Fig. 2d), from a table
  shaped like ``EditEvaluator.evaluate``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp_seal.analysis.quadrants import HeadQuadrants
from interp_seal.interventions import Head
from interp_seal.viz.sweeps import METRIC_NAMES, QUADRANT_COLORS

DIVERGING = "RdBu"


def edit_factors(n_layers: int, n_heads: int, edits: Mapping[Head, float]) -> np.ndarray:
    """``(L, H)`` array of each head's factor (1 where not edited)."""
    factors = np.ones((n_layers, n_heads))
    for (layer, head), factor in edits.items():
        factors[layer, head] = factor
    return factors


def edit_grid(
    n_layers: int, n_heads: int, edits: Mapping[Head, float], *, selected: Head | None = None
) -> go.Figure:
    """Layers x heads grid of ``edits`` (``{(layer, head): factor}``), layer 0 at the top."""
    factors = edit_factors(n_layers, n_heads, edits)
    text = [[_factor_label(f) for f in row] for row in factors]
    fig = go.Figure(
        go.Heatmap(
            z=factors - 1,
            x=list(range(n_heads)),
            y=list(range(n_layers)),
            text=text,
            texttemplate="%{text}",
            customdata=factors,
            colorscale=DIVERGING,
            reversescale=True,
            zmid=0,
            zmin=-1,
            zmax=1,
            xgap=2,
            ygap=2,
            colorbar={"title": {"text": "factor - 1"}},
            hovertemplate="layer %{y}, head %{x}: x %{customdata:.2f}<extra></extra>",
        )
    )
    if selected is not None:
        layer, head = selected
        fig.add_shape(
            type="rect",
            x0=head - 0.5,
            x1=head + 0.5,
            y0=layer - 0.5,
            y1=layer + 0.5,
            line={"color": "black", "width": 3},
        )
    fig.update_layout(
        title="Head edits (click: keep / prune / scale)",
        xaxis={"title": "head", "dtick": 1},
        yaxis={"title": "layer", "dtick": 1, "autorange": "reversed"},
        dragmode=False,  # heatmap cells fire no clicks in select mode
        template="plotly_white",
        width=160 + 44 * n_heads,
        height=140 + 44 * n_layers,
        margin={"t": 50, "b": 40},
    )
    return fig


def _factor_label(factor: float) -> str:
    if factor == 1:
        return ""
    return "x0" if factor == 0 else f"x{factor:.2f}"


def accuracy_curves(table: pd.DataFrame, *, metric: str = "exact_match") -> go.Figure:
    """``metric`` against length: the unedited model (dashed) and the edited one.

    ``table`` has ``length``, ``metric``, ``value`` and ``baseline`` columns
    (``EditEvaluator.evaluate``)."""
    rows = table[table.metric == metric].sort_values("length")
    if rows.empty:
        raise ValueError(f"no {metric!r} rows; metrics present: {sorted(table.metric.unique())}")
    name = METRIC_NAMES.get(metric, metric)
    hover = "length %{x}: %{y:.4f}<extra>%{fullData.name}</extra>"
    fig = go.Figure(
        [
            go.Scatter(
                x=rows.length.tolist(),
                y=rows.baseline.tolist(),
                name="baseline",
                mode="lines+markers",
                line={"color": "black", "dash": "dash"},
                hovertemplate=hover,
            ),
            go.Scatter(
                x=rows.length.tolist(),
                y=rows.value.tolist(),
                name="edited",
                mode="lines+markers",
                line={"color": "#c92a2a"},
                hovertemplate=hover,
            ),
        ]
    )
    fig.update_layout(
        title=f"{name} vs context length",
        xaxis_title="length",
        yaxis_title=name,
        template="plotly_white",
        margin={"t": 50, "b": 40},
    )
    if metric == "exact_match":
        fig.update_yaxes(range=[-0.02, 1.02])
    return fig


def quadrant_map(quadrants: HeadQuadrants) -> go.Figure:
    """Every head at (delta at the mid length, delta at the long length), quadrants shaded.

    One trace of all heads, coloured per point by quadrant, so that point indices map to rows
    of ``quadrants.heads`` and box / lasso selections read back directly."""
    heads = quadrants.heads
    metric = METRIC_NAMES.get(quadrants.metric, quadrants.metric)
    extent = float(np.abs(heads[["delta_mid", "delta_long"]].to_numpy()).max(initial=0)) * 1.15
    extent = extent or 1.0
    fig = go.Figure(
        go.Scatter(
            x=heads.delta_mid.tolist(),
            y=heads.delta_long.tolist(),
            mode="markers+text",
            text=[f"L{a}H{b}" for a, b in zip(heads.layer, heads["head"], strict=True)],
            textposition="top center",
            customdata=np.stack(
                [heads.layer.to_numpy(), heads["head"].to_numpy(), heads.quadrant.to_numpy()], 1
            ),
            marker={"color": [QUADRANT_COLORS[q] for q in heads.quadrant], "size": 10},
            hovertemplate=(
                "layer %{customdata[0]}, head %{customdata[1]} (%{customdata[2]})<br>"
                f"delta at {quadrants.mid}: %{{x:.3f}}<br>delta at {quadrants.long}: "
                "%{y:.3f}<extra></extra>"
            ),
            showlegend=False,
        )
    )
    for q, (sx, sy) in {"Q1": (1, 1), "Q2": (-1, 1), "Q3": (-1, -1), "Q4": (1, -1)}.items():
        fig.add_shape(
            type="rect",
            x0=0,
            x1=sx * extent,
            y0=0,
            y1=sy * extent,
            layer="below",
            fillcolor=QUADRANT_COLORS[q],
            opacity=0.08,
            line={"width": 0},
        )
        fig.add_annotation(
            x=sx * extent * 0.92,
            y=sy * extent * 0.92,
            text=q,
            showarrow=False,
            font={"color": QUADRANT_COLORS[q], "size": 14},
        )
    fig.update_layout(
        title=f"Head pruning: change in {metric} (Pearson r = {quadrants.pearson:.2f})",
        xaxis={"title": f"delta at length {quadrants.mid}", "range": [-extent, extent]},
        yaxis={"title": f"delta at length {quadrants.long}", "range": [-extent, extent]},
        dragmode="lasso",
        template="plotly_white",
    )
    return fig
