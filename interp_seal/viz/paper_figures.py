"""Figures of the paper gallery that the other viz modules do not draw: method comparisons.

Pure functions: tidy tables in, a plotly ``Figure`` out (the gallery driver,
``interp_seal.figures``, writes the tables and draws them here).

- ``method_curves``: ``viz.tuning.method_accuracy`` with 95 % Wilson intervals (SEAL Table 1,
  Table 2 / Fig. 6);
- ``position_curves``: accuracy by length on the queried line's position, each tuned method's
  runs as a mean with their range (SEAL Table 1's claim records);
- ``digit_effects``: direct effects of heads and MLPs on each digit, per method (SEAL Fig. 4);
- ``niah_panels``: one needle heatmap per method (SEAL Fig. 5);
- ``lr_samples``: learning rate x samples heatmap and few-sample curves (SEAL Table 4, Fig. 7);
- ``passage_grid``: passage-level attention, cases x models x layers (MuDAF Fig. 10-11);
- ``layer_counts``: selected heads per layer and strategy (MuDAF Table 3);
- ``head_count_curves``, ``method_bars``: MuDAF Fig. 7 and Table 2;
- ``caption``, ``mark_window``: the gallery's line under each title (model, records per
  point) and SEAL Table 2's trained window on the length axis.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp_seal.viz.evaluation import wilson_error_y
from interp_seal.viz.tuning import method_accuracy

BLUE, RED = "#2166ac", "#b2182b"  # the ends of SIGNED (RdBu): helps / hurts the answer
PALETTE = ("#495057", "#1c7ed6", "#e8590c", "#2f9e44", "#9c36b5", "#f08c00", "#0ca678", "#d6336c")


def method_curves(table: pd.DataFrame, *, title: str, metric: str = "exact_match") -> go.Figure:
    """``viz.tuning.method_accuracy`` (95 % Wilson intervals: rows need ``n``) on a fixed 0-1
    axis; with an ``n_tokens`` column each line count is labelled with its records' mean length in tokens."""
    fig = method_accuracy(table, metric=metric, title=title)
    fig.update_yaxes(title_text="exact match (fraction of records)", range=[-0.02, 1.02])
    if "n_tokens" in table.columns:
        tokens = table.groupby("length").n_tokens.mean()
        fig.update_xaxes(
            title_text="lines in the record (below: mean tokens)",
            tickvals=list(tokens.index),
            ticktext=[f"{L}<br>{t:,.0f} tok" for L, t in tokens.items()],
        )
    return fig


