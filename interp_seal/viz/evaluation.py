"""Figures for evaluation results: pure functions from a DataFrame to a plotly ``Figure``.

Accuracies here are means of 0/1 outcomes over ``n`` records, so every accuracy curve carries
95 % Wilson intervals (``analysis.statistics.wilson``); ``wilson_error_y`` builds them for the
other modules of ``viz`` as well.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from interp_seal.analysis.statistics import wilson

METRIC_LABELS = {"exact_match": "exact match", "first_token": "first token correct"}
# metrics that are a mean of 0/1 outcomes per record: binomial proportions
PROPORTIONS = ("exact_match", "first_token")
# gkamradt's NIAH colour map: red (miss) -> yellow -> green (hit)
# viridis' ends and middle: ordered in lightness and readable with red-green colour blindness
NIAH_COLORSCALE = [[0.0, "#440154"], [0.5, "#21918c"], [1.0, "#fde725"]]


def wilson_error_y(p: Sequence[float | None], n: Sequence[float]) -> dict:
    """Plotly ``error_y`` spanning the 95 % Wilson interval of each proportion ``p[i]`` of
    ``n[i]`` records (asymmetric: the interval stays inside [0, 1]); a ``None`` proportion (not
    computed yet) gets no bar."""
    up, down = [], []
    for v, m in zip(p, n, strict=True):
        if v is None:
            up.append(None)
            down.append(None)
            continue
        lo, hi = wilson(float(v) * float(m), float(m))
        up.append(hi - float(v))
        down.append(float(v) - lo)
    return dict(type="data", symmetric=False, thickness=1, array=up, arrayminus=down)


def accuracy_figure(
    table: pd.DataFrame,
    *,
    metrics: tuple[str, ...] = ("exact_match", "first_token"),
    x_title: str = "lines in the record",
    title: str = "Retrieval accuracy vs context length",
) -> go.Figure:
    """Accuracy against length from ``evaluate_lengths``'s table: one line per metric, with
    95 % Wilson intervals for the proportions (exact match, first token).

    Hovering a point shows the mean token count and the number of samples behind it.
    """
    missing = {"length", "n", "n_tokens", *metrics} - set(table.columns)
    if missing:
        raise ValueError(
            f"table lacks columns {sorted(missing)} (expected evaluate_lengths output)"
        )
    table = table.sort_values("length")
    return go.Figure(
        data=[
            go.Scatter(
                x=table["length"],
                y=table[metric],
                mode="lines+markers",
                name=METRIC_LABELS.get(metric, metric),
                error_y=wilson_error_y(table[metric], table["n"])
                if metric in PROPORTIONS
                else None,
                customdata=table[["n_tokens", "n"]].to_numpy(),
                hovertemplate=(
                    "length %{x}<br>%{y:.3f}<br>%{customdata[0]:.0f} tokens (mean)"
                    "<br>n = %{customdata[1]}<extra></extra>"
                ),
            )
            for metric in metrics
        ],
        layout=go.Layout(
            title=title,
            xaxis_title=x_title,
            yaxis=dict(title="accuracy", range=[-0.02, 1.02]),
            template="plotly_white",
        ),
    )


def niah_heatmap(grid: pd.DataFrame, *, title: str = "Needle in a haystack") -> go.Figure:
    """NIAH heatmap of ``niah_grid``'s table: depth (%) on y, context length on x."""
    return go.Figure(
        data=go.Heatmap(
            z=grid.to_numpy(),
            x=[str(c) for c in grid.columns],
            y=[str(d) for d in grid.index],
            zmin=0.0,
            zmax=1.0,
            colorscale=NIAH_COLORSCALE,
            colorbar=dict(title="exact match"),
            hovertemplate="length %{x}<br>depth %{y}%<br>exact match %{z:.2f}<extra></extra>",
        ),
        layout=go.Layout(
            title=title,
            xaxis=dict(title="context length (tokens)", type="category"),
            yaxis=dict(title="needle depth (%)", type="category", autorange="reversed"),
            template="plotly_white",
        ),
    )
