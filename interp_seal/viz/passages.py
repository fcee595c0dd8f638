"""Figures for retrieval scores: passage-level attention maps and head score maps.

- ``passage_heatmap``: MuDAF Fig. 10, one panel per layer, heads x passages, the last
  token's attention summed over each passage. Column ``#0`` is the text before the first
  passage (where attention sinks live); ``#i`` is LongBench's ``Passage i`` (passage id
  ``i - 1``); golden passages are boxed.
- ``head_score_heatmap``: any per-head score (MuDAF F1/EM, copy-paste score) as layer x head;
  a signed one (a difference between models, MuDAF Fig. 9) on the signed scale about 0.
- ``ranked_score_curve``: MuDAF Fig. 3, scores of all heads ranked by the first one.
- ``masking_bars``: MuDAF Fig. 4, task score per masking strategy and mode (random heads
  averaged over seeds, with their spread).
- ``definition_comparison``: retrieval-head definitions side by side
  (``analysis.head_definitions``): Spearman's rho and top-k overlap between every two, and
  the task score with each definition's top set masked beside random sets.
- ``compression_curves``: exact match against the KV cache kept when each definition's top KV
  heads stay full and the rest stream (``analysis.kv_compression``), one panel per length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from interp_seal.analysis.head_definitions import RankingComparison
from interp_seal.analysis.retrieval_scores import PassageAttention
from interp_seal.analysis.statistics import wilson
from interp_seal.viz.colors import SIGNED, symmetric_range
from interp_seal.viz.evaluation import PROPORTIONS, wilson_error_y


def passage_heatmap(
    attention: PassageAttention,
    *,
    layers: Sequence[int] | None = None,
    title: str = "Passage-level attention of the last token",
) -> go.Figure:
    """Heads x passages heatmaps of one question, one panel per layer (all layers by default)."""
    n_layers, n_heads, n_passages = attention.attention.shape
    layers = list(range(n_layers)) if layers is None else list(layers)
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if not layers or bad:
        raise ValueError(f"layers {bad or layers} not in 0..{n_layers - 1}")
    columns = ["#0"] + [f"#{i + 1}" for i in range(n_passages)]
    fig = make_subplots(
        rows=1,
        cols=len(layers),
        subplot_titles=[f"layer {layer}" for layer in layers],
        shared_yaxes=True,
        horizontal_spacing=0.03,
    )
    for col, layer in enumerate(layers, 1):
        z = np.concatenate([attention.prefix[layer][:, None], attention.attention[layer]], 1)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=columns,
                y=[f"head {h}" for h in range(n_heads)],
                coloraxis="coloraxis",
                hovertemplate="%{y}, passage %{x}: %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        for g in attention.golden:  # dotted box around golden columns (Fig. 10)
            fig.add_shape(
                type="rect",
                x0=g + 0.5,
                x1=g + 1.5,
                y0=-0.5,
                y1=n_heads - 0.5,
                line=dict(dash="dot", width=2, color="black"),
                row=1,
                col=col,
            )
    fig.update_layout(
        title=title,
        coloraxis=dict(colorscale="Blues", cmin=0, colorbar_title="attention"),
        template="plotly_white",
    )
    fig.update_yaxes(autorange="reversed")
    return fig


SCORE_NAMES = {"f1": "retrieval F1", "em": "retrieval EM", "diff": "difference (F1)"}
MASKING_NAMES = {
    "exact_match": "exact match (teacher-forced, fraction of questions)",
    "qa_f1": "QA F1 (0-1)",
}


def head_score_heatmap(
    heads: pd.DataFrame, *, value: str = "f1", title: str | None = None
) -> go.Figure:
    """A layer x head heatmap of column ``value`` of a per-head table (``layer``, ``head``).

    Scores that are never negative go on a sequential scale from 0; a signed column (a
    difference such as MuDAF minus SFT) goes on the signed scale (``colors.SIGNED``: blue
    positive, red negative) centred on 0 with a symmetric range."""
    missing = {"layer", "head", value} - set(heads.columns)
    if missing:
        raise ValueError(f"the head table lacks columns {sorted(missing)}")
    grid = heads.pivot(index="layer", columns="head", values=value).sort_index()
    z = grid.to_numpy(dtype=float)
    if np.nanmin(z) < 0:
        extent = symmetric_range(z)
        scale = dict(colorscale=SIGNED, zmid=0, zmin=-extent, zmax=extent)
    else:
        scale = dict(colorscale="Viridis", zmin=0)
    name = SCORE_NAMES.get(value, value)
    return go.Figure(
        data=go.Heatmap(
            z=z,
            x=[str(h) for h in grid.columns],
            y=[str(layer) for layer in grid.index],
            colorbar_title=name,
            hovertemplate=f"layer %{{y}}, head %{{x}}<br>{name} %{{z:.3f}}<extra></extra>",
            **scale,
        ),
        layout=go.Layout(
            title=title or f"Retrieval score per head ({name})",
            xaxis_title="head",
            yaxis=dict(title="layer", autorange="reversed"),
            template="plotly_white",
        ),
    )


def ranked_score_curve(
    heads: pd.DataFrame,
    *,
    values: Sequence[str] = ("f1", "em"),
    title: str = "Retrieval scores of all heads",
) -> go.Figure:
    """Every head's scores, heads sorted by ``values[0]`` descending (MuDAF Fig. 3)."""
    missing = {"layer", "head", *values} - set(heads.columns)
    if missing:
        raise ValueError(f"the head table lacks columns {sorted(missing)}")
    ranked = heads.sort_values(list(values), ascending=False)
    names = [
        f"L{layer}H{head}" for layer, head in zip(ranked["layer"], ranked["head"], strict=True)
    ]
    first = SCORE_NAMES.get(values[0], values[0])
    return go.Figure(
        data=[
            go.Scatter(
                x=np.arange(1, len(ranked) + 1),
                y=ranked[v],
                mode="lines+markers",
                name=SCORE_NAMES.get(v, v),
                customdata=names,
                hovertemplate="%{customdata}, rank %{x}<br>%{y:.3f}<extra>" + v + "</extra>",
            )
            for v in values
        ],
        layout=go.Layout(
            title=title,
            xaxis=dict(title=f"head rank (by {first}, of {len(ranked)} heads)"),
            yaxis=dict(title="retrieval score (fraction, 0-1)", range=[-0.02, 1.02]),
            template="plotly_white",
        ),
    )


