"""Screened head sweeps: exact rows are the exact sweep's, estimated rows attribution patching's.

The independent attribution estimate below differentiates the answer's log-probability with
respect to a per-head interpolation weight ``a`` (``z' = z + a * (target - z)``, ``target`` the
ablated output) at ``a = 0``, through the model's own full forward: no head-output gradients,
no shared code with ``interp_seal.analysis.screening``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import build_checkpoint

from interp_seal.analysis import screening
from interp_seal.analysis.attribution_patching import tracked_head_outputs
from interp_seal.analysis.screening import attribution_estimates, screened_head_sweep, top_heads
from interp_seal.analysis.sweeps import SweepOptions, head_sweep, mean_head_outputs
from interp_seal.cli import main
from interp_seal.models import load_model
from interp_seal.tasks import line_retrieval

QUIET = SweepOptions(progress=False)


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("screen"), "llama", n_layers=3, seed=4)
    return load_model(path)


@pytest.fixture(scope="module")
def samples():
    cfg = line_retrieval.LineRetrievalConfig
    return {n: line_retrieval.generate(cfg(num_lines=n), 2, seed=1) for n in (3, 6)}


def direct_estimates(handle, samples, target) -> dict[int, np.ndarray]:
    """d answer_logprob / d a at a = 0 for z' = z + a[l, h] (target(l, z) - z), mean per length."""
    L, H, D = handle.spec.shape
    out = {}
    for length, batch in samples.items():
        total = np.zeros((L, H))
        for sample in batch:
            enc = sample.encode(handle.tokenizer)
            a = torch.zeros(L, H, requires_grad=True)

            def hook(layer, a=a):
                def pre(_mod, args):
                    z = args[0].view(*args[0].shape[:2], H, D)
                    edited = z + a[layer][None, None, :, None] * (target(layer, z) - z)
                    return (edited.reshape(args[0].shape),)

                return pre

            attn = [layer.self_attn.o_proj for layer in handle.model.model.layers]
            hooks = [m.register_forward_pre_hook(hook(i)) for i, m in enumerate(attn)]
            try:
                logits = handle.model(enc.input_ids[None]).logits[0]
            finally:
                for h in hooks:
                    h.remove()
            logprobs = logits.log_softmax(-1)
            metric = sum(
                logprobs[t - 1, enc.input_ids[t]] for t in range(enc.answer_start, len(enc))
            )
            metric.backward()
            total += a.grad.numpy()
        out[length] = total / len(batch)
    return out


def direct_per_record(handle, samples, target) -> dict[int, np.ndarray]:
    """``direct_estimates`` of each record alone: ``{length: (records, L, H)}``."""
    return {
        length: np.stack(
            [direct_estimates(handle, {length: [sample]}, target)[length] for sample in batch]
        )
        for length, batch in samples.items()
    }


def test_exact_rows_are_the_sweeps_and_estimates_attribution(handle, samples):
    screen = screened_head_sweep(handle, samples, top_k=3, candidates=5, options=QUIET)
    full = head_sweep(handle, samples, options=QUIET)
    per_record = direct_per_record(handle, samples, lambda layer, z: torch.zeros_like(z))

    # candidates: the 5 largest |mean over lengths| + 2 x root-mean-square SE, either sign
    mean = (per_record[3].mean(0) + per_record[6].mean(0)) / 2
    se = {n: v.std(0, ddof=1) / np.sqrt(len(v)) for n, v in per_record.items()}
    bound = np.abs(mean) + 2 * np.sqrt((se[3] ** 2 + se[6] ** 2) / 2)
    order = sorted((-bound[lay, h], lay, h) for lay in range(3) for h in range(4))
    expected = sorted((lay, h) for _, lay, h in order[:5])
    table = screen.table
    exact = table[table.source == "exact"]
    assert sorted(set(zip(exact["layer"], exact["head"], strict=True))) == expected
    assert len(exact) == 5 * 2 * 2  # heads x lengths x metrics
    merged = exact.merge(full, on=["layer", "head", "length", "metric"], suffixes=("", "_full"))
    assert len(merged) == len(exact)
    for column in ("value", "baseline", "delta"):
        np.testing.assert_allclose(merged[column], merged[f"{column}_full"], atol=1e-5)

    estimated = table[table.source == "estimate"]
    assert set(estimated.metric) == {"answer_logprob"} and len(estimated) == 7 * 2
    for row in estimated.itertuples():
        assert row.delta == pytest.approx(
            per_record[row.length].mean(0)[row.layer, row.head], abs=2e-4
        )
        baseline = full[(full.length == row.length) & (full.metric == "answer_logprob")].baseline
        assert row.baseline == pytest.approx(baseline.iloc[0], abs=1e-5)
        assert row.value == pytest.approx(row.baseline + row.delta, abs=1e-9)
    # every head once per length for answer_logprob
    logprob = table[table.metric == "answer_logprob"]
    assert len(logprob) == 12 * 2 and not logprob.duplicated(["layer", "head", "length"]).any()

    # the ranking reads exact deltas where confirmed, estimates elsewhere (mean over lengths)
    combined = {}
    for row in logprob.itertuples():
        combined.setdefault((row.layer, row.head), []).append(row.delta)
    ranked = sorted((float(np.mean(v)), head) for head, v in combined.items())
    assert list(screen.helpful) == [head for _, head in ranked[:3]]
    assert list(screen.harmful) == [head for _, head in ranked[::-1][:3]]

    est = screen.estimates
    assert len(est) == 12 * 2 and est.confirmed.sum() == 5 * 2
    for row in est.itertuples():
        values = per_record[row.length][:, row.layer, row.head]
        assert row.estimate == pytest.approx(values.mean(), abs=2e-4)
        assert row.se == pytest.approx(values.std(ddof=1) / np.sqrt(2), abs=2e-4)


