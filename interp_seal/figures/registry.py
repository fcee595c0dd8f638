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
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from interp_seal.figures import mudaf as M
from interp_seal.figures import seal as S
from interp_seal.figures.run import FigureRun

Tables = dict[str, pd.DataFrame]


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
    """

    name: str
    title: str
    paper: str
    compute: Callable[[FigureRun], Tables]
    draw: Callable[[Tables], go.Figure]
    read: Callable[[Tables], str]
    paper_numbers: str


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

MUDAF_T2 = """| Llama3.1-8B, F1 (%) | HotpotQA | 2WikiMQA | MuSiQue | Qasper | ZS-MuSiQue | ZS-Qasper | Avg. |
|---|---|---|---|---|---|---|---|
| Vanilla-SFT | 46.8 | 50.5 | 28.9 | 29.2 | 30.1 | 41.6 | 37.8 |
| MuDAF-weak | 62.5 | 53.8 | 43.1 | 34.9 | 23.2 | 41.8 | 43.2 |
| MuDAF | 69.6 | 66.2 | 48.2 | 40.0 | 31.2 | 47.9 | 50.5 |"""

MUDAF_T4 = """| heads n | 0 (SFT) | 2 | 4 | 8 | 16 | 32 | 64 |
|---|---|---|---|---|---|---|---|
| Avg. F1 (%) | 37.8 | 40.5 | 44.7 | 49.4 | 48.6 | 49.6 | 50.0 |"""

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
    ),
    FigureSpec(
        name="seal_fig2c_channels",
        title="Channel pruning in the strongest heads",
        paper="SEAL Fig. 2c",
        compute=S.fig2c_compute,
        draw=S.fig2c_draw,
        read=S.fig2c_read,
        paper_numbers="A few channels of a head carry most of its effect; pruning single "
        "channels moves accuracy in both directions.",
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
    ),
    FigureSpec(
        name="seal_fig4_dla",
        title="Direct logit attribution, baseline vs SEAL",
        paper="SEAL Fig. 4",
        compute=S.fig4_compute,
        draw=S.fig4_draw,
        read=S.fig4_read,
        paper_numbers="After SEAL-H / SEAL-C the heads' direct effect shifts toward the "
        "correct digit and the final logit flips from the wrong to the correct one.",
    ),
    FigureSpec(
        name="seal_table1_methods",
        title="Line retrieval by method (Table 1)",
        paper="SEAL Table 1",
        compute=S.table1_compute,
        draw=S.table1_draw,
        read=S.table1_read,
        paper_numbers=SEAL_T1,
    ),
    FigureSpec(
        name="seal_fig5_needle",
        title="Needle in a haystack by method",
        paper="SEAL Fig. 5",
        compute=S.fig5_compute,
        draw=S.fig5_draw,
        read=S.fig5_read,
        paper_numbers="LongChat-7B: baseline fails at deep needles beyond ~17K; SEAL-H/C/L/D "
        "recover most of the grid inside the context window.",
    ),
    FigureSpec(
        name="seal_table4_lr_samples",
        title="Learning rate x samples; few-sample tuning",
        paper="SEAL Table 4 + Fig. 7",
        compute=S.table4_compute,
        draw=S.table4_draw,
        read=S.table4_read,
        paper_numbers=SEAL_T4,
    ),
    FigureSpec(
        name="seal_table2_extension",
        title="Context extension without training",
        paper="SEAL Table 2 + Fig. 6",
        compute=S.table2_compute,
        draw=S.table2_draw,
        read=S.table2_read,
        paper_numbers=SEAL_T2,
    ),
    FigureSpec(
        name="mudaf_fig3_scores",
        title="Retrieval score of every head",
        paper="MuDAF Fig. 3",
        compute=M.fig3_compute,
        draw=M.fig3_draw,
        read=M.fig3_read,
        paper_numbers="Llama3.1-8B: a handful of heads have F1 retrieval scores well above "
        "the rest (top-16 ranked); most heads score near 0.",
    ),
    FigureSpec(
        name="mudaf_fig4_masking",
        title="Masking retrieval vs random vs NIAH heads",
        paper="MuDAF Fig. 4",
        compute=M.fig4_compute,
        draw=M.fig4_draw,
        read=M.fig4_read,
        paper_numbers="Masking the top retrieval heads hurts QA far more than masking random "
        "heads, and more than masking the NIAH retrieval heads.",
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
    ),
    FigureSpec(
        name="mudaf_fig7_num_heads",
        title="Number of selected heads",
        paper="MuDAF Fig. 7 / Table 4",
        compute=M.fig7_compute,
        draw=M.fig7_draw,
        read=M.fig7_read,
        paper_numbers=MUDAF_T4,
    ),
    FigureSpec(
        name="mudaf_fig9_diff",
        title="All heads, MuDAF minus SFT",
        paper="MuDAF Fig. 9",
        compute=M.fig9_compute,
        draw=M.fig9_draw,
        read=M.fig9_read,
        paper_numbers="Gains concentrate on the selected heads; other heads barely move.",
    ),
    FigureSpec(
        name="mudaf_fig10_heatmaps",
        title="Passage-level attention, base vs MuDAF",
        paper="MuDAF Fig. 10",
        compute=M.fig10_compute,
        draw=M.fig10_draw,
        read=M.fig10_read,
        paper_numbers="MuDAF moves attention from the prompt's start "
        "(#0) onto the golden passages.",
    ),
    FigureSpec(
        name="mudaf_table2_methods",
        title="Task score by method",
        paper="MuDAF Table 2",
        compute=M.table2_compute,
        draw=M.table2_draw,
        read=M.table2_read,
        paper_numbers=MUDAF_T2,
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
