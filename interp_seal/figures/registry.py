"""The list of paper figures and tables the gallery regenerates, with the papers' own numbers.

Each ``FigureSpec`` names three functions (``interp_seal.figures.seal`` / ``.mudaf``) and the
numbers the paper reports for the same experiment on its models, shown beside ours on the
gallery page. The papers' numbers are data copied from their tables (SEAL: arXiv 2501.15225,
MuDAF: "MuDAF: Long-Context Multi-Document Attention Focusing through Contrastive
Learning on Attention Heads"); figures without a table give the paper's headline values in
words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import pandas as pd
import plotly.graph_objects as go

from interp_seal.figures import definitions as D
from interp_seal.figures import generalization as G
from interp_seal.figures import mudaf as M
from interp_seal.figures import seal as S
from interp_seal.figures.run import FigureRun
from interp_seal.figures.sizes import FigureSizes
from interp_seal.viz import paper_figures as pv

Tables = dict[str, pd.DataFrame]

# every size at its default: ``FigureSizes.as_dict`` (run.json) leaves out the later fields
# that are at theirs
SIZE_DEFAULTS = asdict(FigureSizes())


@dataclass(frozen=True, kw_only=True)
class Drawing:
    """What a gallery figure shows beside its tables: the model, the run's sizes
    (``FigureSizes.as_dict()``) and the model's trained window (``max_position_embeddings``)."""

    model: str
    sizes: dict
    window: int | None = None


@dataclass(frozen=True, kw_only=True)
class FigureSpec:
    """One figure of the gallery.

    Attributes:
        name: file stem and ``--only`` name.
        title: heading on the gallery page.
        paper: where it is in the paper.
        compute: runs the analyses, returns named tidy tables (written to disk).
        draw: tables -> plotly figure (through ``interp_seal.viz``).
        read: tables -> the one-line reading.
        paper_numbers: the paper's numbers for the same experiment (markdown).
        sample: the records behind each point, in words, written under the title with the
            model's name: a format string over the run's sizes (``"{n} records per point"``)
            or a function of them.
        annotate: adds what the tables alone cannot mark (the trained window), given the
            ``Drawing``; None for most figures.
        compare: all figures' tables -> a sentence setting our numbers against the paper's
            description where they differ in kind (None: the reading says it).
        needles: it may make needle samples, or read scores made from them: its data is
            recomputed when a plan amendment moves the needles to another haystack (data
            written before figures recorded their haystack is judged by this flag); a figure
            that makes needle samples without it is refused (``figures.driver``).
    """

    name: str
    title: str
    paper: str
    compute: Callable[[FigureRun], Tables]
    draw: Callable[[Tables], go.Figure]
    read: Callable[[Tables], str]
    paper_numbers: str
    sample: str | Callable[[dict], str]
    annotate: Callable[[go.Figure, Tables, Drawing], None] | None = None
    compare: Callable[[dict[str, Tables]], str] | None = None
    needles: bool = False

    def finish(self, fig: go.Figure, tables: Tables, drawing: Drawing) -> go.Figure:
        """``fig`` (from ``draw``) with the model and n under its title, plus ``annotate``."""
        sizes = {**SIZE_DEFAULTS, **drawing.sizes}
        sample = self.sample(sizes) if callable(self.sample) else self.sample.format(**sizes)
        pv.caption(fig, f"{drawing.model}, {sample}")
        if self.annotate is not None:
            self.annotate(fig, tables, drawing)
        return fig


SEAL_T1 = """| LongChat-7B-v1.5-32K | params | 9K | 14K | 19K | 23K | 28K | 31K |
|---|---|---|---|---|---|---|---|
| Baseline | - | 0.98 | 0.96 | 0.84 | 0.54 | 0.38 | 0.32 |
| SEAL-H | 1.0K, 1.5e-5% | 1.00 | 1.00 | 0.98 | 1.00 | 0.94 | 0.80 |
| SEAL-C | 131.1K, 1.9e-3% | 0.98 | 0.96 | 0.94 | 0.92 | 0.94 | 0.88 |
| SEAL-L | 4.2M, 6.2e-2% | 1.00 | 1.00 | 1.00 | 1.00 | 0.94 | 0.80 |

SEAL-H matches LoRA "using approximately 4,000 times fewer parameters" (Sec. 6.1)."""

