"""Figures for ablation sweeps (SEAL Fig. 2): delta heatmaps, the quadrant scatter, channel maps
and scale-table curves. Pure functions: a sweep table in, a plotly ``Figure`` out."""

from __future__ import annotations

import numpy as np
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


def head_delta_heatmap(
    table: pd.DataFrame, *, metric: str = "exact_match", unit: str = "lines"
) -> go.Figure:
    """Layer x head heatmap of the change in ``metric`` when each head is ablated, one panel
    per length in ``unit`` (SEAL Fig. 2b as a grid)."""
    rows = _rows(table, metric)
    return _delta_panels(
        rows,
        index="layer",
        columns="head",
        title=f"Change in {METRIC_NAMES.get(metric, metric)} when one head is ablated",
        x_title="head",
        y_title="layer",
        scale_title=f"change in<br>{METRIC_NAMES.get(metric, metric)}",
        unit=unit,
    )


def channel_map(
    table: pd.DataFrame, *, metric: str = "exact_match", unit: str = "lines"
) -> go.Figure:
    """Head x channel heatmap of the change in ``metric`` when each channel is ablated, one
    panel per length in ``unit`` (SEAL Fig. 2c)."""
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
        x_title="channel (dimension of the head's output)",
        y_title="head",
        scale_title=f"change in<br>{METRIC_NAMES.get(metric, metric)}",
        unit=unit,
        shared_x_title=True,
    )


def quadrant_scatter(
    quadrants: HeadQuadrants, *, unit: str = "lines", labels: int = 6
) -> go.Figure:
    """Pruning delta at the mid length (x) against the long length (y), coloured by quadrant
    (SEAL Fig. 2b), with the Pearson correlation in the title.

    Only the notable heads are named on the plot, so that names never pile up: every head
    outside Q3 and the axis (the few whose pruning helps somewhere) and the ``labels`` heads
    farthest from the origin, each kept only if it does not crowd a name already placed;
    hovering any point names its head. ``unit``: what the lengths count.
    """
    heads = quadrants.heads.assign(
        name=[
            f"L{a}H{b}" for a, b in zip(quadrants.heads.layer, quadrants.heads["head"], strict=True)
        ]
    )
    named = _label_heads(heads, labels)
    metric = METRIC_NAMES.get(quadrants.metric, quadrants.metric)
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
                text=[n if n in named else "" for n in part.name],
                customdata=part.name,
                textposition=[named.get(n, "top center") for n in part.name],
                marker={"color": QUADRANT_COLORS[q], "size": 9},
                name=f"{q} ({len(part)})",
                hovertemplate=f"%{{customdata}}<br>change at {quadrants.mid} {unit} %{{x:+.3f}}"
                f"<br>change at {quadrants.long} {unit} %{{y:+.3f}}<extra>{q}</extra>",
            )
        )
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    fig.add_vline(x=0, line={"color": "black", "width": 1})
    fig.update_layout(
        title=f"Head pruning: change in {metric} (Pearson r = {quadrants.pearson:.2f}); "
        "notable heads named, hover for the rest",
        xaxis_title=f"change in {metric} at {quadrants.mid} {unit}",
        yaxis_title=f"change in {metric} at {quadrants.long} {unit}",
        template="plotly_white",
    )
    return fig


LABEL_BOX = (0.09, 0.06)  # a name's width and height, in fractions of the axes' spans


def _label_heads(heads: pd.DataFrame, labels: int) -> dict[str, str]:
    """Name -> text position for the names to write: heads off Q3 / the axis first, then the
    farthest from the origin; each goes above its point, else below, and is dropped if both
    would overlap a name already placed (boxes of ``LABEL_BOX`` in fractions of the axes)."""
    x, y = heads.delta_mid.to_numpy(float), heads.delta_long.to_numpy(float)
    x = x / max(float(np.ptp(x)), 1e-9)
    y = y / max(float(np.ptp(y)), 1e-9)
    width, height = LABEL_BOX
    rare = ~heads.quadrant.isin(["Q3", "axis"]).to_numpy()
    order = sorted(range(len(heads)), key=lambda i: (not rare[i], -np.hypot(x[i], y[i])))
    boxes: list[tuple[float, float]] = []  # centres of the names placed
    named: dict[str, str] = {}
    for i in order:
        if not rare[i] and len(named) >= labels + int(rare.sum()):
            break
        for position, dy in (("top center", 0.6 * height), ("bottom center", -0.6 * height)):
            centre = (x[i], y[i] + dy)
            free = all(
                abs(centre[0] - cx) >= width or abs(centre[1] - cy) >= height for cx, cy in boxes
            )
            if free:
                boxes.append(centre)
                named[heads.name.iloc[i]] = position
                break
    return named