def position_curves(records: pd.DataFrame, *, title: str) -> go.Figure:
    """Exact match against length in two panels, every record and the records whose queried
    line is not the last (``position == "other"``: where copying the last line cannot answer),
    one line per method: the mean over its tuning runs (``tuning_seed``), the error bar
    spanning the runs' lowest and highest accuracy (none for the untuned base)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        shared_yaxes=True,
        subplot_titles=["every record", "queried line not the last"],
        horizontal_spacing=0.06,
    )
    for col, rows in ((1, records), (2, records[records.position == "other"])):
        acc = rows.groupby(["method", "tuning_seed", "length"], sort=False).exact_match.mean()
        acc = acc.reset_index()
        for i, (method, g) in enumerate(acc.groupby("method", sort=False)):
            spread = g.groupby("length").exact_match.agg(["mean", "min", "max"]).sort_index()
            runs = g.tuning_seed.nunique()
            fig.add_trace(
                go.Scatter(
                    x=spread.index.tolist(),
                    y=spread["mean"].tolist(),
                    name=str(method) + (f" ({runs} runs)" if runs > 1 else ""),
                    legendgroup=str(method),
                    showlegend=col == 1,
                    mode="lines+markers",
                    line={"color": "black", "dash": "dash"}
                    if method == "base"
                    else {"color": PALETTE[(i + 1) % len(PALETTE)]},
                    error_y={
                        "type": "data",
                        "symmetric": False,
                        "array": (spread["max"] - spread["mean"]).tolist(),
                        "arrayminus": (spread["mean"] - spread["min"]).tolist(),
                        "visible": runs > 1,
                    },
                    hovertemplate=f"{method}<br>%{{x}} lines<br>exact match %{{y:.3f}}"
                    "<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_yaxes(range=[-0.02, 1.02], title_text="exact match (fraction of records)", col=1)
    fig.update_xaxes(title_text="lines in the record")
    return fig.update_layout(title=title, template="plotly_white")


DIGIT_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


def digit_effects(effects: pd.DataFrame, logits: pd.DataFrame, records: pd.DataFrame) -> go.Figure:
    """SEAL Fig. 4, one column per method: (a) the direct effect of every head on each digit's
    logit (heads flattened layer by layer), (b) of the embedding and every MLP, (c) the final
    logits of the ten digits; below, ``logit(correct) - logit(wrong)`` on every claim record,
    one line per record across the methods.

    Row (b) shows each component's effect on a digit minus its mean over the ten digits: only
    differences between digits choose the answer, and the last MLPs add a shift common to every
    digit that is far larger than those differences and would flatten them. Each row has one y
    range across the methods, so panels compare at a glance.
    """
    methods = list(dict.fromkeys(effects.method))
    right = int(logits[logits.correct].digit.iloc[0])
    n_rec = records.record.nunique()
    fig = make_subplots(
        rows=4,
        cols=len(methods),
        specs=[[{}] * len(methods)] * 3
        + [[{"colspan": len(methods)}] + [None] * (len(methods) - 1)],
        subplot_titles=[f"{m}: (a) heads" for m in methods]
        + [f"{m}: (b) embedding + MLPs" for m in methods]
        + [f"{m}: (c) final logits" for m in methods]
        + [f"logit(correct) - logit(strongest wrong) on {n_rec} fresh record(s)"],
        vertical_spacing=0.1,
        horizontal_spacing=0.06,
        row_heights=[0.3, 0.25, 0.2, 0.25],
    )
    heads_all = effects[effects.component == "head"]
    n_heads = int(heads_all["head"].max()) + 1
    # the embeddings (GPT-2's learned positions too: pos_embed) and the MLPs
    other_all = effects[effects.component.isin(["embed", "pos_embed", "mlp"])]
    keys = ["method", "component", "layer"]
    common = other_all.groupby(keys, dropna=False).value.transform("mean")
    other_all = other_all.assign(value=other_all.value - common)
    ranges = {
        1: _padded_range(heads_all.value.to_numpy(dtype=float)),
        2: _padded_range(other_all.value.to_numpy(dtype=float)),
        3: _padded_range(logits.logit.to_numpy(dtype=float)),
    }
    layers = sorted(int(x) for x in heads_all.layer.unique())
    step = max(1, len(layers) // 6)
    ticks = [lay * n_heads for lay in layers[::step]]
    for c, method in enumerate(methods, 1):
        rows = effects[effects.method == method]
        for k in range(10):
            d = rows[rows.digit == k]
            h = d[d.component == "head"].sort_values(["layer", "head"])
            o = other_all[(other_all.method == method) & (other_all.digit == k)]
            o = o.assign(order=o.layer.fillna(-1).astype(int)).sort_values(["order", "component"])
            style = dict(
                color=DIGIT_COLORS[k],
                width=2.5 if k == right else 1,
            )
            name = f"{k} (correct)" if k == right else str(k)
            common = dict(name=name, legendgroup=str(k), line=style, mode="lines")
            fig.add_trace(
                go.Scatter(
                    x=(h.layer.astype(int) * n_heads + h["head"].astype(int)).tolist(),
                    y=h.value,
                    customdata=np.stack([h.layer.astype(int), h["head"].astype(int)], axis=1),
                    hovertemplate=f"digit {k}: L%{{customdata[0]}}H%{{customdata[1]}} "
                    "%{y:+.3f}<extra></extra>",
                    showlegend=c == 1,
                    **common,
                ),
                row=1,
                col=c,
            )
            fig.add_trace(
                go.Scatter(
                    x=[
                        ("pos" if part == "pos_embed" else "emb") if o_ < 0 else f"L{o_}"
                        for o_, part in zip(o.order, o.component, strict=True)
                    ],
                    y=o.value,
                    hovertemplate=f"digit {k}: %{{x}} %{{y:+.3f}}<extra></extra>",
                    showlegend=False,
                    **common,
                ),
                row=2,
                col=c,
            )
        lg = logits[logits.method == method].sort_values("digit")
        fig.add_trace(
            go.Bar(
                x=[str(int(k)) for k in lg.digit],
                y=lg.logit,
                marker_color=[BLUE if ok else "#adb5bd" for ok in lg.correct],
                hovertemplate="digit %{x}: logit %{y:.3f}<extra></extra>",
                showlegend=False,
            ),
            row=3,
            col=c,
        )
        fig.update_xaxes(tickvals=ticks, ticktext=[f"L{t // n_heads}" for t in ticks], row=1, col=c)
        fig.update_xaxes(title_text="head (flattened, layer by layer)", row=1, col=c)
        shown = layers[::step] if step == 1 else layers[step::step]  # L0 would cover "emb"
        positions = ["pos"] if (other_all.component == "pos_embed").any() else []  # GPT-2
        mlp_ticks = ["emb", *positions] + [f"L{lay}" for lay in shown]
        fig.update_xaxes(title_text="component", tickvals=mlp_ticks, tickangle=0, row=2, col=c)
        fig.update_xaxes(title_text="digit", row=3, col=c)
        for r in (1, 2, 3):
            fig.update_yaxes(range=ranges[r], row=r, col=c)
    rows_y = ((1, "direct effect (logit)"), (2, "effect less digits' mean"), (3, "logit"))
    for r, what in rows_y:
        fig.update_yaxes(title_text=what, row=r, col=1)
    for rec, g in records.groupby("record", sort=False):
        g = g.set_index("method").reindex(methods)
        fig.add_trace(
            go.Scatter(
                x=methods,
                y=g.logit_diff,
                mode="lines+markers",
                line=dict(color="#868e96", width=1),
                marker=dict(color=_signed_colors(g.logit_diff), size=8),
                name=f"record {rec}",
                hovertemplate=f"record {rec}, %{{x}}: %{{y:+.2f}}<extra></extra>",
                showlegend=False,
            ),
            row=4,
            col=1,
        )
    fig.add_hline(y=0, line=dict(color="#212529", width=1, dash="dot"), row=4, col=1)
    fig.update_yaxes(title_text="logit diff", row=4, col=1)
    fig.update_layout(
        title=f"SEAL Fig. 4: direct effects on the digits' logits (correct digit {right})",
        legend=dict(title="digit", x=1.01, y=1.0),
        template="plotly_white",
        height=1250,
        width=max(900, 380 * len(methods)),
    )
    return fig


def _padded_range(values: np.ndarray) -> list[float]:
    """A y range holding 0 and every value, with 10 % room."""
    low, high = min(0.0, float(np.nanmin(values))), max(0.0, float(np.nanmax(values)))
    pad = 0.1 * max(high - low, 1e-9)
    return [low - pad, high + pad]


def _signed_colors(values) -> list[str]:
    """``colors.SIGNED``'s ends for bars: blue for >= 0, red below."""
    return [BLUE if v >= 0 else RED for v in np.asarray(values, dtype=float)]


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
        fig.update_xaxes(title_text="context (tokens)", type="category", row=1, col=c)
    fig.update_yaxes(type="category", autorange="reversed")  # depth 0 at the top, as the paper
    fig.update_yaxes(title_text="needle depth (%)", row=1, col=1)
    fig.update_layout(
        title="SEAL Fig. 5: needle in a haystack by method",
        coloraxis=dict(colorscale="Viridis", cmin=0, cmax=1, colorbar=dict(title="exact match")),
        template="plotly_white",
    )
    return fig


