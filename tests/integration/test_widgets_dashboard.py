"""The head-pruning dashboard: after a simulated click or slider change, the figures hold the
library's own numbers for that edit (evaluate_lengths, logit_attribution, channel sweeps)."""

from __future__ import annotations

import html
import inspect
import json
import re
import threading
from dataclasses import replace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from plotly.callbacks import InputDeviceState, Points

from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.analysis.logit_attribution import logit_attribution
from interp_seal.analysis.sweeps import channel_sweep, scale_table_sweep
from interp_seal.evaluation import line_retrieval_samples
from interp_seal.interventions import hf_logits, scale_table
from interp_seal.models import StreamingHeads, compress_kv, kv_budget_bytes, load_model
from interp_seal.tuning.merge import merged_model
from interp_seal.tuning.scales import load_scales
from interp_seal.widgets import Dashboard, DashboardState

LENGTHS = (10, 60)
N = 6


@pytest.fixture(scope="module")
def organism():
    return load_model("organism")


@pytest.fixture(scope="module")
def records():
    return line_retrieval_samples(load_model("organism").tokenizer, LENGTHS, n=N, seed=0)


@pytest.fixture(scope="module")
def evaluator(organism, records):
    return EditEvaluator(organism, records, progress=False)


@pytest.fixture
def dash(evaluator):
    return Dashboard(evaluator)


def click(dash: Dashboard, layer: int, head: int) -> None:
    """What the browser sends for a click on a grid cell."""
    points = Points(point_inds=[[layer, head]], xs=[head], ys=[layer], trace_index=0)
    dash.grid.data[0]._dispatch_on_click(points, InputDeviceState())


def figures_on_page(widget) -> list:
    """Every FigureWidget in the displayed widget tree, depth first."""
    if isinstance(widget, go.FigureWidget):
        return [widget]
    return [f for child in getattr(widget, "children", ()) for f in figures_on_page(child)]


def shown(dash: Dashboard) -> tuple[list, list]:
    """The accuracy figure's baseline and edited values, as displayed."""
    on_page = figures_on_page(dash.widget)
    assert on_page[:2] == [dash.grid, dash.accuracy] and dash.dla in on_page
    curves = {trace.name: list(trace.y) for trace in dash.accuracy.data}
    return curves["unedited"], curves["edited"]


def brute(handle, records, heads: dict) -> pd.DataFrame:
    """Independent reference: one full HF forward per record under the scale table (hooks),
    exact match = argmax at every answer position, summed answer log-probability."""
    iv = scale_table(handle.spec, heads) if heads else None
    rows = []
    for length, group in records.items():
        for sample in group:
            enc = sample.encode(handle.tokenizer)
            logp = hf_logits(handle, enc.input_ids[None], iv)[0].float().log_softmax(-1)
            pos = torch.arange(enc.answer_start - 1, len(enc) - 1)
            target = enc.input_ids[pos + 1]
            rows.append(
                {
                    "length": length,
                    "exact_match": float((logp[pos].argmax(-1) == target).all()),
                    "answer_logprob": float(logp[pos, target].sum()),
                }
            )
    return pd.DataFrame(rows).groupby("length").mean()


def test_evaluator_equals_full_evaluation_and_sweep(organism, records, evaluator):
    """The cached-clean-run evaluator == teacher forcing == the batched sweep, per length."""
    heads = {(1, 2): 0.0, (3, 5): 1.5}
    table = evaluator.evaluate(scale_table(organism.spec, heads))
    full = brute(organism, records, heads)
    sweep = scale_table_sweep(organism, records, {"t": heads})
    for metric in ("exact_match", "answer_logprob"):
        ours = table[table.metric == metric].set_index("length").sort_index()
        ref = sweep[sweep.metric == metric].set_index("length").sort_index()
        np.testing.assert_allclose(ours.value, full[metric], atol=1e-4)
        np.testing.assert_allclose(ours.value, ref.value, atol=1e-4)
        np.testing.assert_allclose(ours.baseline, ref.baseline, atol=1e-4)


