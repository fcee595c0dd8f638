"""The passage attention explorer: MuDAF Fig. 10 and Fig. 3 for one multi-document question.

For each model (a base and a tuned one side by side, same sample) it shows the last prompt
token's attention per head and passage (``analysis.retrieval_scores.passage_attention``: row-wise
capture, never ``T x T``), golden passages boxed, one layer at a time (``viz.passages
.passage_heatmap``); the MuDAF retrieval score of every head at a threshold the slider sets
(``score_passages``: a passage is attended when its attention exceeds ``eps``; F1 against the
golden set, EM = the top-|G| passages are the golden ones, App. A.2), as a layer x head map; and,
on a click on a (head, passage) cell, that passage's text with its most-attended tokens marked.

A sample with no passages (or no golden passage) shows a message; nothing is computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

import ipywidgets as w
import numpy as np
import pandas as pd
import torch

from interp_seal.analysis import capture_attention_rows
from interp_seal.analysis.retrieval_scores import passage_attention, score_passages
from interp_seal.evaluation import encode_samples
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Sample
from interp_seal.viz import head_score_heatmap, passage_heatmap
from interp_seal.widgets.redraw import redraw


def head_scores(attention: np.ndarray, golden, eps: float) -> pd.DataFrame:
    """``layer, head, f1, em`` of every head for one question at threshold ``eps``."""
    f1, em = score_passages(torch.as_tensor(attention), golden, eps)
    L, H = f1.shape
    layer, head = np.meshgrid(range(L), range(H), indexing="ij")
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "f1": f1.cpu().numpy().ravel(),
            "em": em.cpu().numpy().ravel(),
        }
    )


class PassageExplorer:
    """Passage attention of one sample under one or two models (e.g. base and MuDAF-tuned).

    Args:
        models: ``{name: handle}``, one or two models sharing a tokenizer's view of the sample.
        sample: a multi-document QA sample with passages and golden passage ids.
        eps: the initial attention threshold of the retrieval score.
        top_tokens: how many of a passage's tokens to mark when a cell is clicked.
    """

    def __init__(
        self,
        models: Mapping[str, ModelHandle],
        sample: Sample,
        *,
        eps: float = 0.3,
        top_tokens: int = 5,
    ):
        self.models, self.sample, self.top_tokens = dict(models), sample, top_tokens
        self.message, self.text = w.HTML(), w.HTML()
        self.attention, self.scores, self.figures, self.score_figures = {}, {}, {}, {}
        self.layer = w.Dropdown(description="layer")
        self.eps = w.FloatSlider(value=eps, min=0.0, max=0.95, step=0.05, description="eps")
        self.panels = w.HBox()
        self.widget = w.VBox([self.message, w.HBox([self.layer, self.eps]), self.panels, self.text])
        try:
            if not 1 <= len(self.models) <= 2:
                raise ValueError("give one model, or two (base and tuned) to compare")
            for name, handle in self.models.items():
                self.attention[name] = passage_attention(handle, sample)
        except ValueError as err:
            self.message.value = f'<span style="color:#c92a2a">{escape(str(err))}</span>'
            return
        n_layers = next(iter(self.attention.values())).attention.shape[0]
        self.layer.options = list(range(n_layers))
        self.layer.value = n_layers - 1
        self.layer.observe(lambda _: self._render(), names="value")
        self.eps.observe(lambda _: self._render(), names="value")
        self._render()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def _render(self) -> None:
        """The figures for the layer and threshold: built once, then redrawn in place
        (``redraw.py``)."""
        for name, att in self.attention.items():
            self.scores[name] = head_scores(att.attention, att.golden, self.eps.value)
            attention = passage_heatmap(
                att, layers=[self.layer.value], title=f"{name}: passage attention"
            )
            score = head_score_heatmap(
                self.scores[name], title=f"{name}: MuDAF F1 per head (eps {self.eps.value:.2f})"
            )
            previous = self.figures.get(name)
            self.figures[name] = redraw(previous, attention)
            self.score_figures[name] = redraw(self.score_figures.get(name), score)
            if self.figures[name] is not previous:
                self.figures[name].data[0].on_click(
                    lambda _t, points, _s, name=name: self._on_cell(name, points)
                )
        self.panels.children = [
            w.VBox([self.figures[name], self.score_figures[name]]) for name in self.attention
        ]

    def _on_cell(self, name: str, points) -> None:
        if points.xs:
            head = int(str(points.ys[0]).split()[-1])
            column = str(points.xs[0]).lstrip("#")
            self.show_passage(name, head, int(column) - 1)

    def show_passage(self, name: str, head: int, passage: int) -> list[int]:
        """Show ``passage``'s text with the ``top_tokens`` tokens that ``head`` of the selected
        layer attends most from the last prompt token; returns their positions."""
        handle, layer = self.models[name], int(self.layer.value)
        enc = encode_samples(handle, [self.sample])[0]
        if not 0 <= passage < len(enc.passages):
            self.text.value = "column #0 is the text before the first passage"
            return []
        start, end = enc.passages[passage]
        rows = capture_attention_rows(
            handle, enc.prompt_ids, (-1,), reduce=lambda r: r[0, :, 0]
        )  # (L, H, T): one row per head, never T x T
        weights = rows[layer, head, start:end].double()
        top = (torch.argsort(weights, descending=True)[: self.top_tokens] + start).tolist()
        pieces = []
        for pos in range(start, end):
            token = escape(handle.tokenizer.decode(enc.input_ids[pos : pos + 1]))
            pieces.append(f"<mark>{token}</mark>" if pos in top else token)
        golden = " (golden)" if passage in self.attention[name].golden else ""
        self.text.value = (
            f"<b>{escape(name)}, layer {layer} head {head}, passage #{passage + 1}{golden}</b>: "
            + "".join(pieces)
        )
        return top
