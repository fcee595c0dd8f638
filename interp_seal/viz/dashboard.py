"""Figures of the head-pruning dashboard and the quadrant explorer (SEAL Fig. 2b, 2d).

Pure functions: data in, a plotly ``Figure`` out; the ``set_*`` functions redraw a figure's
data in place, so that a widget (``interp_seal.widgets``) built once sends only the changed
values to the browser.

- ``edit_grid`` / ``set_edits``: the layers x heads grid of the current edits, coloured by
  factor on the edit scale (``colors.EDITS``: grey pruned, white kept, orange amplified), each
  edited cell labelled with its factor; streaming KV heads (sink + window attention) framed in
  teal across the query heads that read them, their cells marked "S".
- ``budget_table``: accuracy per length beside the KV cache the streaming heads keep.
- ``quadrant_map``: SEAL Fig. 2b with the quadrants shaded and every head's layer, head, both
  deltas and quadrant in its hover text; ``customdata`` carries ``(layer, head)`` for clicks.
- ``accuracy_curves`` / ``set_accuracy``: accuracy against length, unedited and edited (SEAL
  Fig. 2d) with 95 % Wilson intervals, from a table shaped like ``EditEvaluator.evaluate``'s.
- ``head_channel_map``: one head's channel map (SEAL Fig. 2c) as one heatmap, context length x
  channel, pending channels blank, its title saying which edits it was computed under.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from html import escape

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp_seal.analysis.quadrants import HeadQuadrants
from interp_seal.interventions import Head
from interp_seal.viz.colors import EDITS, SIGNED, symmetric_range
from interp_seal.viz.evaluation import wilson_error_y
from interp_seal.viz.sweeps import METRIC_NAMES, QUADRANT_COLORS

FACTOR_SPAN = (0.0, 2.0)  # the edit colour scale: pruned .. kept .. doubled
PENDING = "#f08c00"  # the outline of an edit that is queued or computing
STREAMING = "#0c8599"  # the frame of a streaming KV head's query heads


def edit_factors(n_layers: int, n_heads: int, edits: Mapping[Head, float]) -> np.ndarray:
    """``(L, H)`` array of each head's factor (1 where not edited)."""
    factors = np.ones((n_layers, n_heads))
    for (layer, head), factor in edits.items():
        factors[layer, head] = factor
    return factors


def edit_grid(
    n_layers: int,
    n_heads: int,
    edits: Mapping[Head, float],
    *,
    selected: Head | None = None,
    streaming: Iterable[tuple[int, int]] = (),
    group: int = 1,
) -> go.Figure:
    """Layers x heads grid of ``edits`` (``{(layer, head): factor}``), layer 0 at the top.

    Coloured by factor on the edit scale (``colors.EDITS``: grey pruned, white kept, orange
    amplified), each edited cell labelled with its factor; ``selected`` is outlined; the
    ``streaming`` KV heads ``(layer, kv_head)`` framed across their ``group`` query heads."""
    fig = go.Figure(
        go.Heatmap(
            x=list(range(n_heads)),
            y=list(range(n_layers)),
            texttemplate="%{text}",
            colorscale=EDITS,
            zmin=FACTOR_SPAN[0],
            zmax=FACTOR_SPAN[1],
            xgap=2,
            ygap=2,
            colorbar={"title": {"text": "factor"}, "tickvals": [0, 1, 2], "len": 0.8},
            hovertemplate="layer %{y}, head %{x}: factor %{z:.2f}<extra></extra>",
        )
    )
    fig.update_layout(
        title="Head edits",
        xaxis={"title": "head", "dtick": 1, "showgrid": False},
        yaxis={"title": "layer", "dtick": 1, "autorange": "reversed", "showgrid": False},
        dragmode=False,  # heatmap cells fire no clicks in select mode
        template="plotly_white",
        plot_bgcolor="#ced4da",  # the gaps between cells: kept (white) heads stay visible
        width=150 + 40 * n_heads,
        height=130 + 40 * n_layers,
        margin={"t": 40, "b": 40, "l": 50, "r": 10},
    )
    set_edits(fig, edits, selected=selected, streaming=streaming, group=group)
    return fig