SEAL_T2 = """| Llama-2-7b-Chat (4K window) | 5K | 7K | 9K | 12K | 14K | 16K |
|---|---|---|---|---|---|---|
| Baseline | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 |
| NTK | 0.88 | 0.32 | 0.16 | 0.00 | 0.00 | 0.00 |
| NTK + SEAL-C | 0.90 | 0.92 | 0.92 | 0.84 | 0.74 | 0.88 |
| Self-Extend | 0.76 | 0.52 | 0.46 | 0.26 | 0.22 | 0.10 |
| Self-Extend + SEAL-C | 0.96 | 0.96 | 0.90 | 0.84 | 0.68 | 0.56 |"""

SEAL_T4 = """| LongChat-7B, 31K, SEAL-H: lr \\ samples | 10 | 30 | 50 | 70 | 90 |
|---|---|---|---|---|---|
| 5e-3 | 0.56 | 0.64 | 0.68 | 0.70 | 0.72 |
| 1e-2 | 0.68 | 0.74 | 0.78 | 0.82 | 0.82 |
| 2e-2 | 0.70 | 0.82 | 0.82 | 0.84 | 0.70 |
| 3e-2 | 0.76 | 0.84 | 0.90 | 0.86 | 0.82 |

Fig. 7: 25 samples x 2 epochs and 10 x 5 stay close to SEAL-H with 50 samples."""

SEAL_T3 = """LongChat-7B-v1.5-32K on LongBench QA (mean score of the four single-document and of the
four multi-document sets):

| scales | tuned on | single-doc QA | multi-doc QA |
|---|---|---|---|
| none (baseline) | - | 31.87 | 23.29 |
| SEAL-H / SEAL-C, out-of-domain | line retrieval | 33.12 / 32.96 | 23.63 / 23.53 |
| SEAL-H / SEAL-C, in-domain | LongBench QA | 33.52 / 35.46 | 26.23 / 31.27 |

Scales tuned on line retrieval keep LongBench QA where it was or raise it slightly; scales
tuned on the QA format itself raise it more (SEAL-C most). MMLU with the line-retrieval scales
hardly moves: 42.53 (baseline), 42.34 (SEAL-H), 42.17 (SEAL-C) (Sec. 8). MMLU cannot be run
offline: here the held-out perplexity of the bundled essays stands in for it."""

MUDAF_T2 = """| Llama3.1-8B, F1 (%) | HotpotQA | 2WikiMQA | MuSiQue | Qasper | ZS-MuSiQue | ZS-Qasper | Avg. |
|---|---|---|---|---|---|---|---|
| Vanilla-SFT | 46.8 | 50.5 | 28.9 | 29.2 | 30.1 | 41.6 | 37.8 |
| MuDAF-weak | 62.5 | 53.8 | 43.1 | 34.9 | 23.2 | 41.8 | 43.2 |
| MuDAF | 69.6 | 66.2 | 48.2 | 40.0 | 31.2 | 47.9 | 50.5 |"""

MUDAF_T4 = """| heads n | 0 (SFT) | 2 | 4 | 8 | 16 | 32 | 64 |
|---|---|---|---|---|---|---|---|
| Avg. F1 (%) | 37.8 | 40.5 | 44.7 | 49.4 | 48.6 | 49.6 | 50.0 |"""


def _extension_sample(s: dict) -> str:
    if s["extension_task"] == "needle":
        per = f"{s['needle_n']} needle(s) at each of {len(s['needle_depths'])} depths"
    else:
        per = f"{s['n']} records"
    return f"{per} per point, 95 % Wilson intervals"


def _window_marks(fig: go.Figure, t: Tables, d: Drawing) -> None:
    """SEAL Table 2: the trained window and the two extensions' settings on the length axis."""
    s = {**SIZE_DEFAULTS, **d.sizes}
    pv.mark_window(
        fig,
        t["accuracy"],
        window=d.window,
        unit="tokens" if s["extension_task"] == "needle" else "lines",
        note=f"NTK factor {s['ntk_factor']:g}; Self-Extend group {s['se_group']}, "
        f"neighbour window {s['se_window']} tokens",
    )


