"""``interp-seal figures --quick`` on the organism: every figure produced, its data equal to the
analyses' own outputs computed here directly, figures drawn from that data, resumable, PNGs
through kaleido (or a clear message without a browser), claims computed from the numbers."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from interp_seal.analysis.retrieval_scores import passage_retrieval_scores
from interp_seal.analysis.sweeps import head_sweep
from interp_seal.cli import main
from interp_seal.evaluation import evaluate_lengths, evaluate_line_retrieval, teacher_force
from interp_seal.figures import FIGURES, QUICK, load_tables, regenerate
from interp_seal.figures import claims as C
from interp_seal.figures import mudaf as M
from interp_seal.figures import run as run_module
from interp_seal.figures.run import FigureRun
from interp_seal.figures.seal import FRESH_SEED, REPLICATE_SEED, extensions
from interp_seal.figures.sizes import DEFAULT, OTHER, OTHER_QUICK, QUESTION_CHUNK, preset_sizes
from interp_seal.models import extend_context, load_model
from interp_seal.records import fingerprint
from interp_seal.tasks import LineRetrievalConfig, PassagesConfig, line_retrieval, passages
from interp_seal.viz.paper_figures import mark_window

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
        # offline: the page loads the gallery's one copy of plotly.js, no CDN
        assert '<script charset="utf-8" src="plotly.min.js"></script>' in html
        assert "cdn.plot.ly" not in html
        if result.png:
            assert (out / f"{spec.name}.png").read_bytes()[:8] == PNG_MAGIC
        else:
            assert "apt-get install chromium" in result.png_problem
    assert (out / "plotly.min.js").read_text() == get_plotlyjs()
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
    # the figure draws the claim records (fresh, seed FRESH_SEED): per method the mean over
    # its tuning runs, every record (left) and those whose queried line is not the last
    from interp_seal.figures.registry import BY_NAME

    t = tables(out, "seal_table1_methods")
    c = t["confirm"]
    fig = BY_NAME["seal_table1_methods"].draw(t)
    assert len(fig.data) == 2 * c.method.nunique()
    for trace in fig.data:
        rows = c if trace.xaxis == "x" else c[c.position == "other"]
        rows = rows[rows.method == trace.legendgroup]
        runs = rows.groupby(["tuning_seed", "length"]).exact_match.mean()
        np.testing.assert_allclose(trace.y, runs.groupby("length").mean().to_numpy())
    fresh = {
        L: line_retrieval.generate(LineRetrievalConfig(num_lines=L), QUICK.confirm_n, FRESH_SEED)
        for L in QUICK.lengths
    }
    for r in c[c.method == "base"].itertuples():
        x = fresh[r.length][r.record]
        last = x.meta["random_idx"][1] == r.length - 1
        assert r.position == ("last" if last else "other")
    direct = evaluate_line_retrieval(
        organism, QUICK.lengths, n=QUICK.confirm_n, seed=FRESH_SEED, progress=False
    ).set_index("length")
    per = c[c.method == "base"].groupby("length").exact_match.mean()
    np.testing.assert_allclose(per.to_numpy(), direct.exact_match.to_numpy())
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


def quick_questions(n: int, seed: int = 0):
    """MuDAF's evaluation questions at the quick size, generated here (1 hop, seed 0)."""
    return passages.generate(PassagesConfig(num_passages=QUICK.retrieval_passages), n, seed)


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
    # the per-question outcomes behind each condition: its mean, and unmasked, the plain run's
    rec = tables(out, "mudaf_fig4_masking")["records"]
    per = rec.groupby(["strategy", "mode", "seed"]).exact_match.mean()
    for r in masking.itertuples():
        assert per[(r.strategy, r.mode, r.seed)] == pytest.approx(r.exact_match)
    plain = teacher_force(organism, quick_questions(QUICK.retrieval_n))
    got = rec[rec.strategy == "none"].sort_values("record").exact_match.tolist()
    assert got == [int(x.exact_match) for x in plain]
    # MuDAF Fig. 5: each question's mean F1 over the targets averages to the targets' F1
    f5 = tables(out, "mudaf_fig5_targets")
    from interp_seal.figures.mudaf import target_gain

    means = f5["questions"][f5["questions"].group == "mudaf"].groupby("method").f1.mean()
    for method, f1 in target_gain(f5).items():
        assert means[method] == pytest.approx(f1, abs=1e-9)
    base_q = passage_retrieval_scores(organism, quick_questions(QUICK.retrieval_n), progress=False)
    mine = f5["targets"][f5["targets"].group == "mudaf"]
    heads = list(zip(mine.layer, mine["head"], strict=True))
    direct = base_q.per_sample.set_index(["layer", "head"]).loc[heads].groupby("sample").f1.mean()
    q = f5["questions"]
    q = q[(q.group == "mudaf") & (q.method == "base")].sort_values("record").f1
    np.testing.assert_allclose(q.to_numpy(), direct.to_numpy(), atol=1e-12)
    # MuDAF / SFT tune on the same format, other questions: none shared with the evaluation
    run = FigureRun("organism", QUICK, tmp_path, progress=False)
    train = run.tuning_samples("sft", "passages")
    assert len(train) == QUICK.tune_n
    assert all(len(s.passages) == QUICK.retrieval_passages and len(s.golden) == 1 for s in train)
    evaluation = {s.prompt for s in quick_questions(QUICK.retrieval_n)}
    assert not evaluation & {s.prompt for s in train}
    # the claims' fresh questions (seed 2): none is a pilot's or a tuning question; unmasked,
    # their outcomes are a plain run's, and the MuDAF / SFT arms' targets F1 average as stored
    from interp_seal.figures.mudaf import FRESH_SEED as QUESTIONS_SEED

    fresh = quick_questions(QUICK.confirm_questions, seed=QUESTIONS_SEED)
    assert not {s.prompt for s in fresh} & (evaluation | {s.prompt for s in train})
    confirm = tables(out, "mudaf_fig4_masking")["confirm"]
    assert (confirm.questions_seed == QUESTIONS_SEED).all()
    assert set(confirm.strategy) == {"none", "retrieval", "random", "niah"}
    assert set(confirm["mode"]) == {"none", "zero"}
    got = confirm[confirm.strategy == "none"].sort_values("record").exact_match.tolist()
    assert got == [int(x.exact_match) for x in teacher_force(organism, fresh)]
    q = f5["confirm"]
    assert set(q.method) == {"mudaf", "sft"} and set(q.group) == {"mudaf"}
    assert q.groupby("method").record.nunique().tolist() == [QUICK.confirm_questions] * 2
    sft = FigureRun("organism", QUICK, out, progress=False).tuned_model("sft")
    direct = passage_retrieval_scores(sft, fresh, progress=False).per_sample
    direct = direct.set_index(["layer", "head"]).loc[heads].groupby("sample").f1.mean()
    stored = q[q.method == "sft"].sort_values("record").f1.to_numpy()
    np.testing.assert_allclose(stored, direct.to_numpy(), atol=1e-12)


MUDAF_CASES = ["mudaf_fig10_heatmaps", "mudaf_table3_layers"]


@pytest.fixture(scope="module")
def mudaf_cases(tmp_path_factory):
    """MuDAF Fig. 10-11 and Table 3 alone (``--quick``), and a run over the same folder that
    reuses its tuned models and base retrieval scores."""
    out = tmp_path_factory.mktemp("gallery") / "mudaf_cases"
    regenerate("organism", out, quick=True, only=MUDAF_CASES, progress=False, png=False)
    return out, FigureRun("organism", QUICK, out, progress=False)


def test_a_retrained_model_must_have_the_weights_its_earlier_rows_used(mudaf_cases, tmp_path):
    """Tuned models are not kept between machines, so a resumed gallery retrains them: the
    retrained weights are checked against the digest the first training recorded, and a
    different model is refused instead of being mixed into the same figures."""
    out, _ = mudaf_cases
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    folder = copy / "work" / "sft_seed0"
    first = json.loads((folder / run_module.WEIGHTS).read_text())
    shutil.rmtree(folder / "model")
    FigureRun("organism", QUICK, copy, progress=False).tuned_model("sft")  # retrained
    assert json.loads((folder / run_module.WEIGHTS).read_text()) == first
    shutil.rmtree(folder / "model")
    elsewhere = {"sha256": "0" * 64, "trained_on": "another CPU, torch 0.1"}
    (folder / run_module.WEIGHTS).write_text(json.dumps(elsewhere))
    with (
        pytest.warns(UserWarning, match="trained on another CPU, torch 0.1"),
        pytest.raises(run_module.RetrainedModelError, match="'sft_seed0'.*000000000000"),
    ):
        FigureRun("organism", QUICK, copy, progress=False).tuned_model("sft")


