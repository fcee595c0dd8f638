"""QRHead scores and QRRetriever ranking against brute force on full eager attention patterns.

The reference runs each prompt (and its null-query twin) through an eager-attention copy of the
checkpoint with ``output_attentions=True`` and sums the full T x T weights by loops over the
query and passage token spans.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import build_checkpoint
from transformers import AutoModelForCausalLM

from interp_seal.analysis.qrhead import (
    QRConfig,
    null_prompt,
    passage_mass,
    qr_scores,
    rank_passages,
    recall_at_k,
    top_heads,
)
from interp_seal.models import load_model
from interp_seal.tasks import passages
from interp_seal.tasks.sample import Sample


@pytest.fixture(scope="module")
def mdqa() -> list[Sample]:
    return passages.generate(passages.PassagesConfig(num_passages=4, filler_sentences=0), 3, 0)


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("qr_llama"), "llama")
    return load_model(path), AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")


def brute_force(eager, sample: Sample, tokenizer, null_query: str = "N/A"):
    """``(L, H, P)`` query-to-passage mass (mean over query tokens) under the query and the
    null query, by loops over the full eager patterns; and the per-token masses ``(L, H, K)``."""
    out, tokens = [], []
    for prompt in (sample.prompt, null_prompt(sample, null_query)):
        enc = Sample(
            task="passages", prompt=prompt, answer=sample.answer, passages=sample.passages
        ).encode(tokenizer)
        query_start = enc.passages[-1][1]
        query = range(query_start, enc.answer_start)
        with torch.no_grad():
            patterns = eager(enc.prompt_ids[None], output_attentions=True).attentions
        L, H = len(patterns), patterns[0].shape[1]
        mass = np.zeros((L, H, len(enc.passages)))
        per_token = np.zeros((L, H, query_start))
        for layer, pattern in enumerate(patterns):
            pattern = pattern[0].double()
            for head in range(H):
                for t in range(query_start):
                    per_token[layer, head, t] = sum(float(pattern[head, q, t]) for q in query)
                for p, (start, end) in enumerate(enc.passages):
                    mass[layer, head, p] = per_token[layer, head, start:end].sum()
        out.append(mass / len(query))
        tokens.append(per_token / len(query))
    return out, tokens


def test_qr_scores_and_ranking_match_brute_force(family_checkpoint, mdqa):
    handle = load_model(family_checkpoint)
    eager = AutoModelForCausalLM.from_pretrained(family_checkpoint, attn_implementation="eager")
    scores = qr_scores(handle, mdqa, progress=False)
    heads = [(0, 1), (1, 2), (1, 3)]
    ranking = rank_passages(handle, mdqa, heads, progress=False)
    expected_score, expected_raw = [], []
    for i, sample in enumerate(mdqa):
        (raw, null), _ = brute_force(eager, sample, handle.tokenizer)
        got = scores.passages[i]
        np.testing.assert_allclose(got["raw"], raw, atol=1e-5)
        np.testing.assert_allclose(got["calibrated"], raw - null, atol=1e-5)
        golden = list(sample.golden)
        expected_score.append((raw - null)[..., golden].sum(-1))
        expected_raw.append(raw[..., golden].sum(-1))
        # QRRetriever: the selected heads' calibrated masses summed, passages sorted
        summed = sum((raw - null)[layer, head] for layer, head in heads)
        mine = ranking[ranking["sample"] == i]
        np.testing.assert_allclose(mine["score"].to_numpy(), summed, atol=1e-5)
        order = np.argsort(-summed, kind="stable")
        assert mine.sort_values("rank")["passage"].tolist() == order.tolist()
        assert mine["golden"].tolist() == [p in sample.golden for p in range(len(summed))]
    table = scores.heads.sort_values(["layer", "head"])
    np.testing.assert_allclose(table["qr_score"], np.mean(expected_score, 0).ravel(), atol=1e-5)
    np.testing.assert_allclose(table["qr_score_raw"], np.mean(expected_raw, 0).ravel(), atol=1e-5)
    assert (scores.heads["qr_score"].diff().dropna() <= 0).all()  # ranked best first
    assert top_heads(scores.heads, 2) == list(
        zip(scores.heads["layer"][:2], scores.heads["head"][:2], strict=True)
    )


def test_outlier_filter_matches_brute_force(llama_pair, mdqa):
    """QRHead's code: per passage, tokens at or below mean - 2 std dropped before the sum; in
    the ranking, after summing the selected heads."""
    handle, eager = llama_pair
    config = QRConfig(outlier_std=2.0)
    scores = qr_scores(handle, mdqa[:1], config, progress=False)
    heads = [(0, 0), (1, 3)]
    ranking = rank_passages(handle, mdqa[:1], heads, config, progress=False)
    _, (raw, null) = brute_force(eager, mdqa[0], handle.tokenizer)
    cal = raw - null
    spans = mdqa[0].encode(handle.tokenizer).passages

    def filtered_sum(x):
        keep = x > x.mean() - 2 * x.std(ddof=1)
        return x[keep].sum()

    expected = np.array(
        [[[filtered_sum(cal[la, h, s:e]) for s, e in spans] for h in range(4)] for la in range(2)]
    )
    np.testing.assert_allclose(scores.passages[0]["calibrated"], expected, atol=1e-5)
    summed = cal[0, 0] + cal[1, 3]
    np.testing.assert_allclose(
        ranking["score"], [filtered_sum(summed[s:e]) for s, e in spans], atol=1e-5
    )


def test_passage_mass_outlier_filter_hand_computed():
    tokens = torch.tensor([1.0, 1.0, 1.0, 1.0, -10.0, 2.0, 3.0], dtype=torch.float64)
    # passage [0, 5): mean -1.2, std sqrt(24.2) ~ 4.92: -10 is below mean - 2 std? -1.2 - 9.84
    # = -11.04: no, kept; passage [5, 7): mean 2.5, std 0.707: threshold 1.09, both kept
    np.testing.assert_allclose(passage_mass(tokens, [(0, 5), (5, 7)], 2.0), [-6.0, 5.0])
    # with 1 std the threshold is -6.12: -10 is dropped; 2.0 is at 2.5 - 0.707 = 1.79: kept
    np.testing.assert_allclose(passage_mass(tokens, [(0, 5), (5, 7)], 1.0), [4.0, 5.0])
    np.testing.assert_allclose(passage_mass(tokens, [(0, 5), (5, 7)]), [-6.0, 5.0])


def test_recall_at_k_hand_computed():
    ranking = pd.DataFrame(
        {
            "sample": [0, 0, 0, 0, 1, 1, 1],
            "passage": [0, 1, 2, 3, 0, 1, 2],
            "rank": [3, 1, 4, 2, 1, 3, 2],
            "golden": [True, True, False, False, False, True, True],
        }
    )
    # question 0: golden {0, 1} at ranks 3, 1; question 1: golden {1, 2} at ranks 3, 2
    assert recall_at_k(ranking, 1) == pytest.approx((1 / 2 + 0) / 2)
    assert recall_at_k(ranking, 2) == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert recall_at_k(ranking, 3) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        recall_at_k(ranking, 0)


def test_calibration_changes_the_ranking(llama_pair, mdqa):
    """The null-query subtraction matters: with every head, some question's passages come in
    another order calibrated than raw, and each order is brute force's."""
    handle, eager = llama_pair
    heads = [(layer, head) for layer in range(2) for head in range(4)]
    calibrated = rank_passages(handle, mdqa, heads, progress=False)
    raw = rank_passages(handle, mdqa, heads, QRConfig(calibrate=False), progress=False)
    differ = 0
    for i, sample in enumerate(mdqa):
        (m_raw, m_null), _ = brute_force(eager, sample, handle.tokenizer)
        for table, mass in ((calibrated, m_raw - m_null), (raw, m_raw)):
            order = np.argsort(-mass.sum((0, 1)), kind="stable").tolist()
            mine = table[table["sample"] == i].sort_values("rank")["passage"].tolist()
            assert mine == order
        c = calibrated[calibrated["sample"] == i]["rank"].tolist()
        differ += c != raw[raw["sample"] == i]["rank"].tolist()
    assert differ > 0


