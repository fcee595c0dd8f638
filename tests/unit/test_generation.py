"""Generate-then-score beside teacher forcing, checked against HF ``generate`` and by hand."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

from interp_seal.evaluation import evaluate_generated, score_generated, teacher_force
from interp_seal.models import load_model
from interp_seal.tasks import LineRetrievalConfig, Sample, line_retrieval


@pytest.fixture(scope="module")
def organism():
    return load_model("organism")


def test_generated_verdicts_match_hf_generate_and_longchat_scoring(organism):
    samples = [
        s for n in (10, 200) for s in line_retrieval.generate(LineRetrievalConfig(num_lines=n), 4)
    ]
    result = evaluate_generated(organism, samples, max_new_tokens=6, progress=False)
    records, eos = result.records, organism.tokenizer.eos_token_id
    for sample, row in zip(samples, records.itertuples(), strict=True):
        ids = organism.tokenizer(sample.prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = organism.model.generate(
                ids, max_new_tokens=6, do_sample=False, eos_token_id=eos, pad_token_id=eos
            )[0, ids.shape[1] :].tolist()
        text = organism.tokenizer.decode([t for t in out if t != eos])
        assert row.generated == text
        found = re.findall(r"\d+", text)  # LongChat: the last integer of the output
        correct = bool(found) and int(found[-1]) == sample.meta["expected_number"]
        assert row.generated_correct == correct and row.score == float(correct)
        assert row.agree == (correct == row.exact_match)
        assert row.length == sample.meta["num_lines"]
    assert records.exact_match.tolist() != [True] * 8  # 200 lines: some failures to compare
    summary = result.summary.set_index("length")
    for length, group in records.groupby("length"):
        assert summary.loc[length, "agreement"] == group.agree.mean()
        assert summary.loc[length, "generated_accuracy"] == group.generated_correct.mean()
        assert summary.loc[length, "n"] == 4
    # scores already computed (the CLI's path) give the same evaluation without recomputing them
    forced = teacher_force(organism, samples)
    reused = evaluate_generated(organism, samples, max_new_tokens=6, progress=False, forced=forced)
    pd.testing.assert_frame_equal(reused.records, records)
    assert records.exact_match.tolist() == [s.exact_match for s in forced]


def test_qa_outputs_are_scored_by_longbench_f1():
    sample = Sample(
        task="passages", prompt="Q?", answer=" Paris", meta={"answers": ["Paris France"]}
    )
    # normalised "paris" vs "paris france": precision 1, recall 1/2, F1 = 2/3
    assert score_generated(sample, "Paris.") == pytest.approx(2 / 3)
    assert score_generated(sample, "the Paris, France") == 1.0
    needle = Sample(task="needle", prompt="Q?", answer=" The best thing is a sandwich.")
    # "best thing is sandwich" (articles dropped) vs "sandwich": P = 1, R = 1/4, F1 = 0.4
    assert score_generated(needle, "a sandwich") == pytest.approx(0.4)


def test_bad_budget_is_refused(organism):
    sample = line_retrieval.generate(LineRetrievalConfig(num_lines=3), 1)[0]
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        evaluate_generated(organism, [sample], max_new_tokens=0)
