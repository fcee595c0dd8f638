"""SEAL Table 3 (``figures.generalization``) on the organism with ``--quick`` sizes: its QA
numbers equal the QA primitive called here on each variant, its perplexity equals a plain HF
forward's ``labels=`` loss, the in-domain scales are tuned on other questions than the ones
scored, and the drawing and reading show exactly the tables."""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from interp_seal.analysis.statistics import mcnemar_exact
from interp_seal.evaluation import teacher_force
from interp_seal.figures import QUICK
from interp_seal.figures import generalization as G
from interp_seal.figures.mudaf import eval_samples
from interp_seal.figures.registry import FIGURES
from interp_seal.figures.run import FigureRun
from interp_seal.tasks.needle import read_haystack
from interp_seal.tuning.scales import load_scales
from interp_seal.viz import paper_figures as pv
from interp_seal.viz.evaluation import wilson_error_y


@pytest.fixture(scope="module")
def computed(tmp_path_factory):
    run = FigureRun("organism", QUICK, tmp_path_factory.mktemp("table3"), progress=False)
    return run, G.compute(run)


def test_exact_match_equals_the_qa_primitive_on_each_variant(computed):
    """Per question and on average, through the hooked edit (not the merged weights the figure
    evaluates), so the scales each variant claims are the ones it was scored with."""
    run, t = computed
    questions = eval_samples(run)
    assert len(questions) == QUICK.retrieval_n
    acc, records = t["accuracy"].set_index("variant"), t["records"]
    assert list(acc.index) == list(G.VARIANTS)
    logprobs = {}
    for variant, iv in G.scales(run).items():
        scores = teacher_force(run.handle, questions, intervention=iv)
        expected = [int(s.exact_match) for s in scores]
        got = records[records.variant == variant].sort_values("record")
        assert got.record.tolist() == list(range(len(questions)))
        assert got.exact_match.tolist() == expected, variant
        assert acc.loc[variant, "n"] == len(questions)
        assert acc.loc[variant, "exact_match"] == pytest.approx(np.mean(expected))
        logprobs[variant] = np.mean([s.answer_logprob for s in scores])
        assert acc.loc[variant, "answer_logprob"] == pytest.approx(logprobs[variant], abs=1e-4)
    # the five variants are five different models (the answer log-probabilities tell them apart)
    assert len({round(v, 4) for v in logprobs.values()}) == len(G.VARIANTS)
    assert (acc.domain == [G.VARIANTS[v][1] for v in acc.index]).all()


def test_perplexity_equals_a_plain_hf_forward(computed):
    """exp of the token-weighted mean of HF's ``labels=`` loss over the essays, the scales
    hooked on the HF model: independent of the engine's last layer and of merging."""
    run, t = computed
    ability = t["ability"].set_index("variant")
    essays = G.heldout_essays()
    assert len(essays) == 4 and "\n\n".join(essays) == read_haystack("essays").strip()
    for variant, iv in G.scales(run).items():
        total, tokens = 0.0, 0
        for text in essays:
            ids = torch.tensor([run.handle.tokenizer(text)["input_ids"]])
            with torch.no_grad(), nullcontext() if iv is None else run.handle.edit(iv):
                loss = run.handle.model(input_ids=ids, labels=ids).loss
            total += float(loss) * (ids.shape[1] - 1)
            tokens += ids.shape[1] - 1
        assert ability.loc[variant, "tokens"] == tokens
        assert ability.loc[variant, "perplexity"] == pytest.approx(
            math.exp(total / tokens), rel=1e-5
        ), variant
    assert ability.perplexity.nunique() == len(G.VARIANTS)


def test_in_domain_scales_are_tuned_on_other_questions(computed):
    run, _ = computed
    tuning = run.tuning_samples("seal-h", "passages")
    scored = {s.prompt for s in eval_samples(run)}
    assert len(tuning) == QUICK.tune_n and not scored & {s.prompt for s in tuning}
    assert not any(essay in s.prompt for s in tuning for essay in G.heldout_essays())
    for g, method in (("head", "seal-h"), ("channel", "seal-c")):
        files = sorted(run.out.joinpath("work").glob(f"{method}_*_passages*/scales.safetensors"))
        assert len(files) == 1
        stored = load_scales(files[0], run.handle.spec)
        assert stored.task == "passages" and stored.hyperparameters["num_passages"] == (
            QUICK.retrieval_passages
        )
        qa = run.seal_scales(g, task="passages").scale
        assert not torch.equal(qa, run.seal_scales(g).scale)
    with pytest.raises(ValueError, match="task"):
        run.seal_scales("head", task="needle")
    with pytest.raises(ValueError, match="needle_tokens"):
        run.seal_scales("head", task="passages", needle_tokens=300)


def test_drawing_and_reading_show_the_tables(computed):
    _, t = computed
    fig = G.draw(t)
    acc = t["accuracy"].set_index(["method", "domain"])
    ppl = t["ability"].set_index(["method", "domain"]).perplexity
    qa = [tr for tr in fig.data if tr.xaxis == "x"]
    lm = [tr for tr in fig.data if tr.xaxis == "x2"]
    methods = ["base", "seal-h", "seal-c"]
    assert [tr.legendgroup for tr in qa] == methods == [tr.legendgroup for tr in lm]
    for method, bars, curve in zip(methods, qa, lm, strict=True):
        keys = [("base", "untuned")] * 2 if method == "base" else [(method, G.OUT), (method, G.IN)]
        p = [acc.loc[k, "exact_match"] for k in keys]
        assert list(bars.y) == pytest.approx(p)
        err = wilson_error_y(p, [acc.loc[k, "n"] for k in keys])
        assert list(bars.error_y.array) == pytest.approx(err["array"])
        assert list(curve.y) == pytest.approx([ppl[k] for k in keys])
    assert "exact match" in fig.layout.yaxis.title.text
    assert "perplexity" in fig.layout.yaxis2.title.text
    text = G.read(t)
    rec = t["records"]
    for variant in ("seal-h lines", "seal-c QA"):
        x = rec[rec.variant == variant].exact_match.to_numpy()
        y = rec[rec.variant == "base"].exact_match.to_numpy()
        assert f"p = {mcnemar_exact(x, y).p_value:.2g}" in text
    assert f"base {pv.compact_number(t['ability'].perplexity.iloc[0])}," in text
    # after Sec. 7's Table 2 / Fig. 6 (Sec. 8 comes next in the paper), last of SEAL's figures
    names = [f.name for f in FIGURES]
    at = names.index("seal_table3_generalization")
    assert names.index("seal_table2_extension") < at
    assert names[at - 1].startswith("seal_") and names[at + 1].startswith("mudaf_")