def test_each_figure_names_every_tuned_model_it_used_even_one_loaded_before_it(gallery):
    """MuDAF Fig. 9 reuses the models Fig. 5 loaded in the same run: its data still names
    them, so a retrained model's error can say which figures to recompute."""
    out, _ = gallery
    run = FigureRun("organism", QUICK, out, progress=False)
    tag = "mudaf_{}_seed0".format
    sets = M.target_sets(run)
    models = {"sft_seed0"} | {tag("-".join(f"{a}.{b}" for a, b in sets[m])) for m in sets}
    for name in ("mudaf_fig5_targets", "mudaf_fig9_diff"):
        doc = json.loads((out / "data" / f"{name}.json").read_text())
        assert models <= set(doc["heldout"]["tuning"]), name


def test_mudaf_fig10_cases_equal_passage_scores_and_answers(mudaf_cases):
    from interp_seal.analysis.masking import greedy_text
    from interp_seal.evaluation import teacher_force
    from interp_seal.figures.registry import BY_NAME

    out, run = mudaf_cases
    heat = tables(out, "mudaf_fig10_heatmaps")
    cases = heat["cases"]
    # the cases: question 0 (Fig. 10) and the first later one whose golden passage is not the
    # last (Fig. 11), searched here over the generator's own seed-0 questions
    P = QUICK.heatmap_passages
    pool = passages.generate(PassagesConfig(num_passages=P), M.CASE_SEARCH, 0)
    second = next(i for i in range(1, len(pool)) if pool[i].golden[0] != P - 1)
    chosen = {1: pool[0], 2: pool[second]}
    assert sorted(cases.groupby("case").question_index.first().items()) == [(1, 0), (2, second)]
    assert pool[second].golden[0] + 1 < P  # boxed column < P: not the last passage
    golden = heat["golden"].groupby("case").passage.apply(list).to_dict()
    assert golden == {c: [g + 1 for g in q.golden] for c, q in chosen.items()}
    assert sorted(heat["attention"].passage.unique()) == list(range(P + 1))  # #0 = before #1
    assert set(cases.model) == {"sft", "mudaf"}
    handles = {
        "sft": run.tuned_model("sft"),
        "mudaf": run.tuned_model("mudaf", heads=M.target_sets(run)["mudaf"]),
    }
    layers = list(range(run.handle.spec.n_layers))[-3:]
    att = heat["attention"]
    for r in cases.itertuples():
        question, handle = chosen[r.case], handles[r.model]
        assert r.question == question.meta["input"] and r.gold == question.answer
        # the heatmaps and the golden share are passage_retrieval_scores on that question
        pa = passage_retrieval_scores(handle, [question], progress=False).attention[0]
        mine = att[(att.case == r.case) & (att.model == r.model)]
        wide = mine.pivot_table(index=["layer", "head"], columns="passage", values="attention")
        assert sorted(set(mine.layer)) == layers
        direct = np.concatenate([pa.prefix[layers][..., None], pa.attention[layers]], axis=-1)
        np.testing.assert_allclose(wide.to_numpy(), direct.reshape(len(wide), -1), atol=1e-9)
        share = pa.attention[layers][:, :, list(question.golden)].sum(-1).mean()
        assert r.golden_attention == pytest.approx(share)
        assert r.prefix_attention == pytest.approx(pa.prefix[layers].mean())
        # the answer shown is the greedy continuation; the verdict teacher-forced exact match
        prompt = question.encode(handle.tokenizer).prompt_ids
        assert r.answer == greedy_text(handle, prompt, M.ANSWER_TOKENS)
        assert r.exact_match == int(teacher_force(handle, [question])[0].exact_match)
    # drawn from these rows: 2 cases x 2 models x 3 layers, each row headed by its answer
    spec = BY_NAME["mudaf_fig10_heatmaps"]
    fig = spec.draw(heat)
    assert len(fig.data) == 2 * 2 * len(layers)
    first = att[(att.case == 1) & (att.model == "sft") & (att.layer == layers[0])]
    np.testing.assert_allclose(
        fig.data[0].z, first.pivot_table(index="head", columns="passage", values="attention")
    )
    texts = [a.text for a in fig.layout.annotations]
    for r in cases.itertuples():
        label = M.FIG10_MODELS[r.model]
        verdict = "correct" if r.exact_match else "wrong"
        assert f"<b>{label}</b> answers '{r.answer.strip()}' ({verdict})" in texts
    reading = spec.read(heat)
    by = cases.set_index(["case", "model"]).golden_attention
    for c in (1, 2):
        assert f"{by[(c, 'sft')]:.3f} under SFT vs {by[(c, 'mudaf')]:.3f} under MuDAF" in reading


def test_mudaf_table3_layer_counts_equal_the_target_sets(mudaf_cases):
    from collections import Counter

    from interp_seal.figures.registry import BY_NAME

    out, run = mudaf_cases
    t = tables(out, "mudaf_table3_layers")
    layers = t["layers"]
    sets = M.target_sets(run)
    n_layers = run.handle.spec.n_layers
    assert len(sets["mudaf"]) == QUICK.mudaf_k and sets["mudaf-weak"]
    for strategy in ("mudaf", "mudaf-weak"):
        counts = Counter(a for a, _ in sets[strategy])
        rows = layers[layers.strategy == strategy].set_index("layer")
        assert list(rows.index) == list(range(n_layers))
        assert rows.heads.to_dict() == {L: counts.get(L, 0) for L in range(n_layers)}
        for L in range(n_layers):
            names = sorted(f"L{a}H{b}" for a, b in sets[strategy] if a == L)
            assert sorted((rows.names[L] or "").split()) == names
    # the bars are these counts, one trace per strategy, with named axes
    spec = BY_NAME["mudaf_table3_layers"]
    fig = spec.draw(t)
    assert [tr.name for tr in fig.data] == list(M.TABLE3_STRATEGIES.values())
    for tr, strategy in zip(fig.data, M.TABLE3_STRATEGIES, strict=True):
        rows = layers[layers.strategy == strategy]
        assert list(tr.x) == list(rows.layer) and list(tr.y) == list(rows.heads)
    assert fig.layout.xaxis.title.text == "layer" and "count" in fig.layout.yaxis.title.text
    reading = spec.read(t)
    for a, b in sets["mudaf"] + sets["mudaf-weak"]:
        assert f"L{a}H{b}" in reading
    names = [f.name for f in FIGURES]
    assert names.index("mudaf_table3_layers") == names.index("mudaf_fig9_diff") + 1


def test_retrieval_scores_and_dla_equal_the_analyses(gallery, organism):
    out, _ = gallery
    heads = tables(out, "mudaf_fig3_scores")["heads"].sort_values(["layer", "head"])
    samples = quick_questions(QUICK.retrieval_n)
    fresh = passage_retrieval_scores(organism, samples, progress=False).heads
    fresh = fresh.sort_values(["layer", "head"])
    np.testing.assert_allclose(heads.f1, fresh.f1, atol=1e-9)
    np.testing.assert_array_equal(heads["rank"], fresh["rank"])
    # SEAL Fig. 4: direct effects add up to each digit's logit; the records' logit
    # differences are a plain forward's, on records the base model gets wrong
    records = {
        seed: line_retrieval.generate(LineRetrievalConfig(num_lines=QUICK.long), n, seed)
        for seed, n in ((0, QUICK.n), (FRESH_SEED, 30))
    }
    check_digit_effects(tables(out, "seal_fig4_dla"), organism, records)


