"""Figures for direct logit attribution and patching (SEAL Fig. 4, patching heatmaps).

Pure functions: a result table in, a plotly ``Figure`` out. Heatmaps use the signed scale
(``colors.SIGNED``: blue helps, red hurts) centred on zero, so that helpful and harmful
components read at a glance.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp_seal.analysis.logit_attribution import LogitAttribution
from interp_seal.viz.colors import SIGNED, symmetric_range


def _heatmap(grid: pd.DataFrame, *, label: str = "value", zmax: float | None = None) -> go.Heatmap:
    """A signed heatmap of ``grid`` (index on y, columns on x), centred on 0; ``zmax`` fixes
    the colour range to ``[-zmax, zmax]`` (default: the grid's own largest magnitude)."""
    zmax = symmetric_range(grid.to_numpy()) if zmax is None else zmax
    return go.Heatmap(
        z=grid.to_numpy(),
        x=[str(c) for c in grid.columns],
        y=[str(i) for i in grid.index],
        colorscale=SIGNED,
        zmid=0,
        zmin=-zmax,
        zmax=zmax,
        colorbar={"title": {"text": label}},
        hovertemplate="y=%{y}<br>x=%{x}<br>" + label + "=%{z:.4g}<extra></extra>",
    )


def _head_grid(rows: pd.DataFrame) -> pd.DataFrame:
    """Layer x head grid of ``value`` (top layer first)."""
    if rows.duplicated(["layer", "head"]).any():
        raise ValueError("several rows per (layer, head): select one target or position first")
    return rows.pivot(index="layer", columns="head", values="value").sort_index(ascending=False)


def _position_grid(rows: pd.DataFrame) -> pd.DataFrame:
    """Layer x position grid of ``value`` summed over heads (top layer first)."""
    grid = rows.groupby(["layer", "position"])["value"].sum().unstack()
    return grid.sort_index(ascending=False)


def dla_figure(
    result: LogitAttribution,
    target: str | None = None,
    *,
    head_range: float | None = None,
    bar_range: float | None = None,
) -> go.Figure:
    """SEAL Fig. 4 for one target: heads (layer x head heatmap), then the embedding and each
    layer's MLP (bars), with the model's logit in the title.

    ``head_range`` / ``bar_range`` fix the heatmap's colour range and the bars' axis to
    ``[-range, range]`` (a widget fixes them so that views compare); default: this result's."""
    heads, names, values, title = _dla_parts(result, target)
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.55, 0.45],
        subplot_titles=("attention heads", "embedding and MLPs"),
        horizontal_spacing=0.2,
    )
    head_range = symmetric_range(heads.to_numpy()) if head_range is None else head_range
    heatmap = _heatmap(heads, label="direct effect", zmax=head_range)
    # under the heads, clear of the bars' axis
    heatmap.colorbar.update(
        orientation="h", x=0.275, xanchor="center", y=-0.45, len=0.5, thickness=12
    )
    fig.add_trace(heatmap, row=1, col=1)
    fig.add_trace(go.Bar(x=names, showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="head", row=1, col=1)
    fig.update_yaxes(title_text="layer", row=1, col=1)
    bar_range = symmetric_range(values) if bar_range is None else bar_range
    fig.update_yaxes(title_text="direct effect (logit)", row=1, col=2)
    fig.update_layout(margin={"b": 130})
    set_dla(fig, result, target, head_range=head_range, bar_range=bar_range)
    return fig


def set_dla(
    fig: go.Figure,
    result: LogitAttribution,
    target: str | None = None,
    *,
    head_range: float | None = None,
    bar_range: float | None = None,
) -> None:
    """Redraw ``dla_figure``'s values and title in place; ``head_range`` / ``bar_range`` set
    the heatmap's colour range and the bars' axis to ``[-range, range]`` (None: kept)."""
    heads, _, values, title = _dla_parts(result, target)
    fig.data[0].z = heads.to_numpy()
    fig.data[1].y = values
    fig.data[1].marker.color = ["#1c7ed6" if v >= 0 else "#c92a2a" for v in values]
    fig.layout.title.text = title
    if head_range is not None:
        fig.data[0].update(zmin=-head_range, zmax=head_range)
    if bar_range is not None:
        fig.layout.yaxis2.range = [-bar_range, bar_range]


def _dla_parts(result: LogitAttribution, target: str | None):
    """The head grid, bar names, bar values and title of ``result``'s ``target``."""
    targets = list(result.logits)
    target = targets[0] if target is None else target
    if target not in result.logits:
        raise ValueError(f"unknown target {target!r}; this result has {targets}")
    rows = result.table[result.table.target == target]
    grid = _head_grid(rows[rows.component == "head"])
    others = rows[rows.component != "head"]
    names = [
        c if pd.isna(layer) else f"{c} {layer}"
        for c, layer in zip(others.component, others.layer, strict=True)
    ]
    title = (
        f"Direct logit attribution ({result.variant}) of {target!r} at position "
        f"{result.position}; model logit {result.logits[target]:.4g}"
    )
    return grid, names, others.value.tolist(), title


def patching_figure(
    table: pd.DataFrame,
    *,
    title: str = "Activation patching",
    tokens: Sequence[str] | None = None,
) -> go.Figure:
    """Normalised patching effect: layer x head for whole-head patches, layer x position for
    per-position head patches (summed over heads) and for the residual stream.

    All panels share one colour range (the largest magnitude of any of them) and its colour
    bar. ``tokens`` (one label per prompt position, e.g. ``viz.tokens.pair_labels``) names each
    position on the position axes and in the hover text instead of its bare index."""
    head_all = table[(table.site == "head") & table.position.isna()]
    head_pos = table[(table.site == "head") & table.position.notna()]
    resid = table[table.site == "resid"]
    panels = []
    if not head_all.empty:
        panels.append(("heads (all positions)", _head_grid(head_all), "head"))
    if not head_pos.empty:
        panels.append(("heads by position (sum over heads)", _position_grid(head_pos), "position"))
    if not resid.empty:
        panels.append(("residual stream", _position_grid(resid), "position"))
    if not panels:
        raise ValueError("the patching table is empty")
    zmax = symmetric_range(*[grid.to_numpy() for _, grid, _ in panels])
    fig = make_subplots(
        rows=len(panels), cols=1, subplot_titles=[p[0] for p in panels], vertical_spacing=0.12
    )
    for i, (_, grid, x_title) in enumerate(panels, start=1):
        trace = _heatmap(grid, label="normalised LD", zmax=zmax)
        trace.update(showscale=i == 1)
        if x_title == "position" and tokens is not None:
            labels = _position_labels(grid.columns, tokens)
            trace.update(
                text=[labels] * len(grid.index),
                hovertemplate="layer %{y}<br>%{text}<br>normalised LD=%{z:.4g}<extra></extra>",
            )
            fig.update_xaxes(
                tickmode="array", tickvals=list(trace.x), ticktext=labels, row=i, col=1
            )
            x_title = "position and token"
        fig.add_trace(trace, row=i, col=1)
        fig.update_xaxes(title_text=x_title, row=i, col=1)
        fig.update_yaxes(title_text="layer", row=i, col=1)
    fig.update_layout(title=title, height=320 * len(panels))
    return fig


def _position_labels(positions, tokens: Sequence[str]) -> list[str]:
    """``"616 token"`` per position (HTML-escaped: plotly reads tags in tick text)."""
    positions = [int(p) for p in positions]
    outside = [p for p in positions if not 0 <= p < len(tokens)]
    if outside:
        raise ValueError(f"positions {outside} have no token label ({len(tokens)} labels given)")
    return [f"{p} {escape(tokens[p])}" for p in positions]


def attribution_scatter(table: pd.DataFrame, spearman: dict[str, float]) -> go.Figure:
    """Exact effect (x) against attribution patching (y) per head, one trace per method."""
    fig = go.Figure()
    for method, group in table.groupby("method", sort=False):
        fig.add_trace(
            go.Scatter(
                x=group.exact,
                y=group.atp,
                mode="markers",
                name=f"{method} (Spearman {spearman[method]:.3f})",
                text=[f"L{a}H{b}" for a, b in zip(group.layer, group["head"], strict=True)],
                hovertemplate="%{text}<br>exact=%{x:.4g}<br>atp=%{y:.4g}<extra></extra>",
            )
        )
    fig.update_layout(
        title="Attribution patching vs exact", xaxis_title="exact", yaxis_title="attribution"
    )
    return fig
