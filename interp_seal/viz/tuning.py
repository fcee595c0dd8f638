"""Figures for tuning runs: before/after accuracy, loss curves, learned scales, target heads.

Pure functions: a result (a table from ``interp_seal.tuning.evaluate``, a loss history, a scale
tensor) in, a plotly ``Figure`` out.

- ``method_accuracy``: SEAL Fig. 1 / Table 1, line-retrieval accuracy against the number of
  lines for the base model and each tuned variant (``accuracy_by_method``'s table), with 95 %
  Wilson intervals when the table counts its records (``n``); the base is drawn on top, so a
  method with the base's very numbers cannot hide it.
- ``loss_curves``: the answer loss (or any named loss) per optimizer step, one line per run.
- ``scale_heatmap``: learned SEAL-H scales ``(L, H, 1)`` as a layer x head grid, or SEAL-C
  scales ``(L, H, D)`` as a head x channel grid; a diverging scale centred on 1 (the identity),
  so heads the tuner turned down read blue and heads it turned up read red.
- ``target_head_scores``: MuDAF Fig. 5, the retrieval score of each MuDAF target head for the
  base model and each tuned model, with the head's rank among all heads above its bar
  (``retrieval_by_method``'s table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from interp_seal.viz.colors import EDITS
from interp_seal.viz.evaluation import PROPORTIONS, wilson_error_y

METRIC_LABELS = {
    "exact_match": "exact match",
    "first_token": "first token correct",
    "answer_logprob": "answer log-prob",
}
MARKERS = ("circle", "square", "diamond", "triangle-up", "x", "triangle-down", "star", "cross")


def method_accuracy(
    table: pd.DataFrame, *, metric: str = "exact_match", title: str | None = None
) -> go.Figure:
    """``metric`` against length, one line per ``method``; for exact match and first token, 95 %
    Wilson intervals when the table has an ``n`` column. Each method has its own marker, and the
    base (black, dashed) is drawn last, on top, but listed first: a tuned method that scores
    exactly what the base does would otherwise hide the base's line under its own."""
    missing = {"method", "length", metric} - set(table.columns)
    if missing:
        raise ValueError(
            f"the table lacks columns {sorted(missing)} (expected accuracy_by_method's table)"
        )
    name = METRIC_LABELS.get(metric, metric)
    bars = metric in PROPORTIONS and "n" in table.columns
    lines, base = [], []  # the base's trace goes last: drawn on top
    for i, (method, rows) in enumerate(table.groupby("method", sort=False)):
        rows = rows.sort_values("length")
        is_base = method == "base"
        (base if is_base else lines).append(
            go.Scatter(
                x=rows["length"].tolist(),
                y=rows[metric].tolist(),
                name=str(method),
                mode="lines+markers",
                line={"color": "black", "dash": "dash"} if is_base else None,
                marker={"symbol": MARKERS[i % len(MARKERS)], "size": 9},
                legendrank=0 if is_base else i + 1,  # legend: base first, then table order
                error_y=wilson_error_y(rows[metric], rows["n"]) if bars else None,
                hovertemplate=f"%{{fullData.name}}<br>length %{{x}}<br>{name} %{{y:.3f}}"
                "<extra></extra>",
            )
        )
    fig = go.Figure(data=lines + base)
    fig.update_layout(
        title=title or f"{name.capitalize()} vs context length, before and after tuning",
        xaxis_title="lines in the record",
        yaxis_title=name,
        template="plotly_white",
    )
    if metric in ("exact_match", "first_token"):
        fig.update_yaxes(range=[-0.02, 1.02])
    return fig


def loss_curves(
    losses: Mapping[str, Sequence[float]], *, title: str = "Training loss per step"
) -> go.Figure:
    """One line per named run: loss (y) against the 1-based optimizer step (x)."""
    if not losses or any(len(v) == 0 for v in losses.values()):
        raise ValueError("give at least one run with at least one step: {'seal-h': [0.7, ...]}")
    return go.Figure(
        data=[
            go.Scatter(
                x=list(range(1, len(values) + 1)),
                y=[float(v) for v in values],
                name=name,
                mode="lines+markers",
                hovertemplate="%{fullData.name}<br>step %{x}<br>loss %{y:.4f}<extra></extra>",
            )
            for name, values in losses.items()
        ],
        layout=go.Layout(
            title=title, xaxis_title="step", yaxis_title="loss", template="plotly_white"
        ),
    )


def scale_heatmap(scales: torch.Tensor | np.ndarray, *, title: str | None = None) -> go.Figure:
    """Learned scales: layer x head for ``(L, H, 1)``, head x channel for ``(L, H, D)``."""
    values = np.asarray(torch.as_tensor(scales).detach().float().cpu())
    if values.ndim != 3:
        raise ValueError(f"scales must be (L, H, 1) or (L, H, D), got shape {values.shape}")
    L, H, D = values.shape
    if D == 1:
        z, x, y = values[..., 0], [str(h) for h in range(H)], [str(layer) for layer in range(L)]
        axes, kind = ("head", "layer"), "head"
    else:
        z = values.reshape(L * H, D)
        x = [str(c) for c in range(D)]
        y = [f"L{layer}H{h}" for layer in range(L) for h in range(H)]
        axes, kind = ("channel", "head"), "channel"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=y,
            colorscale=EDITS,  # the edit scale: grey turned down, white 1, orange up
            zmin=0.0,
            zmax=2.0,
            colorbar={"title": {"text": "scale"}, "tickvals": [0, 0.5, 1, 1.5, 2]},
            hovertemplate=f"{axes[1]} %{{y}}, {axes[0]} %{{x}}<br>scale %{{z:.4f}}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title or f"Learned {kind} scales (1 = unchanged)",
        xaxis_title=axes[0],
        yaxis={"title": axes[1], "autorange": "reversed"},
        template="plotly_white",
    )
    return fig


def target_head_scores(
    table: pd.DataFrame, *, value: str = "f1", title: str | None = None
) -> go.Figure:
    """Grouped bars of ``value`` for the target heads, one bar per method, ranks as labels."""
    missing = {"method", "layer", "head", "rank", "target", value} - set(table.columns)
    if missing:
        raise ValueError(
            f"the table lacks columns {sorted(missing)} (expected retrieval_by_method's table)"
        )
    targets = table[table["target"].astype(bool)]
    if targets.empty:
        raise ValueError("no target heads in the table; pass targets= to retrieval_by_method")
    order = targets.drop_duplicates(["layer", "head"])[["layer", "head"]]
    names = [f"L{lay}H{h}" for lay, h in zip(order["layer"], order["head"], strict=True)]
    fig = go.Figure()
    for method, rows in targets.groupby("method", sort=False):
        rows = order.merge(rows, on=["layer", "head"], how="left")
        fig.add_trace(
            go.Bar(
                x=names,
                y=rows[value].tolist(),
                name=str(method),
                text=[f"#{int(r)}" for r in rows["rank"]],
                textposition="outside",
                hovertemplate=f"%{{fullData.name}}, %{{x}}<br>{value} %{{y:.3f}}, rank %{{text}}"
                "<extra></extra>",
            )
        )
    fig.update_layout(
        title=title or f"Retrieval score ({value}) of the target heads",
        barmode="group",
        xaxis_title="head",
        yaxis_title=value,
        template="plotly_white",
    )
    return fig