def test_click_cycles_and_figure_equals_library(organism, records, dash):
    base = brute(organism, records, {})
    np.testing.assert_allclose(shown(dash), [base.exact_match, base.exact_match], atol=1e-9)
    click(dash, 0, 3)
    assert dash.state.table() == {(0, 3): 0.0}
    pruned = brute(organism, records, {(0, 3): 0.0})
    np.testing.assert_allclose(shown(dash)[1], pruned.exact_match, atol=1e-9)
    assert dash.grid.data[0].z[0][3] == 0 and dash.grid.data[0].text[0][3] == "x0"

    click(dash, 0, 3)  # prune -> scale by the slider's factor
    assert dash.state.table() == {(0, 3): pytest.approx(0.9)}
    dash.factor.value = 1.6  # the slider rescales the locked head
    assert dash.state.table() == {(0, 3): pytest.approx(1.6)}
    scaled = brute(organism, records, {(0, 3): 1.6})
    np.testing.assert_allclose(shown(dash)[1], scaled.exact_match, atol=1e-9)
    assert dash.grid.data[0].z[0][3] == pytest.approx(1.6)

    click(dash, 0, 3)  # scale -> keep
    assert dash.state.edits == ()
    np.testing.assert_allclose(shown(dash)[1], base.exact_match, atol=1e-9)


def test_dla_panel_equals_logit_attribution_under_the_edit(organism, evaluator, dash):
    click(dash, 1, 4)
    dash.dla_length.value = LENGTHS[0]
    dash.dla_record.value = 2
    enc = evaluator.encoded[LENGTHS[0]][2]
    with organism.edit(scale_table(organism.spec, {(1, 4): 0.0})):
        ref = logit_attribution(organism, enc.prompt_ids, [int(enc.answer_ids[0])])
    heads = ref.table[ref.table.component == "head"]
    grid = heads.pivot(index="layer", columns="head", values="value").sort_index(ascending=False)
    np.testing.assert_allclose(np.array(dash.dla.data[0].z, dtype=float), grid.to_numpy())
    assert dash.state.dla_record == 2 and dash.state.dla_length == LENGTHS[0]
    # the pruned head writes nothing
    assert grid.loc[1, 4] == 0


def test_clicks_above_a_layer_0_edit_equal_the_library(organism, records, dash):
    """Once layer 0 and a layer above are edited, the dashboard caches the run of the layer-0
    edit and starts later clicks above it there: the numbers shown stay the library's."""
    for head, edits in [
        ((0, 3), {(0, 3): 0.0}),
        ((2, 1), {(0, 3): 0.0, (2, 1): 0.0}),  # builds the cached run of L0H3 pruned
        ((3, 0), {(0, 3): 0.0, (2, 1): 0.0, (3, 0): 0.0}),
        ((2, 1), {(0, 3): 0.0, (2, 1): 0.9, (3, 0): 0.0}),
    ]:
        click(dash, *head)
        assert dash.state.table() == pytest.approx(edits)
        np.testing.assert_allclose(shown(dash)[1], brute(organism, records, edits).exact_match)
    assert dash.runs.anchor.table == {(0, 3): 0.0}
    dash.undo()
    np.testing.assert_allclose(
        shown(dash)[1],
        brute(organism, records, {(0, 3): 0.0, (2, 1): 0.0, (3, 0): 0.0}).exact_match,
    )


def test_edits_list_remove_undo_reset(organism, records, dash):
    dash.click((2, 1))
    dash.click((3, 0))
    labels = [row.children[0].value for row in dash.edits_box.children]
    assert labels == ["L2H1: prune", "L3H0: prune"]
    dash.edits_box.children[0].children[1].click()  # remove L2H1
    assert dash.state.table() == {(3, 0): 0.0}
    only = brute(organism, records, {(3, 0): 0.0})
    np.testing.assert_allclose(shown(dash)[1], only.exact_match, atol=1e-9)
    dash.undo_button.click()
    assert dash.state.table() == {(2, 1): 0.0, (3, 0): 0.0}
    dash.reset_button.click()
    assert dash.state.edits == ()


def test_state_round_trips_and_restores_the_same_numbers(evaluator, dash):
    dash.click((1, 1))
    dash.click((2, 6))
    dash.click((2, 6))
    text = dash.state_box.value
    other = Dashboard(evaluator)
    other.restore(text)
    assert other.state == dash.state
    assert shown(other) == shown(dash)
    assert np.array_equal(np.array(other.dla.data[0].z), np.array(dash.dla.data[0].z))