def lr_samples(grid: pd.DataFrame, curves: pd.DataFrame) -> go.Figure:
    """SEAL Table 4 as a heatmap (lr x samples) beside Fig. 7's curves (samples x epochs),
    with 95 % Wilson intervals where ``curves`` has ``n``."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("Table 4: exact match, lr x samples", "Fig. 7: fewer samples, more epochs"),
        horizontal_spacing=0.16,
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
            colorbar=dict(title="exact match", x=0.43, len=0.9),
            hovertemplate="lr %{y}, %{x} samples: %{z:.2f}<extra></extra>",
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
                error_y=wilson_error_y(rows.exact_match, rows.n) if "n" in rows else None,
                mode="lines+markers",
                name=f"{n} samples x {e} epochs",
                line=dict(color=PALETTE[(i + 1) % len(PALETTE)]),
            ),
            row=1,
            col=2,
        )
    fig.update_layout(
        title="SEAL Table 4 + Fig. 7: SEAL-H learning rate, samples and epochs",
        template="plotly_white",
        legend=dict(orientation="h", x=0.57, y=-0.2, xanchor="left", yanchor="top"),
        margin=dict(b=110),
    )
    fig.update_yaxes(title_text="learning rate", type="category", row=1, col=1)
    fig.update_xaxes(title_text="tuning samples (1 epoch)", type="category", row=1, col=1)
    fig.update_xaxes(title_text="lines in the record", row=1, col=2)
    fig.update_yaxes(title_text="exact match (fraction of records)", row=1, col=2)
    return fig


def passage_grid(table: pd.DataFrame, golden: pd.DataFrame, cases: pd.DataFrame) -> go.Figure:
    """Heads x passages attention of two models on one or more questions (MuDAF Fig. 10-11).

    One block per case: a header (the question, the gold answer, the golden passages), then one
    row per model, headed by that model's answer, with one heatmap per layer.

    ``table``: ``case, model, layer, head, passage, attention`` with passage 0 the text before
    the first passage ("#0"); ``golden``: ``case, passage`` (1-based like the columns), boxed;
    ``cases``: one row per case and model: ``case, model, question_index, question, gold,
    answer`` (generated) and ``exact_match`` (0/1).
    """
    case_ids = list(dict.fromkeys(table.case))
    models = list(dict.fromkeys(table.model))
    layers = sorted(table.layer.unique())
    rows = [(c, m) for c in case_ids for m in models]
    n_heads = table["head"].nunique()
    n_passages = int(table.passage.max())
    fig = make_subplots(rows=len(rows), cols=len(layers), horizontal_spacing=0.04)
    # the layout in pixels, top down: per case a header, per row two title lines and the heatmaps
    header_px, title_px, ticks_px, heat_px = 50, 44, 26, max(150, 20 * n_heads)
    spans, headers, y = [], [], 0
    for _, m in rows:
        if m == models[0]:
            headers.append(y)
            y += header_px
        spans.append((y + title_px, y + title_px + heat_px))
        y += title_px + heat_px + ticks_px
    total = y
    info = cases.set_index(["case", "model"])
    left = dict(xref="paper", yref="paper", xanchor="left", showarrow=False, align="left")

    def quoted(text: str, limit: int = 40) -> str:
        text = str(text).strip()
        return "'" + (text if len(text) <= limit else text[: limit - 1] + "…") + "'"

    for r, ((case, model), (top, bottom)) in enumerate(zip(rows, spans, strict=True), 1):
        row = info.loc[(case, model)]
        verdict = "correct" if row.exact_match else "wrong"
        fig.add_annotation(
            text=f"<b>{model}</b> answers {quoted(row.answer)} ({verdict})",
            x=0,
            y=1 - top / total,
            yshift=20,
            yanchor="bottom",
            **left,
        )
        boxed = golden[golden.case == case].passage
        for c, layer in enumerate(layers, 1):
            part = table[(table.case == case) & (table.model == model) & (table.layer == layer)]
            wide = part.pivot_table(index="head", columns="passage", values="attention")
            fig.add_trace(
                go.Heatmap(
                    z=wide.values,
                    x=[f"#{p}" for p in wide.columns],
                    y=[f"head {h}" for h in wide.index],
                    coloraxis="coloraxis",
                    hovertemplate=f"{model}, layer {layer}, %{{y}}, passage %{{x}}: "
                    "%{z:.3f}<extra></extra>",
                ),
                row=r,
                col=c,
            )
            domain = fig.get_subplot(r, c).xaxis.domain
            fig.add_annotation(
                text=f"layer {layer}",
                x=(domain[0] + domain[1]) / 2,
                y=1 - top / total,
                xref="paper",
                yref="paper",
                xanchor="center",
                yanchor="bottom",
                showarrow=False,
                font_size=13,
            )
            for g in boxed:
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
            fig.update_yaxes(
                domain=[1 - bottom / total, 1 - top / total],
                autorange="reversed",
                showticklabels=c == 1,
                row=r,
                col=c,
            )
    for case, at in zip(case_ids, headers, strict=True):
        first = info.loc[case].iloc[0]
        where = ", ".join(f"#{p}" for p in golden[golden.case == case].passage)
        fig.add_annotation(
            text=f"<b>Case {case}</b> (evaluation question {int(first.question_index)}): "
            f"{first.question}<br>gold answer {quoted(first.gold)}; golden passage {where} "
            f"of {n_passages} (dotted box)",
            x=0,
            y=1 - at / total,
            yshift=-2,
            **left,
            yanchor="top",
            font_size=14,
        )
    fig.update_layout(
        title="MuDAF Fig. 10-11: last-token attention per passage, Vanilla SFT vs MuDAF",
        coloraxis=dict(
            colorscale="Blues",
            cmin=0,
            colorbar=dict(title="attention<br>(fraction of<br>the last<br>token's)", len=0.5),
        ),
        template="plotly_white",
        height=int(total) + 200,
        margin=dict(b=80),
    )
    fig.update_xaxes(title_text="passage (#0: text before passage #1)", row=len(rows))
    return fig


def layer_counts(table: pd.DataFrame, *, title: str) -> go.Figure:
    """Selected heads per layer, one bar group per layer and one bar per strategy (MuDAF
    Table 3). ``table``: ``strategy, layer, heads`` (a count, 0 allowed) and ``names`` (the
    heads, written on their bar)."""
    layers = sorted(table.layer.unique())
    fig = go.Figure(
        [
            go.Bar(
                x=rows.layer,
                y=rows.heads,
                name=strategy,
                marker_color=PALETTE[1 + i],
                text=[n.replace(" ", "<br>") for n in rows.names.fillna("")],
                textposition="outside",
                textfont_size=11,
                textangle=-90,  # upright above its bar: neighbouring bars do not overlap
                constraintext="none",  # plotly would shrink a label to its bar's width
                cliponaxis=False,
                hovertemplate=f"{strategy}<br>layer %{{x}}: %{{y}} head(s)<extra></extra>",
            )
            for i, (strategy, rows) in enumerate(table.groupby("strategy", sort=False))
        ]
    )
    top = int(table.heads.max())
    fig.update_layout(
        title=title,
        barmode="group",
        xaxis=dict(
            title="layer",
            tickvals=layers if len(layers) <= 32 else None,
            range=[min(layers) - 0.6, max(layers) + 0.6],
        ),
        yaxis=dict(
            title="selected heads (count)",
            range=[0, top * 1.25 + 1.2],
            dtick=1 if top <= 10 else None,
        ),
        legend=dict(title="selection strategy", x=1.02, y=1, xanchor="left"),
        template="plotly_white",
    )
    return fig


HEAD_COUNT_NAMES = {
    "exact_match": "QA exact match",
    "target_f1": "retrieval F1 of the selected heads",
    "mean_f1": "retrieval F1, mean of all heads",
}


def head_count_curves(heads: pd.DataFrame) -> go.Figure:
    """MuDAF Fig. 7: passage QA exact match and the target / mean retrieval F1 against the
    number of heads MuDAF trains (``k``; 0 is Vanilla SFT), one trace per column, named by
    ``HEAD_COUNT_NAMES``; exact match with 95 % Wilson intervals (``n`` questions)."""
    fig = go.Figure(
        [
            go.Scatter(
                x=heads.k,
                y=heads[c],
                error_y=wilson_error_y(heads[c], heads.n) if c == "exact_match" else None,
                name=label,
                mode="lines+markers",
                hovertemplate=f"{label}<br>%{{x}} heads: %{{y:.3f}}<extra></extra>",
            )
            for c, label in HEAD_COUNT_NAMES.items()
        ]
    )
    fig.update_layout(
        title="MuDAF Fig. 7: number of selected heads (0 = Vanilla SFT)",
        xaxis=dict(title="heads trained contrastively", tickvals=list(heads.k)),
        yaxis=dict(title="score (fraction, 0-1)", range=[-0.02, 1.02]),
        template="plotly_white",
    )
    return fig


def method_bars(accuracy: pd.DataFrame, *, title: str) -> go.Figure:
    """Exact match per method (``method``, ``exact_match``), one bar each, values written on;
    95 % Wilson intervals when the table counts its questions (``n``)."""
    p = accuracy.exact_match.to_numpy(dtype=float)
    error_y = wilson_error_y(p, accuracy.n) if "n" in accuracy.columns else None
    fig = go.Figure(
        go.Bar(
            x=accuracy.method,
            y=p,
            text=[f"{v:.2f}" for v in p],
            textposition="inside",
            insidetextanchor="start",
            marker_color=PALETTE[1],
            error_y=error_y,
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="method",
        yaxis=dict(title="exact match (teacher-forced, fraction of questions)", range=[0, 1.02]),
        template="plotly_white",
    )
    return fig


def caption(fig: go.Figure, text: str) -> go.Figure:
    """Write ``text`` (the model, the records behind each point) under ``fig``'s title."""
    fig.update_layout(title_subtitle_text=text, margin_t=max(fig.layout.margin.t or 0, 110))
    return fig


