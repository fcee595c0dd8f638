"""Figures for ablation sweeps (SEAL Fig. 2): delta heatmaps, the quadrant scatter, channel maps
and scale-table curves. Pure functions: a sweep table in, a plotly ``Figure`` out."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp_seal.analysis.quadrants import QUADRANTS, HeadQuadrants
from interp_seal.viz.colors import SIGNED, symmetric_range
from interp_seal.viz.evaluation import PROPORTIONS, wilson_error_y

QUADRANT_COLORS = dict(
    zip(QUADRANTS, ("#2b8a3e", "#e67700", "#c92a2a", "#1864ab", "#868e96"), strict=True)
)
METRIC_NAMES = {"exact_match": "exact match", "answer_logprob": "answer log-prob"}


def head_delta_heatmap(table: pd.DataFrame, *, metric: str = "exact_match") -> go.Figure:
    """Layer x head heatmap of the change in ``metric`` when each head is ablated, one panel
    per length (SEAL Fig. 2b as a grid)."""
    rows = _rows(table, metric)
    return _delta_panels(
        rows,
        index="layer",
        columns="head",
        title=f"Change in {METRIC_NAMES.get(metric, metric)} when one head is ablated",
        x_title="head",
        y_title="layer",
    )


def channel_map(table: pd.DataFrame, *, metric: str = "exact_match") -> go.Figure:
    """Head x channel heatmap of the change in ``metric`` when each channel is ablated, one
    panel per length (SEAL Fig. 2c)."""
    rows = _rows(table, metric)
    if rows["channel"].isna().any():
        raise ValueError("channel_map needs a channel sweep table (channel_sweep)")
    rows = rows.assign(
        unit=[f"L{lay}H{h}" for lay, h in zip(rows.layer, rows["head"], strict=True)]
    )
    return _delta_panels(
        rows,
        index="unit",
        columns="channel",
        title=f"Change in {METRIC_NAMES.get(metric, metric)} when one channel is ablated",
        x_title="channel",
        y_title="head",
    )


def quadrant_scatter(quadrants: HeadQuadrants) -> go.Figure:
    """Pruning delta at the mid length (x) against the long length (y), coloured by quadrant
    (SEAL Fig. 2b), with the Pearson correlation in the title."""
    heads = quadrants.heads
    fig = go.Figure()
    for q in QUADRANTS:
        part = heads[heads.quadrant == q]
        if part.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=part.delta_mid,
                y=part.delta_long,
                mode="markers+text",
                text=[f"L{lay}H{h}" for lay, h in zip(part.layer, part["head"], strict=True)],
                textposition="top center",
                marker={"color": QUADRANT_COLORS[q], "size": 9},
                name=f"{q} ({len(part)})",
            )
        )
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    fig.add_vline(x=0, line={"color": "black", "width": 1})
    name = METRIC_NAMES.get(quadrants.metric, quadrants.metric)
    fig.update_layout(
        title=f"Head pruning: change in {name} (Pearson r = {quadrants.pearson:.2f})",
        xaxis_title=f"delta at length {quadrants.mid}",
        yaxis_title=f"delta at length {quadrants.long}",
        template="plotly_white",
    )
    return fig


def scale_table_curves(
    table: pd.DataFrame, *, metric: str = "exact_match", n: int | None = None
) -> go.Figure:
    """``metric`` against length for each scale table and the baseline (SEAL Fig. 2d).

    ``n``: records per length (the sweep's table does not count them); with it, exact match
    and first token carry 95 % Wilson intervals."""
    rows = _rows(table, metric)
    bars = n is not None and metric in PROPORTIONS

    def error_y(values):
        return wilson_error_y(values, [n] * len(values)) if bars else None

    if "table" not in rows:
        raise ValueError("scale_table_curves needs a scale_table_sweep table")
    fig = go.Figure()
    baseline = rows.drop_duplicates("length").sort_values("length")
    fig.add_trace(
        go.Scatter(
            x=baseline.length,
            y=baseline.baseline,
            error_y=error_y(baseline.baseline),
            name="baseline",
            line={"color": "black", "dash": "dash"},
        )
    )
    for name, part in rows.groupby("table", sort=False):
        part = part.sort_values("length")
        fig.add_trace(
            go.Scatter(
                x=part.length,
                y=part.value,
                error_y=error_y(part.value),
                name=str(name),
                mode="lines+markers",
            )
        )
    fig.update_layout(
        title=f"{METRIC_NAMES.get(metric, metric)} under multi-head scale tables",
        xaxis_title="length",
        yaxis_title=METRIC_NAMES.get(metric, metric),
        template="plotly_white",
    )
    return fig


def _rows(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    rows = table[table.metric == metric]
    if rows.empty:
        raise ValueError(
            f"no {metric!r} rows in the table; metrics present: {sorted(table.metric.unique())}"
        )
    return rows


def _delta_panels(
    rows: pd.DataFrame, *, index: str, columns: str, title: str, x_title: str, y_title: str
) -> go.Figure:
    """One delta heatmap per length, on a shared signed colour scale (``colors.SIGNED``)
    symmetric about 0."""
    lengths = sorted(rows.length.unique())
    extent = symmetric_range(rows.delta.to_numpy(dtype=float))
    fig = make_subplots(
        rows=1,
        cols=len(lengths),
        subplot_titles=[f"length {n}" for n in lengths],
        shared_yaxes=True,
    )
    for col, length in enumerate(lengths, start=1):
        grid = rows[rows.length == length].pivot(index=index, columns=columns, values="delta")
        fig.add_trace(
            go.Heatmap(
                z=grid.to_numpy(dtype=float),
                x=[str(c) for c in grid.columns],
                y=[str(i) for i in grid.index],
                coloraxis="coloraxis",
                hovertemplate=f"{y_title} %{{y}}, {x_title} %{{x}}: delta %{{z:.3f}}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text=x_title, row=1, col=col)
    fig.update_yaxes(title_text=y_title, row=1, col=1, autorange="reversed")
    fig.update_layout(
        title=title,
        coloraxis={
            "colorscale": SIGNED,
            "cmin": -extent,
            "cmax": extent,
            "colorbar": {"title": {"text": "change"}},
        },
        template="plotly_white",
    )
    return fig
