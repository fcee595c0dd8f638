"""The head quadrant explorer: SEAL Fig. 2b-2d from a head sweep, live.

- **Quadrant map** (Fig. 2b, ``viz.dashboard.quadrant_map``): every head at (pruning delta at a
  mid length, at a long length), quadrants shaded, hover with layer, head, both deltas and the
  quadrant. Clicking a head opens its **channel map** (Fig. 2c): rows of a channel-sweep table
  when one is given, else computed on demand on the evaluator's records.
- **Scale-table editor** (Fig. 2d): box / lasso selections and whole quadrants fill a table, one
  line per head (``L1H3 x 0.9``); "evaluate" runs it across lengths (``EditEvaluator.sweep``,
  the same numbers as ``scale_table_sweep``) and draws the curves against the baseline; "save"
  writes the per-head scale file that ``interp-seal tune merge`` accepts.

Bad input (a table from another model, a line the editor cannot read, a head outside the model)
shows a message in the widget and leaves everything as it was.
"""

from __future__ import annotations

import os
import re
from html import escape

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go

from interp_seal.analysis import SweepUnit, head_quadrants, quadrant_scale_table
from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.analysis.quadrants import HeadQuadrants
from interp_seal.interventions import Head, ablate, scale_table
from interp_seal.models import ModelSpec
from interp_seal.viz import channel_map, quadrant_map, scale_table_curves
from interp_seal.widgets.files import write_head_scale_file
from interp_seal.widgets.redraw import redraw
from interp_seal.widgets.state import check_head

LINE = re.compile(r"^\s*L(\d+)\s*H(\d+)\s*[x*]\s*([0-9.eE+-]+)\s*$")


def check_table_fits(table: pd.DataFrame, spec: ModelSpec, what: str) -> None:
    """Raise unless every ``(layer, head[, channel])`` of ``table`` exists in a model ``spec``."""
    bad = table[(table.layer >= spec.n_layers) | (table["head"] >= spec.n_heads)]
    if "channel" in table and table["channel"].notna().any():
        bad = pd.concat([bad, table[table["channel"] >= spec.d_head]])
    if not bad.empty:
        row = bad.iloc[0]
        raise ValueError(
            f"the {what} holds layer {int(row.layer)}, head {int(row['head'])}, which this model "
            f"({spec.n_layers} layers x {spec.n_heads} heads x {spec.d_head} channels) does not "
            "have: it comes from another model. Sweep this model, or load its own table."
        )


