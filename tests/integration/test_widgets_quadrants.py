"""The quadrant explorer: its map, channel maps and scale-table curves hold the library's
numbers (head_quadrants, channel_sweep, scale_table_sweep) after simulated clicks/selections."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from plotly.callbacks import BoxSelector, InputDeviceState, Points

from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.analysis.quadrants import head_quadrants, quadrant_scale_table
from interp_seal.analysis.sweeps import SweepOptions, channel_sweep, head_sweep, scale_table_sweep
from interp_seal.evaluation import line_retrieval_samples
from interp_seal.models import load_model
from interp_seal.tuning.scales import load_scales
from interp_seal.widgets import QuadrantExplorer

LENGTHS, N = (10, 60), 4
HEADS = [(0, 1), (0, 3), (1, 2), (1, 6), (2, 1), (2, 5), (3, 0), (3, 4)]
QUIET = SweepOptions(progress=False)


@pytest.fixture(scope="module")
def setup():
    handle = load_model("organism")
    records = line_retrieval_samples(handle.tokenizer, LENGTHS, n=N, seed=0)
    heads = head_sweep(handle, records, heads=HEADS, options=QUIET)
    channels = channel_sweep(handle, records, heads=[HEADS[1]], channels=[0, 5], options=QUIET)
    evaluator = EditEvaluator(handle, records, progress=False)
    return handle, records, heads, channels, evaluator


@pytest.fixture
def explorer(setup):
    handle, records, heads, channels, evaluator = setup
    return QuadrantExplorer(evaluator, heads, mid=10, long=60, channel_table=channels)


def test_map_places_heads_at_their_deltas(setup, explorer):
    _, _, heads, _, _ = setup
    ref = head_quadrants(heads, mid=10, long=60).heads
    trace = explorer.map.data[0]
    np.testing.assert_array_equal(trace.x, ref.delta_mid)
    np.testing.assert_array_equal(trace.y, ref.delta_long)
    assert [list(c) for c in trace.customdata] == [
        [a, b, q] for a, b, q in zip(ref.layer, ref["head"], ref.quadrant, strict=True)
    ]


def test_click_opens_the_channel_map_from_the_channel_table(setup, explorer):
    _, _, _, channels, _ = setup
    index = HEADS.index(HEADS[1])
    points = Points(point_inds=[index], xs=[0], ys=[0], trace_index=0)
    explorer.map.data[0]._dispatch_on_click(points, InputDeviceState())
    z = np.array(explorer.channel_figure.data[-1].z, dtype=float)[0]
    rows = channels[(channels.metric == "exact_match") & (channels.length == 60)]
    np.testing.assert_allclose(z, rows.sort_values("channel").delta)


def test_selection_editor_evaluate_and_save(setup, explorer, tmp_path):
    handle, records, _, _, _ = setup
    picked = [2, 5]
    points = Points(point_inds=picked, xs=[0, 0], ys=[0, 0], trace_index=0)
    explorer.map.data[0]._dispatch_on_selection(points, BoxSelector(xrange=[0, 1], yrange=[0, 1]))
    explorer.factor.value = 1.2
    explorer.add(explorer.selected)
    rows = explorer.quadrants.heads.iloc[picked]
    table = {(int(a), int(b)): 1.2 for a, b in zip(rows.layer, rows["head"], strict=True)}
    assert explorer.editor.value.splitlines() == [f"L{a}H{b} x 1.2" for a, b in sorted(table)]
    explorer.evaluate()
    ref = scale_table_sweep(handle, records, {"t": table}, options=QUIET)
    ref = ref[ref.metric == "exact_match"].sort_values("length")
    np.testing.assert_allclose(explorer.curve_figure.data[1].y, ref.value, atol=1e-9)
    np.testing.assert_allclose(explorer.curve_figure.data[0].y, ref.baseline, atol=1e-9)
    explorer.save(tmp_path / "t.safetensors")
    scales = load_scales(tmp_path / "t.safetensors", handle.spec).scales
    for (a, b), f in table.items():
        assert scales[a, b, 0] == pytest.approx(f)
    assert float(scales.sum()) == pytest.approx(handle.spec.n_layers * handle.spec.n_heads + 0.4)


def test_seal_preset_and_quadrant(explorer):
    explorer.seal_preset()
    table = quadrant_scale_table(explorer.quadrants, {"Q1": 0.9, "Q3": 1.1})
    expected = [f"L{a}H{b} x {f:g}" for (a, b), f in sorted(table.items())]
    assert explorer.editor.value.splitlines() == expected


def test_bad_input(setup, explorer, tmp_path):
    handle, _, heads, _, evaluator = setup
    explorer.editor.value = "L1H3 times 2"
    explorer.evaluate()
    assert "not of the form" in explorer.message.value and explorer.curves is None
    explorer.editor.value = f"L{handle.spec.n_layers}H0 x 0.5"
    explorer.save(tmp_path / "x.safetensors")
    assert "does not exist" in explorer.message.value and not list(tmp_path.iterdir())
    # a table from another model: a message, nothing placed; loading the right one then works
    other = heads.assign(layer=heads.layer + handle.spec.n_layers)
    empty = QuadrantExplorer(evaluator, other, mid=10, long=60)
    assert "another model" in empty.message.value and empty.quadrants is None
    assert empty.map_box.children == ()
    empty.seal_preset()
    assert "no head table is loaded" in empty.message.value and empty.editor.value == ""
    explorer.load(other, mid=10, long=60)  # a loaded explorer keeps its table
    assert "another model" in explorer.message.value
    assert explorer.quadrants.heads.layer.max() < handle.spec.n_layers
    empty.load(heads, mid=10, long=60)
    expected = explorer.quadrants.heads
    pd.testing.assert_frame_equal(empty.quadrants.heads, expected)
    assert list(empty.map.data[0].x) == list(explorer.map.data[0].x)
