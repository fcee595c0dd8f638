"""``interp-seal figures --quick`` on the organism: every figure produced, its data equal to the
analyses' own outputs computed here directly, figures drawn from that data, resumable, PNGs
through kaleido (or a clear message without a browser), claims computed from the numbers."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from interp_seal.analysis.retrieval_scores import passage_retrieval_scores
from interp_seal.analysis.sweeps import head_sweep
from interp_seal.cli import main
from interp_seal.evaluation import evaluate_lengths, evaluate_line_retrieval
from interp_seal.figures import FIGURES, QUICK, load_tables, regenerate
from interp_seal.figures import claims as C
from interp_seal.figures.run import FigureRun
from interp_seal.figures.seal import extensions
from interp_seal.figures.sizes import DEFAULT
from interp_seal.models import extend_context, load_model
from interp_seal.records import fingerprint
from interp_seal.tasks import LineRetrievalConfig, PassagesConfig, line_retrieval, passages

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    out = tmp_path_factory.mktemp("gallery") / "organism"
    result = regenerate("organism", out, quick=True, progress=False)
    return out, result


@pytest.fixture(scope="module")
def organism():
    return load_model("organism")


def tables(out: Path, name: str) -> dict[str, pd.DataFrame]:
    return load_tables(out / "data" / f"{name}.json")[0]


def test_every_figure_is_produced(gallery):
    out, result = gallery
    assert sorted(result.computed) == sorted(f.name for f in FIGURES)
    for spec in FIGURES:
        doc = json.loads((out / "data" / f"{spec.name}.json").read_text())
        assert doc["tables"] and all(doc["tables"].values()), spec.name
        for table in doc["tables"]:
            assert (out / "data" / spec.name / f"{table}.csv").exists()
        html = (out / f"{spec.name}.html").read_text()
        assert "plotly" in html.lower()
        if result.png:
            assert (out / f"{spec.name}.png").read_bytes()[:8] == PNG_MAGIC
        else:
            assert "apt-get install chromium" in result.png_problem
    readme = (out / "README.md").read_text()
    for spec in FIGURES:
        assert f"({spec.name}.png)" in readme and spec.paper in readme
    assert "interp-seal figures --model organism" in readme and "--quick" in readme
    assert "0.32" in readme  # SEAL Table 1: LongChat-7B baseline at 31K, beside ours


def test_line_retrieval_points_equal_the_evaluation(gallery, organism):
    out, _ = gallery
    acc = tables(out, "seal_table1_methods")["accuracy"]
    direct = evaluate_line_retrieval(organism, QUICK.lengths, n=QUICK.n, seed=0, progress=False)
    base = acc[acc.method == "base"].sort_values("length")
    np.testing.assert_allclose(base.exact_match, direct.exact_match)
    np.testing.assert_allclose(base.n_tokens, direct.n_tokens)
    # the figure is drawn from these rows: one trace per method, y = exact match by length
    from interp_seal.figures.registry import BY_NAME

    fig = BY_NAME["seal_table1_methods"].draw(tables(out, "seal_table1_methods"))
    for trace in fig.data:
        rows = acc[acc.method == trace.name].sort_values("length")
        np.testing.assert_allclose(trace.y, rows.exact_match)
    params = tables(out, "seal_table1_methods")["params"].set_index("method").trainable
    L, H, D = organism.spec.n_layers, organism.spec.n_heads, organism.spec.d_head
    assert params["seal-h"] == L * H and params["seal-c"] == L * H * D


def test_context_extension_points_equal_direct_evaluation(gallery, organism):
    out, _ = gallery
    acc = tables(out, "seal_table2_extension")["accuracy"].set_index(["method", "length"])
    length = QUICK.extension_lengths[0]
    for name, ext in extensions_of(organism).items():
        with extend_context(organism, ext):
            row = evaluate_line_retrieval(organism, [length], n=QUICK.n, seed=0, progress=False)
        assert acc.loc[(name, length), "exact_match"] == pytest.approx(row.exact_match.iloc[0])
        assert acc.loc[(name, length), "n"] == QUICK.n


def extensions_of(handle):
    class _Run:
        sizes = QUICK

    return extensions(_Run())


def test_head_sweep_and_quadrants_equal_a_fresh_sweep(gallery, organism):
    out, _ = gallery
    stored = tables(out, "seal_fig2b_quadrants")["sweep"]
    samples = {
        L: line_retrieval.generate(LineRetrievalConfig(num_lines=L), QUICK.sweep_n, 0)
        for L in (QUICK.mid, QUICK.long)
    }
    fresh = head_sweep(organism, samples)
    key = ["layer", "head", "length", "metric"]
    a = stored.sort_values(key).reset_index(drop=True)
    b = fresh.sort_values(key).reset_index(drop=True)
    np.testing.assert_allclose(a.value, b.value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.delta, b.delta, rtol=1e-5, atol=1e-6)


def quick_questions(n: int):
    """MuDAF's evaluation questions at the quick size, generated here (1 hop, seed 0)."""
    return passages.generate(PassagesConfig(num_passages=QUICK.retrieval_passages), n, 0)