def mark_window(
    fig: go.Figure,
    accuracy: pd.DataFrame,
    *,
    window: int | None,
    unit: str = "lines",
    note: str = "",
) -> go.Figure:
    """Mark the model's trained window (``window`` tokens) on a length axis (SEAL Table 2).

    ``accuracy``: ``length`` in ``unit`` and, for lines, ``n_tokens`` (the records' mean
    length): the line count at ``window`` tokens is read off a straight line through them and
    the tokens are written under each line count. The axis is widened to show the mark;
    ``note`` (the extensions' settings) goes in the corner."""
    lengths = np.sort(accuracy.length.unique()).astype(float)
    at = float(window) if window else None
    if unit == "lines" and "n_tokens" in accuracy.columns:
        tokens = accuracy.groupby("length").n_tokens.mean()
        fig.update_xaxes(
            title_text="lines in the record (below: mean tokens)",
            tickvals=list(tokens.index),
            ticktext=[f"{int(L)}<br>{t:,.0f} tok" for L, t in tokens.items()],
        )
        if window and len(tokens) > 1:
            slope, offset = np.polyfit(tokens.index.to_numpy(float), tokens.to_numpy(float), 1)
            at = (window - offset) / slope
    else:
        fig.update_xaxes(title_text=f"context length ({unit})")
    if at is not None:
        where = "" if unit == "tokens" else f"<br>(about {at:.0f} {unit})"
        fig.add_vline(
            x=at,
            line=dict(color="#495057", dash="dot", width=2),
            annotation=dict(
                text=f"max_position_embeddings<br>{window:,} tokens{where}",
                xanchor="right",
                yanchor="top",
                font_size=11,
            ),
            annotation_position="top left",
        )
        step = max((lengths.max() - lengths.min()) / 20, 1.0)
        # the label sits left of the mark: a mark left of every length gets room for it there
        room = 0.3 * (lengths.max() - at) if at < lengths.min() else step
        fig.update_xaxes(range=[min(lengths.min(), at) - room, max(lengths.max(), at) + step])
    if note:
        fig.add_annotation(
            text=note,
            xref="paper",
            yref="paper",
            x=0,
            y=1.0,
            xanchor="left",
            yanchor="bottom",
            showarrow=False,
            font=dict(size=11, color="#495057"),
        )
    return fig