def check_digit_effects(dla: dict, handle, samples) -> None:
    """SEAL Fig. 4's tables against the model: every method's direct effects on a digit sum to
    that digit's logit (frozen-norm DLA is exact); the drawn record is the first seed-0 record
    whose first answer digit a plain Hugging Face forward gets wrong; the base model's
    margin logit(correct) - logit(strongest wrong) on the first 30 fresh (``FRESH_SEED``)
    records, chosen on no answer, equals that forward's."""
    import torch

    from interp_seal.evaluation import encode_samples
    from interp_seal.evaluation.teacher_forcing import first_content

    sums = dla["effects"].groupby(["method", "digit"]).value.sum()
    for r in dla["logits"].itertuples():
        assert sums[(r.method, r.digit)] == pytest.approx(r.logit, abs=1e-3)
    assert dla["logits"].correct.sum() == dla["logits"].method.nunique()  # one digit each
    rec = dla["records"]
    base = rec[rec.method == "base"]
    assert len(base) == 30 and set(rec.method) == {"base", "seal-h", "seal-c"}
    assert sorted(base.record) == list(range(30))
    tok = handle.tokenizer

    def answer_digit(enc):
        at = enc.answer_start + first_content(tok, enc.answer_ids)
        with torch.no_grad():
            logits = handle.model(enc.input_ids[None, :at]).logits[0, -1].double()
        return at, logits

    drawn = None
    for enc in encode_samples(handle, samples[0]):
        at, logits = answer_digit(enc)
        if int(logits.argmax()) != int(enc.input_ids[at]):
            drawn = tok.convert_ids_to_tokens(int(enc.input_ids[at]))
            break
    correct = dla["logits"][dla["logits"].correct].digit.iloc[0]
    if drawn is not None:
        assert drawn.strip().lstrip("Ġ▁") == str(correct)
    encoded = encode_samples(handle, samples[FRESH_SEED])
    for r in base.itertuples():
        enc = encoded[r.record]
        at, logits = answer_digit(enc)
        assert tok.convert_ids_to_tokens(int(enc.input_ids[at])) == r.correct
        right = tok.convert_tokens_to_ids(r.correct)
        others = logits.clone()
        others[right] = -torch.inf
        wrong = int(others.argmax())
        assert tok.convert_ids_to_tokens(wrong) == r.wrong
        assert r.logit_diff == pytest.approx(float(logits[right] - logits[wrong]), abs=1e-4)
        assert bool(r.top_is_correct) == (int(logits.argmax()) == right) == (r.logit_diff > 0)


def test_masking_claim_pairs_each_random_draw_with_the_retrieval_heads():
    # 20 fresh questions: zeroing the retrieval heads gets 2 right; draw 0 gets 14 (the 2
    # included, b = 12, c = 0: McNemar p = 2 * 0.5^12); draw 1 gets 5 (b = 3, c = 0: p = 0.25).
    # Every draw must beat it (intersection-union): not shown, p = 0.25.
    ret = [1] * 2 + [0] * 18
    draws = {0: [1] * 14 + [0] * 6, 1: [1] * 5 + [0] * 15}
    rows = [("retrieval", -1, ret)] + [("random", k, v) for k, v in draws.items()]
    records = pd.DataFrame(
        [
            {"strategy": st, "mode": "zero", "seed": sd, "record": i, "exact_match": x}
            for st, sd, xs in rows
            for i, x in enumerate(xs)
        ]
    )
    masking = records.groupby(["strategy", "mode", "seed"], as_index=False).exact_match.mean()
    masking["n_samples"] = 20
    data = {"mudaf_fig4_masking": {"masking": masking, "confirm": records.assign(questions_seed=2)}}
    row = C.masking_hurts(data)
    assert row.p_value == pytest.approx(0.25) and row.verdict == "not shown"
    assert "McNemar" in row.test and row.n == 20
    draws[1] = [1] * 2 + [0] * 2 + [1] * 8 + [0] * 8  # b = 8, c = 0: p = 2 * 0.5^8
    records = records[records.seed != 1]
    extra = [
        {"strategy": "random", "mode": "zero", "seed": 1, "record": i, "exact_match": x}
        for i, x in enumerate(draws[1])
    ]
    records = pd.concat([records, pd.DataFrame(extra)], ignore_index=True)
    data["mudaf_fig4_masking"]["confirm"] = records.assign(questions_seed=2)
    row = C.masking_hurts(data)
    assert row.p_value == pytest.approx(2 / 2**8) and row.verdict == "supported"
    # fresh questions decide it alone: there draw 1 gets 3 of the 2 + 18 right (b = 1, c = 0)
    fresh = records.assign(questions_seed=2)
    fresh.loc[(fresh.seed == 1) & (fresh.record >= 3), "exact_match"] = 0
    fresh.loc[(fresh.seed == 1) & (fresh.record < 3), "exact_match"] = 1
    data["mudaf_fig4_masking"]["confirm"] = fresh
    data["mudaf_fig4_masking"]["records"] = records
    row = C.masking_hurts(data)
    assert row.p_value == pytest.approx(1.0) and row.verdict == "not shown"
    assert row.measured.startswith("on 20 fresh questions (seed 2)")
    assert "random heads 0.42 (mean of 2 draws)" in row.measured  # (14 + 3) / 2 / 20
    # the page's text under the figure reports the same fresh questions, each draw apart
    none = [{"strategy": "none", "seed": -1, "record": i, "exact_match": 1} for i in range(20)]
    table = data["mudaf_fig4_masking"] | {
        "confirm": pd.concat([fresh, pd.DataFrame(none).assign(mode="zero", questions_seed=2)]),
        "niah": pd.DataFrame({"layer": [0], "head": [0], "score": [0.5]}),
    }
    assert M.fig4_read(table).endswith(
        "On 20 fresh questions (seed 2): no masking 1.00, retrieval 0.10, random draws 0.70 / 0.15."
    )
    # the figure draws them beside the pilot: a second panel, bar for bar the same numbers
    fig = M.fig4_draw(table | {"masking": table["masking"].assign(k=4)})
    assert fig.layout.annotations[1].text == "fresh: 20 questions (seed 2), heads zeroed"
    fresh_bars = {t.name: list(t.y) for t in fig.data if t.xaxis == "x2"}
    assert fresh_bars == {
        "retrieval (k=4)": [pytest.approx(0.10)],
        "random (k=4)": [pytest.approx(0.425)],
        "one random draw": [pytest.approx(0.70), pytest.approx(0.15)],  # diamonds on its bar
    }
    band = [b for b in fig.layout.shapes if b.xref == "x2 domain" and b.type == "line"]
    assert band[0].y0 == 1.0  # no masking on the fresh questions


def test_target_claim_is_a_signed_rank_test_per_question():
    # 8 fresh questions; SFT - MuDAF differences 1..8 (all one way, no ties): the exact
    # two-sided Wilcoxon signed-rank p is 2 / 2^8 = 0.0078, against MuDAF
    q = pd.DataFrame(
        [
            {"method": m, "group": "mudaf", "record": i, "f1": v}
            for m, xs in (("sft", np.arange(1, 9) / 10), ("mudaf", np.zeros(8)))
            for i, v in enumerate(xs)
        ]
    )
    scores = pd.DataFrame(
        {"method": ["base", "sft", "mudaf"], "layer": 0, "head": 0, "f1": [0, 0, 0.45]}
    )
    targets = pd.DataFrame({"group": ["mudaf"], "layer": [0], "head": [0], "f1": [0.3]})
    t = {"scores": scores, "targets": targets, "questions": q, "confirm": q.assign(seed=2)}
    row = C.mudaf_targets({"mudaf_fig5_targets": t})
    assert row.p_value == pytest.approx(2 / 256) and row.verdict == "contradicted"
    assert row.difference == pytest.approx(-0.45) and row.n == 8
    assert row.test.startswith("Wilcoxon")
    assert row.measured.startswith("on 8 fresh questions (seed 2), targets' mean F1: SFT 0.45")
    text = M.fig5_read(t)
    assert text.startswith("Base-model F1 of the sets, strong targets (mudaf): L0H0 0.30")
    assert text.endswith("On 8 fresh questions (seed 2): SFT 0.45, MuDAF 0.00.")


def test_fig6_needles_at_table2_lengths_equal_teacher_forcing(gallery, organism, tmp_path):
    """SEAL Fig. 6 on the organism (Table 2 in lines): its lengths are Table 2's records' mean
    token counts, and the base model's grid is plain teacher forcing of those needles."""
    from interp_seal.evaluation import teacher_force
    from interp_seal.evaluation.niah import niah_grid

    out, _ = gallery
    grid = tables(out, "seal_fig6_needle_extension")["grid"]
    run = FigureRun("organism", QUICK, tmp_path, progress=False)
    (L,) = QUICK.extension_lengths
    lines = line_retrieval.generate(LineRetrievalConfig(num_lines=L), QUICK.n, 0)
    mean = np.mean([len(x.encode(organism.tokenizer).input_ids) for x in lines])
    assert set(grid.context_length) == {int(round(mean, -2))}
    needles = run.samples("needle", QUICK.needle_n, seed=0, size=int(round(mean, -2)))
    direct = niah_grid(needles, [x.exact_match for x in teacher_force(organism, needles)])
    base = grid[grid.method == "base"].pivot_table(
        index="depth", columns="context_length", values="exact_match"
    )
    np.testing.assert_allclose(base.to_numpy(), direct.to_numpy())
    assert set(grid.method) == {
        "base", "NTK", "NTK + SEAL-C", "Self-Extend", "Self-Extend + SEAL-C", "SEAL-C"
    }  # fmt: skip