def masking_bars(
    frame: pd.DataFrame | Mapping[str, pd.DataFrame],
    *,
    metric: str = "exact_match",
    title: str | None = None,
) -> go.Figure:
    """Task ``metric`` per strategy, one bar group per masking mode (MuDAF Fig. 4).

    ``frame``: one masking table, or several by panel title (e.g. a pilot and the fresh
    questions a claim is tested on), drawn side by side on one y axis. Random-head rows are
    averaged over their draws (seeds), each draw a black diamond on its bar.
    Error bars: for exact match with an ``n_samples`` column, the 95 % Wilson interval of the
    pooled questions (all draws together; the diamonds show the spread between draws) and a grey
    band for the unmasked model's interval; otherwise the standard deviation over draws.
    """
    panels = dict(frame) if isinstance(frame, Mapping) else {"": frame}
    titles = list(panels) if len(panels) > 1 else None
    fig = make_subplots(cols=len(panels), shared_yaxes=True, subplot_titles=titles)
    for col, part in enumerate(panels.values(), 1):
        wilson_bars = _masking_panel(fig, part, metric, col)
    fig.update_layout(
        title=title or f"Masking heads: {metric}",
        barmode="group",
        scattermode="group",  # a draw's marker sits on its own strategy's bar
        template="plotly_white",
    )
    fig.update_xaxes(title_text="masking mode (zero: head output 0; uniform: uniform attention)")
    fig.update_yaxes(title_text=MASKING_NAMES.get(metric, metric), col=1)
    if wilson_bars:
        fig.update_yaxes(range=[0, 1.02])
    return fig


MASKING_STRATEGIES = ("retrieval", "niah", "random")  # bar order and colour, in every panel


def _rank(strategy: str) -> int:
    """Bar order and colour of ``analysis.masking.conditions``' strategies; a ranking masked
    under its own name (``head_definitions.mask_rankings``) takes retrieval's place."""
    return MASKING_STRATEGIES.index(strategy) if strategy in MASKING_STRATEGIES else 0


