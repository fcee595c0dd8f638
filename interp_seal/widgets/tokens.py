"""The attention-over-tokens widget: one head's attention over a prompt's real tokens.

CircuitsVis-style (``useHoverLock``): hovering a token shows, as colour over the tokens before
it, where that query position attends; clicking locks the query (click it again to unlock);
with nothing hovered or locked the answer position's row is shown. Long prompts are windowed
around the question and the answer's source line (``viz.tokens.token_windows``), each skipped
span an ellipsis that says how many tokens it hides and how much weight the query puts on them.

Only the shown query positions' rows are computed (``analysis.capture_attention_rows``, one
forward per head chosen, never ``T x T``). The browser side is a small anywidget module kept
here (no CDN, works offline); what it draws is ``AttentionView.state()``, and the locked query
is synced back as ``TokenAttention.locked``. Outside a live kernel (a static render of a saved
notebook) the explorer shows ``viz.tokens.attention_html`` of the locked or answer position.
"""

from __future__ import annotations

from collections.abc import Mapping

import anywidget
import ipywidgets as w
import numpy as np
import traitlets
from jaxtyping import Int
from torch import Tensor

from interp_seal.analysis import capture_attention_rows
from interp_seal.analysis.token_views import line_retrieval_focus
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Sample
from interp_seal.viz.tokens import (
    ATTENTION_RGB,
    AttentionView,
    Span,
    attention_html,
    attention_view,
    shown_positions,
    token_labels,
    token_windows,
)

ESM = """
const RGB = "__RGB__";
function render({ model, el }) {
  let spans = [], gaps = [], status = null, hovered = -1;
  function focused(v) {  // index into the shown tokens: locked, else hovered, else the last
    const locked = v.positions.indexOf(model.get("locked"));
    return locked >= 0 ? locked : hovered >= 0 ? hovered : v.positions.length - 1;
  }
  function paint() {
    const v = model.get("view"), q = focused(v), locked = model.get("locked") >= 0;
    spans.forEach((s, j) => {
      const wt = v.weights[q][j], a = Math.min(Math.max(wt / v.vmax, 0), 1);
      s.style.background = `rgba(${RGB}, ${a.toFixed(3)})`;
      s.style.color = a > 0.6 ? "white" : "";
      s.classList.toggle("isv-query", j === q);
      s.classList.toggle("isv-future", v.positions[j] > v.positions[q]);
      s.title = `position ${v.positions[j]} ${v.labels[j]}: weight ${wt.toFixed(4)}`;
    });
    gaps.forEach(([g, seg, k]) => {
      g.textContent = `[… ${seg[1] - seg[0]} tokens skipped, positions ${seg[0]}-${seg[1] - 1}` +
        `; weight ${v.skipped[q][k].toFixed(3)} in total …]`;
    });
    const what = locked ? "locked: click it again to unlock" :
      hovered >= 0 ? "hovered: click to lock" : "the answer position; hover a token, click to lock";
    status.textContent = `query ${v.positions[q]} ${v.labels[q]} (${what})`;
  }
  function draw() {
    const v = model.get("view");
    el.innerHTML = "";
    spans = []; gaps = []; hovered = -1;
    const root = document.createElement("div");
    root.className = "isv-root";
    const title = document.createElement("div");
    title.className = "isv-title";
    title.textContent = v.title;
    status = document.createElement("div");
    status.className = "isv-status";
    const legend = document.createElement("div");
    legend.className = "isv-legend";
    legend.innerHTML = `attention weight <span class="isv-bar" style="background:linear-gradient(` +
      `to right, rgba(${RGB}, 0), rgba(${RGB}, 1))"></span> 0 .. ${v.vmax}`;
    const text = document.createElement("div");
    text.className = "isv-tokens";
    let j = 0, k = 0;
    for (const seg of v.segments) {
      if (!seg[2]) {
        if (text.lastChild && text.lastChild.tagName === "BR") text.lastChild.remove();
        const g = document.createElement("div");
        g.className = "isv-gap";
        gaps.push([g, seg, k++]);
        text.appendChild(g);
        continue;
      }
      for (let p = seg[0]; p < seg[1]; p++, j++) {
        const s = document.createElement("span"), index = j;
        s.className = "isv-token";
        s.textContent = v.labels[j];
        for (const [name, span] of Object.entries(v.focus)) {
          if (span[0] <= p && p < span[1]) s.classList.add("isv-focus");
        }
        s.addEventListener("mouseenter", () => { hovered = index; paint(); });
        s.addEventListener("mouseleave", () => { hovered = -1; paint(); });
        s.addEventListener("click", () => {
          const pos = v.positions[index];
          model.set("locked", model.get("locked") === pos ? -1 : pos);
          model.save_changes();
        });
        spans.push(s);
        text.appendChild(s);
        if (v.labels[j].endsWith("\\u21b5")) text.appendChild(document.createElement("br"));
      }
    }
    root.append(title, status, legend, text);
    el.appendChild(root);
    paint();
  }
  model.on("change:view", draw);
  model.on("change:locked", paint);
  draw();
}
export default { render };
""".replace("__RGB__", ", ".join(map(str, ATTENTION_RGB)))