def test_dla_claim_is_a_sign_test_over_records():
    # SEAL-H raises the margin on 7 of 8 records, SEAL-C on all 8: two-sided exact sign test
    # p = 2 * (1 + 8) / 256 = 0.0703 and 2 / 256 = 0.0078; the row needs both
    # (intersection-union): not shown, p = 0.0703
    base = [-1.0] * 8
    seal_h = [0.5] * 7 + [-2.0]
    seal_c = [0.2] * 8
    rows = [
        {"record": i, "method": m, "logit_diff": v, "top_is_correct": v > 0}
        for m, xs in (("base", base), ("seal-h", seal_h), ("seal-c", seal_c))
        for i, v in enumerate(xs)
    ]
    row = C.dla_flips({"seal_fig4_dla": {"records": pd.DataFrame(rows)}})
    assert row.p_value == pytest.approx(18 / 256) and row.verdict == "not shown"
    assert "correct token on top: base 0, seal-h 7, seal-c 8" in row.measured
    rows = [r if r["method"] != "seal-h" else {**r, "logit_diff": 0.5} for r in rows]
    row = C.dla_flips({"seal_fig4_dla": {"records": pd.DataFrame(rows)}})
    assert row.p_value == pytest.approx(2 / 256) and row.verdict == "supported"


def test_the_page_names_the_figures_not_computed_yet(gallery, tmp_path):
    from interp_seal.figures.gallery import write_gallery

    out, _ = gallery
    copy = tmp_path / "partial"
    shutil.copytree(out, copy)
    (copy / "data" / "seal_fig5_needle.json").unlink()
    text = write_gallery(copy, command="interp-seal figures", png=False).read_text()
    assert f"Not computed yet (1 of {len(FIGURES)};" in text
    assert "`seal_fig5_needle` (SEAL Fig. 5)" in text and "## Needle in a haystack" not in text
    full = (out / "README.md").read_text()
    assert "Not computed yet" not in full and "## Needle in a haystack" in full


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
    records = copy / "work" / "table1_paired" / "records.jsonl"
    records.write_bytes(records.read_bytes()[:-25])
    resumed = regenerate("organism", copy, quick=True, only=[name], progress=False, png=False)
    assert resumed.computed == [name]
    pd.testing.assert_frame_equal(tables(copy, name)["accuracy"], before)
    pd.testing.assert_frame_equal(tables(copy, name)["records"], tables(out, name)["records"])


def test_a_figure_whose_stored_rows_changed_is_recomputed_not_redrawn(gallery, tmp_path):
    """The data file of a figure is a cache of its stores: when a row it read was recomputed
    (here: one record of Table 1's pilot now scored the other way), the next run recomputes
    the figure from the stores, and its table shows the stored row, not the old file."""
    out, _ = gallery
    copy = tmp_path / "stale"
    shutil.copytree(out, copy)
    name = "seal_table1_methods"
    path = copy / "work" / "table1_paired" / "records.jsonl"
    first = json.loads(path.read_text().splitlines()[0])
    key = json.loads(first["key"])
    flipped = 1 - first["values"]["correct"][0]
    first["values"]["correct"][0] = flipped
    with path.open("a") as f:  # the store's last record of a key is the one it returns
        f.write(json.dumps(first) + "\n")
    result = regenerate("organism", copy, quick=True, progress=False, png=False)
    assert result.stale == {name: ["table1_paired"]} and result.computed == [name]
    records = tables(copy, name)["records"]
    row = records[
        (records.method == key["method"])
        & (records.length == key["length"])
        & (records.record == 0)
    ]
    assert row.exact_match.tolist() == [flipped]
    assert tables(out, name)["records"].loc[row.index, "exact_match"].tolist() == [1 - flipped]
    # the data now matches its stores again: a third run only redraws
    again = regenerate("organism", copy, quick=True, only=[name], progress=False, png=False)
    assert again.reused == [name] and again.stale == {}


def test_a_figure_whose_store_folder_changed_is_recomputed(gallery, tmp_path):
    """A sweep, score log or tuning folder that differs from the one a figure read (a side
    worker's records merged in, a store rebuilt) makes the figure stale too; its time ledger,
    appended by every run that opens the folder, does not."""
    out, _ = gallery
    copy = tmp_path / "folder"
    shutil.copytree(out, copy)
    readers = [
        load_tables(p)[1]["figure"]
        for p in sorted((copy / "data").glob("*.json"))
        if "retrieval_base" in load_tables(p)[1]["inputs"]["folders"]
    ]
    assert "mudaf_fig3_scores" in readers
    with (copy / "work" / "retrieval_base" / "compute.jsonl").open("a") as f:
        f.write(json.dumps({"key": "x", "fingerprint": "", "cpu_seconds": 1.0}) + "\n")
    unchanged = regenerate("organism", copy, quick=True, only=readers, progress=False, png=False)
    assert unchanged.stale == {} and sorted(unchanged.reused) == sorted(readers)
    log = copy / "work" / "retrieval_base" / "log.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:-1]) + "\n")  # the last record lost: recomputed
    result = regenerate("organism", copy, quick=True, only=readers, progress=False, png=False)
    # the first reader recomputes the lost record, byte for byte: the others then read the
    # store they were drawn from and are reused
    first, *rest = [spec.name for spec in FIGURES if spec.name in readers]
    assert result.stale == {first: ["retrieval_base"]} and result.computed == [first]
    assert log.read_text().splitlines() == lines and sorted(result.reused) == sorted(rest)
    pd.testing.assert_frame_equal(
        tables(copy, "mudaf_fig3_scores")["heads"], tables(out, "mudaf_fig3_scores")["heads"]
    )


def test_data_written_before_inputs_were_recorded_is_reused_and_named(gallery, tmp_path, capsys):
    out, _ = gallery
    copy = tmp_path / "legacy"
    shutil.copytree(out, copy)
    name = "mudaf_fig3_scores"
    path = copy / "data" / f"{name}.json"
    doc = json.loads(path.read_text())
    del doc["inputs"]
    path.write_text(json.dumps(doc))
    main(
        [
            "figures",
            "--model",
            "organism",
            "--out",
            str(copy),
            "--quick",
            "--only",
            name,
            "--no-png",
        ]
    )
    printed = capsys.readouterr().out
    assert f"reused without a check of their stores ({name})" in printed
    assert "computed 0, reused 1" in printed


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


def test_more_fresh_questions_add_chunks_and_keep_the_stored_ones(tmp_path):
    """``more_questions`` appends whole chunks of fresh questions: the first chunks are the same
    questions as without it (the generator is prefix-stable), the run's identity does not
    change, so nothing stored is refused; partial chunks are refused before any work."""
    base = dataclasses.replace(DEFAULT, confirm_questions=80, retrieval_passages=4)
    grown = dataclasses.replace(base, more_questions=2 * QUESTION_CHUNK)
    assert grown.as_dict() == base.as_dict() and grown.fresh_questions == 160
    before = M.fresh_chunks(FigureRun("organism", base, tmp_path / "a", progress=False))
    after = M.fresh_chunks(FigureRun("organism", grown, tmp_path / "b", progress=False))
    assert [len(c) for c in before] == [40, 40] and [len(c) for c in after] == [40] * 4

    def texts(chunks):
        return [(x.prompt, x.answer) for c in chunks for x in c]

    assert texts(after[:2]) == texts(before)
    assert set(texts(after[2:])).isdisjoint(texts(before))
    for bad in ({"more_questions": 30}, {"confirm_questions": 90, "more_questions": 40}):
        with pytest.raises(ValueError, match="whole chunks of 40"):
            dataclasses.replace(base, **bad)


def test_other_sizes_and_unknown_figures_are_refused_before_work(gallery, capsys):
    out, _ = gallery
    assert main(["figures", "--out", str(out), "--only", "seal_fig99"]) == 2
    assert "unknown figure" in capsys.readouterr().err
    assert main(["figures", "--out", str(out)]) == 2  # quick data: default sizes refused
    assert "other arguments" in capsys.readouterr().err


def paired_data(base, seal_h, seal_l, length: int = 200, seal_c=None) -> dict:
    """A Table 1 whose claim records (``confirm``) hold one tuning run of SEAL-H, SEAL-C (=
    base unless given) and LoRA beside the base model, every queried line not the last."""
    arms = {"base": base, "seal-h": seal_h, "seal-c": base if seal_c is None else seal_c}
    arms["seal-l"] = seal_l
    records = pd.DataFrame(
        [
            {"method": m, "tuning_seed": 0, "length": length, "record": i, "exact_match": int(v)}
            for m, xs in arms.items()
            for i, v in enumerate(xs)
        ]
    ).assign(position="other", seed=FRESH_SEED)
    params = pd.DataFrame({"method": ["seal-h", "seal-l"], "trainable": [32, 18432]})
    return {"seal_table1_methods": {"confirm": records, "params": params}}