def test_passage_qa_scores_equal_teacher_forcing(gallery, organism, tmp_path):
    out, _ = gallery
    direct = evaluate_lengths(organism, {0: quick_questions(QUICK.retrieval_n)}, progress=False)
    exact = direct.exact_match.iloc[0]
    base = tables(out, "mudaf_table2_methods")["accuracy"].set_index("method").loc["base"]
    assert base.exact_match == pytest.approx(exact) and base.n == QUICK.retrieval_n
    assert base.n_tokens == pytest.approx(direct.n_tokens.iloc[0])
    masking = tables(out, "mudaf_fig4_masking")["masking"]
    none = masking[masking.strategy == "none"].iloc[0]
    assert none.exact_match == pytest.approx(exact) and none.n_samples == QUICK.retrieval_n
    # MuDAF / SFT tune on the same format, other questions: none shared with the evaluation
    train = FigureRun("organism", QUICK, tmp_path, progress=False).tuning_samples("passages")
    assert len(train) == QUICK.tune_n
    assert all(len(s.passages) == QUICK.retrieval_passages and len(s.golden) == 1 for s in train)
    evaluation = {s.prompt for s in quick_questions(QUICK.retrieval_n)}
    assert not evaluation & {s.prompt for s in train}
    # Fig. 10 marks the generator's golden passage (column 0 is the text before passage 1)
    heat = tables(out, "mudaf_fig10_heatmaps")
    question = passages.generate(PassagesConfig(num_passages=QUICK.heatmap_passages), 1, 0)[0]
    assert list(heat["golden"].passage) == [g + 1 for g in question.golden]
    assert sorted(heat["attention"].passage.unique()) == list(range(QUICK.heatmap_passages + 1))


def test_retrieval_scores_and_dla_equal_the_analyses(gallery, organism):
    out, _ = gallery
    heads = tables(out, "mudaf_fig3_scores")["heads"].sort_values(["layer", "head"])
    samples = quick_questions(QUICK.retrieval_n)
    fresh = passage_retrieval_scores(organism, samples, progress=False).heads
    fresh = fresh.sort_values(["layer", "head"])
    np.testing.assert_allclose(heads.f1, fresh.f1, atol=1e-9)
    np.testing.assert_array_equal(heads["rank"], fresh["rank"])
    # SEAL Fig. 4: the base model's logit difference is the model's own (a plain forward)
    dla = tables(out, "seal_fig4_dla")
    attr = dla["attribution"]
    base = attr[attr.method == "base"]
    logit = dla["logits"].set_index("method").logit["base"]
    assert base.value.sum() == pytest.approx(logit, abs=1e-3)  # direct effects add up


def test_second_run_only_redraws_and_a_lost_figure_resumes(gallery, tmp_path):
    out, _ = gallery
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    again = regenerate("organism", copy, quick=True, progress=False, png=False)
    assert again.computed == [] and sorted(again.reused) == sorted(f.name for f in FIGURES)
    # a kill mid-figure: its JSON never written, its records' last line cut short
    name = "seal_table1_methods"
    before = tables(copy, name)["accuracy"]
    (copy / "data" / f"{name}.json").unlink()
    records = copy / "work" / "table1" / "records.jsonl"
    records.write_bytes(records.read_bytes()[:-25])
    resumed = regenerate("organism", copy, quick=True, only=[name], progress=False, png=False)
    assert resumed.computed == [name]
    pd.testing.assert_frame_equal(tables(copy, name)["accuracy"], before)


def test_no_browser_still_writes_html_and_data(gallery, tmp_path, monkeypatch, capsys):
    import plotly.graph_objects as go

    out, _ = gallery
    copy = tmp_path / "nobrowser"
    shutil.copytree(out, copy)
    for png in copy.glob("*.png"):
        png.unlink()

    def no_browser(*args, **kwargs):
        raise RuntimeError("ChromeNotFoundError: no chrome found")

    monkeypatch.setattr(go.Figure, "write_image", no_browser)
    result = regenerate("organism", copy, quick=True, only=["mudaf_fig3_scores"], progress=False)
    assert not result.png and "apt-get install chromium" in capsys.readouterr().err
    assert (copy / "mudaf_fig3_scores.html").exists() and not list(copy.glob("*.png"))
    assert "PNG images were not written" in (copy / "README.md").read_text()