def set_edits(
    fig: go.Figure,
    edits: Mapping[Head, float],
    *,
    selected: Head | None,
    pending: Iterable[Head] = (),
    streaming: Iterable[tuple[int, int]] = (),
    group: int = 1,
) -> None:
    """Redraw ``edit_grid``'s cells and outlines in place (a widget sends only what changed):
    ``selected`` outlined in blue, ``pending`` heads (edited, not computed yet) outlined with
    orange dashes inside their cells, each streaming KV head ``(layer, kv_head)`` framed in teal
    across its ``group`` query heads, which are marked "S"."""
    trace = fig.data[0]
    factors = edit_factors(len(trace.y), len(trace.x), edits)
    streaming = sorted(streaming)
    text = [[_factor_label(f) for f in row] for row in factors]
    for layer, kv in streaming:
        for head in range(kv * group, (kv + 1) * group):
            text[layer][head] = f"{text[layer][head]} S".strip()
    trace.z = factors
    trace.text = text
    shapes = [_group_frame(layer, kv, group) for layer, kv in streaming]
    shapes += [
        _outline(head, {"color": PENDING, "width": 3, "dash": "dot"}, 0.38) for head in pending
    ]
    if selected is not None:
        shapes.append(_outline(selected, {"color": "#1c7ed6", "width": 3}, 0.5))
    fig.layout.shapes = shapes


def _outline(head: Head, line: dict, half: float) -> dict:
    layer, index = head
    return {
        "type": "rect",
        "x0": index - half,
        "x1": index + half,
        "y0": layer - half,
        "y1": layer + half,
        "line": line,
    }


def _group_frame(layer: int, kv: int, group: int) -> dict:
    """A teal frame around the query heads of KV head ``kv`` of ``layer`` (a streaming one)."""
    return {
        "type": "rect",
        "x0": kv * group - 0.45,
        "x1": (kv + 1) * group - 0.55,
        "y0": layer - 0.45,
        "y1": layer + 0.45,
        "line": {"color": STREAMING, "width": 3},
    }


def _factor_label(factor: float) -> str:
    if factor == 1:
        return ""
    return "x0" if factor == 0 else f"x{factor:.2f}"


def accuracy_curves(
    table: pd.DataFrame, *, metric: str = "exact_match", records: Mapping[int, int] | None = None
) -> go.Figure:
    """``metric`` against length: the edited model (solid) under the unedited one (dashed, on
    top so it stays visible where the curves coincide).

    ``table`` has ``length``, ``metric``, ``value`` and ``baseline`` columns
    (``EditEvaluator.evaluate``); lengths it lacks are drawn as gaps (not computed yet).
    ``records`` (records per length) adds 95 % Wilson intervals to exact match."""
    lengths = sorted(records) if records else sorted(table.length.unique())
    name = METRIC_NAMES.get(metric, metric)
    hover = "%{x} lines: %{y:.3f}<extra>%{fullData.name}</extra>"
    fig = go.Figure(
        [
            go.Scatter(
                x=lengths,
                name="edited",
                mode="lines+markers",
                line={"color": "#e8590c", "width": 4},
                marker={"size": 10},
                hovertemplate=hover,
            ),
            go.Scatter(
                x=lengths,
                name="unedited",
                mode="lines+markers",
                line={"color": "black", "dash": "dash", "width": 2},
                marker={"size": 6},
                hovertemplate=hover,
            ),
        ]
    )
    fig.update_layout(
        title=f"{name} vs context length",
        xaxis={"title": "context length (lines)", "tickvals": lengths},
        yaxis_title=name,
        template="plotly_white",
        width=460,
        height=380,
        margin={"t": 40, "b": 40, "l": 60, "r": 10},
        legend={"orientation": "h", "y": -0.2},
    )
    if metric == "exact_match":
        fig.update_yaxes(range=[-0.03, 1.03])
    set_accuracy(fig, table, metric=metric, records=records)
    return fig


def set_accuracy(
    fig: go.Figure,
    table: pd.DataFrame,
    *,
    metric: str = "exact_match",
    records: Mapping[int, int] | None = None,
) -> None:
    """Redraw ``accuracy_curves``' points in place from ``table`` (missing lengths: gaps)."""
    rows = table[table.metric == metric].set_index("length")
    if rows.empty and not table.empty:
        raise ValueError(f"no {metric!r} rows; metrics present: {sorted(table.metric.unique())}")
    edited, unedited = fig.data
    lengths = list(edited.x)
    for trace, column in ((edited, "value"), (unedited, "baseline")):
        values = [float(rows.loc[x, column]) if x in rows.index else math.nan for x in lengths]
        values = [v if math.isfinite(v) else None for v in values]  # NaN: not computed yet
        trace.y = values
        if records and metric == "exact_match":
            trace.error_y = wilson_error_y(values, [records[x] for x in lengths])


