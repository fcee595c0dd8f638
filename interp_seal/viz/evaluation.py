"""Figures for evaluation results: pure functions from a DataFrame to a plotly ``Figure``."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

METRIC_LABELS = {"exact_match": "exact match", "first_token": "first token correct"}
# gkamradt's NIAH colour map: red (miss) -> yellow -> green (hit)
NIAH_COLORSCALE = [[0.0, "#F0496E"], [0.5, "#EBB839"], [1.0, "#0CD79F"]]


def accuracy_figure(
    table: pd.DataFrame,
    *,
    metrics: tuple[str, ...] = ("exact_match", "first_token"),
    x_title: str = "lines in the record",
    title: str = "Retrieval accuracy vs context length",
) -> go.Figure:
    """Accuracy against length from ``evaluate_lengths``'s table: one line per metric.

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
