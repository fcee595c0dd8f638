"""The head-pruning dashboard: prune and scale heads, watch retrieval change (SEAL Sec. 3, Fig. 2).

Panels, all driven by one ``DashboardState`` (``state.py``):

- a layers x heads grid (``viz.dashboard.edit_grid``): a click cycles the head through keep ->
  prune -> scale (by the slider's factor) and locks it; moving the slider rescales the locked
  head when it is scaled;
- the list of current edits, each with its own remove button, and undo / reset;
- accuracy against context length, unedited (dashed) and edited: teacher-forced greedy exact
  match on a fixed set of LongEval records, computed by ``EditEvaluator`` from a cached clean run
  so that an edit costs only the layers from the lowest edited one up (SEAL Fig. 2d, live);
- the direct logit attribution (SEAL Fig. 4) of one record's first answer token under the edits;
- the locked head's channel map on demand (per-channel pruning deltas, SEAL Fig. 2c): with the
  click toggle on "drill down", a click on a head locks it and opens its channels instead of
  editing it;
- save the edits as a per-head scale file (``interp-seal tune merge`` accepts it) or merge them
  into a checkpoint; the state as JSON, to copy, paste and restore.

Bad input (a head outside the model, a state or scale file for another geometry, an unwritable
path) shows a message in the widget; nothing is applied or written half-way. Forwards run under
``lock`` so that several views of one model (browser tabs of the served page) never interleave
their hooks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from html import escape
from pathlib import Path

import ipywidgets as w
import plotly.graph_objects as go

from interp_seal.analysis import SweepUnit, logit_attribution
from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.evaluation import line_retrieval_samples
from interp_seal.interventions import Head, ablate, hf_hooks, scale_table
from interp_seal.models import ModelHandle
from interp_seal.outputs import atomic_dir
from interp_seal.tuning import load_scales, save_merged
from interp_seal.viz import accuracy_curves, channel_map, dla_figure, edit_grid
from interp_seal.widgets.files import head_scales, write_head_scale_file
from interp_seal.widgets.state import FACTOR_RANGE, DashboardState, check_head

DEFAULT_LENGTHS = (40, 80, 120, 160)  # lines: where the organism v2 degrades (docs/organism.md)


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
    """

    def __init__(
        self,
        evaluator: EditEvaluator,
        *,
        state: DashboardState | None = None,
        lock: threading.Lock | None = None,
        metric: str = "exact_match",
        save_dir: str | os.PathLike | None = None,
    ):
        self.evaluator, self.handle, self.metric = evaluator, evaluator.handle, metric
        self.save_dir = None if save_dir is None else Path(save_dir).resolve()
        self._confirm: Path | None = None  # a save target the user was asked to confirm
        self.lock = lock or nullcontext()
        spec = self.handle.spec
        self.state = state or DashboardState(
            model=self.handle.name_or_path,
            geometry=spec.as_dict(),
            dla_length=evaluator.lengths[-1],
        )
        if self.state.geometry != spec.as_dict():
            raise ValueError("the state was made for a model of another geometry")
        self.history: list[DashboardState] = []
        self._rendering = False
        self.results = self._evaluate()
        self.attribution = self._attribute()
        self._build()

    @classmethod
    def from_model(
        cls,
        handle: ModelHandle,
        *,
        lengths: Sequence[int] = DEFAULT_LENGTHS,
        n: int = 20,
        seed: int = 0,
        **kwargs,
    ) -> Dashboard:
        """A dashboard on ``n`` LongEval records per number of lines in ``lengths``
        (``evaluation.line_retrieval_samples``: the same records every time)."""
        records = line_retrieval_samples(handle.tokenizer, lengths, n=n, seed=seed)
        return cls(EditEvaluator(handle, records), **kwargs)

    # -- computing (library calls only) ----------------------------------------------------
    def intervention(self, state: DashboardState | None = None):
        """The ``HeadIntervention`` of ``state``'s edits (None when there are none)."""
        table = (state or self.state).table()
        return scale_table(self.handle.spec, table) if table else None

    def _evaluate(self):
        with self.lock:
            return self.evaluator.evaluate(self.intervention())

    def _attribute(self):
        """DLA of the chosen record's first answer token at the last prompt position."""
        records = self.evaluator.encoded[self.state.dla_length]
        enc = records[self.state.dla_record]
        iv = self.intervention()
        with self.lock, hf_hooks(self.handle, iv) if iv is not None else nullcontext():
            return logit_attribution(
                self.handle, enc.prompt_ids, [int(enc.answer_ids[0])], position=-1
            )

    def channel_table(self, head: Head, *, channels: Sequence[int] | None = None, on_progress=None):
        """Per-channel pruning deltas of ``head`` on the dashboard's records (SEAL Fig. 2c);
        ``channels`` defaults to all ``d_head``."""
        check_head(self.handle.spec, head)
        channels = range(self.handle.spec.d_head) if channels is None else channels
        layer, index = head
        units = [
            SweepUnit(
                labels={"layer": layer, "head": index, "channel": c},
                intervention=ablate(self.handle.spec, [(layer, index, c)], "zero"),
            )
            for c in channels
        ]
        with self.lock:
            return self.evaluator.sweep(units, on_progress=on_progress)

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.message = w.HTML()
        self.grid_box, self.accuracy_box, self.dla_box = w.Box(), w.Box(), w.Box()
        self._render_figures()
        self.factor = w.FloatSlider(
            value=self.state.factor,
            min=FACTOR_RANGE[0],
            max=FACTOR_RANGE[1],
            step=0.05,
            description="scale factor",
        )
        self.factor.observe(self._on_factor, names="value")
        self.undo_button = w.Button(description="undo", icon="undo")
        self.undo_button.on_click(lambda _: self.undo())
        self.reset_button = w.Button(description="reset", icon="times")
        self.reset_button.on_click(lambda _: self.reset())
        self.edits_box = w.VBox()
        self.dla_length = w.Dropdown(
            options=list(self.evaluator.lengths), value=self.state.dla_length, description="length"
        )
        self.dla_record = w.BoundedIntText(value=self.state.dla_record, min=0, description="record")
        self._set_record_bound()
        for widget in (self.dla_length, self.dla_record):
            widget.observe(self._on_record, names="value")
        self.scale_path = w.Text(value="dashboard_scales.safetensors", description="scale file")
        self.save_button = w.Button(description="save scale file", icon="save")
        self.save_button.on_click(lambda _: self._on_save())
        self.load_button = w.Button(description="load scale file", icon="folder-open")
        self.load_button.on_click(lambda _: self.load_scale_file(self.scale_path.value))
        self.merge_path = w.Text(value="dashboard_merged", description="checkpoint")
        self.merge_button = w.Button(description="merge into checkpoint", icon="compress")
        self.merge_button.on_click(lambda _: self.merge(self.merge_path.value))
        self.state_box = w.Textarea(layout=w.Layout(width="100%", height="70px"))
        self.apply_button = w.Button(description="restore state", icon="upload")
        self.apply_button.on_click(lambda _: self.restore(self.state_box.value))
        self.click_mode = w.ToggleButtons(
            options=[("edit: keep / prune / scale", "edit"), ("drill down: channels", "channels")],
            value="edit",
            description="a click",
        )
        self.channel_button = w.Button(description="channels of locked head", icon="search")
        self.channel_button.on_click(lambda _: self.open_channels())
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="200px"))
        self.channels = w.Box()
        self.widget = w.VBox(
            [
                w.HTML(f"<h3>Head-pruning dashboard: {escape(self.handle.name_or_path)}</h3>"),
                self.message,
                w.HBox(
                    [
                        w.VBox(
                            [
                                self.grid_box,
                                self.click_mode,
                                self.factor,
                                w.HBox([self.undo_button, self.reset_button]),
                            ]
                        ),
                        self.accuracy_box,
                    ]
                ),
                w.HTML("<b>Edits</b>"),
                self.edits_box,
                w.HBox([self.dla_length, self.dla_record]),
                self.dla_box,
                w.HBox([self.channel_button, self.progress]),
                self.channels,
                w.HBox([self.scale_path, self.save_button, self.load_button]),
                w.HBox([self.merge_path, self.merge_button]),
                w.HTML("<b>State</b> (JSON: copy to share, paste and restore)"),
                self.state_box,
                self.apply_button,
            ]
        )
        self._render_controls()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    # -- events ----------------------------------------------------------------------------
    def _on_grid_click(self, _trace, points, _state) -> None:
        if points.xs:
            head = (int(points.ys[0]), int(points.xs[0]))
            (self.drill if self.click_mode.value == "channels" else self.click)(head)

    def _on_factor(self, change) -> None:
        if not self._rendering:
            self.set_factor(float(change["new"]))

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
        self._guard(lambda: self.apply(replace(self.state, edits=(), selected=None)))

    def restore(self, text: str) -> None:
        """Apply a state pasted as JSON (every field checked against the model and the
        dashboard's records first; a bad state changes nothing and says which field is wrong)."""
        records = {length: len(encs) for length, encs in self.evaluator.encoded.items()}

        def restore() -> None:
            state = DashboardState.from_json(text, self.handle.spec, records=records)
            self.apply(state, record=True)

        self._guard(restore)

    def apply(self, state: DashboardState, *, record: bool = True) -> None:
        """Make ``state`` the current one: recompute what changed, then redraw."""
        if record and state != self.state:
            self.history.append(self.state)
        old, self.state = self.state, state
        if state.edits != old.edits:
            self.results = self._evaluate()
        if (state.edits, state.dla_length, state.dla_record) != (
            old.edits,
            old.dla_length,
            old.dla_record,
        ):
            self.attribution = self._attribute()
        self._render()

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

        return self._guard(save, done="saved the scale file to {}")

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

        return self._guard(merge, done="merged the edits into {}")

    def open_channels(self, channels: Sequence[int] | None = None) -> None:
        """Show the locked head's channel map (all channels by default), with a progress bar."""
        head = self.state.selected
        if head is None:
            self._say("click a head first: the channel map opens for the locked head", error=True)
            return

        def progress(done: int, total: int) -> None:
            self.progress.max, self.progress.value = total, done

        def open_map() -> None:
            self.channel_results = self.channel_table(head, channels=channels, on_progress=progress)
            self.channel_figure = go.FigureWidget(
                channel_map(self.channel_results, metric=self.metric)
            )
            self.channels.children = (self.channel_figure,)

        self._guard(open_map, done=f"channel map of L{head[0]}H{head[1]}")

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

    def _figures(self) -> tuple[go.Figure, go.Figure, go.Figure]:
        """The grid, accuracy and DLA figures of the current state and results."""
        spec, state = self.handle.spec, self.state
        grid = edit_grid(spec.n_layers, spec.n_heads, state.table(), selected=state.selected)
        return grid, accuracy_curves(self.results, metric=self.metric), dla_figure(self.attribution)

    def _render(self) -> None:
        self._render_figures()
        self._render_controls()

    def _render_figures(self) -> None:
        """New figure widgets for the current state, each built complete.

        Plotly's ``FigureWidget`` sends in-place edits (``batch_update``) as transient messages
        that the browser missed when measured here (Voila 0.5, plotly 7, anywidget 0.11): the
        page kept the first figure while the Python object changed. A widget constructed with
        its data always renders what it holds, and these figures are small (a layers x heads
        grid, a few points), so each state change swaps in new ones."""
        grid, curves, dla = self._figures()
        self.grid = go.FigureWidget(grid)
        self.grid.data[0].on_click(self._on_grid_click)
        self.accuracy, self.dla = go.FigureWidget(curves), go.FigureWidget(dla)
        self.grid_box.children = (self.grid,)
        self.accuracy_box.children = (self.accuracy,)
        self.dla_box.children = (self.dla,)

    def _render_controls(self) -> None:
        state = self.state
        self._rendering = True  # widget values follow the state without firing edits
        try:
            self.factor.value = state.factor
            self.dla_length.value = state.dla_length
            self._set_record_bound()
            self.dla_record.value = state.dla_record
        finally:
            self._rendering = False
        self.edits_box.children = [self._edit_row(layer, head, f) for layer, head, f in state.edits]
        self.state_box.value = state.to_json()

    def _edit_row(self, layer: int, head: int, factor: float) -> w.HBox:
        kind = "prune" if factor == 0 else f"scale x {factor:.2f}"
        remove = w.Button(description="remove", icon="trash", layout=w.Layout(width="90px"))
        remove.on_click(lambda _, h=(layer, head): self.remove(h))
        return w.HBox([w.Label(f"L{layer}H{head}: {kind}"), remove])
