"""Training data: the answer loss by hand, line passages, format samples per task."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from interp_seal.engine import pad_id_of
from interp_seal.models import load_model
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.data import (
    answer_loss,
    collate,
    encode_examples,
    format_samples,
    with_line_passages,
)


def test_answer_loss_is_the_mean_of_per_sample_answer_token_losses(llama_checkpoint):
    """Padded batch loss == mean over samples of each one's mean answer-token CE, run alone."""
    handle = load_model(llama_checkpoint)
    samples = generate(LineRetrievalConfig(num_lines=3), 3, seed=7)
    examples = encode_examples(samples, handle.tokenizer)
    assert len({len(e.encoded) for e in examples}) > 1, "the batch needs padding"
    expected = []
    with torch.no_grad():
        for e in examples:
            ids, a = e.encoded.input_ids, e.encoded.answer_start
            logits = handle.model(ids[None]).logits[0]
            expected.append(F.cross_entropy(logits[a - 1 : -1], ids[a:]))
        loss = answer_loss(handle.model, collate(examples, pad_id_of(handle.tokenizer)))
    torch.testing.assert_close(loss, torch.stack(expected).mean(), rtol=1e-6, atol=1e-6)


def test_line_passages_are_the_lines_and_the_golden_one_is_queried():
    sample = generate(LineRetrievalConfig(num_lines=6), 1, seed=2)[0]
    lined = with_line_passages(sample)
    lines = [lined.prompt[a:b] for a, b in lined.passages]
    assert len(lines) == 6 and all(line.startswith("line ") for line in lines)
    assert lines[lined.golden[0]] == sample.meta["correct_line"]
    with pytest.raises(ValueError, match="line_retrieval"):
        with_line_passages(format_samples("passages", None, 1, num_passages=3)[0])


def test_format_samples_per_task(llama_checkpoint):
    tok = load_model(llama_checkpoint).tokenizer
    lines = format_samples("line_retrieval", tok, 3, num_lines=5, seed=1)
    assert len(lines) == 3 and all(s.meta["num_lines"] == 5 for s in lines)
    assert all(s.meta["index_style"] == "adjective-noun" for s in lines)
    integers = format_samples("line_retrieval", tok, 3, num_lines=5, seed=1, index_style="integers")
    assert [s.meta["index_style"] for s in integers] == ["integers"] * 3
    assert all(f"line {s.meta['random_idx'][0]}: " in s.prompt for s in integers)
    assert all(str(s.meta["random_idx"][0]).isdigit() for s in integers)
    needles = format_samples("needle", tok, 3, tokens=300, seed=1)
    assert [s.meta["depth_percent"] for s in needles] == [0, 50, 100]
    assert all(s.needle is not None and s.meta["context_length"] == 300 for s in needles)
    passages = format_samples("passages", tok, 2, num_passages=4)
    assert all(len(s.passages) == 4 and s.golden for s in passages)
    with pytest.raises(ValueError, match="exactly one of num_lines or tokens"):
        format_samples("line_retrieval", tok, 3)
    with pytest.raises(ValueError, match="unknown task"):
        format_samples("ruler", tok, 3)