def _window_axis(fig: go.Figure, t: Tables, d: Drawing) -> None:
    """SEAL Fig. 6: the trained window, against which the lengths are read, on the axes."""
    if d.window:  # one axis title for the row of panels, under the first
        fig.update_xaxes(title_text="")
        fig.update_xaxes(title_text=f"context (tokens; trained window {d.window:,})", col=1)


def _f1_axis(fig: go.Figure, t: Tables, d: Drawing) -> None:
    """MuDAF Fig. 5-6: name the bars' quantity and its range."""
    fig.update_yaxes(title_text="retrieval F1 (0-1)")


def _fig3_compare(data: dict[str, Tables]) -> str:
    """Where the ranked F1 scores fall most between two neighbouring ranks."""
    heads = data["mudaf_fig3_scores"]["heads"].sort_values("rank")
    f1 = heads.f1.to_numpy()
    drops = f1[:-1] - f1[1:]
    k = int(drops.argmax())
    zero = int((f1 == 0).sum())
    shape = "a cliff, not a smooth decline" if drops[k] > 0.5 * f1[0] else "a gradual decline"
    return (
        f"Ranked F1 falls from {f1[k]:.2f} (rank {k + 1}) to {f1[k + 1]:.2f} (rank {k + 2}): "
        f"{shape}; {zero} of {len(f1)} heads score 0."
    )


