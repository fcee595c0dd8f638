"""Peers' code conventions, each checked against a direct implementation of that convention.

``mudaf_code_scores`` follows MuDAF's visualisation and ``retrieval_score.py`` scripts (chunk
boundaries from tokenising prompt prefixes, the full eager attention pattern, its F1 / EM
loops); ``retrieval_head_scores`` follows Retrieval_Head's detection script (needle window
search, one full eager forward per decoding step, ROUGE-1 recall filter). Neither uses
``interp_seal.analysis``.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
import torch
import transformers

from interp_seal.analysis import peer_conventions as peers
from interp_seal.analysis.retrieval_scores import (
    CopyPasteConfig,
    PassageScoreConfig,
    copy_paste_score,
    needle_retrieval_scores,
    passage_attention,
    passage_retrieval_scores,
)
from interp_seal.models import load_model
from interp_seal.models.load import ORGANISM_DIR
from interp_seal.tasks import line_retrieval, passages
from interp_seal.tasks.sample import Sample

# -- MuDAF ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def handle(llama_checkpoint):
    return load_model(llama_checkpoint)


@pytest.fixture(scope="module")
def mdqa() -> list[Sample]:
    return passages.generate(passages.PassagesConfig(num_passages=5, filler_sentences=0), 4, 3)


def mudaf_code_chunks(prompt: str, tokenizer) -> list[int]:
    """MuDAF's ``chunk_ids``: token counts of the prompt's prefixes at each cut."""
    chunk_ids, i = [], 1
    while f"Passage {i}:" in prompt:
        chunk_ids.append(len(tokenizer.encode(prompt[: prompt.index(f"Passage {i}:")])))
        i += 1
    cut = prompt.index("\nAnswer the question based on the given passages.") + 1
    chunk_ids.append(len(tokenizer.encode(prompt[:cut])))
    chunk_ids.append(len(tokenizer.encode(prompt)))
    return chunk_ids


def mudaf_code_scores(eager, tokenizer, samples, threshold=0.3):
    """Per-head mean F1 and EM as MuDAF's scripts compute them, and the chunk sums."""
    f1s, ems, sums = [], [], []
    for sample in samples:
        ids = torch.tensor([tokenizer.encode(sample.prompt)])
        chunk_ids = mudaf_code_chunks(sample.prompt, tokenizer)
        with torch.no_grad():
            attentions = eager(ids, output_attentions=True).attentions
        golden = [g + 1 for g in sample.golden]  # the scripts number passages from 1
        f1 = np.zeros((len(attentions), attentions[0].shape[1]))
        em, chunk_sums = np.zeros_like(f1), []
        for layer, pattern in enumerate(attentions):
            per_head = []
            for head in range(pattern.shape[1]):
                distribution = pattern[0, head, -1].numpy()
                values, prepoint = [], 0
                for j, point in enumerate(chunk_ids):
                    value = float(distribution[prepoint:point].sum())
                    if j != 0 and j < len(chunk_ids) - 1:
                        values.append(value)
                    prepoint = point
                per_head.append(values)
                data = [{"Position": p, "Attention Value": v} for p, v in enumerate(values)]
                data = sorted(data, key=lambda x: x["Attention Value"], reverse=True)
                data = [d for d in data if d["Attention Value"] > threshold]
                attended = [d["Position"] + 1 for d in data]
                top = [d["Position"] + 1 for d in data[: len(golden)]]
                recall = len(set(golden) & set(attended)) / len(golden)
                precision = len(set(golden) & set(attended)) / len(attended) if attended else 0
                f1[layer, head] = (
                    0 if recall + precision == 0 else 2 * recall * precision / (recall + precision)
                )
                em[layer, head] = 1 if set(golden) == set(top) else 0
            chunk_sums.append(per_head)
        f1s.append(f1)
        ems.append(em)
        sums.append(np.array(chunk_sums))
    return np.mean(f1s, 0), np.mean(ems, 0), sums


