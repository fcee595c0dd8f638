"""Figures of the paper gallery that the other viz modules do not draw: method comparisons.

Pure functions: tidy tables in, a plotly ``Figure`` out (the gallery driver,
``interp_seal.figures``, writes the tables and draws them here).

- ``method_curves``: ``viz.tuning.method_accuracy`` with 95 % Wilson intervals (SEAL Table 1,
  Table 2 / Fig. 6);
- ``dla_comparison``: direct logit attribution of heads and MLPs per method (SEAL Fig. 4);
- ``niah_panels``: one needle heatmap per method (SEAL Fig. 5);
- ``lr_samples``: learning rate x samples heatmap and few-sample curves (SEAL Table 4, Fig. 7);
- ``passage_grid``: passage-level attention, models x layers (MuDAF Fig. 10).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp_seal.analysis.statistics import wilson
from interp_seal.viz.tuning import method_accuracy

PALETTE = ("#495057", "#1c7ed6", "#e8590c", "#2f9e44", "#9c36b5", "#f08c00", "#0ca678", "#d6336c")


def method_curves(table: pd.DataFrame, *, title: str, metric: str = "exact_match") -> go.Figure:
    """``viz.tuning.method_accuracy`` with 95 % Wilson intervals (rows need ``n``)."""
    fig = method_accuracy(table, metric=metric, title=title)
    for trace, (_, rows) in zip(fig.data, table.groupby("method", sort=False), strict=True):
        rows = rows.sort_values("length")
        bounds = [wilson(p * n, n) for p, n in zip(rows[metric], rows.n, strict=True)]
        p = rows[metric].to_numpy()
        trace.error_y = dict(
            type="data",
            symmetric=False,
            thickness=1,
            array=[hi - v for (_, hi), v in zip(bounds, p, strict=True)],
            arrayminus=[v - lo for (lo, _), v in zip(bounds, p, strict=True)],
        )
    return fig


def dla_comparison(attribution: pd.DataFrame, logits: pd.DataFrame) -> go.Figure:
    """Per method: head effects (layer x head), then embedding / MLP effects, then the logit."""
    methods = list(dict.fromkeys(attribution.method))
    fig = make_subplots(
        rows=len(methods),
        cols=3,
        column_widths=[0.45, 0.4, 0.15],
        subplot_titles=[
            f"{m}: {w}" for m in methods for w in ("heads", "embed + MLPs", "logit diff")
        ],
        vertical_spacing=0.08,
    )
    vmax = float(attribution[attribution.component == "head"].value.abs().max() or 1.0)
    for r, method in enumerate(methods, 1):
        rows = attribution[attribution.method == method]
        heads = rows[rows.component == "head"].pivot_table(
            index="layer", columns="head", values="value", aggfunc="sum"
        )
        fig.add_trace(
            go.Heatmap(
                z=heads.values,
                x=[f"H{int(h)}" for h in heads.columns],
                y=[f"L{int(lay)}" for lay in heads.index],
                coloraxis="coloraxis",
            ),
            row=r,
            col=1,
        )
        other = rows[rows.component != "head"]
        labels = [
            c if pd.isna(lay) else f"{c} L{int(lay)}"
            for c, lay in zip(other.component, other.layer, strict=True)
        ]
        fig.add_trace(
            go.Bar(x=labels, y=other.value, marker_color=PALETTE[1], showlegend=False), row=r, col=2
        )
        lg = logits[logits.method == method]
        fig.add_trace(
            go.Bar(x=lg.target, y=lg.logit, marker_color=PALETTE[2], showlegend=False), row=r, col=3
        )
    fig.update_layout(
        title="SEAL Fig. 4: direct effects on logit(correct) - logit(wrong)",
        coloraxis=dict(colorscale="RdBu", cmid=0, cmin=-vmax, cmax=vmax),
        template="plotly_white",
        height=260 * len(methods),
    )
    return fig


def niah_panels(grid: pd.DataFrame, heatmap: Callable[[pd.DataFrame], go.Figure]) -> go.Figure:
    """One depth x length heatmap per ``method`` (tidy rows: method, depth, context_length,
    exact_match), each drawn by ``heatmap`` (``interp_seal.viz.niah_heatmap``)."""
    methods = list(dict.fromkeys(grid.method))
    fig = make_subplots(rows=1, cols=len(methods), subplot_titles=methods, shared_yaxes=True)
    for c, method in enumerate(methods, 1):
        wide = grid[grid.method == method].pivot_table(
            index="depth", columns="context_length", values="exact_match"
        )
        for trace in heatmap(wide).data:
            trace.update(coloraxis="coloraxis", showscale=False)
            fig.add_trace(trace, row=1, col=c)
    fig.update_layout(
        title="SEAL Fig. 5: needle in a haystack (depth % x tokens)",
        coloraxis=dict(colorscale="RdYlGn", cmin=0, cmax=1),
        template="plotly_white",
    )
    return fig


def lr_samples(grid: pd.DataFrame, curves: pd.DataFrame) -> go.Figure:
    """SEAL Table 4 as a heatmap (lr x samples) beside Fig. 7's curves (samples x epochs)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("Table 4: lr x samples", "Fig. 7: fewer samples, more epochs"),
    )
    wide = grid.pivot_table(index="lr", columns="samples", values="exact_match")
    fig.add_trace(
        go.Heatmap(
            z=wide.values,
            x=[str(c) for c in wide.columns],
            y=[f"{v:g}" for v in wide.index],
            text=np.round(wide.values, 2),
            texttemplate="%{text}",
            colorscale="Viridis",
            zmin=0,
            zmax=1,
        ),
        row=1,
        col=1,
    )
    for i, ((n, e), rows) in enumerate(curves.groupby(["samples", "epochs"], sort=False)):
        rows = rows.sort_values("length")
        fig.add_trace(
            go.Scatter(
                x=rows.length,
                y=rows.exact_match,
                mode="lines+markers",
                name=f"{n} samples x {e} epochs",
                line=dict(color=PALETTE[(i + 1) % len(PALETTE)]),
            ),
            row=1,
            col=2,
        )
    fig.update_layout(title="SEAL-H hyper-parameters", template="plotly_white")
    fig.update_yaxes(title_text="learning rate", row=1, col=1)
    fig.update_xaxes(title_text="samples", row=1, col=1)
    fig.update_xaxes(title_text="lines in the record", row=1, col=2)
    return fig