def test_bad_input_gives_a_message_and_changes_nothing(evaluator, dash, tmp_path):
    dash.click((1, 1))
    before, figure = dash.state, shown(dash)
    spec = dash.handle.spec
    outside = json.loads(dash.state.to_json())
    outside["edits"] = [[spec.n_layers, 0, 0.0]]
    dash.restore(json.dumps(outside))
    assert "does not exist" in dash.message.value
    other = json.loads(dash.state.to_json())
    other["geometry"] = {**other["geometry"], "n_heads": spec.n_heads * 2}
    dash.restore(json.dumps(other))
    assert "geometry" in dash.message.value
    dash.restore("not json")
    assert "not valid JSON" in dash.message.value
    dash.click((spec.n_layers + 3, 0))
    assert "does not exist" in dash.message.value
    assert dash.state == before and shown(dash) == figure
    # a scale file for another geometry: refused, nothing applied
    small = load_model_geometry_file(tmp_path)
    dash.load_scale_file(small)
    assert "geometry" in dash.message.value and dash.state == before
    # a directory is not a scale file path; nothing written
    dash.save_scale_file(tmp_path)
    assert "directory" in dash.message.value and list(tmp_path.iterdir()) == [small]


def load_model_geometry_file(tmp_path):
    """A valid scale file for a 2-layer x 4-head model."""
    from interp_seal.models import ModelSpec
    from interp_seal.tuning.scales import ScaleFile, save_scales

    spec = ModelSpec(
        n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_model=32, vocab_size=50, max_positions=64
    )
    scale_file = ScaleFile(
        scales=torch.ones(2, 4, 1), spec=spec, model="tiny", granularity="head", task="t"
    )
    return save_scales(tmp_path / "tiny.safetensors", scale_file)


def test_save_load_and_merge(organism, evaluator, dash, tmp_path):
    dash.click((0, 5))
    dash.click((2, 2))
    dash.click((2, 2))  # scale x 0.9
    path = dash.save_scale_file(tmp_path / "edits.safetensors")
    saved = load_scales(path, organism.spec)
    expected = torch.ones(organism.spec.n_layers, organism.spec.n_heads, 1)
    expected[0, 5], expected[2, 2] = 0.0, 0.9
    assert saved.granularity == "head" and torch.equal(saved.scales, expected)
    assert [p.name for p in tmp_path.iterdir()] == ["edits.safetensors"]  # no temp file left

    fresh = Dashboard(evaluator)
    fresh.load_scale_file(path)
    assert fresh.state.table() == pytest.approx(dash.state.table())
    assert shown(fresh) == shown(dash)

    out = dash.merge(tmp_path / "merged")
    reloaded = load_model(str(out))
    ids = evaluator.encoded[LENGTHS[-1]][0].input_ids[None]
    with torch.no_grad():
        want = merged_model(organism, expected).model(ids).logits
        got = reloaded.model(ids).logits
    torch.testing.assert_close(got, want)
    assert "merged" in dash.message.value
    dash.merge(tmp_path / "merged")  # not empty any more: refused
    assert "not empty" in dash.message.value


def test_channel_button_without_a_locked_head(dash):
    dash.channel_button.click()
    assert "click a head first" in dash.message.value and dash.channels.children == ()


CHANNEL_CASES = {
    # the head itself edited: its factor stays on the channels not zeroed (from the clean run)
    "head edited": ({(0, 3): 0.5, (1, 2): 0.0}, (0, 3), [0, 7, 30]),
    # edits below the head (and above it): the map runs from a cached run of the layer-0 edit
    "edits below": ({(0, 1): 0.0, (1, 6): 1.5, (3, 5): 0.0}, (2, 3), [1, 12, 31]),
}