def _fig9_compare(data: dict[str, Tables]) -> str:
    """MuDAF minus SFT for the heads not selected, in the selected heads' layers and elsewhere."""
    if "mudaf_fig5_targets" not in data:
        return ""
    diff = data["mudaf_fig9_diff"]["diff"]
    targets = data["mudaf_fig5_targets"]["targets"]
    targets = targets[targets.group == "mudaf"]
    chosen = set(zip(targets.layer, targets["head"], strict=True))
    layers = sorted(int(v) for v in set(targets.layer))
    other = diff[[(a, b) not in chosen for a, b in zip(diff.layer, diff["head"], strict=True)]]
    same = other[other.layer.isin(layers)]["diff"]
    rest = other[~other.layer.isin(layers)]["diff"]
    up, down = int((same > 0).sum()), int((same < 0).sum())
    verdict = (
        "the paper's same-layer gain is not seen here"
        if same.mean() <= 0 or up <= down
        else "same-layer heads gain on average, as in the paper"
    )
    return (
        f"Heads not selected, in the selected heads' layers {layers}: {len(same)} heads, "
        f"MuDAF - SFT {same.min():+.3f} to {same.max():+.3f} F1 (mean {same.mean():+.3f}; "
        f"{up} up, {down} down, {len(same) - up - down} unchanged); in the other layers: {rest.min():+.3f} to {rest.max():+.3f} "
        f"(mean {rest.mean():+.3f}); {verdict}."
    )


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec(
        name="seal_fig2b_quadrants",
        title="Head quadrants",
        paper="SEAL Fig. 2b",
        compute=S.fig2b_compute,
        draw=S.fig2b_draw,
        read=S.fig2b_read,
        paper_numbers="LongChat-7B: pruning single heads moves 31K line retrieval both ways; "
        "most heads fall in Q1 / Q3, i.e. the sign is consistent between the two lengths.",
        sample="{sweep_n} records per length; best and worst head again on {confirm_n} fresh",
    ),
    FigureSpec(
        name="seal_fig2c_channels",
        title="Channel pruning in the most harmful and the most helpful head",
        paper="SEAL Fig. 2c",
        compute=S.fig2c_compute,
        draw=S.fig2c_draw,
        read=S.fig2c_read,
        paper_numbers="LongChat-7B: in L1H18 (pruning it helps most) a few of its 128 channels "
        "carry most of the change; in L13H16 (pruning it hurts most) some channels help when "
        "pruned alone.",
        sample="{sweep_n} records at {long} lines",
    ),
    FigureSpec(
        name="seal_fig2d_scaling",
        title="Multi-head scaling across lengths",
        paper="SEAL Fig. 2d",
        compute=S.fig2d_compute,
        draw=S.fig2d_draw,
        read=S.fig2d_read,
        paper_numbers="LongChat-7B: Q1 x 0.9 + Q3 x 1.1 lifts line retrieval above the "
        "baseline at the long lengths.",
        sample="{confirm_n} fresh records per point",
    ),
    FigureSpec(
        name="seal_fig4_dla",
        title="Direct effects on each digit's logit, baseline vs SEAL",
        paper="SEAL Fig. 4",
        compute=S.fig4_compute,
        draw=S.fig4_draw,
        read=S.fig4_read,
        paper_numbers="LongChat-7B, one record: the baseline answers 5, SEAL-H and SEAL-C "
        "answer the correct 1; the MLPs' direct effects dominate the heads'; after SEAL the "
        "heads' effects shift toward the correct digit and its final logit becomes the largest.",
        sample="one record of {long} lines drawn; below, 30 fresh records chosen on no answer",
    ),
    FigureSpec(
        name="seal_table1_methods",
        title="Line retrieval by method (Table 1)",
        paper="SEAL Table 1",
        compute=S.table1_compute,
        draw=S.table1_draw,
        read=S.table1_read,
        paper_numbers=SEAL_T1,
        sample=lambda s: (
            f"{s['confirm_n']} fresh records per length; each tuned method's "
            f"{s['tuning_seeds']} tuning runs: mean, bars their range"
        ),
    ),
    FigureSpec(
        name="seal_fig5_needle",
        needles=True,
        title="Needle in a haystack by method",
        paper="SEAL Fig. 5",
        compute=S.fig5_compute,
        draw=S.fig5_draw,
        read=S.fig5_read,
        paper_numbers="LongChat-7B: baseline fails at deep needles beyond ~17K; SEAL-H/C/L/D "
        "recover most of the grid inside the context window.",
        sample="{needle_n} SEAL needle(s) per cell; every method tuned on generated needles",
    ),
    FigureSpec(
        name="seal_table4_lr_samples",
        title="Learning rate x samples; few-sample tuning",
        paper="SEAL Table 4 + Fig. 7",
        compute=S.table4_compute,
        draw=S.table4_draw,
        read=S.table4_read,
        paper_numbers=SEAL_T4,
        sample="{n} records per cell (at {long} lines) and per point",
    ),
    FigureSpec(
        name="seal_table2_extension",
        needles=True,
        title="Context extension without training",
        paper="SEAL Table 2",
        compute=S.table2_compute,
        draw=S.table2_draw,
        read=S.table2_read,
        paper_numbers=SEAL_T2,
        sample=_extension_sample,
        annotate=_window_marks,
    ),
    FigureSpec(
        name="seal_fig6_needle_extension",
        needles=True,
        title="Needles past the window: NTK / Self-Extend with and without SEAL-C",
        paper="SEAL Fig. 6",
        compute=S.fig6_compute,
        draw=S.fig6_draw,
        read=S.fig6_read,
        paper_numbers="Llama-2-7B-Chat (4K window), needles up to ~30K tokens: NTK and "
        "Self-Extend alone lose the needles well past 4K (NTK almost everywhere beyond 12K); "
        "with SEAL-C most of the grid is found again.",
        sample="{needle_n} needle(s) at each depth and length; SEAL-C tuned on needles",
        annotate=_window_axis,
    ),
    FigureSpec(
        name="seal_table3_generalization",
        title="Out-of-domain and in-domain QA, and general ability",
        paper="SEAL Table 3 + Sec. 8",
        compute=G.compute,
        draw=G.draw,
        read=G.read,
        paper_numbers=SEAL_T3,
        sample="{retrieval_n} questions of {retrieval_passages} passages per bar (in-domain "
        "scales tuned on {tune_n} other questions), 95 % Wilson intervals; perplexity of the "
        "4 bundled essays",
    ),
    FigureSpec(
        name="mudaf_fig3_scores",
        title="Retrieval score of every head",
        paper="MuDAF Fig. 3",
        compute=M.fig3_compute,
        draw=M.fig3_draw,
        read=M.fig3_read,
        paper_numbers="Llama3.1-8B: F1 and EM retrieval scores of all heads ranked by F1 (the "
        "top 16 listed in an inset); the ranked scores decline smoothly from the top heads, with "
        "no gap setting a few heads apart.",
        sample="{retrieval_n} questions of {retrieval_passages} passages",
        compare=_fig3_compare,
    ),
    FigureSpec(
        name="mudaf_fig4_masking",
        needles=True,
        title="Masking retrieval vs random vs NIAH heads",
        paper="MuDAF Fig. 4",
        compute=M.fig4_compute,
        draw=M.fig4_draw,
        read=M.fig4_read,
        paper_numbers="Masking the top retrieval heads hurts QA far more than masking random "
        "heads, and more than masking the NIAH retrieval heads.",
        sample="random heads: seeds {mask_seeds}; each panel's questions in its title",
    ),
    FigureSpec(
        name="mudaf_fig5_targets",
        title="Target heads before / after MuDAF vs SFT",
        paper="MuDAF Fig. 5-6",
        compute=M.fig5_compute,
        draw=M.fig5_draw,
        read=M.fig5_read,
        paper_numbers="Target heads' retrieval scores rise under MuDAF "
        "and stay flat under Vanilla SFT; weak heads (R_h < 0.1) gain retrieval ability.",
        sample="{retrieval_n} questions of {retrieval_passages} passages",
        annotate=_f1_axis,
    ),
    FigureSpec(
        name="mudaf_fig7_num_heads",
        title="Number of selected heads",
        paper="MuDAF Fig. 7 / Table 4",
        compute=M.fig7_compute,
        draw=M.fig7_draw,
        read=M.fig7_read,
        paper_numbers=MUDAF_T4,
        sample="{retrieval_n} questions per point",
    ),
    FigureSpec(
        name="mudaf_fig9_diff",
        title="All heads, MuDAF minus SFT",
        paper="MuDAF Fig. 9",
        compute=M.fig9_compute,
        draw=M.fig9_draw,
        read=M.fig9_read,
        paper_numbers="Llama3.1-8B, per layer: most heads in a layer with a selected head "
        "improve too, though only the selected ones are trained contrastively (e.g. layer 16 "
        "under MuDAF); layers with no selected head barely change, some of their heads get "
        "worse (Appendix C; the paper suspects grouped-query attention).",
        sample="{retrieval_n} questions of {retrieval_passages} passages",
        compare=_fig9_compare,
    ),
    FigureSpec(
        name="mudaf_table3_layers",
        title="Layers of the selected heads",
        paper="MuDAF Table 3",
        compute=M.table3_compute,
        draw=M.table3_draw,
        read=M.table3_read,
        paper_numbers="Llama3.1-8B (Appendix C): the table puts MuDAF-strong's heads in layers "
        "13 (two) and 16 (three), MuDAF-weak's in layers 16, 19 and 27 (one each) and 25 "
        "(four); layer 16 is the only one both strategies use. The appendix text counts four "
        "MuDAF-strong heads in layer 16 and also names layer 17 for MuDAF-strong, and Sec. 4.2 "
        "selects 8 heads, so the table as printed may be incomplete.",
        sample="up to {mudaf_k} heads per strategy, from the base model's retrieval scores "
        "on {retrieval_n} questions",
    ),
    FigureSpec(
        name="mudaf_fig10_heatmaps",
        title="Passage-level attention, Vanilla SFT vs MuDAF",
        paper="MuDAF Fig. 10-11",
        compute=M.fig10_compute,
        draw=M.fig10_draw,
        read=M.fig10_read,
        paper_numbers="Llama3.1-8B, two LongBench cases with each model's output and the "
        "last token's attention per passage in three layers: 9 passages with golden #1 and #2 "
        "(Fig. 10), 10 passages with golden #1 and #9 (Fig. 11). Beside Vanilla SFT, MuDAF's "
        "attention is more focused and moves from the prompt's start (#0) onto the passages, "
        "the relevant ones above all.",
        sample="two questions of {heatmap_passages} passages",
    ),
    FigureSpec(
        name="mudaf_table2_methods",
        title="Task score by method",
        paper="MuDAF Table 2",
        compute=M.table2_compute,
        draw=M.table2_draw,
        read=M.table2_read,
        paper_numbers=MUDAF_T2,
        sample="{retrieval_n} questions per method",
    ),
    # plan amendment 1 (issue 41)
    FigureSpec(
        name="heads_definitions",
        needles=True,
        title="Retrieval heads by five definitions",
        paper="Wu et al. / MuDAF / QRHead / causal ablation / DuoAttention",
        compute=D.definitions_compute,
        draw=D.definitions_draw,
        read=D.definitions_read,
        paper_numbers="Each paper defines retrieval heads its own way and compares at most two "
        "definitions: Wu et al. 2024 (copy-paste scores on needles; masking the top retrieval "
        "heads breaks needle retrieval, masking random heads does not), MuDAF Sec. 3.1 and "
        "Fig. 4 (passage scores; masking its top heads hurts multi-document QA more than "
        "random or NIAH heads), QRHead (query-focused scores, calibrated by a null query, as "
        "a passage retriever), DuoAttention (learned gates; few heads need the full context), "
        "causal ablation (SEAL Fig. 2b's per-head sweep). None puts all five side by side.",
        sample=lambda s: (
            f"rankings on {s['retrieval_n']} detection questions (causal sweep on "
            f"{s['causal_n'] or s['retrieval_n']}) and SEAL's needles; masking on "
            f"{s['definition_questions']} fresh questions; random heads: seeds {s['mask_seeds']}"
        ),
    ),
    FigureSpec(
        name="kv_budget",
        needles=True,
        title="Accuracy vs KV budget, heads chosen by each definition",
        paper="DuoAttention / RazorAttention; issue 41",
        compute=D.kv_compute,
        draw=D.kv_draw,
        read=D.kv_read,
        paper_numbers="DuoAttention keeps a full KV cache only for its gated retrieval heads "
        "and gives the other heads attention sinks + a recent window, reporting 1.7-2.5x less "
        "KV memory at close to full-attention accuracy on long-context tasks; "
        "RazorAttention chooses the full heads by retrieval scores. Neither checks its choice "
        "causally, and no paper compares the five definitions at the same budget.",
        sample="{kv_n} fresh line records per length (seed 4); sink {kv_sink}, window "
        "{kv_window} tokens; random orders: seeds {mask_seeds}",
    ),
    # plan amendment 2 (issue 41)
    FigureSpec(
        name="heads_duo_groups",
        title="DuoAttention's heads masked as whole KV heads",
        paper="DuoAttention (Xiao et al. 2024); MuDAF Fig. 4's control",
        compute=D.duo_groups_compute,
        draw=D.duo_groups_draw,
        read=D.duo_groups_read,
        paper_numbers="DuoAttention learns one gate per KV head and keeps the full cache for "
        "the KV heads whose gates stay high: its unit is the KV head, so its top 5 % of heads "
        "is the top KV heads' query heads. The papers mask retrieval heads against random "
        "heads of the same number (MuDAF Fig. 4; Wu et al. 2024).",
        sample="{definition_questions} fresh questions; random heads: seeds {mask_seeds}",
    ),
    # plan amendment 3 (issue 41)
    FigureSpec(
        name="heads_duo_tied",
        title="DuoAttention's heads masked as whole KV heads, the whole tie of gates",
        paper="DuoAttention (Xiao et al. 2024); MuDAF Fig. 4's control",
        compute=D.duo_tied_compute,
        draw=D.duo_groups_draw,
        read=D.duo_groups_read,
        paper_numbers="DuoAttention clamps its gates to [0, 1] at every step and keeps the "
        "full cache for the KV heads whose gates stay high; the heads that need the whole "
        "context saturate at 1 together, so its set is the tie, not an order within it. The "
        "papers mask retrieval heads against random heads of the same number (MuDAF Fig. 4; "
        "Wu et al. 2024).",
        sample="{definition_questions} fresh questions; random heads: seeds {mask_seeds}",
    ),
)

BY_NAME = {f.name: f for f in FIGURES}


def select(only: list[str] | None) -> list[FigureSpec]:
    """The figures named in ``only`` (all when empty), in gallery order; unknown names refused."""
    if not only:
        return list(FIGURES)
    unknown = sorted(set(only) - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; choose from: {', '.join(BY_NAME)}")
    return [f for f in FIGURES if f.name in only]