def scale_table_curves(
    table: pd.DataFrame, *, metric: str = "exact_match", n: int | None = None, unit: str = "lines"
) -> go.Figure:
    """``metric`` against length for each scale table and the baseline (SEAL Fig. 2d).

    ``n``: records per length (the sweep's table does not count them); with it, exact match
    and first token carry 95 % Wilson intervals. ``unit``: what the lengths count."""
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
        title=f"{METRIC_NAMES.get(metric, metric).capitalize()} under multi-head scale tables "
        "(Q1: heads whose pruning helps, Q3: hurts)",
        xaxis_title=f"{unit} in the record",
        yaxis_title=f"{METRIC_NAMES.get(metric, metric)} (fraction of records)"
        if metric in PROPORTIONS
        else METRIC_NAMES.get(metric, metric),
        template="plotly_white",
    )
    return fig


def replication_points(
    fig: go.Figure, length: float, rates: dict[str, float], n: int, label: str
) -> go.Figure:
    """Mark a replication's exact match at ``length`` beside the curves of
    ``scale_table_curves``: one open marker per curve named in ``rates``, in that curve's colour,
    with its 95 % Wilson interval over the replication's ``n`` records; ``label`` says which
    records they are."""
    palette = fig.layout.template.layout.colorway  # plotly colours traces by their index
    colors = {t.name: t.line.color or palette[k % len(palette)] for k, t in enumerate(fig.data)}
    xs = [float(x) for t in fig.data for x in t.x]
    beside = 0.02 * (max(xs) - min(xs))  # off the curves' own point at ``length``
    for k, (name, value) in enumerate(rates.items(), 1):
        fig.add_trace(
            go.Scatter(
                x=[length + k * beside],
                y=[value],
                error_y=wilson_error_y([value], [n]),
                name=f"{name}, {label}",
                mode="markers",
                marker={
                    "symbol": "diamond-open",
                    "size": 10,
                    "color": colors[name],
                },
            )
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
    rows: pd.DataFrame,
    *,
    index: str,
    columns: str,
    title: str,
    x_title: str,
    y_title: str,
    scale_title: str = "change",
    unit: str = "lines",
    shared_x_title: bool = False,
) -> go.Figure:
    """One delta heatmap per length (``unit``), on a shared signed colour scale
    (``colors.SIGNED``) symmetric about 0, its colour bar titled ``scale_title``.
    ``shared_x_title``: ``x_title`` once, centred under every panel (a long title repeated
    under narrow panels overlaps its neighbours)."""
    lengths = sorted(rows.length.unique())
    extent = symmetric_range(rows.delta.to_numpy(dtype=float))
    fig = make_subplots(
        rows=1,
        cols=len(lengths),
        subplot_titles=[f"{n} {unit}" for n in lengths],
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
        if not shared_x_title:
            fig.update_xaxes(title_text=x_title, row=1, col=col)
    fig.update_yaxes(title_text=y_title, row=1, col=1, autorange="reversed")
    if shared_x_title:
        fig.add_annotation(
            text=x_title,
            x=0.5,
            y=0,
            xref="paper",
            yref="paper",
            yanchor="top",
            yshift=-28,  # below the tick labels
            showarrow=False,
            font={"size": 14},
        )
        fig.update_layout(margin={"b": 70})
    fig.update_layout(
        title=title,
        coloraxis={
            "colorscale": SIGNED,
            "cmin": -extent,
            "cmax": extent,
            "colorbar": {"title": {"text": scale_title}},
        },
        template="plotly_white",
    )
    return fig