def test_the_backward_recomputes_each_layer_and_keeps_no_cache(handle, samples):
    """Activation checkpointing is on (each layer's MLP starts twice per gradient: forward and
    recomputation, which stops once it has what the backward needs) and off again afterwards;
    the numbers are those checked above."""
    enc = samples[3][0].encode(handle.tokenizer)
    calls, caches = [], []
    mlps = [layer.mlp for layer in handle.model.model.layers]
    hooks = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in mlps]
    hooks.append(
        handle.model.model.register_forward_pre_hook(
            lambda _m, _a, kw: caches.append(kw.get("use_cache")), with_kwargs=True
        )
    )
    try:
        z, grad, metric = screening.answer_logprob_gradients(handle, enc)
        assert len(calls) == 2 * len(mlps) and caches == [False]
        calls.clear()
        with torch.no_grad():
            handle.model(enc.input_ids[None])
        assert len(calls) == len(mlps)
    finally:
        for h in hooks:
            h.remove()
    assert not any(layer.training for layer in handle.model.model.layers)
    assert not any(layer.gradient_checkpointing for layer in handle.model.model.layers)
    calls.clear()  # a backward afterwards keeps its activations: no recomputation
    hooks = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in mlps]
    try:
        with tracked_head_outputs(handle) as zs:
            logits = handle.model(enc.input_ids[None], use_cache=False).logits
            torch.autograd.grad(logits.sum(), [zs[0]])
    finally:
        for h in hooks:
            h.remove()
    assert len(calls) == len(mlps)


def test_confirmed_on_fewer_records(handle, samples):
    screen = screened_head_sweep(
        handle, samples, top_k=2, candidates=3, confirm_records=1, options=QUIET
    )
    """Exact match: the exact sweep on the first record. Answer log-probability: the difference
    estimator, the exact change on the first record plus the estimates' mean over all records
    minus the first record's estimate; its baseline the mean over all records."""
    first = {n: batch[:1] for n, batch in samples.items()}
    confirmed = screen.table[screen.table.source != "estimate"]
    heads = sorted(
        {(int(lay), int(h)) for lay, h in zip(confirmed["layer"], confirmed["head"], strict=True)}
    )
    assert len(heads) == 3
    sweep = head_sweep(handle, first, heads=heads, options=QUIET)
    merged = confirmed.merge(sweep, on=["layer", "head", "length", "metric"], suffixes=("", "_one"))
    assert len(merged) == 3 * 2 * 2
    em = merged[merged.metric == "exact_match"]
    assert (em.source == "exact").all()
    np.testing.assert_allclose(em["delta"], em["delta_one"], atol=1e-5)
    lp = merged[merged.metric == "answer_logprob"]
    assert (lp.source == "corrected").all()
    keys = ["layer", "head", "length"]
    every = attribution_estimates(handle, samples, progress=False).set_index(keys)
    one = attribution_estimates(handle, first, progress=False).set_index(keys)
    index = pd.MultiIndex.from_frame(lp[keys])
    shift = every.estimate.reindex(index).to_numpy() - one.estimate.reindex(index).to_numpy()
    assert np.abs(shift).max() > 1e-3  # the correction is not nothing on these records
    np.testing.assert_allclose(lp["delta"], lp["delta_one"] + shift, atol=1e-4)
    full = head_sweep(handle, samples, heads=heads[:1], options=QUIET)
    baseline = full[full.metric == "answer_logprob"].groupby("length").baseline.first()
    np.testing.assert_allclose(lp["baseline"], baseline.reindex(lp["length"]), atol=1e-5)
    np.testing.assert_allclose(lp["value"], lp["baseline"] + lp["delta"], atol=1e-9)