def _masking_panel(fig: go.Figure, frame: pd.DataFrame, metric: str, col: int) -> bool:
    """One panel of ``masking_bars``; returns whether its error bars are Wilson intervals."""
    missing = {"strategy", "mode", "k", metric} - set(frame.columns)
    if missing:
        raise ValueError(f"the masking table lacks columns {sorted(missing)}")
    wilson_bars = metric in PROPORTIONS and "n_samples" in frame.columns
    baseline = frame[frame["strategy"] == "none"]
    masked = frame[frame["strategy"] != "none"]
    groups = sorted(masked.groupby(["strategy", "k"], sort=False), key=lambda g: _rank(g[0][0]))
    for (strategy, k), rows in groups:
        modes = list(dict.fromkeys(rows["mode"]))
        draws = [rows[rows["mode"] == m] for m in modes]
        means = [float(d[metric].mean()) for d in draws]
        if wilson_bars:
            n = [float(d["n_samples"].sum()) for d in draws]  # questions over all draws
            hits = [float((d[metric] * d["n_samples"]).sum()) for d in draws]
            means = [h / m for h, m in zip(hits, n, strict=True)]  # = the mean, for equal n
            error_y = wilson_error_y(means, n)
        else:
            error_y = dict(type="data", array=[float(d[metric].std(ddof=1)) for d in draws])
            error_y["array"] = [0.0 if np.isnan(v) else v for v in error_y["array"]]
        group = f"{strategy} (k={k})"
        fig.add_trace(
            go.Bar(
                x=modes,
                y=means,
                error_y=error_y,
                name=group,
                legendgroup=group,
                offsetgroup=group,
                showlegend=col == 1,
                marker_color=qualitative.Plotly[_rank(strategy)],
                hovertemplate=f"%{{fullData.name}}, %{{x}}<br>{metric} %{{y:.3f}}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        if any(len(d) > 1 for d in draws):  # each draw a marker on its bar: the spread
            seeded = "seed" in rows.columns
            fig.add_trace(
                go.Scatter(
                    x=[m for m, d in zip(modes, draws, strict=True) for _ in range(len(d))],
                    y=[float(v) for d in draws for v in d[metric]],
                    customdata=[int(s) for d in draws for s in d["seed"]] if seeded else None,
                    mode="markers",
                    offsetgroup=group,
                    marker={"symbol": "diamond-open", "color": "black", "size": 9},
                    name="one random draw",
                    legendgroup="draws",
                    showlegend=col == 1,
                    hovertemplate=f"{group}, %{{x}}, one draw"
                    + (" (seed %{customdata})" if seeded else "")
                    + f"<br>{metric} %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    if len(baseline):
        value = float(baseline[metric].iloc[0])
        if wilson_bars:
            n = float(baseline["n_samples"].iloc[0])
            low, high = wilson(value * n, n)
            fig.add_hrect(
                y0=low, y1=high, fillcolor="grey", opacity=0.15, line_width=0, row=1, col=col
            )
        fig.add_hline(y=value, line_dash="dash", annotation_text="no masking", row=1, col=col)
    return wilson_bars


def gate_cut(ranking: pd.DataFrame, *, k: int, group: int) -> go.Figure:
    """DuoAttention's gates per KV head, best first, from a ranked head table (``score`` the
    gate, each query head carrying its KV head's): the ``k // group`` KV heads of a top set,
    the KV heads outside it whose gate ties its last one, and the next five."""
    kv = ranking.assign(kv=ranking["head"] // group)
    kv = kv.groupby(["layer", "kv"], as_index=False).agg(
        gate=("score", "first"), rank=("rank", "min")
    )
    kv = kv.sort_values("rank").reset_index(drop=True)
    inside = k // group
    cut = float(kv.gate.iloc[inside - 1])
    tied, held = int((kv.gate == cut).sum()), int((kv.gate.iloc[:inside] == cut).sum())
    shown = kv.head(int((kv.gate >= cut).sum()) + 5)
    names = [f"L{int(a)} KV{int(b)}" for a, b in zip(shown.layer, shown.kv, strict=True)]
    kind = [
        "in the set" if i < inside else ("tied with its last" if g == cut else "outside")
        for i, g in enumerate(shown.gate)
    ]
    fig = go.Figure()
    for name, colour in (("in the set", 0), ("tied with its last", 1), ("outside", 7)):
        rows = [i for i, found in enumerate(kind) if found == name]
        fig.add_trace(
            go.Bar(
                x=[names[i] for i in rows],
                y=[float(shown.gate.iloc[i]) for i in rows],
                name=name,
                marker_color=qualitative.Plotly[colour],
                hovertemplate="%{x}: gate %{y:.4f}<extra>" + name + "</extra>",
            )
        )
    fig.update_layout(
        title=f"DuoAttention's top {inside} KV heads hold {held} of the {tied} KV heads tied "
        f"at gate {cut:.4g}: index order, not masked",
        template="plotly_white",
    )
    fig.update_xaxes(
        title_text="KV head, best gate first", categoryorder="array", categoryarray=names
    )
    fig.update_yaxes(title_text="gate (1: full attention)", range=[0, 1.05])
    return fig


def definition_comparison(
    comparison: RankingComparison, effects: pd.DataFrame | None = None
) -> go.Figure:
    """Spearman's rho and the top-``k`` overlap between every two definitions (heatmaps, each
    cell written), and, with ``effects`` (``head_definitions.masking_effects``), the task's
    exact match with each definition's top ``k`` heads zeroed, with 95 % Wilson intervals,
    beside the random draws' mean (dashed), the unmasked model's (dotted) and each verdict
    under its bar ("supported": hurts more than every random draw; "not shown (tie)" where the
    top set is cut from a tie of scores, ``comparison.cut``, as the gallery's claims read it)."""
    names = list(comparison.spearman.index)
    cols = 3 if effects is not None else 2
    titles = ["Spearman's rho (all heads)", f"shared top-{comparison.k} heads / {comparison.k}"]
    if effects is not None:
        titles.append(f"exact match, top {comparison.k} zeroed")
    fig = make_subplots(cols=cols, subplot_titles=titles, horizontal_spacing=0.12)
    for col, (values, scale) in enumerate(
        [
            (comparison.spearman, dict(colorscale=SIGNED, zmid=0, zmin=-1, zmax=1)),
            (comparison.overlap, dict(colorscale="Viridis", zmin=0, zmax=1)),
        ],
        1,
    ):
        z = values.loc[names, names].to_numpy(dtype=float)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=names,
                y=names,
                text=[[f"{v:.2f}" for v in row] for row in z],
                texttemplate="%{text}",
                showscale=False,
                hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>",
                **scale,
            ),
            row=1,
            col=col,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    if effects is not None:
        p, n = effects["exact_match"].to_numpy(), effects["n"].to_numpy()
        fig.add_trace(
            go.Bar(
                x=effects["definition"],
                y=p,
                error_y=wilson_error_y(p, n),
                marker_color=qualitative.Plotly[0],
                hovertemplate="%{x}: %{y:.3f}<br>heads %{customdata}<extra></extra>",
                customdata=effects["heads"],
                showlegend=False,
            ),
            row=1,
            col=3,
        )
        fig.add_hline(
            y=float(effects["random_exact_match"].iloc[0]),
            line_dash="dash",
            annotation_text="random heads",
            annotation_position="bottom right",  # below its line; "no heads masked" above
            row=1,
            col=3,
        )
        unmasked = float(effects["unmasked_exact_match"].iloc[0])
        if unmasked == unmasked:
            fig.add_hline(
                y=unmasked,
                line_dash="dot",
                annotation_text="no heads masked",
                annotation_position="top right",
                row=1,
                col=3,
            )
        fig.update_yaxes(range=[0, 1.1], row=1, col=3)
        defs = list(effects["definition"])  # each verdict under its bar, legible at any width
        verdicts = [  # a set cut from a tie is index order: not the definition's, not read
            f"{d}: {'not shown (tie)' if d in comparison.cut else v}"
            for d, v in zip(defs, effects["verdict"], strict=True)
        ]
        fig.update_xaxes(tickvals=defs, ticktext=verdicts, tickangle=-35, row=1, col=3)
    fig.update_layout(title="Retrieval-head definitions compared", template="plotly_white")
    return fig


def compression_curves(curve: pd.DataFrame) -> go.Figure:
    """Exact match (95 % Wilson intervals) against the share of the KV cache kept, one line per
    definition (random orders averaged per point), one panel per context length; the end points
    (every head streaming, every head full) are shared by all lines."""
    lengths = sorted(curve["length"].unique())
    fig = make_subplots(
        cols=len(lengths), shared_yaxes=True, subplot_titles=[f"length {L}" for L in lengths]
    )
    ends = curve[curve["definition"].isin(["all streaming", "all full"])]
    names = [
        d for d in dict.fromkeys(curve["definition"]) if d not in ("all streaming", "all full")
    ]
    for col, length in enumerate(lengths, 1):
        for i, name in enumerate(names):
            part = pd.concat([curve[curve["definition"] == name], ends])
            part = part[part["length"] == length]
            points = part.groupby("full_kv_heads", as_index=False).agg(
                kv_share=("kv_share", "mean"), exact_match=("exact_match", "mean"), n=("n", "sum")
            )
            fig.add_trace(
                go.Scatter(
                    x=points["kv_share"],
                    y=points["exact_match"],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line_color=qualitative.Plotly[i % len(qualitative.Plotly)],
                    error_y=wilson_error_y(points["exact_match"].to_numpy(), points["n"]),
                    customdata=points["full_kv_heads"],
                    hovertemplate=f"{name}: %{{customdata}} full KV heads<br>KV kept %{{x:.2f}}"
                    "<br>exact match %{y:.3f}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="share of the full KV cache kept")
    fig.update_yaxes(title_text="exact match", range=[0, 1.02], col=1)
    fig.update_layout(
        title="KV compression: heads kept full by each definition", template="plotly_white"
    )
    return fig