@pytest.mark.parametrize(
    "edits, head, channels",
    [
        *CHANNEL_CASES.values(),
        pytest.param({(1, 2): 0.0}, (0, 3), None, marks=pytest.mark.slow, id="all channels"),
    ],
    ids=[*CHANNEL_CASES, "all channels"],
)
def test_channel_map_under_the_edits_equals_channel_sweep_under_them(
    organism, records, dash, edits, head, channels
):
    """The map is computed under the dashboard's edits: every value, baseline and delta equals
    the library's channel sweep of the edited model (``intervention=`` the edits), and the
    figure shows those deltas, its title naming the edits."""
    dash.apply(
        replace(dash.state, edits=tuple((a, b, f) for (a, b), f in edits.items()), selected=head)
    )
    if channels is None:
        dash.channel_button.click()
    else:
        dash.open_channels(channels)
    table = dash.channel_results
    iv = scale_table(organism.spec, edits)
    ref = channel_sweep(
        organism, records, heads=[head], channels=channels, intervention=iv, options=_quiet()
    )
    n_channels = organism.spec.d_head if channels is None else len(channels)
    merged = table.merge(ref, on=["layer", "head", "channel", "length", "metric"])
    assert len(merged) == len(ref) == len(table) == 2 * len(LENGTHS) * n_channels
    exact = merged.metric == "exact_match"
    for column in ("value", "baseline", "delta"):
        np.testing.assert_array_equal(merged[exact][f"{column}_x"], merged[exact][f"{column}_y"])
        np.testing.assert_allclose(merged[f"{column}_x"], merged[f"{column}_y"], atol=1e-4)
    # the edits matter here: a map of the unedited model would have other baselines
    assert not np.allclose(ref.baseline, ref.merge(dash.unedited, on=["length", "metric"]).value_y)
    z = np.array(dash.channel_figure.data[0].z, dtype=float)  # rows: lengths, columns: channels
    for row, length in enumerate(LENGTHS):
        last = ref[(ref.metric == "exact_match") & (ref.length == length)].sort_values("channel")
        np.testing.assert_array_equal(z[row], last.delta)
    title = dash.channel_figure.layout.title.text
    for a, b in edits:
        if (a, b) != head:
            assert f"L{a}H{b} " in title
    if head in edits:
        assert f"L{head[0]}H{head[1]}'s own x{edits[head]:.2f} kept on its other channels" in title
    assert dash.channel_busy.value == dash.channel_busy.max  # forwards: all done
    assert f"{n_channels} channels under {len(edits)} edits" in dash.channel_status.value
    dash.click((3, 7))  # the edits change: the map says it is of the edits before
    assert "edits changed: press again" in dash.channel_status.value


def test_drill_down_click_opens_channels_and_keeps_the_edits(organism, records, dash):
    click(dash, 1, 2)  # prune L1H2
    before = dash.results.copy()
    dash.click_mode.value = "channels"
    top = organism.spec.n_layers - 1  # the cheapest channel sweep
    click(dash, top, 3)  # drill into the head: locked, its channel map open, the edits unchanged
    assert dash.state.selected == (top, 3) and dash.state.table() == {(1, 2): 0.0}
    pd.testing.assert_frame_equal(dash.results, before)
    under = scale_table(organism.spec, {(1, 2): 0.0})
    ref = channel_sweep(organism, records, heads=[(top, 3)], intervention=under, options=_quiet())
    last = ref[(ref.metric == "exact_match") & (ref.length == LENGTHS[-1])].sort_values("channel")
    z = np.array(dash.channel_figure.data[0].z, dtype=float)[-1]
    np.testing.assert_array_equal(z, last.delta)
    dash.drill((organism.spec.n_layers, 0))
    assert "does not exist" in dash.message.value and dash.state.selected == (top, 3)
    dash.click_mode.value = "edit"
    click(dash, 0, 3)
    assert dash.state.table() == {(1, 2): 0.0, (0, 3): 0.0}


def _quiet():
    from interp_seal.analysis.sweeps import SweepOptions

    return SweepOptions(progress=False)


def test_state_rejects_bad_values():
    spec = load_model("organism").spec
    with pytest.raises(ValueError, match="does not exist"):
        DashboardState(model="m", geometry=spec.as_dict(), edits=((0, spec.n_heads, 0.0),))
    with pytest.raises(ValueError, match="finite"):
        DashboardState(model="m", geometry=spec.as_dict(), edits=((0, 0, float("nan")),))


def test_cli_refuses_a_missing_model_before_serving(tmp_path, capsys):
    from interp_seal.cli import main

    assert main(["dashboard", "--model", str(tmp_path / "nothing"), "--n", "2"]) == 2
    assert "dashboard: error" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # counts are checked when the arguments are parsed
        main(["dashboard", "--n", "0"])
    assert "--n" in capsys.readouterr().err
    assert main(["dashboard", "--port", "70000"]) == 2
    assert "--port must be in 0..65535" in capsys.readouterr().err


def _state(dash: Dashboard, **fields) -> str:
    """The dashboard's state as JSON with ``fields`` replaced (``None`` values dropped)."""
    data = json.loads(dash.state.to_json()) | fields
    return json.dumps({k: v for k, v in data.items() if v is not None})