def budget_table(table: pd.DataFrame, budget: pd.DataFrame, *, metric: str = "exact_match") -> str:
    """HTML table: per length, ``metric`` with the edits and streaming heads and unedited
    (``EditEvaluator.evaluate``'s table; lengths it lacks shown as pending), beside the KV
    cache kept after the prompt and its share of the all-full cache (``EditEvaluator.kv_budget``).

    Each row carries its numbers unrounded as ``data-*`` attributes (``data-length``,
    ``data-value``, ``data-baseline``, ``data-kv-bytes``, ``data-kv-share``; ``data-value`` is
    empty while pending), for tests that read the page."""
    name = METRIC_NAMES.get(metric, metric)
    rows = table[table.metric == metric].set_index("length")
    head = "".join(
        f"<th>{escape(h)}</th>"
        for h in ("lines", "tokens", name, "unedited", "KV cache kept", "of full")
    )
    body = []
    for b in budget.itertuples():
        done = b.length in rows.index
        value = float(rows.loc[b.length, "value"]) if done else None
        base = float(rows.loc[b.length, "baseline"]) if done else None
        shown = "&hellip;" if value is None else f"{value:.3f}"
        unedited = "" if base is None else f"{base:.3f}"
        attrs = (
            f"data-length='{b.length}' data-value='{'' if value is None else repr(value)}' "
            f"data-baseline='{'' if base is None else repr(base)}' "
            f"data-kv-bytes='{b.kv_bytes!r}' data-kv-share='{b.kv_share!r}'"
        )
        cells = (b.length, f"{b.tokens:.0f}", shown, unedited, kv_size(b.kv_bytes))
        cells += (f"{100 * b.kv_share:.1f} %",)
        body.append(f"<tr {attrs}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (
        "<table data-kv-budget cellpadding='3' style='font-size:13px;text-align:right'>"
        f"<tr style='border-bottom:1px solid #adb5bd'>{head}</tr>{''.join(body)}</table>"
    )


def kv_size(n_bytes: float) -> str:
    """``n_bytes`` in KiB or MiB (binary units, as memory is counted)."""
    if n_bytes >= 2**20:
        return f"{n_bytes / 2**20:.2f} MiB"
    return f"{n_bytes / 2**10:.1f} KiB"


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


def head_channel_map(
    table: pd.DataFrame,
    *,
    head: Head,
    channels: Sequence[int],
    lengths: Sequence[int],
    under: str,
    metric: str = "exact_match",
    unit: str = "lines",
) -> go.Figure:
    """``head``'s channel map: the change in ``metric`` when one of its channels is zeroed, one
    row per context length, one column per channel (SEAL Fig. 2c for one head).

    ``table`` is a channel sweep's (``channel``, ``length``, ``metric``, ``delta``); channels
    it lacks yet are blank. ``under`` says what the map was computed under (the dashboard's
    edits): the subtitle, one line per line of it. Signed colours (``colors.SIGNED``) symmetric about 0."""
    grid = np.full((len(lengths), len(channels)), np.nan)
    if not table.empty:
        rows = table[table.metric == metric]
        column = {c: j for j, c in enumerate(channels)}
        row = {n: i for i, n in enumerate(lengths)}
        for c, n, d in zip(rows.channel, rows.length, rows.delta, strict=True):
            grid[row[int(n)], column[int(c)]] = float(d)
    extent = symmetric_range(grid)
    lines = under.split("\n")
    xs, ys = [str(c) for c in channels], [str(n) for n in lengths]
    name = METRIC_NAMES.get(metric, metric)
    label = f"L{head[0]}H{head[1]}"
    fig = go.Figure(
        go.Heatmap(
            z=[[None if np.isnan(v) else v for v in r] for r in grid],
            x=xs,
            y=ys,
            colorscale=SIGNED,
            zmin=-extent,
            zmax=extent,
            xgap=1,
            ygap=1,
            colorbar={"title": {"text": f"change in<br>{name}"}, "len": 0.9},
            hovertemplate=f"{label} channel %{{x}}, %{{y}} {unit}: change %{{z:+.3f}}<extra></extra>",
        )
    )
    fig.update_layout(
        title={
            "text": f"Channel map of {label}: change in {name} when one channel is zeroed"
            + "".join(f"<br><span style='font-size:12px'>{line}</span>" for line in lines),
            "x": 0.01,
            "xanchor": "left",
        },
        # every channel and length on the axes from the start, computed or not
        xaxis={
            "title": f"channel of {label}'s output",
            "type": "category",
            "categoryarray": xs,
            "range": [-0.5, len(xs) - 0.5],
            "tickangle": 0,
        },
        yaxis={
            "title": f"context length ({unit})",
            "type": "category",
            "categoryarray": ys,
            "range": [len(ys) - 0.5, -0.5],  # the shortest on top
        },
        template="plotly_white",
        plot_bgcolor="#f1f3f5",  # pending channels: light grey, not white (= no change)
        height=160 + 42 * len(lengths) + 20 * len(lines),
        margin={"t": 60 + 20 * len(lines), "b": 50, "l": 80, "r": 10},
    )
    return fig