CSS = """
.isv-root { font-family: sans-serif; max-width: 100%; }
.isv-title { font-weight: bold; }
.isv-status, .isv-legend { font-size: 12px; color: #495057; margin: 2px 0; }
.isv-bar { display: inline-block; width: 120px; height: 10px; border: 1px solid #ced4da;
  vertical-align: middle; }
.isv-tokens { font-family: monospace; font-size: 13px; line-height: 1.9; word-break: break-all; }
.isv-token { padding: 1px 0; border-radius: 2px; cursor: pointer; }
.isv-focus { border-bottom: 2px solid #868e96; }
.isv-query { outline: 2px solid #212529; }
.isv-future { opacity: 0.45; }
.isv-gap { color: #868e96; font-style: italic; margin: 2px 0; }
"""


class TokenAttention(anywidget.AnyWidget):
    """The browser view of an ``AttentionView``: ``view`` is its ``state()``, ``locked`` the
    locked query position (-1: none)."""

    _esm = ESM
    _css = CSS
    view = traitlets.Dict().tag(sync=True)
    locked = traitlets.Int(-1).tag(sync=True)


class AttentionExplorer:
    """One head's attention over one prompt's tokens, hover to preview, click to lock.

    Args:
        handle: the model.
        input_ids: the prompt ``(pos,)``; its last position is the answer position.
        layer, head: the head shown first (dropdowns change it).
        focus: named token spans to keep when windowing (``{"source": ..., "question": ...}``)
            and to underline; none: the whole prompt is shown.
        margin: tokens kept either side of each focus span.
        max_tokens: a prompt of at most this many tokens is shown whole.
        vmax: the attention weight drawn at full colour.
        title: what the prompt is, for the view's title (e.g. "the organism's 40-line record").
    """

    def __init__(
        self,
        handle: ModelHandle,
        input_ids: Int[Tensor, " pos"],
        *,
        layer: int,
        head: int,
        focus: Mapping[str, Span] | None = None,
        margin: int = 4,
        max_tokens: int | None = 160,
        vmax: float = 1.0,
        title: str = "the prompt",
    ):
        self.handle, self.input_ids = handle, input_ids.cpu()
        self.focus, self.vmax, self.name = dict(focus or {}), vmax, title
        n = len(self.input_ids)
        self.labels = token_labels(handle.tokenizer, self.input_ids.tolist())
        keep = [(0, 1), *self.focus.values(), (n - 1, n)]  # the first token (sinks), the answer
        self.segments = token_windows(n, keep, margin=margin, max_tokens=max_tokens)
        self.tokens = TokenAttention()
        spec = handle.spec
        self.layer = w.Dropdown(
            options=list(range(spec.n_layers)), value=layer, description="layer"
        )
        self.head = w.Dropdown(options=list(range(spec.n_heads)), value=head, description="head")
        self.view: AttentionView | None = None
        self._selecting = False
        self.select(layer, head)
        for box in (self.layer, self.head):
            box.observe(self._on_dropdown, names="value")
        self.widget = w.VBox([w.HBox([self.layer, self.head]), self.tokens])

    @classmethod
    def from_sample(cls, handle: ModelHandle, sample: Sample, **kwargs) -> AttentionExplorer:
        """The explorer on ``sample``'s prompt; a line-retrieval sample is windowed around its
        queried line and its question."""
        ids = sample.encode(handle.tokenizer).prompt_ids
        if sample.task == "line_retrieval":
            kwargs.setdefault("focus", line_retrieval_focus(sample, handle.tokenizer))
        return cls(handle, ids, **kwargs)

    def rows(self, layer: int, head: int) -> np.ndarray:
        """``(shown query, pos)``: head ``(layer, head)``'s rows of the shown positions."""
        queries = shown_positions(self.segments)
        rows = capture_attention_rows(
            self.handle, self.input_ids, queries, reduce=lambda r: r[0, head]
        )  # (layer, query, pos): one head's rows per layer, never T x T
        return rows[layer].double().cpu().numpy()

    def select(self, layer: int, head: int) -> None:
        """Show head ``(layer, head)`` (the locked query stays locked)."""
        self.view = attention_view(
            self.labels,
            self.rows(layer, head),
            shown_positions(self.segments),
            self.segments,
            title=f"L{layer}H{head} attention over {self.name}",
            vmax=self.vmax,
            focus=self.focus,
        )
        self._selecting = True
        try:
            self.layer.value, self.head.value = layer, head
        finally:
            self._selecting = False
        self.tokens.view = self.view.state()

    def _on_dropdown(self, _change) -> None:
        if not self._selecting:
            self.select(self.layer.value, self.head.value)

    def query(self) -> int:
        """The query position whose row is drawn when nothing is hovered: the locked one, or
        the answer position."""
        locked = self.tokens.locked
        return locked if locked in self.view.positions else self.view.positions[-1]

    def shown_row(self) -> dict[int, float]:
        """``{key position: weight}`` drawn for ``query()`` (as the browser receives it)."""
        state = self.tokens.view
        i = state["positions"].index(self.query())
        return dict(zip(state["positions"], state["weights"][i], strict=True))

    def html(self) -> str:
        """Static HTML of the current view (no script): ``viz.tokens.attention_html``."""
        return attention_html(self.view, self.query())

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/html"] = self.html()  # what a static render of a saved notebook shows
        return bundle