BAD_STATES = {  # field -> (replacement, the message naming it)
    "layer-float": (
        {"edits": [[0.7, 1, 0.0]]},
        r"'edits\[0\] layer' must be a whole number, got 0\.7",
    ),
    "layer-string": ({"edits": [["1", 1, 0.0]]}, r"'edits\[0\] layer' must be a whole number"),
    "head-bool": (
        {"edits": [[0, True, 0.0]]},
        r"'edits\[0\] head' must be a whole number, got True",
    ),
    "head-outside": ({"edits": [[0, 99, 0.0]]}, r"'edits\[0\]': head L0H99 does not exist"),
    "layer-negative": ({"edits": [[-1, 0, 0.0]]}, r"'edits\[0\]': head L-1H0 does not exist"),
    "edit-short": ({"edits": [[0, 1]]}, r"'edits\[0\]' must be \[layer, head, factor\]"),
    "edit-not-list": ({"edits": [{"layer": 0}]}, r"'edits\[0\]' must be a list"),
    "edits-not-list": ({"edits": "0.1"}, r"'edits' must be a list"),
    "factor-nan": ({"edits": [[0, 1, float("nan")]]}, r"'edits\[0\] factor' is nan; use a finite"),
    "factor-negative": (
        {"edits": [[0, 1, -5]]},
        r"'edits\[0\] factor' is -5\.0; use a finite factor in 0\.\.2",
    ),
    "factor-huge": ({"edits": [[0, 1, 1e308]]}, r"'edits\[0\] factor' is 1e\+308"),
    "factor-string": ({"edits": [[0, 1, "0.5"]]}, r"'edits\[0\] factor' must be a number"),
    "slider-nan": ({"factor": float("nan")}, r"'factor' is nan"),
    "slider-large": ({"factor": 5}, r"'factor' is 5\.0; use a finite factor in 0\.\.2"),
    "selected-short": ({"selected": [1]}, r"'selected' must be \[layer, head\]"),
    "selected-outside": ({"selected": [9, 0]}, r"'selected': head L9H0 does not exist"),
    "record-negative": (
        {"dla_record": -1},
        r"'dla_record' is -1, but the dashboard has records 0\.\.5",
    ),
    "record-past-end": (
        {"dla_record": 6},
        r"'dla_record' is 6, but the dashboard has records 0\.\.5",
    ),
    "record-float": ({"dla_record": 1.5}, r"'dla_record' must be a whole number, got 1\.5"),
    "length-unknown": (
        {"dla_length": 33},
        r"'dla_length' is 33, but the dashboard's lengths are \[10, 60\]",
    ),
    "streaming-outside": (
        {"streaming": [[0, 9]]},
        r"'streaming\[0\]': KV head L0 KV9 does not exist",
    ),
    "streaming-short": ({"streaming": [[0]]}, r"'streaming\[0\]' must be \[layer, kv_head\]"),
    "streaming-twice": ({"streaming": [[0, 1], [0, 1]]}, r"streams once"),
    "window-zero": ({"window": 0}, r"'sink' / 'window'.*window 0"),
    "sink-float": ({"sink": 1.5}, r"'sink' must be a whole number"),
    "model-number": ({"model": 3}, r"'model' must be a string, got 3"),
    "geometry-other": ({"geometry": {"n_layers": 1}}, r"made for a model with geometry"),
    "unknown-field": ({"colour": "red"}, r"unknown fields \['colour'\]"),
    "not-json": (None, r"not valid JSON"),
    "not-object": ([], r"not a dashboard state"),
}


@pytest.mark.parametrize("name", list(BAD_STATES))
def test_a_bad_state_changes_nothing_and_names_the_field(dash, name):
    fields, message = BAD_STATES[name]
    click(dash, 1, 2)
    before, results, history = dash.state, dash.results.copy(), list(dash.history)
    if fields is None:
        text = "{not json"
    elif isinstance(fields, list):
        text = json.dumps(fields)
    else:
        text = _state(dash, **fields)
    dash.restore(text)
    assert re.search(message, html.unescape(dash.message.value)), dash.message.value
    assert dash.state == before and dash.history == history
    pd.testing.assert_frame_equal(dash.results, results)
    assert json.loads(dash.state_box.value) == json.loads(before.to_json())
    dash.restore(before.to_json())  # the same view restores cleanly
    assert dash.state == before and dash.message.value == ""