def test_resume_and_bad_input(llama_pair, mdqa, tmp_path, monkeypatch):
    handle, _ = llama_pair
    first = qr_scores(handle, mdqa, results=tmp_path / "qr.jsonl", progress=False)
    import interp_seal.analysis.qrhead as module

    def fail(*args, **kwargs):
        raise AssertionError("recomputed a finished sample")

    monkeypatch.setattr(module, "query_token_attention", fail)
    again = qr_scores(handle, mdqa, results=tmp_path / "qr.jsonl", progress=False)
    pd.testing.assert_frame_equal(first.heads, again.heads)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="meta\\['input'\\]"):
        qr_scores(handle, [Sample(task="passages", prompt="a b c", answer=" d")], progress=False)
    with pytest.raises(ValueError, match="not in a 2 x 4 model"):
        rank_passages(handle, mdqa, [(2, 0)], progress=False)
    with pytest.raises(ValueError, match="null_query"):
        QRConfig(null_query=" ")


def test_cli_qr_scores(llama_pair, mdqa, tmp_path):
    from interp_seal.cli import main
    from interp_seal.tasks import jsonl

    handle, _ = llama_pair
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    jsonl.write_samples(train, mdqa[:2])
    jsonl.write_samples(test, mdqa[2:])
    out = tmp_path / "qr"
    model = str(handle.name_or_path)
    args = ["retrieval", "qr-scores", "--model", model, "--samples", str(train), "--out", str(out)]
    args += ["--rank-samples", str(test), "--top-heads", "3", "--ks", "1", "2", "--threads", "1"]
    assert main(args) == 0
    heads = pd.read_csv(out / "head_scores.csv")
    assert list(heads.columns) == [
        "layer",
        "head",
        "qr_score",
        "qr_score_raw",
        "rank",
        "model",
        "n",
    ]
    expected = qr_scores(handle, mdqa[:2], progress=False).heads
    np.testing.assert_allclose(heads["qr_score"], expected["qr_score"], atol=1e-12)
    assert (heads["n"] == 2).all() and (heads["model"] == model).all()
    ranking = rank_passages(handle, mdqa[2:], top_heads(expected, 3), progress=False)
    recall = pd.read_csv(out / "recall.csv")
    assert recall["k"].tolist() == [1, 2] and (recall["heads"] == 3).all()
    assert recall["recall"].tolist() == pytest.approx([recall_at_k(ranking, k) for k in (1, 2)])
    assert list(recall.columns[-2:]) == ["model", "n"] and (recall["n"] == 1).all()
    written = pd.read_csv(out / "ranking.csv")
    np.testing.assert_allclose(written["score"], ranking["score"], atol=1e-12)
    assert main([*args, "--resume"]) == 0
    bad = ["retrieval", "qr-scores", "--model", model, "--samples", str(train)]
    assert main([*bad, "--outlier-std", "-1", "--out", str(tmp_path / "bad")]) == 2


def test_nnsight_backend_gives_the_same_scores(llama_pair, mdqa):
    handle, _ = llama_pair
    hf = qr_scores(handle, mdqa[:1], progress=False)
    traced = qr_scores(handle, mdqa[:1], QRConfig(backend="nnsight"), progress=False)
    np.testing.assert_allclose(traced.passages[0]["raw"], hf.passages[0]["raw"], atol=1e-6)
    np.testing.assert_allclose(
        traced.passages[0]["calibrated"], hf.passages[0]["calibrated"], atol=1e-6
    )