@pytest.mark.parametrize("mode", ["scale", "mean"])
def test_estimates_of_scale_and_mean_ablation(handle, samples, mode):
    mean_z = mean_head_outputs(handle, samples[3]) if mode == "mean" else None
    factor = 1.5 if mode == "scale" else None
    est = attribution_estimates(
        handle, samples, mode=mode, factor=factor, mean_z=mean_z, progress=False
    )
    if mode == "scale":
        direct = direct_estimates(handle, samples, lambda layer, z: 1.5 * z)
    else:
        direct = direct_estimates(handle, samples, lambda layer, z: mean_z[layer].expand_as(z))
    for row in est.itertuples():
        assert row.estimate == pytest.approx(direct[row.length][row.layer, row.head], abs=2e-4)


def test_resume_reads_the_estimates_back(handle, samples, tmp_path, monkeypatch):
    first = screened_head_sweep(
        handle, samples, top_k=2, options=SweepOptions(out=tmp_path, progress=False)
    )
    records = (tmp_path / "screen" / "records.jsonl").read_text().splitlines()
    assert len(records) == 4 and (tmp_path / "exact" / "records.jsonl").exists()

    def refuse(*args, **kwargs):
        raise AssertionError("resuming must not recompute the estimates")

    monkeypatch.setattr(screening, "answer_logprob_gradients", refuse)
    again = screened_head_sweep(
        handle, samples, top_k=2, options=SweepOptions(out=tmp_path, resume=True, progress=False)
    )
    pd.testing.assert_frame_equal(first.table, again.table)
    with pytest.raises(ValueError, match="already holds a run; pass resume=True"):
        screened_head_sweep(handle, samples, top_k=2, options=SweepOptions(out=tmp_path))
    other = {3: samples[3]}
    with pytest.raises(ValueError, match="made with other arguments"):
        screened_head_sweep(
            handle, other, top_k=2, options=SweepOptions(out=tmp_path, resume=True, progress=False)
        )


def test_bad_input(handle, samples):
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        screened_head_sweep(handle, samples, top_k=0)
    with pytest.raises(ValueError, match="candidates must be >= 1"):
        screened_head_sweep(handle, samples, top_k=1, candidates=0)
    with pytest.raises(ValueError, match="confirm_records must be >= 1"):
        screened_head_sweep(handle, samples, top_k=1, confirm_records=0)
    with pytest.raises(ValueError, match="uniform attention changes the attention itself"):
        screened_head_sweep(handle, samples, top_k=2, mode="uniform")
    with pytest.raises(ValueError, match="at least one sample for every length"):
        screened_head_sweep(handle, {3: []}, top_k=2)


def test_top_heads_hand_computed():
    table = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1] * 2,
            "head": [0, 1, 0, 1] * 2,
            "channel": pd.array([pd.NA] * 8, dtype="Int64"),
            "length": [10] * 4 + [20] * 4,
            "metric": "answer_logprob",
            "delta": [-1.0, 0.5, 2.0, 0.0, -3.0, 0.5, 0.0, -0.5],
        }
    )
    # mean deltas: (0,0) -2, (0,1) 0.5, (1,0) 1, (1,1) -0.25
    assert top_heads(table, 2) == {"helpful": [(0, 0), (1, 1)], "harmful": [(1, 0), (0, 1)]}


def test_cli_screen_flag(tmp_path, llama_checkpoint, capsys):
    out = tmp_path / "screen"
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
        "--screen",
        "2",
        "--out",
        str(out),
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    table = pd.read_csv(out / "results.csv")
    handle = load_model(llama_checkpoint)
    cfg = line_retrieval.LineRetrievalConfig
    samples = {n: line_retrieval.generate(cfg(num_lines=n), 2, seed=0) for n in (2, 4)}
    expected = screened_head_sweep(handle, samples, top_k=2, options=QUIET).table
    assert table["source"].tolist() == expected["source"].tolist()
    np.testing.assert_allclose(table["delta"], expected["delta"], atol=1e-5)
    estimates = pd.read_csv(out / "screen_estimates.csv")
    assert len(estimates) == 8 * 2 and estimates["confirmed"].sum() == 4 * 2
    assert list(estimates.columns) == [
        "layer",
        "head",
        "length",
        "estimate",
        "se",
        "baseline",
        "confirmed",
        "model",
        "seed",
        "n",
    ]
    assert (table.n == 2).all() and table.value_ci_low.notna().eq(
        table.metric == "exact_match"
    ).all()
    assert {"head_deltas.html", "quadrants.html", "quadrants.csv"} <= {
        p.name for p in out.iterdir()
    }
    assert "screen: most helpful" in capsys.readouterr().out
    assert main([*argv, "--resume"]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), table)
    assert main([*argv, "--resume", "--heads", "0.1"]) == 2
    assert "--screen ranks every head" in capsys.readouterr().err