def test_saves_stay_inside_the_save_dir_and_ask_before_overwriting(evaluator, tmp_path):
    dash = Dashboard(evaluator, save_dir=tmp_path)
    click(dash, 1, 2)
    assert dash.save_scale_file("edits.safetensors") == tmp_path / "edits.safetensors"
    assert f"saved the scale file to {tmp_path / 'edits.safetensors'}" in html.unescape(
        dash.message.value
    )
    for outside in ("../escape.safetensors", "/etc/passwd", tmp_path.parent / "x.safetensors"):
        assert dash.save_scale_file(outside) is None
        assert "is outside" in dash.message.value
        assert dash.merge(outside) is None and "is outside" in dash.message.value
    assert not (tmp_path.parent / "escape.safetensors").exists()
    # the button: a second press confirms overwriting
    dash.scale_path.value = "edits.safetensors"
    written = (tmp_path / "edits.safetensors").stat().st_mtime_ns
    click(dash, 1, 3)
    dash.save_button.click()
    assert "exists: press 'save scale file' again to overwrite it" in html.unescape(
        dash.message.value
    )
    assert (tmp_path / "edits.safetensors").stat().st_mtime_ns == written
    dash.save_button.click()
    assert "saved the scale file to" in dash.message.value
    factors = load_scales(tmp_path / "edits.safetensors", evaluator.handle.spec).scales[..., 0]
    assert factors[1, 2] == 0 and factors[1, 3] == 0 and factors.sum() == factors.numel() - 2


def test_the_page_and_the_widget_default_to_the_same_records():
    from interp_seal.cli import build_parser
    from interp_seal.widgets.dashboard import DEFAULT_LENGTHS

    args = build_parser().parse_args(["dashboard"])
    assert tuple(args.lengths) == DEFAULT_LENGTHS
    assert inspect.signature(Dashboard.from_model).parameters["lengths"].default == DEFAULT_LENGTHS


def test_a_click_shows_the_cell_at_once_then_exact_lengths_one_by_one(organism, records, dash):
    """While a click computes, the page never shows a wrong number: the cell is recoloured
    before any forward, then each length's exact value appears in turn (others are gaps), and
    the status says what is being computed and how far it is."""
    seen = []

    def snapshot(_change):
        edited = {t.name: list(t.y) for t in dash.accuracy.data}["edited"]
        seen.append((dash.status.value, float(dash.grid.data[0].z[1][2]), edited))

    dash.status.observe(snapshot, names="value")
    click(dash, 1, 2)
    dash.status.unobserve(snapshot, names="value")
    final = brute(organism, records, {(1, 2): 0.0}).exact_match.tolist()
    busy = [s for s in seen if "computing exact match" in s[0]]
    assert [s[0].split(": ")[-1].split("<")[0] for s in busy] == [
        f"{k}/{len(LENGTHS)}" for k in range(len(LENGTHS) + 1)
    ]
    for done, (_, cell, edited) in enumerate(busy):
        assert cell == 0  # pruned before the first forward
        assert edited[:done] == pytest.approx(final[:done], abs=1e-9)
        assert edited[done:] == [None] * (len(LENGTHS) - done)
    assert "ready: 1 edit" in seen[-1][0] and seen[-1][2] == pytest.approx(final, abs=1e-9)


class Gate:
    """A lock the test opens: the dashboard's forwards wait at it while it is closed, so an
    update is provably running when the next click arrives (a closed gate opens by itself
    after 30 s, so a dashboard that computes in the click's thread fails, never hangs)."""

    def __init__(self):
        self.opened, self.entered = threading.Event(), threading.Event()
        self.opened.set()

    def __enter__(self):
        self.entered.set()
        self.opened.wait(30)

    def __exit__(self, *exc):
        return False