def parse_table(text: str, spec: ModelSpec) -> dict[Head, float]:
    """``"L1H3 x 0.9"`` lines -> ``{(1, 3): 0.9}``; raises on a line it cannot read."""
    table: dict[Head, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = LINE.match(line)
        if match is None:
            raise ValueError(f"line {number} ({line.strip()!r}) is not of the form 'L1H3 x 0.9'")
        head = (int(match[1]), int(match[2]))
        check_head(spec, head)
        table[head] = float(match[3])
    if not table:
        raise ValueError("the scale table is empty: select heads or a quadrant first")
    return table


def format_table(table: dict[Head, float]) -> str:
    return "\n".join(f"L{a}H{b} x {f:g}" for (a, b), f in sorted(table.items()))


class QuadrantExplorer:
    """Quadrant map, channel maps and the scale-table editor over one head sweep.

    Args:
        evaluator: the model and records that channel maps and scale tables are computed on.
        head_table: a ``head_sweep`` table (columns ``layer, head, length, metric, delta``).
        mid, long: the two lengths compared (SEAL Fig. 2b).
        channel_table: an optional ``channel_sweep`` table; heads missing from it are computed.
        metric: the metric whose deltas place the heads.
    """

    def __init__(
        self,
        evaluator: EditEvaluator,
        head_table: pd.DataFrame,
        *,
        mid: int,
        long: int,
        channel_table: pd.DataFrame | None = None,
        metric: str = "exact_match",
    ):
        self.evaluator, self.handle, self.metric = evaluator, evaluator.handle, metric
        self.quadrants: HeadQuadrants | None = None
        self.channel_tables: pd.DataFrame | None = None
        self.selected: list[Head] = []
        self.curves: pd.DataFrame | None = None
        self.message = w.HTML()
        self.map_box, self.channel_box, self.curve_box = w.Box(), w.Box(), w.Box()
        self.channel_figure: go.FigureWidget | None = None
        self.curve_figure: go.FigureWidget | None = None
        self.load(head_table, mid=mid, long=long, channel_table=channel_table)
        self.factor = w.FloatText(value=0.9, description="factor")
        self.quadrant = w.Dropdown(options=["Q1", "Q2", "Q3", "Q4"], description="quadrant")
        add_q = w.Button(description="add quadrant")
        add_q.on_click(lambda _: self.add_quadrant(self.quadrant.value))
        add_sel = w.Button(description="add selection")
        add_sel.on_click(lambda _: self.add(self.selected))
        seal = w.Button(description="Q1 x 0.9, Q3 x 1.1")
        seal.on_click(lambda _: self.seal_preset())
        self.editor = w.Textarea(placeholder="L1H3 x 0.9", layout=w.Layout(height="120px"))
        evaluate = w.Button(description="evaluate across lengths", icon="line-chart")
        evaluate.on_click(lambda _: self.evaluate())
        self.path = w.Text(value="scale_table.safetensors", description="scale file")
        save = w.Button(description="save scale file", icon="save")
        save.on_click(lambda _: self.save(self.path.value))
        self.widget = w.VBox(
            [
                self.message,
                w.HBox([self.map_box, self.channel_box]),
                w.HBox([self.factor, self.quadrant, add_q, add_sel, seal]),
                w.HBox([self.editor, w.VBox([evaluate, self.path, save])]),
                self.curve_box,
            ]
        )

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def load(
        self,
        head_table: pd.DataFrame,
        *,
        mid: int,
        long: int,
        channel_table: pd.DataFrame | None = None,
    ) -> None:
        """Place the heads of ``head_table`` (and keep ``channel_table`` for channel maps).

        A table that does not fit this model (another model's sweep), or lacks the two lengths,
        leaves a message and the explorer as it was (empty, when constructed with it)."""
        spec = self.handle.spec
        try:
            check_table_fits(head_table, spec, "head sweep table")
            if channel_table is not None:
                check_table_fits(channel_table, spec, "channel sweep table")
            quadrants = head_quadrants(head_table, mid=mid, long=long, metric=self.metric)
        except ValueError as err:
            return self._say(str(err), error=True)
        self.quadrants, self.channel_tables, self.selected = quadrants, channel_table, []
        self.map = go.FigureWidget(quadrant_map(quadrants))
        self.map.data[0].on_click(self._on_click)
        self.map.data[0].on_selection(self._on_select)
        self.map_box.children = (self.map,)
        self._say(f"{len(quadrants.heads)} heads placed")

    def _loaded(self) -> bool:
        if self.quadrants is None:
            self._say(
                "no head table is loaded: call load() with this model's head sweep", error=True
            )
        return self.quadrants is not None

    # -- events ----------------------------------------------------------------------------
    def _on_click(self, _trace, points, _state) -> None:
        if points.point_inds:
            row = self.quadrants.heads.iloc[points.point_inds[0]]
            self.open_channels((int(row.layer), int(row["head"])))

    def _on_select(self, _trace, points, _selector) -> None:
        heads = self.quadrants.heads.iloc[list(points.point_inds)]
        self.selected = [(int(a), int(b)) for a, b in zip(heads.layer, heads["head"], strict=True)]
        self._say(f"{len(self.selected)} heads selected")

    # -- actions ---------------------------------------------------------------------------
    def add(self, heads: list[Head]) -> None:
        """Add ``heads`` to the editor at the current factor (replacing their old lines)."""
        try:
            table = parse_table(self.editor.value, self.handle.spec) if self.editor.value else {}
        except ValueError as err:
            return self._say(str(err), error=True)
        table.update({head: float(self.factor.value) for head in heads})
        self.editor.value = format_table(table)

    def add_quadrant(self, quadrant: str) -> None:
        """Add every head of ``quadrant`` (``"Q1"`` ... ``"Q4"``) at the current factor."""
        if self._loaded():
            self.add(self.quadrants.members(quadrant))

    def seal_preset(self) -> None:
        """SEAL Fig. 2d's table: every Q1 head x 0.9, every Q3 head x 1.1."""
        if not self._loaded():
            return
        table = quadrant_scale_table(self.quadrants, {"Q1": 0.9, "Q3": 1.1})
        self.editor.value = format_table(table)

    def channel_rows(self, head: Head) -> pd.DataFrame:
        """The channel-sweep rows of ``head``: from the given table, else computed."""
        given = self.channel_tables
        if given is not None:
            rows = given[(given.layer == head[0]) & (given["head"] == head[1])]
            if not rows.empty:
                return rows
        units = [
            SweepUnit(
                labels={"layer": head[0], "head": head[1], "channel": c},
                intervention=ablate(self.handle.spec, [(*head, c)], "zero"),
            )
            for c in range(self.handle.spec.d_head)
        ]
        return self.evaluator.sweep(units)

    def open_channels(self, head: Head) -> None:
        """Show ``head``'s channel map (SEAL Fig. 2c)."""
        try:
            check_head(self.handle.spec, head)
            figure = channel_map(self.channel_rows(head), metric=self.metric)
        except ValueError as err:
            return self._say(str(err), error=True)
        self.channel_figure = redraw(self.channel_figure, figure, self.channel_box)
        self._say(f"channel map of L{head[0]}H{head[1]}")

    def evaluate(self) -> None:
        """The editor's table across lengths against the baseline (SEAL Fig. 2d)."""
        try:
            table = parse_table(self.editor.value, self.handle.spec)
        except ValueError as err:
            return self._say(str(err), error=True)
        unit = SweepUnit(
            labels={"table": "edited"}, intervention=scale_table(self.handle.spec, table)
        )
        self.curves = self.evaluator.sweep([unit])
        figure = scale_table_curves(self.curves, metric=self.metric)
        self.curve_figure = redraw(self.curve_figure, figure, self.curve_box)
        self._say(f"evaluated {len(table)} heads")

    def save(self, path: str | os.PathLike) -> None:
        """Save the editor's table as a per-head scale file."""
        try:
            table = parse_table(self.editor.value, self.handle.spec)
            target = write_head_scale_file(self.handle, table, path, source="quadrant explorer")
        except (ValueError, OSError) as err:
            return self._say(str(err), error=True)
        self._say(f"saved the scale file to {target}")

    def _say(self, text: str, *, error: bool = False) -> None:
        color = "#c92a2a" if error else "#2b8a3e"
        self.message.value = f'<span style="color:{color}">{escape(text)}</span>'
