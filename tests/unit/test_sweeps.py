"""Ablation sweeps, the cached batched forward, resumption and head quadrants.

Every batched result is checked against the brute-force definition: one ``hf_logits`` forward
per (edit, sample) on the unpadded sample, argmax and log-softmax at the answer positions.
Samples mix answers the model reproduces greedily (so exact match is 1 before ablation and
ablations can flip it) with LongEval answers a random model gets wrong.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import DISTINCT_FAMILIES, QWEN3_MOE_LAYOUTS, build_checkpoint
from plotly.offline import get_plotlyjs

from interp_seal.analysis.quadrants import head_quadrants, quadrant_of, quadrant_scale_table
from interp_seal.analysis.statistics import wilson
from interp_seal.analysis.sweeps import (
    SweepOptions,
    channel_sweep,
    head_sweep,
    mean_head_outputs,
    scale_table_sweep,
)
from interp_seal.cli import main
from interp_seal.engine import AnswerBatch, clean_run, run_from_layer
from interp_seal.interventions import ablate, hf_logits, scale_table
from interp_seal.models import load_model
from interp_seal.tasks import line_retrieval as lr
from interp_seal.tasks.sample import Encoded
from interp_seal.viz.sweeps import (
    channel_map,
    head_delta_heatmap,
    quadrant_scatter,
    scale_table_curves,
)

QUIET = SweepOptions(progress=False, batch_rows=6, batch_samples=2)
# the sweep machinery (batching, resuming, refusals) is the same on every family: checked on
# GQA llama and multi-head qwen2 only
machinery = pytest.mark.parametrize("handle", ["llama", "qwen2"], indirect=True)


@pytest.fixture(scope="module", params=DISTINCT_FAMILIES)
def handle(request, tmp_path_factory):
    """3 layers (so edited forwards cross a middle layer), one checkpoint per family."""
    path = tmp_path_factory.mktemp(f"sweep_{request.param}")
    return load_model(build_checkpoint(path, request.param, n_layers=3, seed=1))


def greedy_sample(handle, sample, n_tokens: int = 2) -> Encoded:
    """``sample``'s prompt with the model's own greedy continuation as the answer."""
    ids = sample.encode(handle.tokenizer).prompt_ids
    start = len(ids)
    for _ in range(n_tokens):
        next_id = hf_logits(handle, ids[None])[0, -1].argmax()
        ids = torch.cat([ids, next_id[None]])
    return Encoded(input_ids=ids, answer_start=start)


def samples_for(handle) -> dict[int, list]:
    """Two lengths; per length two greedy answers (exact 1) and one real answer (exact 0)."""
    out = {}
    for n_lines in (3, 5):
        raw = lr.generate(lr.LineRetrievalConfig(num_lines=n_lines), 3, seed=n_lines)
        out[n_lines] = [greedy_sample(handle, raw[0]), raw[1], greedy_sample(handle, raw[2], 3)]
    return out


def encoded(handle, sample) -> Encoded:
    return sample if isinstance(sample, Encoded) else sample.encode(handle.tokenizer)


def naive_scores(handle, samples, iv) -> tuple[list[bool], list[float]]:
    """Exact match and answer log-prob per sample: one unpadded ``hf_logits`` forward each."""
    exact, logprob = [], []
    for sample in samples:
        enc = encoded(handle, sample)
        logits = hf_logits(handle, enc.input_ids[None], iv)[0, enc.answer_start - 1 : -1]
        target = enc.answer_ids
        exact.append(bool((logits.argmax(-1) == target).all()))
        logprob.append(float(logits.log_softmax(-1).gather(-1, target[:, None]).sum()))
    return exact, logprob


def naive_table(handle, samples_by_length, units: dict) -> pd.DataFrame:
    """Per-length means under each ``{key: intervention}``, key None for the baseline."""
    rows = []
    for key, iv in {None: None, **units}.items():
        for length, samples in samples_by_length.items():
            exact, logprob = naive_scores(handle, samples, iv)
            rows.append(
                {
                    "key": key,
                    "length": length,
                    "exact_match": np.mean(exact),
                    "answer_logprob": np.mean(logprob),
                }
            )
    return pd.DataFrame(rows)


def assert_matches_naive(table: pd.DataFrame, naive: pd.DataFrame, keys: list) -> None:
    """Same exact match (exactly), log-probs within 1e-5, baseline and delta consistent."""
    for key in keys:
        for length in table.length.unique():
            got = table[(table.key == key) & (table.length == length)].set_index("metric")
            ref = naive[(naive.key == key) & (naive.length == length)].iloc[0]
            base = naive[(naive.key.isna()) & (naive.length == length)].iloc[0]
            assert got.loc["exact_match", "value"] == ref.exact_match
            assert got.loc["exact_match", "baseline"] == base.exact_match
            assert got.loc["answer_logprob", "value"] == pytest.approx(ref.answer_logprob, abs=1e-5)
            assert got.loc["answer_logprob", "baseline"] == pytest.approx(
                base.answer_logprob, abs=1e-5
            )
            assert got.loc["exact_match", "delta"] == ref.exact_match - base.exact_match


# -- the cached batched forward ------------------------------------------------------------


def test_forward_from_layer_matches_hf_logits(handle):
    """Every start layer, every ablation mode, multi-layer tables: logits within 1e-5."""
    spec = handle.spec
    last = spec.n_layers - 1
    batch_samples = [encoded(handle, s) for ss in samples_for(handle).values() for s in ss]
    batch = AnswerBatch.from_encoded(batch_samples, pad_id=0)
    clean = clean_run(handle, batch, range(spec.n_layers))
    mean_z = mean_head_outputs(handle, batch_samples[:2])
    for start in range(spec.n_layers):
        ivs = [
            ablate(spec, [(start, 1)], "zero"),
            ablate(spec, [(start, 0, 3), (start, 2, 5)], "scale", factor=-0.5),
            ablate(spec, [(start, 2)], "mean", mean_z=mean_z),
            ablate(spec, [(start, 3)], "uniform"),
            scale_table(spec, {(start, 0): 0.5, (last, 3): 1.7}),  # touches the last layer too
            ablate(spec, [(start, 1), (last, 2)], "uniform"),
        ]
        logits = run_from_layer(handle, clean, start, ivs)
        assert logits.shape[0] == len(ivs) * len(batch_samples)
        for a, iv in enumerate(ivs):
            for s, enc in enumerate(batch_samples):
                ref = hf_logits(handle, enc.input_ids[None], iv)[0, enc.answer_start - 1 : -1]
                got = logits[a * len(batch_samples) + s, : len(ref)]
                torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for s, enc in enumerate(batch_samples):  # the clean run's own answer logits
        ref = hf_logits(handle, enc.input_ids[None])[0, enc.answer_start - 1 : -1]
        torch.testing.assert_close(clean.logits[s, : len(ref)], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", QWEN3_MOE_LAYOUTS.values(), ids=QWEN3_MOE_LAYOUTS)
def test_forward_from_layer_on_qwen3_moe_layouts(tmp_path, layout):
    """The same on the other Qwen3-MoE layouts (``QWEN3_MOE_LAYOUTS``): restarts from dense
    and from mixture layers, edits crossing both."""
    handle = load_model(build_checkpoint(tmp_path, "qwen3_moe", n_layers=4, seed=1, config=layout))
    test_forward_from_layer_matches_hf_logits(handle)


def test_answer_batch_scores_by_hand():
    """Exact match ignores padded answer slots; log-probs sum real slots only."""
    batch = AnswerBatch.from_encoded(
        [
            Encoded(input_ids=torch.tensor([5, 1, 2]), answer_start=1),
            Encoded(input_ids=torch.tensor([5, 7, 0, 3]), answer_start=3),
        ],
        pad_id=9,
    )
    assert batch.ids.tolist() == [[5, 1, 2, 9], [5, 7, 0, 3]]
    assert batch.query.tolist() == [[0, 1], [2, 2]] and batch.target.tolist() == [[1, 2], [3, 3]]
    logits = torch.zeros(2, 2, 4)
    logits[0, 0, 1] = logits[0, 1, 2] = 5.0  # row 0: both answer tokens are the argmax
    logits[1, :, 3] = 5.0  # row 1: its one answer token is the argmax
    logits[1, 1] = torch.tensor([9.0, 0, 0, 0])  # padded slot: wrong but ignored
    scored = batch.score(logits)
    lp = float(torch.log_softmax(torch.tensor([0, 5.0, 0, 0]), -1)[1])
    assert scored.exact.tolist() == [True, True]
    torch.testing.assert_close(scored.logprob, torch.tensor([2 * lp, lp]))
    assert scored.correct.tolist() == [[True, True], [True, False]]  # padding is never correct
    assert scored.predicted.tolist() == [[1, 2], [3, 0]]


@machinery
def test_run_from_layer_rejects_edits_below_start(handle):
    batch = AnswerBatch.from_encoded([encoded(handle, samples_for(handle)[3][1])], pad_id=0)
    clean = clean_run(handle, batch, [1])
    with pytest.raises(ValueError, match="touch layer 1 or above"):
        run_from_layer(handle, clean, 1, [ablate(handle.spec, [(0, 1)])])


# -- sweeps against the naive loop ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["zero", "uniform"])
def test_head_sweep_matches_naive_loop(handle, mode):
    samples = samples_for(handle)
    table = head_sweep(handle, samples, mode=mode, options=QUIET)
    assert list(table.columns) == [
        "layer",
        "head",
        "channel",
        "length",
        "metric",
        "value",
        "baseline",
        "delta",
    ]
    assert len(table) == handle.spec.n_layers * handle.spec.n_heads * 2 * 2
    assert table.channel.isna().all()
    heads = [(lay, h) for lay in range(handle.spec.n_layers) for h in range(handle.spec.n_heads)]
    naive = naive_table(handle, samples, {hd: ablate(handle.spec, [hd], mode) for hd in heads})
    table["key"] = list(zip(table.layer.astype(int), table["head"].astype(int), strict=True))
    assert_matches_naive(table, naive, heads)
    exact = table[table.metric == "exact_match"]
    assert set(exact.baseline) == {2 / 3}  # the greedy answers, not the LongEval one
    assert (exact.delta != 0).any()  # some ablation flips a greedy answer


def test_channel_sweep_matches_naive_loop(handle):
    samples = samples_for(handle)
    heads, channels = [(0, 1), (2, 3)], [0, 5, 15]
    mean_z = mean_head_outputs(handle, samples[3])
    table = channel_sweep(
        handle, samples, heads=heads, channels=channels, mode="mean", mean_z=mean_z, options=QUIET
    )
    keys = [(lay, h, c) for lay, h in heads for c in channels]
    naive = naive_table(
        handle, samples, {k: ablate(handle.spec, [k], "mean", mean_z=mean_z) for k in keys}
    )
    table["key"] = list(
        zip(
            table.layer.astype(int),
            table["head"].astype(int),
            table.channel.astype(int),
            strict=True,
        )
    )
    assert_matches_naive(table, naive, keys)


def test_scale_table_sweep_matches_naive_loop(handle):
    samples = samples_for(handle)
    tables = {
        "Q1 x 0.9, Q3 x 1.1": {(0, 1): 0.9, (1, 2): 0.9, (2, 0): 1.1},
        "layer 2 x 0": {(2, h): 0.0 for h in range(handle.spec.n_heads)},
        "nothing": {},
    }
    table = scale_table_sweep(handle, samples, tables, options=QUIET)
    naive = naive_table(
        handle, samples, {k: scale_table(handle.spec, t) for k, t in tables.items()}
    )
    table["key"] = table["table"]
    assert_matches_naive(table, naive, list(tables))
    assert (table[table.table == "nothing"].delta == 0).all()


@machinery
def test_sweep_results_do_not_depend_on_batching(handle):
    samples = samples_for(handle)
    a = head_sweep(
        handle, samples, options=SweepOptions(progress=False, batch_rows=1, batch_samples=1)
    )
    b = head_sweep(
        handle, samples, options=SweepOptions(progress=False, batch_rows=64, batch_samples=8)
    )
    pd.testing.assert_frame_equal(a, b, atol=1e-5, rtol=0)


# -- resumption ----------------------------------------------------------------------------


class Interrupt(Exception):
    pass


def stop_after(k: int, seen: list):
    def on_progress(done: int, total: int) -> None:
        seen.append((done, total))
        if done == k:
            raise Interrupt

    return on_progress


@machinery
def test_sweep_resumes_after_interruption(handle, tmp_path):
    samples = samples_for(handle)
    reference = head_sweep(handle, samples, options=QUIET)
    options = SweepOptions(out=tmp_path, resume=True, progress=False, batch_rows=6, batch_samples=2)
    first: list = []
    with pytest.raises(Interrupt):
        head_sweep(handle, samples, options=options, on_progress=stop_after(3, first))
    total = first[-1][1]
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    keys = {(r["length"], r["sample"], r["unit"]) for r in records}
    assert len(keys) == len(records) > 0  # the 3 finished forwards, each record once
    with (tmp_path / "records.jsonl").open("a") as f:
        f.write('{"length": 3, "sam')  # a line cut short by the kill
    second: list = []
    resumed = head_sweep(handle, samples, options=options, on_progress=stop_after(-1, second))
    assert 0 < second[-1][1] < total  # only the unfinished forwards ran
    pd.testing.assert_frame_equal(resumed, reference, atol=1e-5, rtol=0)
    third: list = []
    again = head_sweep(handle, samples, options=options, on_progress=stop_after(-1, third))
    assert third == []  # everything on disk: no forward at all
    pd.testing.assert_frame_equal(again, reference, atol=1e-5, rtol=0)


@machinery
def test_sweep_refuses_other_arguments_on_same_output(handle, tmp_path):
    samples = samples_for(handle)
    options = SweepOptions(out=tmp_path, resume=True, progress=False)
    head_sweep(handle, samples, heads=[(0, 1)], options=options)
    with pytest.raises(ValueError, match=r"different arguments.*mode: 'zero' -> 'uniform'"):
        head_sweep(handle, samples, heads=[(0, 1)], mode="uniform", options=options)
    with pytest.raises(ValueError, match="different arguments.*samples"):
        head_sweep(handle, {3: samples[3]}, heads=[(0, 1)], options=options)
    fresh = SweepOptions(out=tmp_path, progress=False)
    with pytest.raises(ValueError, match="already holds a run; pass resume=True"):
        head_sweep(handle, samples, heads=[(0, 1)], options=fresh)


@machinery
def test_bad_sweep_inputs_are_refused(handle):
    samples = samples_for(handle)
    with pytest.raises(ValueError, match="uniform attention replaces a whole head"):
        channel_sweep(handle, samples, heads=[(0, 1)], mode="uniform", options=QUIET)
    with pytest.raises(ValueError, match="at least one sample for every length"):
        head_sweep(handle, {3: []}, options=QUIET)
    with pytest.raises(ValueError, match="does not exist"):
        head_sweep(handle, samples, heads=[(9, 0)], options=QUIET)
    with pytest.raises(ValueError, match="needs an output directory"):
        SweepOptions(resume=True)
    with pytest.raises(ValueError, match="needs a factor"):
        head_sweep(handle, samples, mode="scale", options=QUIET)


# -- quadrants and figures -----------------------------------------------------------------


def hand_table() -> pd.DataFrame:
    """Five heads with known deltas at lengths 10 (mid) and 30 (long)."""
    deltas = {
        (0, 0): (0.2, 0.1),
        (0, 1): (-0.1, 0.3),
        (1, 0): (-0.2, -0.4),
        (1, 1): (0.1, -0.1),
        (2, 0): (0.0, 0.5),
    }
    rows = []
    for (layer, head), (mid, long) in deltas.items():
        for length, d in ((10, mid), (30, long)):
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "channel": pd.NA,
                    "length": length,
                    "metric": "exact_match",
                    "value": 0.5 + d,
                    "baseline": 0.5,
                    "delta": d,
                }
            )
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "channel": pd.NA,
                    "length": length,
                    "metric": "answer_logprob",
                    "value": -1.0,
                    "baseline": -1.0,
                    "delta": 0.0,
                }
            )
    return pd.DataFrame(rows)


def test_head_quadrants_on_hand_built_table():
    q = head_quadrants(hand_table(), mid=10, long=30)
    got = dict(zip(zip(q.heads.layer, q.heads["head"], strict=True), q.heads.quadrant, strict=True))
    assert got == {(0, 0): "Q1", (0, 1): "Q2", (1, 0): "Q3", (1, 1): "Q4", (2, 0): "axis"}
    x, y = np.array([0.2, -0.1, -0.2, 0.1, 0.0]), np.array([0.1, 0.3, -0.4, -0.1, 0.5])
    dx, dy = x - x.mean(), y - y.mean()
    assert q.pearson == pytest.approx((dx * dy).sum() / np.sqrt((dx**2).sum() * (dy**2).sum()))
    assert q.counts() == {"Q1": 1, "Q2": 1, "Q3": 1, "Q4": 1, "axis": 1}
    assert quadrant_scale_table(q, {"Q1": 0.9, "Q3": 1.1}) == {(0, 0): 0.9, (1, 0): 1.1}
    assert np.isnan(head_quadrants(hand_table(), mid=10, long=30, metric="answer_logprob").pearson)
    assert quadrant_of(0.0, -1.0) == "axis"
    with pytest.raises(ValueError, match="no 'exact_match' results at length 20"):
        head_quadrants(hand_table(), mid=20, long=30)


def test_figures_carry_the_deltas():
    table = hand_table()
    fig = head_delta_heatmap(table)
    assert len(fig.data) == 2
    z = np.array(fig.data[0].z, dtype=float)  # length 10: rows layers 0..2, columns heads 0..1
    np.testing.assert_array_equal(z[:2], [[0.2, -0.1], [-0.2, 0.1]])
    assert z[2, 0] == 0.0 and np.isnan(z[2, 1])
    scatter = quadrant_scatter(head_quadrants(table, mid=10, long=30))
    q1 = next(t for t in scatter.data if t.name.startswith("Q1"))
    assert list(q1.x) == [0.2] and list(q1.y) == [0.1] and list(q1.text) == ["L0H0"]
    channels = table.assign(channel=1)
    assert np.array(channel_map(channels).data[1].z, dtype=float)[0, 0] == 0.1
    tables = table[table.layer == 0].assign(table=lambda d: d["head"].map({0: "a", 1: "b"}))
    curves = scale_table_curves(tables)
    assert [t.name for t in curves.data] == ["baseline", "a", "b"]
    assert list(curves.data[1].y) == [0.7, 0.6]
    assert curves.data[1].error_y.array is None  # records per length unknown: no intervals
    bars = scale_table_curves(tables, n=10).data[1].error_y
    low, high = wilson(7, 10)
    np.testing.assert_allclose([bars.arrayminus[0], bars.array[0]], [0.7 - low, high - 0.7])


# -- command line --------------------------------------------------------------------------


def test_cli_head_and_channel_sweeps(tmp_path, llama_checkpoint, capsys):
    out = tmp_path / "heads"
    argv = [
        "analysis",
        "head-sweep",
        "--model",
        llama_checkpoint,
        "--lengths",
        "2",
        "4",
        "--n",
        "2",
        "--out",
        str(out),
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    table = pd.read_csv(out / "results.csv")
    assert len(table) == 2 * 4 * 2 * 2  # 2 layers x 4 heads x 2 lengths x 2 metrics
    assert list(table.columns)[-5:] == ["model", "seed", "n", "value_ci_low", "value_ci_high"]
    assert (table.model == llama_checkpoint).all() and (table.seed == 0).all()
    exact = table.metric == "exact_match"  # the interval of a proportion, on its rows only
    assert (table.n == 2).all() and table.value_ci_low.notna().eq(exact).all()
    for row in table[exact].itertuples():
        assert (row.value_ci_low, row.value_ci_high) == pytest.approx(wilson(row.value * 2, 2))
    assert list(pd.read_csv(out / "quadrants.csv").columns)[-3:] == ["model", "seed", "n"]
    # the two pages of one directory share one plotly.js, written once beside them
    pages = [out / "head_deltas.html", out / "quadrants.html"]
    assert [p.name for p in out.glob("*.js")] == ["plotly.min.js"]
    assert (out / "plotly.min.js").read_text() == get_plotlyjs()
    for page in pages:
        html = page.read_text()
        assert page.stat().st_size < 100_000 and html.count('src="plotly.min.js"') == 1
        assert get_plotlyjs()[:200] not in html  # not embedded
    assert "Pearson r" in capsys.readouterr().out
    assert main(argv) == 2  # the output is taken: needs --resume
    assert "holds the results of an earlier run" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), table)
    assert main([*argv, "--resume", "--mode", "uniform"]) == 2
    assert "mode: 'zero' -> 'uniform'" in capsys.readouterr().err
    out = tmp_path / "channels"
    assert (
        main(
            [
                "analysis",
                "channel-sweep",
                "--model",
                llama_checkpoint,
                "--heads",
                "1.2",
                "--channels",
                "0",
                "7",
                "--lengths",
                "3",
                "--n",
                "2",
                "--mode",
                "scale",
                "--factor",
                "2",
                "--out",
                str(out),
                "--format",
                "parquet",
            ]
        )
        == 0
    )
    table = pd.read_parquet(out / "results.parquet")
    assert table.channel.tolist() == [0, 0, 7, 7] and (out / "channel_map.html").exists()