def test_comparable_needs_equivalence_and_both_arms_above_the_baseline():
    # nothing moved: 20 of 50 right for all three arms, the same records -> not "supported"
    same = [1] * 20 + [0] * 30
    row = C.seal_h_parameters(paired_data(same, same, same))
    assert row.verdict == "not shown"
    # the row shows the test that leaves it undecided: McNemar vs the base (p 1), not the TOST
    assert row.test == "exact McNemar (paired)" and row.p_value == 1.0
    # both arms 20 -> 45 of 50 on the same records: equivalent and both above the baseline.
    # McNemar vs base: b = 25, c = 0, p = 2 * 0.5^25 ~ 6e-8; TOST SEAL-H vs LoRA: b = c = 0,
    # se = sqrt(1 / 52^2) = 1/52, z = 0.1 * 52 = 5.2, p = 1 - Phi(5.2) = 9.96e-8. The row's p
    # is the largest of the three (intersection-union): the TOST's.
    up = [1] * 45 + [0] * 5
    row = C.seal_h_parameters(paired_data(same, up, up))
    assert row.verdict == "supported" and row.n_needed == ""
    assert row.p_value == pytest.approx(9.9644e-8, rel=1e-4)
    # SEAL-H far below LoRA (LoRA right on 25 records SEAL-H misses): contradicted
    row = C.seal_h_parameters(paired_data(same, same, up))
    assert row.verdict == "contradicted"


def test_table1_claims_pool_the_lengths_pair_by_pair():
    # two lengths, record ids 0-9 at each: SEAL-H (and SEAL-C) wins 4 records at 100 lines and
    # 5 at 200 (b = 9, c = 0 over the 20 pairs): exact McNemar p = 2 * 0.5^9 = 1/256. At 200
    # lines alone (b = 5) p would be 1/16, not significant: pooling is what decides it.
    parts = []
    for length, wins in ((100, 4), (200, 5)):
        base = [0] * 10
        seal = [1] * wins + [0] * (10 - wins)
        d = paired_data(base, seal, seal, length=length, seal_c=seal)["seal_table1_methods"]
        parts.append(d["confirm"])
    t = {"confirm": pd.concat(parts, ignore_index=True), "params": d["params"]}
    row = C.seal_raises({"seal_table1_methods": t})
    assert "over 100-200 lines" in row.measured and "seal-h 0.45" in row.measured
    assert row.n == 20 and row.p_value == pytest.approx(2 / 2**9) and row.verdict == "supported"
    # a record whose queried line is the last is not read: there copying answers
    extra = t["confirm"][(t["confirm"].record == 9) & (t["confirm"].length == 200)]
    extra = extra.assign(record=10, position="last", exact_match=extra.method.ne("base") * 1)
    t["confirm"] = pd.concat([t["confirm"], extra], ignore_index=True)
    assert C.seal_raises({"seal_table1_methods": t}).n == 20


def test_table2_claim_pools_the_lengths_past_the_window():
    # 10 needles at each of 9000 and 12000 tokens. NTK + SEAL-C finds 3 + 4 needles NTK misses
    # (b = 7, c = 0 over the 20 pairs): exact McNemar p = 2 * 0.5^7 = 1/64; Self-Extend + SEAL-C
    # finds 4 + 4 (p = 2 * 0.5^8 = 1/128). At 12000 alone (b = 4) p = 1/8: pooling decides it.
    rows = []
    for length, ntk_wins, se_wins in ((9000, 3, 4), (12000, 4, 4)):
        arms = {
            "NTK": [0] * 10,
            "NTK + SEAL-C": [1] * ntk_wins + [0] * (10 - ntk_wins),
            "Self-Extend": [0] * 10,
            "Self-Extend + SEAL-C": [1] * se_wins + [0] * (10 - se_wins),
        }
        rows += [
            {"method": m, "length": length, "record": i, "exact_match": v}
            for m, xs in arms.items()
            for i, v in enumerate(xs)
        ]
    records = pd.DataFrame(rows)
    acc = records.groupby(["method", "length"], as_index=False).exact_match.mean().assign(n=10)
    data = {
        "seal_table2_extension": {"accuracy": acc, "records": records},
        "_sizes": {"extension_task": "needle"},
    }
    row = C.extension_recovers(data)
    assert row.verdict == "supported" and row.n == 20
    assert row.p_value == pytest.approx(1 / 64)  # the larger of the two (both must hold)
    assert "over 9000, 12000 tokens (needles) pooled" in row.measured
    assert "NTK + SEAL-C 0.35" in row.measured and "Self-Extend + SEAL-C 0.40" in row.measured
    at_long = C.compare(data["seal_table2_extension"], "NTK + SEAL-C", "NTK", 12000, "x")
    assert at_long.p_value == pytest.approx(1 / 8) and at_long.verdict == "not shown"


def test_table1_claims_hold_only_if_every_tuning_run_holds():
    # three tuning runs: runs 0 and 1 move 20 -> 45 of 50 (the hand case above), run 2 moves
    # nothing: the row is not supported, and its deciding test is run 2's
    same, up = [1] * 20 + [0] * 30, [1] * 45 + [0] * 5
    runs = [paired_data(same, up, up, seal_c=up)["seal_table1_methods"]["confirm"]] * 2
    runs.append(paired_data(same, same, same)["seal_table1_methods"]["confirm"])
    confirm = pd.concat(
        [r.assign(tuning_seed=k) for k, r in enumerate(runs)], ignore_index=True
    ).drop_duplicates(["method", "tuning_seed", "length", "record"])
    confirm = confirm[(confirm.method != "base") | (confirm.tuning_seed == 0)]
    t = {"confirm": confirm, "params": paired_data(same, up, up)["seal_table1_methods"]["params"]}
    row = C.seal_h_parameters({"seal_table1_methods": t})
    assert row.verdict == "not shown" and row.p_value == 1.0
    assert "3 tuning runs per method" in row.measured and "seal-h 0.73 (0.40-0.90)" in row.measured
    row = C.seal_raises({"seal_table1_methods": t})
    assert row.verdict == "not shown" and "run 2" in row.n_needed
    # data made before the design (no runs, no positions) is named, not misread
    old = {"confirm": confirm.drop(columns=["tuning_seed", "position"]), "params": t["params"]}
    with pytest.raises(C.MissingData, match="predates the held-out design"):
        C.seal_raises({"seal_table1_methods": old})


def test_c_beats_h_is_a_plain_superiority_test():
    # 200 pairs: base right on none, SEAL-H on 100, SEAL-C on 96 of those 100 (C - H = -0.02,
    # b = 0, c = 4: McNemar p = 0.125): not shown. No non-inferiority margin can make an
    # estimate that points the other way "supported".
    base, h, c = [0] * 200, [1] * 100 + [0] * 100, [1] * 96 + [0] * 104
    row = C.seal_c_beats_h(paired_data(base, h, base, seal_c=c))
    assert row.verdict == "not shown" and row.p_value == pytest.approx(0.125)
    assert row.difference == pytest.approx(-0.02) and "margin" not in row.test


def test_paired_claims_use_mcnemar_on_the_records():
    # SEAL-H right on 8 records the base misses, wrong on 2 it gets: b = 8, c = 2,
    # exact McNemar p = 2 * (1 + 10 + 45) / 1024 = 0.109375 -> not shown, n from Connor 1987
    base = [1] * 2 + [0] * 8 + [1] * 20 + [0] * 20
    seal_h = [0] * 2 + [1] * 8 + [1] * 20 + [0] * 20
    records = paired_data(base, seal_h, base)["seal_table1_methods"]["confirm"]
    check = C.compare({"records": records}, "seal-h", "base", 200, "SEAL-H - base")
    assert check.p_value == pytest.approx(112 / 1024)
    assert check.difference == pytest.approx(6 / 50)
    assert check.verdict == "not shown"
    from interp_seal.analysis.statistics import mcnemar_sample_size

    assert str(mcnemar_sample_size(6 / 50, 10 / 50)) in check.n_needed