def test_mudaf_code_convention_matches_mudafs_scripts(handle, eager, mdqa):
    threshold = 0.2
    config = PassageScoreConfig(eps=threshold, convention="mudaf_code")
    scores = passage_retrieval_scores(handle, mdqa, config, progress=False)
    f1, em, sums = mudaf_code_scores(eager, handle.tokenizer, mdqa, threshold)
    for pa, expected in zip(scores.attention, sums, strict=True):
        np.testing.assert_allclose(pa.attention, expected, atol=1e-5)
    heads = scores.heads.sort_values(["layer", "head"])
    np.testing.assert_allclose(heads["f1"], f1.ravel(), atol=1e-12)
    np.testing.assert_allclose(heads["em"], em.ravel(), atol=1e-12)
    assert 0 < heads["f1"].mean() < 1 and heads["em"].sum() > 0  # not a trivial agreement
    # the spans: marker to next marker (separator newline included), last to the question
    tok = handle.tokenizer
    sample = mdqa[0]
    spans = peers.mudaf_code_spans(sample, tok)
    chunks = mudaf_code_chunks(sample.prompt, tok)
    assert list(spans) == list(zip(chunks[:-2], chunks[1:-1], strict=True))
    paper = sample.encode(tok).passages
    assert [s for s, _ in spans] == [s for s, _ in paper]
    assert all(e > p for (_, e), (_, p) in zip(spans, paper, strict=True))
    # and the paper's definition gives other numbers on the same prompt
    assert not np.allclose(passage_attention(handle, sample).attention, sums[0])


def test_mudaf_code_fingerprints_apart(handle, mdqa, tmp_path):
    results = tmp_path / "scores.jsonl"
    passage_retrieval_scores(
        handle, mdqa[:1], PassageScoreConfig(), results=results, progress=False
    )
    with pytest.raises(ValueError, match="different input or setting"):
        passage_retrieval_scores(
            handle,
            mdqa[:1],
            PassageScoreConfig(convention="mudaf_code"),
            results=results,
            progress=False,
        )


# -- Retrieval_Head -------------------------------------------------------------------------


def rouge1_recall(needle: str, response: str) -> float:
    """rouge-score's ROUGE-1 recall of ``needle`` by ``response`` (no stemming)."""
    ref = Counter(re.findall(r"[a-z0-9]+", needle.lower()))
    got = Counter(re.findall(r"[a-z0-9]+", response.lower()))
    return sum((ref & got).values()) / max(sum(ref.values()), 1)


def retrieval_head_scores(eager, tokenizer, samples, steps) -> tuple[np.ndarray, list[float]]:
    """Retrieval_Head's detection loop: mean score over samples with ROUGE-1 recall > 50.

    Its ``decode_len`` is 50; the test decodes ``steps`` tokens to stay fast.
    """
    kept, recalls = [], []
    for sample in samples:
        prompt_ids = torch.tensor(tokenizer(sample.prompt)["input_ids"])
        needle_text = sample.prompt[sample.needle[0] : sample.needle[1]]
        needle_ids = tokenizer(needle_text, add_special_tokens=False)["input_ids"]
        span_len = len(needle_ids)
        needle_start = needle_end = -1
        for i in range(len(prompt_ids)):
            span_ids = set(prompt_ids[i : i + span_len].tolist())
            overlap = len(span_ids & set(needle_ids)) / len(set(needle_ids))
            if overlap > 0.9:
                needle_start, needle_end = i, i + span_len
                break
        ids, output = prompt_ids.clone(), []
        score = None
        for _ in range(steps):
            with torch.no_grad():
                out = eager(ids[None], output_attentions=True)
            token = int(out.logits[0, -1].argmax())
            if score is None:
                score = np.zeros((len(out.attentions), out.attentions[0].shape[1]))
            for layer, pattern in enumerate(out.attentions):
                for head in range(pattern.shape[1]):
                    i = int(pattern[0, head, -1].topk(1).indices[0])
                    if needle_start <= i < needle_end and token == int(prompt_ids[i]):
                        score[layer, head] += 1 / (needle_end - needle_start)
            output.append(token)
            ids = torch.cat([ids, torch.tensor([token])])
            if tokenizer.decode([token]) == "\n" or token == tokenizer.eos_token_id:
                break
        response = tokenizer.decode(output, skip_special_tokens=True).strip()
        recalls.append(rouge1_recall(needle_text, response))
        if recalls[-1] * 100 > 50:
            kept.append(score)
    return (np.mean(kept, 0) if kept else None), recalls