def test_a_click_during_an_update_shows_queued_at_once_then_applies(organism, records, evaluator):
    gate = Gate()
    dash = Dashboard(evaluator, lock=gate, background=True)
    unedited = shown(dash)
    gate.opened.clear()
    gate.entered.clear()
    click(dash, 0, 3)  # layer 0: the update is now computing, held at the gate
    assert gate.entered.wait(10)
    assert "computing exact match under 1 edit" in dash.status.value
    click(dash, 2, 1)  # made during the update: returns at once, shown queued
    assert dash.state.table() == {(0, 3): 0.0, (2, 1): 0.0}
    assert dash.grid.data[0].z[2][1] == 0 and dash.grid.data[0].text[2][1] == "x0"
    dotted = {
        (round(s.y0 + 0.38), round(s.x0 + 0.38))
        for s in dash.grid.layout.shapes
        if s.line.dash == "dot"
    }
    assert dotted == {(0, 3), (2, 1)}  # both edits outlined: neither is computed yet
    assert "queued: L2H1 pruned" in dash.status.value and "data-update" not in dash.status.value
    assert shown(dash)[1] == [None] * len(LENGTHS)  # gaps, never numbers of another state
    gate.opened.set()
    assert dash.wait(120)
    final = brute(organism, records, {(0, 3): 0.0, (2, 1): 0.0})
    np.testing.assert_allclose(shown(dash)[1], final.exact_match, atol=1e-9)
    assert shown(dash)[0] == unedited[0]
    assert dash.shown == dash.state and dash.history[-1].table() == {(0, 3): 0.0}
    assert "ready: 2 edits" in dash.status.value and "queued" not in dash.status.value
    assert [s.line.dash for s in dash.grid.layout.shapes] == [None]  # only the locked outline


# -- streaming KV heads ---------------------------------------------------------------------


def budget_shown(dash: Dashboard) -> pd.DataFrame:
    """The accuracy / KV budget table under the curve, from its rows' data attributes."""
    rows = re.findall(
        r"data-length='(\d+)' data-value='([^']*)' data-baseline='([^']*)' "
        r"data-kv-bytes='([^']*)' data-kv-share='([^']*)'",
        dash.budget.value,
    )
    table = pd.DataFrame(rows, columns=["length", "value", "baseline", "kv_bytes", "kv_share"])
    return table.replace("", "nan").astype(float).astype({"length": int}).set_index("length")


def library_budget(handle, records, config) -> pd.DataFrame:
    """``kv_budget_bytes`` at each record's prompt length, averaged per length."""
    rows = []
    for length, group in records.items():
        tokens = [len(s.encode(handle.tokenizer).prompt_ids) for s in group]
        kept = [kv_budget_bytes(config, handle.spec, t, itemsize=4) for t in tokens]
        full = [kv_budget_bytes(None, handle.spec, t, itemsize=4) for t in tokens]
        rows.append({"length": length, "kv_bytes": np.mean(kept), "full": np.mean(full)})
    return pd.DataFrame(rows).set_index("length")


def brute_streaming(handle, records, heads: dict, config) -> pd.DataFrame:
    """``brute`` (one full HF forward per record) with ``config``'s streaming KV heads on."""
    with compress_kv(handle, config):
        return brute(handle, records, heads)