def test_claims_are_computed_from_the_data(gallery, organism):
    out, _ = gallery
    claims = pd.read_csv(out / "claims.csv", keep_default_na=False, na_values=[""])
    assert list(claims.claim) == [c for c, _, _ in C.CLAIMS]
    # every claim is read at the n its registered plan names (quick sizes included)
    assert not claims.measured.str.startswith("off plan").any(), claims.measured.tolist()
    # the length claim: the base model on the fresh records whose queried line is not the
    # last, shortest vs longest length, Fisher's exact test
    t = tables(out, "seal_table1_methods")
    rec = t["confirm"]
    other = rec[(rec.method == "base") & (rec.position == "other")]
    lo, hi = (
        other[other.length == L].exact_match for L in (min(QUICK.lengths), max(QUICK.lengths))
    )
    row = claims[claims.claim == "Accuracy falls with context length"].iloc[0]
    assert row.difference == pytest.approx(lo.mean() - hi.mean(), abs=1e-4)
    from scipy.stats import fisher_exact

    expected = fisher_exact([[lo.sum(), len(lo) - lo.sum()], [hi.sum(), len(hi) - hi.sum()]]).pvalue
    assert row.p_value == pytest.approx(expected, rel=1e-2) and row.test.startswith("Fisher")
    # the pilot's per-record outcomes are its accuracies
    means = t["records"].groupby(["method", "length"]).exact_match.mean()
    for r in t["accuracy"].itertuples():
        assert means[(r.method, r.length)] == pytest.approx(r.exact_match)
    # the method claims: the fresh records, non-last, every length pooled, each run vs base
    assert (rec.seed == FRESH_SEED).all()
    assert set(rec.method) == {"base", "seal-h", "seal-c", "seal-l"}
    assert set(rec.tuning_seed) == set(range(QUICK.tuning_seeds))
    from interp_seal.analysis.statistics import mcnemar_exact

    y = other.sort_values(["length", "record"]).exact_match.to_numpy()
    diffs = []
    for m in ("seal-h", "seal-c"):
        x = rec[(rec.method == m) & (rec.position == "other")]
        diffs.append(mcnemar_exact(x.sort_values(["length", "record"]).exact_match.to_numpy(), y))
    row = claims[claims.claim == "SEAL-H and SEAL-C raise long-context accuracy"].iloc[0]
    assert "McNemar" in row.test and row.n == len(y)
    assert any(row.difference == pytest.approx(d.difference, abs=1e-4) for d in diffs)
    # fresh records: the confirm table's baseline and Fig. 2d's records (``FRESH_SEED``)
    confirm = tables(out, "seal_fig2b_quadrants")["confirm"]
    assert set(confirm.unit) == {"baseline", "best", "worst"} and (confirm.seed == FRESH_SEED).all()
    cfg = LineRetrievalConfig(num_lines=QUICK.long)
    fresh = line_retrieval.generate(cfg, QUICK.confirm_n, FRESH_SEED)
    assert confirm.record.nunique() == QUICK.confirm_n
    direct = evaluate_lengths(organism, {QUICK.long: fresh}, progress=False)
    assert confirm[confirm.unit == "baseline"].exact_match.mean() == pytest.approx(
        direct.exact_match.iloc[0]
    )
    scaling = tables(out, "seal_fig2d_scaling")
    per = scaling["records"].groupby(["unit", "length"]).exact_match.mean()
    sw = scaling["sweep"][scaling["sweep"].metric == "exact_match"]
    for r in sw.itertuples():
        assert per[(r.table, r.length)] == pytest.approx(r.value)
        assert per[("baseline", r.length)] == pytest.approx(r.baseline)
    # its curves carry 95 % Wilson intervals over the confirm_n fresh records of each point
    from interp_seal.analysis.statistics import wilson
    from interp_seal.figures.registry import BY_NAME

    base = BY_NAME["seal_fig2d_scaling"].draw(scaling).data[0]
    for v, up, down in zip(base.y, base.error_y.array, base.error_y.arrayminus, strict=True):
        lo, hi = wilson(v * QUICK.confirm_n, QUICK.confirm_n)
        assert (v - down, v + up) == pytest.approx((lo, hi))
    # the claimed scaling's replication: replicate_n records of REPLICATE_SEED at the long
    # length, a plain evaluation's for the baseline; the claim is their McNemar test alone
    rep = scaling["replicate"]
    assert (rep.seed == REPLICATE_SEED).all() and set(rep.length) == {QUICK.long}
    assert set(rep.unit) == {"baseline", "Q1 x 0.9 + Q3 x 1.1"}
    assert "Q3 x 0.9" in set(scaling["records"].unit)  # the paper's control, drawn
    assert rep.record.nunique() == QUICK.replicate_n
    third = line_retrieval.generate(cfg, QUICK.replicate_n, REPLICATE_SEED)
    direct = evaluate_lengths(organism, {QUICK.long: third}, progress=False)
    assert rep[rep.unit == "baseline"].exact_match.mean() == pytest.approx(
        direct.exact_match.iloc[0]
    )
    x, y = (
        rep[rep.unit == u].sort_values("record").exact_match.to_numpy()
        for u in ("Q1 x 0.9 + Q3 x 1.1", "baseline")
    )
    row = claims[claims.paper == "SEAL Fig. 2d"].iloc[0]
    assert row.n == QUICK.replicate_n and row.p_value == pytest.approx(mcnemar_exact(x, y).p_value)
    assert f"seed {REPLICATE_SEED}" in row.measured
    # drawn beside the curves: open markers at the replication's rates, their Wilson intervals
    drawn = BY_NAME["seal_fig2d_scaling"].draw(scaling).data[-2:]
    for trace, x_ in zip(drawn, (y, x), strict=True):
        assert trace.y[0] == pytest.approx(x_.mean()) and "replication" in trace.name
        lo, hi = wilson(float(x_.sum()), len(x_))
        assert trace.y[0] - trace.error_y.arrayminus[0] == pytest.approx(lo)
    qa = tables(out, "mudaf_table2_methods")
    per = qa["records"].groupby("method").exact_match.mean()
    for r in qa["accuracy"].itertuples():
        assert per[r.method] == pytest.approx(r.exact_match)


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
    print_ = fingerprint(["organism", QUICK.as_dict()], {"x": 1})
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
    # a point computed for other sizes is not reused: it is computed again, with a warning
    # (a gallery refuses other sizes as a whole, by run.json; records.recompute_changed)
    other = FigureRun("organism", DEFAULT, tmp_path, progress=False)
    with pytest.warns(UserWarning, match="computed on other inputs"):
        assert other.rows("points", [{"x": 1}], lambda key: {"y": 0}).y.tolist() == [0]


def test_compute_time_counts_the_timed_stores_of_earlier_runs(tmp_path, monkeypatch):
    """A store built in ``FigureRun.timed`` (a sweep, a training) books its own time beside it,
    while it runs and when it ends; nested rows and stores book only theirs (a hand-driven
    clock gives exact seconds); a later run that reuses them counts each booking once, and a
    reused row counts the stores it built."""

    class Clock:  # CPU seconds t, wall seconds 2 t
        t = 0.0

        def process_time(self):
            return self.t

        def perf_counter(self):
            return 2 * self.t

    clock = Clock()
    monkeypatch.setattr(run_module, "time", clock)
    monkeypatch.setattr(run_module, "BOOK_EVERY", 0.02)
    work = tmp_path / "work"
    first = FigureRun("organism", QUICK, tmp_path, progress=False)

    def row(key):
        clock.t += 2
        with first.timed("scales"):
            clock.t += 4
        clock.t += 1
        return {"y": 1}

    with first.timed("sweep") as folder:
        assert folder == work / "sweep"
        clock.t = 1
        deadline = time.time() + 10
        while not (folder / run_module.LEDGER).exists() and time.time() < deadline:
            time.sleep(0.01)  # booked while it runs
        first.rows("points", [{"x": 1}], row)
        clock.t = 10

    def booked(name):
        lines = (work / name / run_module.LEDGER).read_text().splitlines()
        entries = [json.loads(line) for line in lines]
        assert len({e["key"] for e in entries}) == 1
        return entries[-1]["cpu_seconds"], entries[-1]["wall_seconds"]

    assert booked("sweep") == (10 - 7, 20 - 14)  # less the row's gross 7 s
    assert booked("scales") == (4, 8)
    (point,) = [json.loads(x) for x in (work / "points" / "records.jsonl").read_text().splitlines()]
    assert (point["cpu_seconds"], point["wall_seconds"], point["stores"]) == (3, 6, ["scales"])
    assert (first.earlier.cpu, first.earlier.wall) == (0, 0)  # its own: in the driver's clock

    later = FigureRun("organism", QUICK, tmp_path, progress=False)
    later.rows("points", [{"x": 1}], lambda key: 1 / 0)  # reused, with the scales it tuned
    assert (later.earlier.cpu, later.earlier.wall) == (3 + 4, 6 + 8)
    with later.timed("sweep"), later.timed("scales"):
        pass
    later.rows("points", [{"x": 1}], lambda key: 1 / 0)
    assert (later.earlier.cpu, later.earlier.wall) == (3 + 4 + 3, 6 + 8 + 6)  # each once