def needle_samples() -> list[Sample]:
    """LongEval records whose queried value is the needle, with distinct digits.

    With the answer prefix forced the organism answers the value (the sample is kept); without
    it, it often does not.
    """
    out = []
    for force_prefix, value in ((True, 13579), (False, 24680), (False, 86420)):
        cfg = line_retrieval.LineRetrievalConfig(num_lines=8, force_prefix=force_prefix)
        sample = line_retrieval.generate(cfg, 1, seed=value)[0]
        old = f"<{sample.meta['expected_number']}>"
        prompt = sample.prompt.replace(old, f"<{value}>")
        start = prompt.index(f"<{value}>") + 1
        answer = sample.answer.replace(str(sample.meta["expected_number"]), str(value))
        out.append(Sample(task="needle", prompt=prompt, answer=answer, needle=(start, start + 5)))
    return out


@pytest.fixture(scope="module")
def organism():
    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("the model organism's checkpoint is not in this checkout")
    return load_model("organism")


def test_retrieval_head_code_convention_matches_its_script(organism):
    samples = needle_samples()
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        ORGANISM_DIR, attn_implementation="eager"
    )
    config = CopyPasteConfig(convention="retrieval_head_code", max_new_tokens=10)
    scores = needle_retrieval_scores(organism, samples, config, progress=False)
    expected, recalls = retrieval_head_scores(eager, organism.tokenizer, samples, steps=10)
    per_sample = scores.per_sample.groupby("sample").first()
    np.testing.assert_allclose(per_sample["rouge1_recall"], recalls, atol=1e-12)
    assert per_sample["kept"].tolist() == [r > 0.5 for r in recalls]
    assert 0 < sum(per_sample["kept"]) < len(samples)  # some kept, some not
    heads = scores.heads.sort_values(["layer", "head"])
    np.testing.assert_allclose(heads["score"], expected.ravel(), atol=1e-12)
    assert heads["score"].max() > 0.1  # the organism's retrieval heads copy the value
    # the paper's definition averages every sample over the answer's own tokens
    paper = needle_retrieval_scores(organism, samples, CopyPasteConfig(), progress=False)
    assert not np.allclose(paper.heads.sort_values(["layer", "head"])["score"], expected.ravel())


def test_needle_window_and_rouge_hand_computed(handle):
    prompt = (
        "line happy-tiger: REGISTER_CONTENT is <12345>\n"
        "line calm-owl: REGISTER_CONTENT is <13579>\n"
    )
    needle = prompt.index("line calm-owl")
    sample = Sample(task="needle", prompt=prompt, answer=" 1", needle=(needle, len(prompt) - 1))
    enc = sample.encode(handle.tokenizer)
    # tokens: <s> line happy-tiger : REGISTER_CONTENT is < 1 2 3 4 5 > \n | line calm-owl ...
    # the needle is tokens 14..25 (12 distinct ids); the window starting 2 earlier at "> \n"
    # already holds 11 of them (all but "9"): 11/12 > 90%, so the rule takes it for the needle
    assert enc.needle == (14, 26)
    assert peers.locate_needle(handle.tokenizer, sample, enc.prompt_ids) == (12, 24)
    with pytest.raises(ValueError, match="no window of the prompt covers more than 90%"):
        peers.locate_needle(handle.tokenizer, sample, enc.prompt_ids[:14])
    assert peers.rouge1_recall("The best thing: eat a sandwich!", "eat a SANDWICH, the end") == (
        pytest.approx(4 / 6)
    )
    assert peers.rouge1_recall("a a b", "a") == pytest.approx(1 / 3)  # clipped counts
    assert peers.rouge1_recall("...", "anything") == 0.0


def test_conventions_bad_input(handle, mdqa):
    with pytest.raises(ValueError, match="unknown convention 'mudaf'; choose one of"):
        PassageScoreConfig(convention="mudaf")
    with pytest.raises(ValueError, match="unknown convention 'paper2'"):
        CopyPasteConfig(convention="paper2")
    prompt = "line calm-owl: REGISTER_CONTENT is <13579>\n"
    enc = Sample(task="needle", prompt=prompt, answer=" 1", needle=(0, 13)).encode(handle.tokenizer)
    with pytest.raises(ValueError, match="needs a Sample with a needle span"):
        copy_paste_score(handle, enc, convention="retrieval_head_code")  # token ids only
