"""The head-pruning dashboard: prune and scale heads, watch retrieval change (SEAL Sec. 3, Fig. 2).

Panels, all driven by one ``DashboardState`` (``state.py``):

- a layers x heads grid (``viz.dashboard.edit_grid``): a click cycles the head through keep ->
  prune -> scale (by the slider's factor) and locks it; moving the slider rescales the locked
  head when it is scaled;
- with the click toggle on "stream KV", a click switches the KV head the clicked query head
  reads (all its query heads under grouped-query attention) between full attention and sink +
  recent window (``models.streaming_heads``: DuoAttention / RazorAttention's streaming heads,
  sizes in the *sink* / *window* boxes), framed in teal in the grid; the edits and the
  streaming heads apply together (``compress_kv`` around the edited runs);
- the list of current edits and streaming KV heads, each with its own remove button, and undo /
  reset;
- accuracy against context length, unedited (dashed) and edited (solid, under it), with 95 %
  Wilson intervals: teacher-forced greedy exact
  match on a fixed set of LongEval records, computed by ``EditEvaluator`` from a cached clean run
  so that an edit costs only the layers from the lowest edited one up (SEAL Fig. 2d, live);
  below it, while any KV head streams, per length the same accuracy beside the KV cache kept
  after the prompt, in bytes and as a share of the all-full cache (``EditEvaluator.kv_budget``;
  hidden otherwise, so that a click without streaming heads sends nothing more); with streaming
  heads on, a run starts at the lowest edited layer below them, else at the input of the
  lowest streaming layer, its attention run again (``engine.run_from_input``);
- the direct logit attribution (SEAL Fig. 4) of one record's first answer token under the edits
  and the streaming heads;
- the locked head's channel map on demand (per-channel pruning deltas, SEAL Fig. 2c) under
  the current edits (``runs.EditedRuns.channel_table``: each channel zeroed on top of the
  edits, against the edited model; the map's title says so), filled in as channels finish,
  with its progress and time beside the button that asked for it; with the click toggle on
  "channels", a click on a head locks it and opens its channels instead of editing it;
- save the edits as a per-head scale file (``interp-seal tune merge`` accepts it) or merge them
  into a checkpoint; the state as JSON, to copy, paste and restore.

How a click feels: the widgets are built once and redrawn in place (``viz.dashboard.set_*``,
``redraw.py``), so a click sends the page about 50 KB of changed values instead of new figure
widgets (5 MB of plotly.js each). ``apply`` changes the grid cell, the edit list and a status
line first, then fills the accuracy curve in length by length as the forwards finish (a
pending length is a gap, never an old number), then the DLA panel; the status says what is
computing and, when done, how long the update took. The forwards run from cached runs
(``runs.EditedRuns``): an edit starts at its layer, and once a layer-0 edit is made, the
edits above it start from a cached run of it instead of layer 0. With ``background=True`` (the
served page) they run on a worker thread (``worker.py``): a click made during an update shows
at once (its cell outlined with orange dots, the status line saying it is queued) and its
update follows the running one, so every state shown is a real one.

Colours mean one thing each (``viz.colors``): grey / white / orange for pruned / kept /
amplified heads, blue / red for effects that help / hurt the answer, on ranges fixed per record
(DLA: the record's unedited attribution) so that views compare.

Bad input (a head outside the model, a state or scale file for another geometry, an unwritable
path) shows a message in the widget; nothing is applied or written half-way. Forwards run under
``lock`` so that several views of one model (browser tabs of the served page) never interleave
their hooks.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from html import escape
from pathlib import Path

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go

from interp_seal.analysis import logit_attribution
from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.analysis.sweeps import ProgressCallback, SweepOptions
from interp_seal.evaluation import line_retrieval_samples
from interp_seal.interventions import Head, scale_table
from interp_seal.models import ModelHandle, StreamingHeads, compress_kv
from interp_seal.models.load import ORGANISM_DIR
from interp_seal.models.streaming_heads import check_supported
from interp_seal.outputs import atomic_dir
from interp_seal.tuning import load_scales, save_merged
from interp_seal.viz import accuracy_curves, dla_figure, edit_grid
from interp_seal.viz.attribution import set_dla
from interp_seal.viz.colors import symmetric_range
from interp_seal.viz.dashboard import budget_table, head_channel_map, set_accuracy, set_edits
from interp_seal.widgets.files import head_scales, write_head_scale_file
from interp_seal.widgets.redraw import redraw
from interp_seal.widgets.runs import EditedRuns
from interp_seal.widgets.state import FACTOR_RANGE, DashboardState, check_head, check_sizes
from interp_seal.widgets.worker import Worker

DEFAULT_LENGTHS = (40, 80, 120, 160)  # lines: where the organism v2 degrades (docs/organism.md)
# records per cached forward, as the library's sweeps batch them on a CPU: a layer-0 update at
# the defaults took 4.3 CPU s in chunks of 4 records against 5.1 in one chunk per length
BATCH_SAMPLES = SweepOptions().batch_samples
HELP = (
    "<div style='max-width:900px'><b>How to use.</b> Click a head in the grid: keep &rarr; "
    "prune (x0) &rarr; scale (by the slider's factor) &rarr; keep. The cell changes at once; "
    "the accuracy curve then fills in length by length (solid: with your edits, dashed: the "
    "unedited model; bars: 95% Wilson intervals over the records). The outlined head is the "
    "locked one: the slider rescales it, and its channel map (under your edits) opens with "
    "the button below (or switch <i>a click</i> to <i>channels</i>). With <i>a click</i> on "
    "<i>stream KV</i>, a click switches the clicked head's KV head (all the query heads that "
    "read it) between full attention and its first <i>sink</i> + last <i>window</i> tokens "
    "(framed in teal); the table under the curve gives the KV cache kept per length. A click "
    "made while an "
    "update runs is outlined with orange dots and queued. Grey cells are pruned, orange "
    "amplified; in the attribution and channel maps blue helps the answer and red hurts "
    "it.</div>"
)


class Dashboard:
    """The head-pruning dashboard over one ``EditEvaluator`` (its model and records).

    Args:
        evaluator: the model and the fixed records, with their cached clean run.
        state: a view to restore (``DashboardState.from_json``), or None for no edits.
        lock: serialises forwards between dashboards sharing the model.
        metric: ``"exact_match"`` or ``"answer_logprob"`` for the accuracy panel.
        save_dir: where scale files and merged checkpoints go: relative paths resolve
            against it and paths outside it are refused (the served page passes the directory
            ``interp-seal dashboard`` was started in). None: the working directory, no limit.
        background: compute on a worker thread, so that clicks made during an update show
            at once and queue (the served page); False computes before each call returns
            (scripts, tests; ``wait`` returns at once).
    """

    def __init__(
        self,
        evaluator: EditEvaluator,
        *,
        state: DashboardState | None = None,
        lock: threading.Lock | None = None,
        metric: str = "exact_match",
        save_dir: str | os.PathLike | None = None,
        name: str | None = None,
        background: bool = False,
    ):
        self.evaluator, self.handle, self.metric = evaluator, evaluator.handle, metric
        self.name = name or model_name(self.handle.name_or_path)
        self.save_dir = None if save_dir is None else Path(save_dir).resolve()
        self._confirm: Path | None = None  # a save target the user was asked to confirm
        self.lock = lock or nullcontext()
        spec = self.handle.spec
        self.state = state or DashboardState(
            model=self.name,
            geometry=spec.as_dict(),
            dla_length=evaluator.lengths[-1],
        )
        if self.state.geometry != spec.as_dict():
            raise ValueError("the state was made for a model of another geometry")
        self.history: list[DashboardState] = []
        self._rendering = False
        self.updates = 0  # finished updates, shown on the page's status
        self._dla_ranges: dict[tuple[int, int], tuple[float, float]] = {}
        self.records = {length: len(encs) for length, encs in evaluator.encoded.items()}
        self.runs = EditedRuns(evaluator)
        self.unedited = self.runs.unedited
        self._budgets: dict[StreamingHeads | None, pd.DataFrame] = {}
        self.shown = self.state  # the state whose numbers the panels show
        self.results = self._evaluate(self.state)
        self._budget_shown = self.kv_budget(self.state)  # the budget of the numbers shown
        self._budget_on = bool(self.state.streaming)  # the table shows only with streaming heads
        self.attribution = self._attribute(self.state)
        self.channel_results: pd.DataFrame | None = None
        self._mapped: tuple[Head, tuple] | None = None  # the map shown: its head and edits
        self._ui = threading.RLock()  # the status line and the grid, changed from two threads
        self._progress: tuple[str, int, int] | None = None  # what the worker computes now
        self._queued: list[tuple[object, str, str]] = []  # (job key, kind, what) waiting
        self._seconds = 0.0  # how long the last update computed
        self._edit_requests = 0  # edits asked for so far: a map asked for before one stops
        self.worker = Worker(background=background, on_error=self._failed)
        self._build()

    @classmethod
    def from_model(
        cls,
        handle: ModelHandle,
        *,
        lengths: Sequence[int] = DEFAULT_LENGTHS,
        n: int = 20,
        seed: int = 0,
        on_progress: ProgressCallback | None = None,
        **kwargs,
    ) -> Dashboard:
        """A dashboard on ``n`` LongEval records per number of lines in ``lengths``
        (``evaluation.line_retrieval_samples``: the same records every time). The clean runs
        show a progress bar, or report to ``on_progress(done, total)`` instead."""
        records = line_retrieval_samples(handle.tokenizer, lengths, n=n, seed=seed)
        evaluator = EditEvaluator(
            handle,
            records,
            batch_samples=BATCH_SAMPLES,
            progress=on_progress is None,
            on_progress=on_progress,
        )
        return cls(evaluator, **kwargs)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued update and channel map has finished (background mode)."""
        return self.worker.wait(timeout)

    # -- computing (library calls only) ----------------------------------------------------
    def intervention(self, state: DashboardState | None = None):
        """The ``HeadIntervention`` of ``state``'s edits (None when there are none)."""
        table = (state or self.state).table()
        return scale_table(self.handle.spec, table) if table else None

    def _evaluate(self, state: DashboardState, on_length=None):
        with self.lock:
            return self.runs.evaluate(
                state.table(), streaming=state.attention(), on_length=on_length
            )

    def kv_budget(self, state: DashboardState | None = None) -> pd.DataFrame:
        """``EditEvaluator.kv_budget`` of ``state``'s streaming heads (default: the current
        state's), computed once per configuration."""
        config = (state or self.state).attention()
        if config not in self._budgets:
            self._budgets[config] = self.evaluator.kv_budget(config)
        return self._budgets[config]

    def _attribute(self, state: DashboardState):
        """DLA of the chosen record's first answer token at the last prompt position, under the
        edits; the first time a record is shown, its unedited DLA fixes the panel's ranges."""
        key = (state.dla_length, state.dla_record)
        enc = self.evaluator.encoded[key[0]][key[1]]
        iv, streaming = self.intervention(state), state.attention()
        result = self._attribution(enc, iv, streaming)
        if key not in self._dla_ranges:
            plain = iv is None and streaming is None
            unedited = result if plain else self._attribution(enc, None, None)
            table = unedited.table
            heads = table.component == "head"
            self._dla_ranges[key] = (
                symmetric_range(table.value[heads]),
                symmetric_range(table.value[~heads]),
            )
        return result

    def _attribution(self, enc, iv, streaming: StreamingHeads | None = None):
        attention = compress_kv(self.handle, streaming) if streaming else nullcontext()
        with self.lock, attention, self.handle.edit(iv) if iv is not None else nullcontext():
            return logit_attribution(
                self.handle, enc.prompt_ids, [int(enc.answer_ids[0])], position=-1
            )

    def channel_table(
        self,
        head: Head,
        *,
        channels: Sequence[int] | None = None,
        on_progress=None,
        on_forward=None,
    ):
        """Per-channel pruning deltas of ``head`` on the dashboard's records (SEAL Fig. 2c)
        under the shown edits: channel ``c`` zeroed on top of them (``head``'s own factor stays
        on its other channels), against the edited model, as ``channel_sweep(...,
        intervention=<the edits>)`` defines them. ``channels`` defaults to all ``d_head``;
        ``on_progress(done, total, table so far)`` after each group of channels,
        ``on_forward(done, total)`` after each forward."""
        check_head(self.handle.spec, head)
        with self.lock:
            return self.runs.channel_table(
                head,
                self.shown.table(),
                channels=channels,
                on_progress=on_progress,
                on_forward=on_forward,
                on_prepare=lambda: self._channel_note(
                    head, "caching the run under the edits below it"
                ),
            )

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        """The widgets, each built once: later states change their values in place."""
        spec, state = self.handle.spec, self.state
        self.message = w.HTML()
        self.status = w.HTML()
        self.busy = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="160px"))
        self.grid = go.FigureWidget(
            edit_grid(
                spec.n_layers,
                spec.n_heads,
                state.table(),
                selected=state.selected,
                streaming=state.streaming,
                group=spec.group_size,
            )
        )
        self.grid.data[0].on_click(self._on_grid_click)
        self.accuracy = go.FigureWidget(
            accuracy_curves(self.results, metric=self.metric, records=self.records)
        )
        self.budget = w.HTML(
            budget_table(self.results, self._budget_shown, metric=self.metric),
            layout=w.Layout(display=None if self._budget_on else "none"),
        )
        self.dla = go.FigureWidget(dla_figure(self.attribution, **self._dla_range()))
        self.dla.update_layout(width=720, height=440)
        self.factor = w.FloatSlider(
            value=state.factor,
            min=FACTOR_RANGE[0],
            max=FACTOR_RANGE[1],
            step=0.05,
            description="scale factor",
            tooltip="the factor a second click scales a head by; moving it "
            "rescales the locked (outlined) head if it is scaled",
            style={"description_width": "initial"},
        )
        self.factor.observe(self._on_factor, names="value")
        self.undo_button = w.Button(description="undo", icon="undo", tooltip="undo the last edit")
        self.undo_button.on_click(lambda _: self.undo())
        self.reset_button = w.Button(description="reset", icon="times", tooltip="remove all edits")
        self.reset_button.on_click(lambda _: self.reset())
        self.edits_box = w.VBox()
        self.dla_length = w.Dropdown(
            options=[(f"{n} lines", n) for n in self.evaluator.lengths],
            value=state.dla_length,
            description="record of",
            tooltip="the context length of the record whose answer is attributed",
            layout=w.Layout(width="200px"),
        )
        self.dla_record = w.BoundedIntText(
            value=state.dla_record,
            min=0,
            description="number",
            tooltip="which record of that length (0-based)",
            layout=w.Layout(width="160px"),
        )
        self._set_record_bound()
        for widget in (self.dla_length, self.dla_record):
            widget.observe(self._on_record, names="value")
        wide = w.Layout(width="340px")
        button = w.Layout(width="auto")
        self.scale_path = w.Text(value="dashboard_scales.safetensors", layout=wide)
        self.save_button = w.Button(
            description="save scale file",
            icon="save",
            layout=button,
            tooltip="save the edits as a per-head scale file (interp-seal tune merge reads it)",
        )
        self.save_button.on_click(lambda _: self._on_save())
        self.load_button = w.Button(
            description="load scale file",
            icon="folder-open",
            layout=button,
            tooltip="replace the edits by a per-head scale file's factors",
        )
        self.load_button.on_click(lambda _: self.load_scale_file(self.scale_path.value))
        self.merge_path = w.Text(value="dashboard_merged", layout=wide)
        self.merge_button = w.Button(
            description="merge into checkpoint",
            icon="compress",
            layout=button,
            tooltip="fold the edits into o_proj and save a plain Hugging Face checkpoint",
        )
        self.merge_button.on_click(lambda _: self.merge(self.merge_path.value))
        self.state_box = w.Textarea(layout=w.Layout(width="100%", height="70px"))
        self.apply_button = w.Button(description="restore state", icon="upload", layout=button)
        self.apply_button.on_click(lambda _: self.restore(self.state_box.value))
        self.click_mode = w.ToggleButtons(
            options=[("edit", "edit"), ("stream KV", "stream"), ("channels", "channels")],
            value="edit",
            description="a click:",
            tooltips=[
                "cycle the head: keep -> prune (x0) -> scale (x slider factor) -> keep",
                "switch the head's KV head (all query heads reading it) between full attention "
                "and sink + window",
                "open the head's channel map (its edit is unchanged)",
            ],
            style={"button_width": "90px"},
        )
        size = w.Layout(width="150px")
        self.sink = w.BoundedIntText(
            value=state.sink,
            min=0,
            max=1_000_000,
            description="sink",
            tooltip="the first tokens a streaming KV head sees (attention sinks)",
            layout=size,
        )
        self.window = w.BoundedIntText(
            value=state.window,
            min=1,
            max=1_000_000,
            description="window",
            tooltip="the most recent tokens a streaming KV head sees, itself included",
            layout=size,
        )
        for widget in (self.sink, self.window):
            widget.observe(self._on_sizes, names="value")
        self.channel_button = w.Button(
            description="channel map of the outlined head",
            icon="search",
            tooltip="zero each channel of the outlined head in turn, under the current edits",
            layout=w.Layout(width="auto"),
        )
        self.channel_button.on_click(lambda _: self.open_channels())
        # the map's progress beside the button that asked for it
        self.channel_busy = w.IntProgress(
            value=0, min=0, max=1, layout=w.Layout(width="160px", visibility="hidden")
        )
        self.channel_status = w.HTML()
        self.channel_figure: go.FigureWidget | None = None
        self.channels = w.Box()
        lengths = self.evaluator.lengths
        sizes = (
            f"{len(lengths)} lengths ({min(lengths)}-{max(lengths)} lines) x "
            f"{max(self.records.values())} LongEval records; exact match by teacher forcing"
        )
        wrap = w.Layout(display="flex", flex_flow="row wrap", align_items="flex-start")
        self.widget = w.VBox(
            [
                w.HTML(
                    f"<h3 style='margin:4px 0'>Head-pruning dashboard: {escape(self.name)}</h3>"
                    f"<div>{escape(sizes)}</div>"
                ),
                w.HTML(HELP),
                w.HBox([self.busy, self.status], layout=w.Layout(align_items="center")),
                self.message,
                w.Box(
                    [
                        w.VBox(
                            [
                                self.grid,
                                self.click_mode,
                                w.HBox([self.sink, self.window]),
                                self.factor,
                                w.HBox([self.undo_button, self.reset_button]),
                            ]
                        ),
                        w.VBox(
                            [
                                self.accuracy,
                                self.budget,
                                w.HTML("<b>Edits</b>"),
                                self.edits_box,
                            ]
                        ),
                    ],
                    layout=wrap,
                ),
                w.HTML("<b>Direct logit attribution</b> of a record's first answer token"),
                w.Box([self.dla_length, self.dla_record], layout=wrap),
                self.dla,
                w.HBox(
                    [self.channel_button, self.channel_busy, self.channel_status],
                    layout=w.Layout(align_items="center"),
                ),
                self.channels,
                w.Box([self.scale_path, self.save_button, self.load_button], layout=wrap),
                w.Box([self.merge_path, self.merge_button], layout=wrap),
                w.HTML("<b>State</b> (JSON: copy to share, paste and restore)"),
                self.state_box,
                self.apply_button,
            ],
            layout=w.Layout(max_width="1400px"),
        )
        self._render_controls()
        self._ready()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    # -- events ----------------------------------------------------------------------------
    def _on_grid_click(self, _trace, points, _state) -> None:
        if points.xs:
            head = (int(points.ys[0]), int(points.xs[0]))
            mode = self.click_mode.value
            (self.drill if mode == "channels" else self.stream if mode == "stream" else self.click)(
                head
            )

    def _on_factor(self, change) -> None:
        if not self._rendering:
            self.set_factor(float(change["new"]))

    def _on_sizes(self, _change) -> None:
        if not self._rendering:
            self.set_sizes(int(self.sink.value), int(self.window.value))

    def _on_record(self, _change) -> None:
        if self._rendering:
            return
        self._set_record_bound()
        self.apply(
            replace(
                self.state,
                dla_length=int(self.dla_length.value),
                dla_record=int(self.dla_record.value),
            ),
            record=False,
        )

    def _set_record_bound(self) -> None:
        self.dla_record.max = len(self.evaluator.encoded[int(self.dla_length.value)]) - 1

    # -- actions (what the buttons call; tests call them too) ------------------------------
    def click(self, head: Head) -> None:
        """A click on ``head`` in the grid: keep -> prune -> scale -> keep."""
        self._guard(lambda: self.apply(self.state.cycled(head)))

    def stream(self, head: Head) -> None:
        """A click in stream mode on query head ``head``: the KV head it reads switches
        between full attention and sink + window (with all the query heads reading it)."""

        def stream() -> None:
            state = self.state.stream_toggled(head)
            if state.attention() is not None:  # e.g. sliding-window models: refused here
                check_supported(self.handle, state.attention())
            self.apply(state)

        self._guard(stream)

    def set_sizes(self, sink: int, window: int) -> None:
        """The sink and window boxes: the streaming heads' sizes (recomputed if any streams)."""

        def sizes() -> None:
            check_sizes(sink, window)
            self.apply(replace(self.state, sink=sink, window=window))
            return True

        if self._guard(sizes) is None and (sink, window) != (self.state.sink, self.state.window):
            self._render_controls()  # a refused size: the boxes show the state's again

    def drill(self, head: Head) -> None:
        """A click in drill-down mode: lock ``head`` (its edit unchanged) and open its channels."""
        try:
            check_head(self.handle.spec, head)
        except ValueError as err:
            return self._say(str(err), error=True)
        self.apply(replace(self.state, selected=head), record=False)
        self.open_channels()

    def set_factor(self, factor: float) -> None:
        """The slider: the factor of the next scale step, and of the locked head if scaled."""
        state = replace(self.state, factor=factor)
        locked = state.selected
        if locked is not None and state.table().get(locked, 0) != 0:
            state = state.with_edit(locked, factor)
        self._guard(lambda: self.apply(state))

    def remove(self, head: Head) -> None:
        self._guard(lambda: self.apply(self.state.with_edit(head, None)))

    def undo(self) -> None:
        if self.history:
            self._guard(lambda: self.apply(self.history.pop(), record=False))

    def reset(self) -> None:
        self._guard(lambda: self.apply(replace(self.state, edits=(), streaming=(), selected=None)))

    def restore(self, text: str) -> None:
        """Apply a state pasted as JSON (every field checked against the model and the
        dashboard's records first; a bad state changes nothing and says which field is wrong)."""
        records = {length: len(encs) for length, encs in self.evaluator.encoded.items()}

        def restore() -> None:
            state = DashboardState.from_json(text, self.handle.spec, records=records)
            self.apply(state, record=True)

        self._guard(restore)

    def apply(self, state: DashboardState, *, record: bool = True) -> None:
        """Make ``state`` the current one: the grid, edit list and controls change at once;
        then (on the worker, after any running update) the accuracy curve fills in length by
        length as exact results arrive (pending lengths are gaps, never stale numbers), then
        the DLA panel. While an earlier update runs, the status line says this one is queued
        and the grid outlines its changed heads; queued states are computed latest first
        (an update always computes the newest state asked for)."""
        asked = time.perf_counter()
        if record and state != self.state:
            self.history.append(self.state)
        old, self.state = self.state, state
        self._render_controls()
        self._submit(self._update, _change(old, state), kind="update", asked=asked)

    def _submit(self, job, what: str, *, kind: str, asked: float) -> None:
        """Queue ``job``; if another is running, say at once that ``what`` waits its turn. An
        edit stops a running channel map after its current channels (the map was of the old
        edits; its button computes it again). The job's time counts from ``asked`` (when the
        click came), or from its own start when it had to wait."""
        key = object()
        with self._ui:
            waits = self.worker.pending > 0
            if what and waits:
                self._queued.append((key, kind, what))
                self._show_status()
            if kind == "update" and what:
                self._edit_requests += 1
        self.worker.submit(lambda: job(key, None if waits else asked))

    def _start(self, key, kind: str) -> None:
        """A job begins: it no longer waits (an update computes the newest state, so every
        update waiting before it is done by it too)."""
        with self._ui:
            self._queued = [
                q for q in self._queued if q[0] is not key and not (kind == "update" == q[1])
            ]

    def _update(self, key, started: float | None) -> None:
        """The worker's part of ``apply``: compute the newest state asked for."""
        self._start(key, "update")
        started = started or time.perf_counter()
        state, shown = self.state, self.shown
        if state.computed() != shown.computed():
            lengths = self.evaluator.lengths
            what = f"exact match under {_edits(state)}"
            self._budget_shown = self.kv_budget(state)
            self._budget_on = bool(state.streaming)
            if not self._budget_on and self.budget.layout.display != "none":
                self.budget.layout.display = "none"  # every head full: nothing to compare
            self._draw_accuracy(self.results.iloc[:0])
            self._busy(what, 0, len(lengths))

            def partial(table: pd.DataFrame) -> None:
                self._draw_accuracy(table)
                self._busy(what, table.length.nunique(), len(lengths))

            self.results = self._evaluate(state, on_length=partial)
        if (state.computed(), state.dla_length, state.dla_record) != (
            shown.computed(),
            shown.dla_length,
            shown.dla_record,
        ):
            self._busy(
                f"direct logit attribution of record {state.dla_record} at "
                f"{state.dla_length} lines",
                0,
                1,
            )
            self.attribution = self._attribute(state)
            self._draw_dla()
        self.shown = state
        if self._mapped is not None and self._mapped[1] != state.edits:
            head, edits = self._mapped
            then = f"{len(edits)} edit{'s' if len(edits) > 1 else ''}" if edits else "no edits"
            self._channel_note(
                head, f"map computed under {then}; the edits changed: press again to recompute"
            )
            self._mapped = None
        self._finish(time.perf_counter() - started)

    def _finish(self, seconds: float) -> None:
        """A job is done: the grid's pending outlines follow; the status says "ready" unless
        another job waits (it takes over the status line)."""
        with self._ui:
            self._draw_grid()
            if self.worker.pending <= 1:  # only this job
                self._ready(seconds)

    def _failed(self, err: Exception) -> None:
        """A job raised: say so; the page stays usable."""
        self._say(f"{type(err).__name__}: {err}", error=True)
        with self._ui:
            self._progress = None
            if self.worker.pending <= 1:
                self._ready()

    def output_path(self, path: str | os.PathLike) -> Path:
        """``path`` made absolute against ``save_dir``; ``ValueError`` if it leaves it."""
        path = Path(path).expanduser()
        if self.save_dir is None:
            return path.resolve()
        target = (self.save_dir / path).resolve()
        if not target.is_relative_to(self.save_dir):
            raise ValueError(
                f"{path} is outside {self.save_dir}: the dashboard saves and loads files only "
                "inside the directory it was started in (or its --save-dir)"
            )
        return target

    def _on_save(self) -> None:
        """The save button: a second press confirms overwriting an existing file."""
        try:
            target = self.output_path(self.scale_path.value)
        except ValueError as err:
            return self._say(str(err), error=True)
        if target.is_file() and self._confirm != target:
            self._confirm = target
            return self._say(
                f"{target} exists: press 'save scale file' again to overwrite it", error=True
            )
        self._confirm = None
        self.save_scale_file(target, overwrite=True)

    def save_scale_file(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path | None:
        """Save the edits as a per-head scale file ``(L, H, 1)``; written whole or not at all.
        An existing file is replaced only with ``overwrite``."""

        def save() -> Path:
            target = self.output_path(path)
            if target.is_file() and not overwrite:
                raise ValueError(f"{target} exists; save again to overwrite it")
            return write_head_scale_file(
                self.handle, self.state.table(), target, source="dashboard"
            )

        return self._guard(save, done="saved the scale file to {}" + self._not_weights())

    def load_scale_file(self, path: str | os.PathLike) -> None:
        """Replace the edits by a per-head scale file's factors (checked against the model)."""

        def load() -> None:
            scale_file = load_scales(self.output_path(path), self.handle.spec)
            if scale_file.granularity != "head":
                raise ValueError(
                    f"{path} holds per-channel scales (SEAL-C); the dashboard edits whole heads, "
                    "so load a per-head (SEAL-H) scale file"
                )
            factors = scale_file.scales[..., 0].tolist()
            edits = tuple(
                (layer, head, float(f))
                for layer, row in enumerate(factors)
                for head, f in enumerate(row)
                if f != 1
            )
            self.apply(replace(self.state, edits=edits))

        self._guard(load, done=f"loaded {path}")

    def merge(self, out_dir: str | os.PathLike) -> Path | None:
        """Fold the edits into ``o_proj`` and save a plain HF checkpoint (exact, SEAL Sec. 4.3)."""

        def merge() -> Path:
            target = self.output_path(out_dir)
            if target.exists() and any(target.iterdir()):
                raise ValueError(f"{target} exists and is not empty; choose a new directory")
            scales = head_scales(self.handle, self.state.table())
            with self.lock, atomic_dir(target, mode="replace") as partial:
                save_merged(self.handle, scales, partial)
            return target

        return self._guard(merge, done="merged the edits into {}" + self._not_weights())

    def _not_weights(self) -> str:
        """What a weight file leaves out: the streaming heads, an attention mode."""
        if not self.state.streaming:
            return ""
        return (
            " (the streaming KV heads are an attention mode, not weights: the state JSON keeps "
            "them; interp-seal evaluate lines --streaming-heads "
            + ",".join(f"{a}.{k}" for a, k in self.state.streaming)
            + f" --sink {self.state.sink} --window {self.state.window} runs them)"
        )

    def open_channels(self, channels: Sequence[int] | None = None) -> None:
        """Show the locked head's channel map (all channels by default) under the current
        edits, drawn as groups of channels finish (pending channels blank), its progress and
        time beside the button."""
        head = self.state.selected
        if head is None:
            self._say("click a head first: the channel map opens for the locked head", error=True)
            return
        if self.state.streaming:
            self._say(
                "channel maps are computed with every KV head full: switch the streaming KV "
                "heads back to full attention (reset, or their 'full' buttons) first",
                error=True,
            )
            return
        channels = list(range(self.handle.spec.d_head) if channels is None else channels)
        label = f"L{head[0]}H{head[1]}"
        self.channel_busy.layout.visibility = "visible"
        self.channel_busy.bar_style, self.channel_busy.value = "warning", 0
        self._channel_note(head, "queued after the running update" if self.worker.pending else "")
        edits = self._edit_requests
        self._submit(
            lambda key, started: self._open_channels(key, started, head, channels, edits),
            f"channel map of {label}",
            kind="channels",
            asked=time.perf_counter(),
        )

    def _open_channels(
        self, key, started: float | None, head: Head, channels: list[int], edits: int
    ) -> None:
        """The worker's part of ``open_channels``; it stops if an edit is asked for after
        ``edits`` edit requests."""
        self._start(key, "channels")
        started = started or time.perf_counter()
        state = self.shown
        label = f"L{head[0]}H{head[1]}"
        under = _under(state, head)
        what = f"channel map of {label}"
        finished = 0  # channels

        def progress(done: int, total: int, table: pd.DataFrame) -> None:
            nonlocal finished
            finished = done
            self._draw_channels(table, head, channels, under)
            self._channel_note(head, f"channels {done} / {total}, {_took(started)}")
            self._busy(what, done, total)
            if done < total and self._edit_requests > edits:
                raise _Stopped(f"stopped at {done} / {total} channels: an edit came first")

        def forward(done: int, total: int) -> None:
            self.channel_busy.max, self.channel_busy.value = total, done
            self._channel_note(head, f"channels {finished} / {len(channels)}, {_took(started)}")

        try:
            progress(0, len(channels), pd.DataFrame())
            table = self.channel_table(
                head, channels=channels, on_progress=progress, on_forward=forward
            )
        except _Stopped as stop:
            self.channel_busy.bar_style = "danger"
            self._channel_note(head, f"{stop}; press the button again for the new edits")
        else:
            self.channel_results, self._mapped = table, (head, state.edits)
            self.channel_busy.bar_style = "success"
            self.channel_busy.value = self.channel_busy.max
            seconds = time.perf_counter() - started
            self._channel_note(
                head,
                f"{len(channels)} channels under {_edits(state)} in {seconds:.1f} s",
                seconds=seconds,
            )
            self._say(what)
        self._finish(0.0)

    def _channel_note(self, head: Head, text: str, *, seconds: float | None = None) -> None:
        """The line beside the channel button; a finished map carries its compute time as
        ``data-compute-s`` (the browser test and benchmark read it)."""
        done = "" if seconds is None else f" data-compute-s='{seconds:.4f}'"
        label = f"L{head[0]}H{head[1]}"
        self.channel_status.value = (
            f"<span data-channels='{label}'{done}>{label}: {escape(text)}</span>" if text else ""
        )

    # -- rendering -------------------------------------------------------------------------
    def _guard(self, action, *, done: str | None = None):
        """Run ``action``; a ``ValueError`` / ``OSError`` becomes a message, not a traceback."""
        try:
            result = action()
        except (ValueError, OSError) as err:
            self._say(str(err), error=True)
            return None
        self._say(done.format(result) if done else "")
        return result

    def _say(self, text: str, *, error: bool = False) -> None:
        color = "#c92a2a" if error else "#2b8a3e"
        self.message.value = f'<span style="color:{color}">{escape(text)}</span>' if text else ""

    def _busy(self, what: str, done: int, total: int) -> None:
        """Say what is being computed and how far it is (shown at once, before the work)."""
        with self._ui:
            self._progress = (what, done, total)
            self._show_status()

    def _ready(self, seconds: float = 0.0) -> None:
        """Say that the page is up to date; ``seconds``: how long the update computed. The
        status carries the update's number and time as data attributes (the browser test and
        benchmark read them)."""
        with self._ui:
            self.updates += 1
            self._progress = None
            self._seconds = seconds
            self._show_status()

    def _show_status(self) -> None:
        """The status line: what the worker computes and what waits, or "ready"."""
        queued = "; ".join(what for _, _, what in self._queued)
        if self._progress is None and not queued:
            self.busy.value, self.busy.bar_style = self.busy.max, "success"
            took = f" (updated in {self._seconds:.2f} s)" if self._seconds else ""
            self.status.value = (
                f"<span data-update='{self.updates}' data-compute-s='{self._seconds:.4f}'>"
                f"ready: {escape(_edits(self.state))}{took}</span>"
            )
            return
        parts = []
        if self._progress is not None:
            what, done, total = self._progress
            self.busy.max, self.busy.value = max(total, 1), done
            parts.append(f"computing {escape(what)}: {done}/{total}")
        self.busy.bar_style = "warning"
        if queued:
            parts.append(f"<b data-queued='{len(self._queued)}'>queued: {escape(queued)}</b>")
        self.status.value = (
            f"<span style='background:#fff3bf;padding:2px 6px'>{' &middot; '.join(parts)}</span>"
        )

    def _dla_range(self) -> dict[str, float]:
        """The DLA panel's fixed ranges for the shown record (its unedited attribution's)."""
        heads, bars = self._dla_ranges[(self.state.dla_length, self.state.dla_record)]
        return {"head_range": heads, "bar_range": bars}

    def _draw_accuracy(self, table: pd.DataFrame) -> None:
        """The accuracy panel from ``table``'s lengths (the rest drawn as gaps)."""
        done = set(table.length)
        pending = self.unedited[~self.unedited.length.isin(done)].assign(value=float("nan"))
        with self.accuracy.batch_update():
            set_accuracy(
                self.accuracy,
                pd.concat([table, pending], ignore_index=True),
                metric=self.metric,
                records=self.records,
            )
        if self._budget_on:  # a click without streaming heads sends nothing more
            self.budget.value = budget_table(table, self._budget_shown, metric=self.metric)
            if self.budget.layout.display == "none":
                self.budget.layout.display = None

    def _draw_dla(self) -> None:
        with self.dla.batch_update():
            set_dla(self.dla, self.attribution, **self._dla_range())

    def _draw_channels(
        self, table: pd.DataFrame, head: Head, channels: Sequence[int], under: str
    ) -> None:
        """``head``'s channel map from ``table``; channels not in it yet are blank."""
        figure = head_channel_map(
            table,
            head=head,
            channels=channels,
            lengths=self.evaluator.lengths,
            under=under,
            metric=self.metric,
        )
        self.channel_figure = redraw(self.channel_figure, figure, self.channels)

    def _draw_grid(self) -> None:
        """The grid of the state asked for; heads whose edit is not computed yet outlined."""
        state, shown = self.state, self.shown
        asked, done = state.table(), shown.table()
        pending = [h for h in set(asked) | set(done) if asked.get(h, 1) != done.get(h, 1)]
        if set(state.streaming) != set(shown.streaming) or (
            state.streaming and (state.sink, state.window) != (shown.sink, shown.window)
        ):  # a changed attention mode: its query heads are pending too
            group = self.handle.spec.group_size
            changed = set(state.streaming) ^ set(shown.streaming) or set(state.streaming)
            pending += [(a, k * group + g) for a, k in changed for g in range(group)]
        with self._ui, self.grid.batch_update():
            set_edits(
                self.grid,
                asked,
                selected=state.selected,
                pending=sorted(set(pending)),
                streaming=state.streaming,
                group=self.handle.spec.group_size,
            )

    def _render_controls(self) -> None:
        """Everything that follows the state without computing: the grid, the slider and
        record controls, the list of edits and the state's JSON."""
        state = self.state
        self._draw_grid()
        self._rendering = True  # widget values follow the state without firing edits
        try:
            self.factor.value = state.factor
            self.sink.value, self.window.value = state.sink, state.window
            self.dla_length.value = state.dla_length
            self._set_record_bound()
            self.dla_record.value = state.dla_record
        finally:
            self._rendering = False
        self.edits_box.children = [
            self._edit_row(layer, head, f) for layer, head, f in state.edits
        ] + [self._stream_row(layer, kv) for layer, kv in state.streaming]
        self.state_box.value = state.to_json()

    def _edit_row(self, layer: int, head: int, factor: float) -> w.HBox:
        kind = "prune" if factor == 0 else f"scale x {factor:.2f}"
        remove = w.Button(description="remove", icon="trash", layout=w.Layout(width="90px"))
        remove.on_click(lambda _, h=(layer, head): self.remove(h))
        return w.HBox([w.Label(f"L{layer}H{head}: {kind}"), remove])

    def _stream_row(self, layer: int, kv: int) -> w.HBox:
        group, state = self.handle.spec.group_size, self.state
        heads = f"H{kv * group}-H{(kv + 1) * group - 1}" if group > 1 else f"H{kv}"
        label = f"L{layer} KV{kv} ({heads}): stream, sink {state.sink} + window {state.window}"
        remove = w.Button(description="full", icon="trash", layout=w.Layout(width="90px"))
        remove.tooltip = "back to full attention"
        remove.on_click(lambda _, h=(layer, kv * group): self.stream(h))
        return w.HBox([w.Label(label), remove])


class _Stopped(Exception):
    """A channel map stopped for an edit."""


def _change(old: DashboardState, new: DashboardState) -> str:
    """What the update from ``old`` to ``new`` computes, in a few words ("" for nothing)."""
    before, after = old.table(), new.table()
    changed = [h for h in sorted(set(before) | set(after)) if before.get(h) != after.get(h)]
    words = [f"L{a}H{b} {_factor(after.get((a, b)))}" for a, b in changed]
    was, now = set(old.streaming), set(new.streaming)
    words += [
        f"L{a} KV{k} {'streaming' if (a, k) in now else 'full'}" for a, k in sorted(was ^ now)
    ]
    if now and (old.sink, old.window) != (new.sink, new.window):
        words.append(f"sink {new.sink} + window {new.window}")
    if (old.dla_length, old.dla_record) != (new.dla_length, new.dla_record):
        words.append(f"attribution of record {new.dla_record} at {new.dla_length} lines")
    return ", ".join(words)


def _factor(factor: float | None) -> str:
    return "kept" if factor is None else "pruned" if factor == 0 else f"x{factor:.2f}"


def _under(state: DashboardState, head: Head) -> str:
    """The channel map's subtitle: the edits it is computed under."""
    edits = state.table()
    if not edits:
        return "under no edits\nchange against the unedited model"
    own = edits.get(tuple(head))
    others = [f"L{a}H{b} {_factor(f)}" for (a, b), f in edits.items() if (a, b) != tuple(head)]
    if len(others) > 6:
        others = [*others[:6], f"{len(others) - 6} more"]
    text = "under the current edits (" + (", ".join(others) or "no other head edited") + ")"
    if own is not None:
        text += f"; L{head[0]}H{head[1]}'s own {_factor(own)} kept on its other channels"
    return text + "\nchange against the edited model"


def _took(started: float) -> str:
    return f"{time.perf_counter() - started:.1f} s"


def _edits(state: DashboardState) -> str:
    n, m = len(state.edits), len(state.streaming)
    text = "no edits" if n == 0 else f"{n} edit{'s' if n > 1 else ''}"
    if m:
        text += f", {m} streaming KV head{'s' if m > 1 else ''}"
    return text


def model_name(name_or_path: str) -> str:
    """A short name for the title: 'organism' for the bundled model, a hub id as it is, else
    the checkpoint directory's name."""
    path = Path(name_or_path)
    if path.exists():
        return "organism" if path.resolve() == ORGANISM_DIR.resolve() else path.name
    return str(name_or_path)