def generalization_bars(
    acc: pd.DataFrame,
    ability: pd.DataFrame,
    *,
    groups: dict[str, str],
    labels: dict[str, str],
    colors: dict[str, str],
) -> go.Figure:
    """SEAL Table 3. Left: passage-QA exact match with 95 % Wilson intervals per method
    (``labels``) and tuning domain (``groups``: domain -> axis label; the base's one row is
    drawn in every group); right: the same variants' perplexity of held-out essays on a log
    axis, a uniform guess over the vocabulary dashed (a model above it does not model the
    text)."""
    n, tokens = int(acc.n.iloc[0]), int(ability.tokens.iloc[0])
    uniform = float(ability.uniform.iloc[0])
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.56, 0.44],
        horizontal_spacing=0.12,
        subplot_titles=(
            f"passage QA: {n} questions, the same for every bar",
            f"MMLU stand-in: held-out essays, exp of mean NLL of {tokens} tokens",
        ),
    )
    x = list(groups.values())
    for method, label in labels.items():
        a, b = _by_group(acc, method, groups), _by_group(ability, method, groups)
        p = a.exact_match.to_numpy(dtype=float)
        name = "base (one model, in both groups)" if method == "base" else label
        common = dict(name=name, legendgroup=method, marker_color=colors[method], x=x)
        fig.add_trace(
            go.Bar(
                y=p,
                error_y=wilson_error_y(p, a.n),
                text=[f"{v:.2f}" for v in p],
                textposition="inside",
                insidetextanchor="start",
                **common,
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                y=b.perplexity,
                text=[compact_number(v) for v in b.perplexity],
                textposition="outside",
                showlegend=False,
                **common,
            ),
            row=1,
            col=2,
        )
    top = float(ability.perplexity.max())
    if uniform <= 1.5 * top:  # on the axis only where it does not squash the bars
        fig.add_hline(y=uniform, line=dict(dash="dash", color="black", width=1), row=1, col=2)
    fig.add_annotation(
        text=f"uniform guess over the vocabulary: {compact_number(uniform)}",
        x=1,
        xref="x2 domain",
        xanchor="right",
        y=0.99,
        yref="y2 domain",
        yanchor="top",
        showarrow=False,
        bgcolor="rgba(255,255,255,0.8)",
    )
    fig.update_layout(
        barmode="group",
        title="SEAL Table 3: passage QA with SEAL scales tuned out of domain (line retrieval) "
        "and in domain (QA); general ability",
        template="plotly_white",
        legend=dict(orientation="h", x=0.0, y=-0.22),
        margin=dict(b=110),
    )
    fig.update_yaxes(
        title_text="exact match (teacher-forced, fraction of questions)", range=[0, 1.02], col=1
    )
    # a linear axis: a rise in perplexity (damage) reads as the height it is
    peak = max(top, uniform) if uniform <= 1.5 * top else top
    fig.update_yaxes(title_text="perplexity (lower = better)", range=[0, 1.25 * peak], col=2)
    fig.update_xaxes(title_text="what the SEAL scales were tuned on")
    return fig


def _by_group(table: pd.DataFrame, method: str, groups: dict[str, str]) -> pd.DataFrame:
    """``method``'s row in each domain group (the base's one row in both: the reference)."""
    base = table[table.method == "base"]
    if method == "base":
        return pd.concat([base] * len(groups), ignore_index=True)
    rows = table[table.method == method].set_index("domain")
    return rows.loc[list(groups)].reset_index()


def compact_number(v: float) -> str:
    """``v`` in at most four characters of digits: 12.3, 456, 7.4k, 11.6M."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"