def test_other_sizes_and_unknown_figures_are_refused_before_work(gallery, capsys):
    out, _ = gallery
    assert main(["figures", "--out", str(out), "--only", "seal_fig99"]) == 2
    assert "unknown figure" in capsys.readouterr().err
    assert main(["figures", "--out", str(out)]) == 2  # quick data: default sizes refused
    assert "other arguments" in capsys.readouterr().err


def test_claim_statistics_by_hand():
    # (k+1)/(n+2): 9/10 -> 10/12, 5/10 -> 6/12
    a, b = 10 / 12, 6 / 12
    expected = (a * (1 - a) / 12 + b * (1 - b) / 12) ** 0.5
    assert C.se_diff(0.9, 10, 0.5, 10) == pytest.approx(expected)
    assert C.verdict(0.4, 0.15) == "supported"
    assert C.verdict(-0.4, 0.15) == "contradicted"
    assert C.verdict(0.2, 0.15) == "not shown"


def test_claims_are_computed_from_the_data(gallery):
    out, _ = gallery
    claims = pd.read_csv(out / "claims.csv")
    assert len(claims) == len(C.CLAIMS)
    acc = tables(out, "seal_table1_methods")["accuracy"]
    base = acc[acc.method == "base"].sort_values("length")
    p1, p2, n = base.exact_match.iloc[0], base.exact_match.iloc[-1], base.n.iloc[0]
    row = claims[claims.claim == "Accuracy falls with context length"].iloc[0]
    assert row.difference == pytest.approx(p1 - p2, abs=1e-4)
    assert row.se == pytest.approx(C.se_diff(p1, n, p2, n), abs=1e-4)
    assert row.verdict == C.verdict(p1 - p2, C.se_diff(p1, n, p2, n))


def test_list_names_every_figure(tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path), "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(f.name in listed for f in FIGURES)


@pytest.mark.slow
def test_kill_9_then_rerun_gives_the_same_gallery(gallery, tmp_path):
    """A real SIGKILL part-way through ``--quick``; the rerun completes with identical data."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "interp_seal.cli",
        "figures",
        "--out",
        str(out),
        "--quick",
        "--no-png",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (out / "work" / "seal-l").exists() and time.time() < deadline:  # mid-way
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert subprocess.run([*cmd, "--resume"], env=env, capture_output=True).returncode == 0
    reference, _ = gallery
    for spec in FIGURES:
        for name, table in tables(out, spec.name).items():
            pd.testing.assert_frame_equal(
                table, tables(reference, spec.name)[name], check_exact=False, rtol=1e-5
            )


def test_compute_time_counts_the_records_of_interrupted_runs(tmp_path):
    """A figure's rows computed by an earlier (killed) run keep their CPU time; rows computed
    now are in this run's own clock; a row shared by two figures counts once per run."""
    run = FigureRun("organism", QUICK, tmp_path, progress=False)
    records = tmp_path / "work" / "points" / "records.jsonl"
    records.parent.mkdir(parents=True)
    key = json.dumps({"x": 1})
    print_ = fingerprint(["organism", dataclasses.asdict(QUICK)], {"x": 1})
    earlier = {"key": key, "fingerprint": print_, "values": {"y": 2}, "cpu_seconds": 7.5}
    earlier |= {"wall_seconds": 9.0, "run": "an-earlier-run"}
    records.write_text(json.dumps(earlier) + "\n")
    table = run.rows("points", [{"x": 1}, {"x": 2}], lambda key: {"y": key["x"] * 2})
    assert table.to_dict("records") == [{"x": 1, "y": 2}, {"x": 2, "y": 4}]
    assert (run.earlier.cpu, run.earlier.wall) == (7.5, 9.0)
    run.rows("points", [{"x": 1}, {"x": 2}], lambda key: 1 / 0)  # all stored: nothing computed
    assert (run.earlier.cpu, run.earlier.wall) == (7.5, 9.0)  # the shared row counted once
    stored = [json.loads(line) for line in records.read_text().splitlines()]
    assert stored[1]["run"] == run.run_id and stored[1]["cpu_seconds"] >= 0
    # a point computed for other sizes is refused, not reused
    other = FigureRun("organism", DEFAULT, tmp_path, progress=False)
    with pytest.raises(ValueError, match="computed on a different input or setting"):
        other.rows("points", [{"x": 1}], lambda key: {"y": 0})