# -- SmolLM2: the real-model gallery in --quick form -----------------------------------------
SMOLLM2_FAST = (
    "seal_fig4_dla",
    "seal_table2_extension",
    "mudaf_fig3_scores",
    "mudaf_fig4_masking",
)  # ~90 s of CPU; the rest of the quick gallery (tunings of five methods and MuDAF, the
# 270-head sweeps) runs in the slow test


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2")


@pytest.fixture(scope="module")
def smollm2_gallery(tmp_path_factory, smollm2):
    out = tmp_path_factory.mktemp("gallery") / "smollm2"
    result = regenerate("smollm2", out, quick=True, only=list(SMOLLM2_FAST), progress=False)
    return out, result


def smollm2_format(samples, tokenizer, lead):
    """The SmolLM2 preset's format built here by hand: lead-in forced, then its chat template."""
    from interp_seal.tasks.chat import force_prefix, wrap_samples

    return wrap_samples([force_prefix(s, lead(s)) for s in samples], "tokenizer", tokenizer)


def smollm2_run_sizes():
    """The quick SmolLM2 sizes a gallery computes with: its registered preset (the short
    essays, repeated) with plan amendment 4's long haystack, never repeated."""
    from interp_seal.figures import plan as P

    Q = preset_sizes("smollm2", quick=True)
    assert (Q.haystack, Q.haystack_repeat) == ("essays", True)
    return P.amended_sizes(Q, P.gallery_amendments("smollm2", Q))


LONG_OPENING = "There is a particular kind of humility"  # the long haystack's, not the essays'


def smollm2_needles(tokenizer, lengths):
    Q = smollm2_run_sizes()
    from interp_seal.tasks import NeedleConfig, needle

    assert (Q.haystack, Q.haystack_repeat) == ("long", False)
    cfg = NeedleConfig(
        context_lengths=lengths,
        depths=Q.needle_depths,
        haystack=needle.read_haystack("long"),
        repeat=False,
        answer="key_phrase",
    )
    return smollm2_format(needle.generate(cfg, tokenizer, Q.needle_n, 0), tokenizer, needle.lead_in)


def smollm2_questions(tokenizer):
    Q = preset_sizes("smollm2", quick=True)
    from interp_seal.tasks import passages as P

    raw = P.generate(PassagesConfig(num_passages=Q.retrieval_passages), Q.retrieval_n, 0)
    return smollm2_format(raw, tokenizer, P.lead_in)


def test_a_needle_grid_longer_than_its_haystack_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    from interp_seal.figures import driver
    from interp_seal.tasks.needle import haystack_digest, read_haystack

    long_grid = dataclasses.replace(OTHER_QUICK, needle_lengths=(300, 100_000))
    monkeypatch.setattr(driver, "preset_sizes", lambda model, quick: long_grid)
    with pytest.raises(ValueError, match=r"haystack 'long': the haystack has \d+ tokens, but a "):
        regenerate("organism", tmp_path / "g", quick=True, only=["seal_fig5_needle"], png=False)
    assert not (tmp_path / "g").exists()
    # the needles of a model without a preset are hidden in the long haystack
    run = FigureRun("organism", OTHER_QUICK, tmp_path / "r", progress=False)
    (sample,) = run.samples("needle", 1, seed=0, depths=(50,))
    assert sample.meta["haystack"] == haystack_digest(read_haystack("long"))


def test_the_smollm2_preset_is_chosen_and_recorded():
    SMOLLM2, SMOLLM2_QUICK = preset_sizes("smollm2"), preset_sizes("smollm2", quick=True)

    assert preset_sizes("smollm2") == SMOLLM2 and SMOLLM2_QUICK.preset == "smollm2-quick"
    assert preset_sizes("organism") is DEFAULT and preset_sizes("organism", quick=True) is QUICK
    # another model gets the long haystack, never repeated; the organism its own, never
    # repeated; SmolLM2, made before the field existed, keeps the short one, repeated, and its
    # sizes (and records) read as before
    assert preset_sizes("/some/ckpt") is OTHER and preset_sizes("/ckpt", quick=True) is OTHER_QUICK
    assert OTHER == dataclasses.replace(DEFAULT, haystack="long", haystack_repeat=False)
    assert {"haystack": "long", "haystack_repeat": False}.items() <= OTHER.as_dict().items()
    for sizes in (DEFAULT, QUICK):
        assert (sizes.haystack, sizes.haystack_repeat) == ("organism", False)
        assert {"haystack": "organism", "haystack_repeat": False}.items() <= sizes.as_dict().items()
    for sizes in (SMOLLM2, SMOLLM2_QUICK):
        assert (sizes.haystack, sizes.haystack_repeat) == ("essays", True)
        assert "haystack" not in sizes.as_dict() and "haystack_repeat" not in sizes.as_dict()
    committed = json.loads(Path("figures/smollm2/run.json").read_text())
    assert json.loads(json.dumps(SMOLLM2.as_dict())) == committed["sizes"]
    d = SMOLLM2.as_dict()
    assert (d["preset"], d["index_style"], d["chat_template"], d["lead_in"]) == (
        "smollm2",
        "integers",
        "tokenizer",
        True,
    )
    # the needle grid reaches 4K+ tokens and SEAL Table 2 runs past the 8K window
    assert max(SMOLLM2.needle_lengths) >= 4000 and min(SMOLLM2.extension_lengths) > 8192
    # the organism's sizes read back exactly as its committed run.json holds them
    committed = json.loads(Path("figures/organism/run.json").read_text())
    assert json.loads(json.dumps(DEFAULT.as_dict())) == committed["sizes"]
    assert committed["model"] == "organism"


def test_the_run_makes_every_sample_in_the_smollm2_format(smollm2, tmp_path):
    """``FigureRun.samples`` against the evaluation's own record maker and the hand-built format:
    the same prompts and answers for line records, needles, passage questions and tuning data."""
    from interp_seal.evaluation import line_retrieval_samples
    from interp_seal.figures.run import DATA_SEED

    Q = smollm2_run_sizes()
    registered = preset_sizes("smollm2", quick=True)

    run = FigureRun("smollm2", Q, tmp_path, registered=registered, progress=False)
    tok = smollm2.tokenizer
    mine = run.line_records((3, 7), 2, seed=1)
    theirs = line_retrieval_samples(
        tok, (3, 7), n=2, seed=1, index_style="integers", chat_template="tokenizer"
    )
    for L in (3, 7):
        assert [(s.prompt, s.answer) for s in mine[L]] == [(s.prompt, s.answer) for s in theirs[L]]
    assert "line 1: REGISTER_CONTENT is <" in mine[3][0].prompt
    needles = run.samples("needle", Q.needle_n, seed=0)
    assert [s.prompt for s in needles] == [s.prompt for s in smollm2_needles(tok, Q.needle_lengths)]
    assert all(LONG_OPENING in s.prompt for s in needles)
    for s in needles:  # the key phrase finishes the needle sentence the forced lead-in starts
        sentence, key = s.prompt[slice(*s.needle)], s.answer.strip()
        assert sentence.index(key) > 0 and "<|im_start|>assistant\n" in s.prompt
        assert s.prompt.endswith("assistant\n" + sentence[: sentence.index(key)].rstrip())
    questions = run.samples("passages", Q.retrieval_n, seed=0, size=Q.retrieval_passages)
    assert [(s.prompt, s.answer) for s in questions] == [
        (s.prompt, s.answer) for s in smollm2_questions(tok)
    ]
    for s in questions:
        assert s.prompt.endswith(" is") or s.prompt.endswith(" born in")
        assert s.answer.strip() in s.prompt[slice(*s.passages[s.golden[0]])]
    train = run.tuning_samples("seal-h")
    assert len(train) == Q.tune_n and all(s.meta["num_lines"] == Q.tune_lines for s in train)
    assert all("<|im_start|>assistant" in s.prompt for s in train)
    evaluation = {s.prompt for s in run.samples("line_retrieval", Q.n, seed=0, size=Q.tune_lines)}
    assert DATA_SEED != 0 and not evaluation & {s.prompt for s in train}