def test_a_stream_click_switches_a_kv_head_and_shows_the_library_numbers(organism, records, dash):
    """In stream mode a click switches the clicked head's KV head (its whole query group) to
    sink + window: the curve and the table show the library's numbers for it (compress_kv
    around one full forward per record), alone and with head edits below and above it; the
    table's KV bytes are kv_budget_bytes at each record's prompt length; a second click
    switches it back."""
    spec, group = organism.spec, organism.spec.group_size
    base = brute(organism, records, {})
    budget = budget_shown(dash)  # hidden while every head is full
    np.testing.assert_allclose(budget.kv_share, 1.0)
    np.testing.assert_allclose(budget.value, base.exact_match, atol=1e-9)
    assert dash.budget.layout.display == "none"
    dash.click_mode.value = "stream"
    click(dash, 3, 5)  # query head 5 reads KV head 1
    assert dash.state.streaming == ((3, 5 // group),) and dash.state.edits == ()
    config = StreamingHeads(heads={(3, 1)}, sink=dash.state.sink, window=dash.state.window)
    ref = brute_streaming(organism, records, {}, config)
    assert not np.allclose(ref.exact_match, base.exact_match)  # the switch changes accuracy
    np.testing.assert_allclose(shown(dash), [base.exact_match, ref.exact_match], atol=1e-9)
    budget, want = budget_shown(dash), library_budget(organism, records, config)
    np.testing.assert_allclose(budget.value, ref.exact_match, atol=1e-9)
    np.testing.assert_allclose(budget.kv_bytes, want.kv_bytes, rtol=1e-12)
    np.testing.assert_allclose(budget.kv_share, want.kv_bytes / want.full, rtol=1e-12)
    assert (budget.kv_share < 1).all() and dash.budget.layout.display is None
    text = dash.grid.data[0].text
    assert [text[3][h] for h in range(spec.n_heads)] == [""] * group + ["S"] * group
    assert [row.children[0].value for row in dash.edits_box.children] == [
        "L3 KV1 (H4-H7): stream, sink 4 + window 64"
    ]

    dash.click_mode.value = "edit"
    for head, edits in [((0, 3), {(0, 3): 0.0}), ((3, 2), {(0, 3): 0.0, (3, 2): 0.0})]:
        click(dash, *head)  # below the streaming layer (a run from it), then on it
        ref = brute_streaming(organism, records, edits, config)
        np.testing.assert_allclose(shown(dash)[1], ref.exact_match, atol=1e-9)
        np.testing.assert_allclose(budget_shown(dash).value, ref.exact_match, atol=1e-9)
    assert dash.grid.data[0].text[3][2] == "x0" and dash.grid.data[0].text[3][6] == "S"

    dash.set_sizes(2, 16)  # the sizes apply to the streaming heads at once
    config = StreamingHeads(heads={(3, 1)}, sink=2, window=16)
    ref = brute_streaming(organism, records, {(0, 3): 0.0, (3, 2): 0.0}, config)
    np.testing.assert_allclose(shown(dash)[1], ref.exact_match, atol=1e-9)
    want = library_budget(organism, records, config)
    np.testing.assert_allclose(budget_shown(dash).kv_bytes, want.kv_bytes, rtol=1e-12)

    dash.click_mode.value = "stream"
    click(dash, 3, 4)  # the same KV head: back to full
    assert dash.state.streaming == ()
    ref = brute(organism, records, {(0, 3): 0.0, (3, 2): 0.0})
    np.testing.assert_allclose(shown(dash)[1], ref.exact_match, atol=1e-9)
    assert dash.budget.layout.display == "none"  # every head full again: the table hides


def test_dla_under_streaming_heads_equals_logit_attribution(organism, evaluator, dash):
    dash.click_mode.value = "stream"
    click(dash, 2, 1)
    enc = evaluator.encoded[dash.state.dla_length][0]
    config = StreamingHeads(heads={(2, 0)}, sink=dash.state.sink, window=dash.state.window)
    with compress_kv(organism, config):
        ref = logit_attribution(organism, enc.prompt_ids, [int(enc.answer_ids[0])])
    heads = ref.table[ref.table.component == "head"]
    grid = heads.pivot(index="layer", columns="head", values="value").sort_index(ascending=False)
    np.testing.assert_allclose(np.array(dash.dla.data[0].z, dtype=float), grid.to_numpy())


def test_streaming_state_round_trips_and_old_states_load(evaluator, dash):
    dash.click((1, 1))
    dash.click_mode.value = "stream"
    click(dash, 3, 0)
    click(dash, 0, 6)
    dash.set_sizes(3, 24)
    text = dash.state_box.value
    assert json.loads(text)["streaming"] == [[3, 0], [0, 1]]
    other = Dashboard(evaluator)
    other.restore(text)
    assert other.state == dash.state and other.state.attention() == StreamingHeads(
        heads={(3, 0), (0, 1)}, sink=3, window=24
    )
    assert shown(other) == shown(dash) and other.budget.value == dash.budget.value
    assert (other.sink.value, other.window.value) == (3, 24)
    # a state saved before streaming heads existed: every head full, default sizes
    old = {k: v for k, v in json.loads(text).items() if k not in ("streaming", "sink", "window")}
    other.restore(json.dumps(old))
    assert other.message.value == "" and other.state.streaming == ()
    assert other.state.table() == {(1, 1): 0.0} and other.budget.layout.display == "none"


def test_streaming_refusals_are_messages(organism, dash, monkeypatch):
    """What the library refuses shows as a message and changes nothing: streaming heads on a
    model with sliding-window layers, a window of 0, a channel map under streaming heads."""
    dash.click_mode.value = "stream"
    before = dash.state
    with monkeypatch.context() as patch:
        patch.setattr(type(organism), "sliding_window", lambda self, layer: 16)
        click(dash, 1, 0)
    assert "sliding-window layers" in html.unescape(dash.message.value)
    assert dash.state == before
    dash.set_sizes(4, 0)  # the box allows >= 1; a script may still ask
    assert "window 0" in dash.message.value and dash.state.window == before.window
    click(dash, 1, 0)
    dash.open_channels()
    assert "channel maps are computed with every KV head full" in dash.message.value