def passage_grid(table: pd.DataFrame, golden: list[int]) -> go.Figure:
    """Heads x passages attention, one row per model and one column per layer (MuDAF Fig. 10).

    ``table``: ``model, layer, head, passage, attention`` with passage 0 the prefix ("#0");
    golden passages (1-based like the columns) are boxed.
    """
    models = list(dict.fromkeys(table.model))
    layers = sorted(table.layer.unique())
    fig = make_subplots(
        rows=len(models),
        cols=len(layers),
        shared_yaxes=True,
        subplot_titles=[f"{m}, layer {lay}" for m in models for lay in layers],
    )
    for r, model in enumerate(models, 1):
        for c, layer in enumerate(layers, 1):
            part = table[(table.model == model) & (table.layer == layer)]
            wide = part.pivot_table(index="head", columns="passage", values="attention")
            fig.add_trace(
                go.Heatmap(
                    z=wide.values,
                    x=[f"#{p}" for p in wide.columns],
                    y=[f"head {h}" for h in wide.index],
                    coloraxis="coloraxis",
                ),
                row=r,
                col=c,
            )
            for g in golden:
                fig.add_shape(
                    type="rect",
                    x0=g - 0.5,
                    x1=g + 0.5,
                    y0=-0.5,
                    y1=len(wide.index) - 0.5,
                    row=r,
                    col=c,
                    line=dict(dash="dot", width=2, color="black"),
                )
    fig.update_layout(
        title="MuDAF Fig. 10: last-token attention per passage (golden boxed)",
        coloraxis=dict(colorscale="Blues", cmin=0),
        template="plotly_white",
        height=300 * len(models),
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def head_count_curves(heads: pd.DataFrame) -> go.Figure:
    """MuDAF Fig. 7: passage QA exact match and the target / mean retrieval F1 against the
    number of heads MuDAF trains (``k``; 0 is Vanilla SFT)."""
    fig = go.Figure(
        [
            go.Scatter(x=heads.k, y=heads[c], name=c, mode="lines+markers")
            for c in ("exact_match", "target_f1", "mean_f1")
        ]
    )
    fig.update_layout(
        title="MuDAF Fig. 7: number of selected heads (0 = Vanilla SFT)",
        xaxis_title="selected heads",
        template="plotly_white",
    )
    return fig


def method_bars(accuracy: pd.DataFrame, *, title: str) -> go.Figure:
    """Exact match per method (``method``, ``exact_match``), one bar each, values written on."""
    fig = go.Figure(
        go.Bar(x=accuracy.method, y=accuracy.exact_match, text=accuracy.exact_match.round(2))
    )
    fig.update_layout(
        title=title, yaxis_title="exact match (teacher-forced)", template="plotly_white"
    )
    return fig