@pytest.mark.timeout(1800)  # the fixture's regeneration; ~90 s of CPU, slower on a busy machine
def test_smollm2_quick_figures_equal_the_analyses_in_its_format(smollm2_gallery, smollm2):
    from interp_seal.analysis.retrieval_scores import passage_retrieval_scores
    from interp_seal.evaluation import teacher_force
    from interp_seal.figures.seal import past_the_window

    Q = preset_sizes("smollm2", quick=True)

    out, result = smollm2_gallery
    assert sorted(result.computed) == sorted(SMOLLM2_FAST)
    run = json.loads((out / "run.json").read_text())
    assert run["model"] == "smollm2" and run["sizes"]["preset"] == "smollm2-quick"
    tok = smollm2.tokenizer
    # SEAL Table 2 on needles: the base row is the hand-built needles scored as they are
    t2 = tables(out, "seal_table2_extension")
    acc = t2["accuracy"]
    assert set(acc.length) == set(Q.extension_lengths)
    assert (acc.n == Q.needle_n * len(Q.needle_depths)).all()
    assert any((out / "work").glob("seal-c_*_needle*_extNTK*"))
    L = Q.extension_lengths[0]
    handle, _ = past_the_window(smollm2, None)
    hand = smollm2_needles(tok, (L,))
    assert all(LONG_OPENING in x.prompt for x in hand)  # the gallery ran under amendment 4
    assert json.loads((out / "plan_amendment_4.json").read_text())["sizes"]["haystack"] == "long"
    direct = [int(x.exact_match) for x in teacher_force(handle, hand)]
    rec = t2["records"]
    got = rec[(rec.method == "base") & (rec.length == L)].sort_values("record").exact_match
    assert got.tolist() == direct
    claims = pd.read_csv(out / "claims.csv", keep_default_na=False, na_values=[""])
    row = claims[claims.paper == "SEAL Table 2"].iloc[0]
    assert f"over {L} tokens (needles) pooled" in row.measured
    # MuDAF: passage questions restated as their answer's start, in the template
    questions = smollm2_questions(tok)
    scores = teacher_force(smollm2, questions)
    masking = tables(out, "mudaf_fig4_masking")["masking"]
    none = masking[masking.strategy == "none"].iloc[0]
    assert none.exact_match == pytest.approx(np.mean([s.exact_match for s in scores]))
    assert none.n_samples == Q.retrieval_n
    heads = tables(out, "mudaf_fig3_scores")["heads"].sort_values(["layer", "head"])
    fresh = passage_retrieval_scores(smollm2, questions, progress=False).heads
    fresh = fresh.sort_values(["layer", "head"])
    np.testing.assert_allclose(heads.f1, fresh.f1, atol=1e-9)
    np.testing.assert_array_equal(heads["rank"], fresh["rank"])
    # SEAL Fig. 4 on templated records: the digits are the value's (not the bare space that
    # opens a BPE answer), and every number is the model's own
    from interp_seal.evaluation import line_retrieval_samples

    Q = preset_sizes("smollm2", quick=True)

    records = {
        seed: line_retrieval_samples(
            smollm2.tokenizer,
            (Q.long,),
            n=n,
            seed=seed,
            index_style="integers",
            chat_template="tokenizer",
        )[Q.long]
        for seed, n in ((0, Q.n), (FRESH_SEED, 30))
    }
    check_digit_effects(tables(out, "seal_fig4_dla"), smollm2, records)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # every quick SmolLM2 figure: 48 min beside two background runs
def test_smollm2_quick_gallery_is_complete(smollm2_gallery, smollm2):
    """The whole quick SmolLM2 gallery: every figure produced; Table 1 equal to the evaluation's
    own numbers in SmolLM2's format, the needle grid to the hand-built needles, MuDAF Table 2 to
    teacher forcing, the head sweep to a fresh one."""
    from interp_seal.evaluation import line_retrieval_samples, teacher_force

    Q = preset_sizes("smollm2", quick=True)

    out, _ = smollm2_gallery
    result = regenerate("smollm2", out, quick=True, progress=False, png=False)
    assert sorted(result.computed + result.reused) == sorted(f.name for f in FIGURES)
    tok = smollm2.tokenizer
    acc = tables(out, "seal_table1_methods")["accuracy"]
    direct = evaluate_line_retrieval(
        smollm2,
        Q.lengths,
        n=Q.n,
        seed=0,
        index_style="integers",
        chat_template="tokenizer",
        progress=False,
    )
    base = acc[acc.method == "base"].sort_values("length")
    np.testing.assert_allclose(base.exact_match, direct.exact_match)
    np.testing.assert_allclose(base.n_tokens, direct.n_tokens)
    samples = smollm2_needles(tok, Q.needle_lengths)
    fig5 = tables(out, "seal_fig5_needle")
    expected = [int(x.exact_match) for x in teacher_force(smollm2, samples)]
    rec = fig5["records"]
    assert rec[rec.method == "base"].sort_values("record").exact_match.tolist() == expected
    grid = fig5["grid"].groupby("method").exact_match.mean()
    assert grid["base"] == pytest.approx(np.mean(expected))
    claims = pd.read_csv(out / "claims.csv", keep_default_na=False, na_values=[""])
    assert claims[claims.paper == "SEAL Fig. 5"].iloc[0].n == len(samples)
    scores = teacher_force(smollm2, smollm2_questions(tok))
    qa = tables(out, "mudaf_table2_methods")["accuracy"].set_index("method").loc["base"]
    assert qa.exact_match == pytest.approx(np.mean([s.exact_match for s in scores]))
    stored = tables(out, "seal_fig2b_quadrants")["sweep"]
    records = line_retrieval_samples(
        tok, (Q.mid, Q.long), n=Q.sweep_n, seed=0, index_style="integers", chat_template="tokenizer"
    )
    fresh = head_sweep(smollm2, records)
    key = ["layer", "head", "length", "metric"]
    a = stored.sort_values(key).reset_index(drop=True)
    b = fresh.sort_values(key).reset_index(drop=True)
    np.testing.assert_allclose(a.value, b.value, rtol=1e-5, atol=1e-6)


def test_table2_reads_and_tunes_past_the_trained_window(tmp_path, organism):
    """SEAL Table 2 on needles past the window (the SmolLM2 preset's form, here on the organism's
    4,096 positions): the extensions' SEAL-C tunes there, every method is scored there, and the
    base row is the model read past its window as is."""
    import dataclasses

    from interp_seal.evaluation import teacher_force
    from interp_seal.figures import seal as S

    window = organism.spec.max_positions
    sizes = dataclasses.replace(
        QUICK,
        extension_task="needle",
        extension_lengths=(window + 300,),
        extension_tune_n=2,
        needle_depths=(50,),
    )
    run = FigureRun("organism", sizes, tmp_path, progress=False)
    t = S.table2_compute(run)
    acc = t["accuracy"]
    assert (acc.n_tokens > window).all() and (acc.n == 1).all()
    assert set(acc.method) == {
        "base",
        "NTK",
        "NTK + SEAL-C",
        "Self-Extend",
        "Self-Extend + SEAL-C",
        "SEAL-C",
    }
    trained = sorted(p.name for p in (tmp_path / "work").glob("seal-c_*_needle*"))
    assert len(trained) == 2 and all("_n2_" in name for name in trained)
    assert organism.model.config.max_position_embeddings == window  # restored after tuning
    with pytest.raises(ValueError, match="context window"):  # the plain path still refuses
        teacher_force(organism, run.samples("needle", 1, seed=0, size=window + 300))
    base = acc.set_index("method").loc["base"]
    handle, _ = S.past_the_window(organism, None)
    direct = teacher_force(handle, run.samples("needle", 1, seed=0, size=window + 300))
    assert base.exact_match == pytest.approx(float(direct[0].exact_match))
    assert base.n_tokens == direct[0].n_tokens
    assert S.table2_read(t).startswith(f"At {window + 300:,} tokens (needles): base ")


def test_table2_reading_names_its_unit():
    """Lines or tokens, read off the records (a gallery page said "12000 lines" of needles)."""
    from interp_seal.figures import seal as S

    lines = pd.DataFrame(
        {
            "method": ["base", "NTK"],
            "length": [250, 250],
            "n_tokens": [3319.5, 3319.5],
            "exact_match": [0.0, 0.25],
        }
    )
    assert S.table2_read({"accuracy": lines}) == "At 250 lines: base 0.00, NTK 0.25."
    needles = lines.assign(length=12000, n_tokens=11886.6)
    assert (
        S.table2_read({"accuracy": needles}) == "At 12,000 tokens (needles): base 0.00, NTK 0.25."
    )


def test_window_mark_has_room_for_its_label_left_of_every_length():
    """SEAL Table 2 on needles: the window (8,192) lies left of every length; its label, drawn
    left of the mark, needs room inside the axis (a gallery PNG had it cut off)."""
    fig = mark_window(
        go.Figure(), pd.DataFrame({"length": [9000, 12000]}), window=8192, unit="tokens"
    )
    (mark,) = fig.layout.shapes
    assert mark.x0 == mark.x1 == 8192
    left, right = fig.layout.xaxis.range
    assert left == pytest.approx(8192 - 0.3 * (12000 - 8192)) and right == 12000 + 150
    assert fig.layout.annotations[0].text == "max_position_embeddings<br>8,192 tokens"
