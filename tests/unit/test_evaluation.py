"""Evaluation: teacher-forced exact match against ``generate()``, tables, scores, figures, CLI.

The reference for teacher forcing is independent of it: ``model.generate`` (greedy, KV cache,
one sample at a time) for exact match and first-token correctness, and a per-token loop of
full forwards over growing prefixes for the answer log-probability.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from interp_seal.cli import evaluate as evaluate_cli
from interp_seal.evaluation import (
    ACCURACY_COLUMNS,
    evaluate_lengths,
    evaluate_line_retrieval,
    evaluate_niah,
    niah_grid,
    normalize_answer,
    qa_f1,
    score_records,
    teacher_force,
    token_f1,
)
from interp_seal.interventions import HeadIntervention, ablate
from interp_seal.models import load_model
from interp_seal.tasks import line_retrieval
from interp_seal.tasks.sample import Encoded, Sample
from interp_seal.viz import accuracy_figure, niah_heatmap


@pytest.fixture(scope="module")
def llama(llama_checkpoint):
    return load_model(llama_checkpoint)


def records(num_lines: int, n: int, seed: int = 0) -> list[Sample]:
    return line_retrieval.generate(line_retrieval.LineRetrievalConfig(num_lines=num_lines), n, seed)


def greedy(handle, prompt_ids: torch.Tensor, n_new: int) -> list[int]:
    """The naive reference: ``generate()`` greedy, one sample."""
    out = handle.model.generate(
        prompt_ids[None],
        do_sample=False,
        max_new_tokens=n_new,
        pad_token_id=handle.tokenizer.pad_token_id,
    )
    return out[0, len(prompt_ids) :].tolist()


def mixed_samples(handle) -> list[Sample | Encoded]:
    """Normal records (wrong on a random model) plus answers the model gets right or half right.

    A "right" answer is the model's own greedy continuation; a "half right" one keeps its
    first two tokens and then changes the third, so exact match fails but the first token holds.
    """
    normal = records(3, 3) + records(6, 2, seed=1)
    made = []
    for sample in records(4, 4, seed=2):
        prompt = sample.encode(handle.tokenizer).prompt_ids
        cont = greedy(handle, prompt, 4)
        half = cont[:2] + [(cont[2] + 1) % handle.spec.vocab_size] + cont[3:]
        for answer in (cont, half):
            ids = torch.tensor(prompt.tolist() + answer)
            made.append(Encoded(input_ids=ids, answer_start=len(prompt)))
    return normal + made


def test_exact_match_agrees_with_generate(family_checkpoint):
    handle = load_model(family_checkpoint)
    samples = mixed_samples(handle)
    scores = teacher_force(handle, samples, batch_size=3)
    assert len(scores) == len(samples)
    matches = []
    for sample, score in zip(samples, scores, strict=True):
        enc = sample.encode(handle.tokenizer) if isinstance(sample, Sample) else sample
        answer = enc.answer_ids.tolist()
        generated = greedy(handle, enc.prompt_ids, len(answer))
        assert score.exact_match == (generated == answer)
        assert score.first_token == (generated[0] == answer[0])
        assert score.n_tokens == len(enc)
        # up to and including the first error, the teacher-forced argmax is what greedy emits
        first_error = next(
            (i for i, ok in enumerate(score.token_correct) if not ok), len(answer) - 1
        )
        assert list(score.predicted[: first_error + 1]) == generated[: first_error + 1]
        assert score.token_correct == tuple(
            p == a for p, a in zip(score.predicted, answer, strict=True)
        )
        matches.append(score.exact_match)
    assert any(matches) and not all(matches)
    assert any(s.first_token and not s.exact_match for s in scores)


def brute_force(handle, enc: Encoded) -> tuple[float, list[int]]:
    """Answer log-prob and argmaxes from one full forward per answer token (growing prefixes)."""
    total, argmaxes = 0.0, []
    with torch.no_grad():
        for t in range(enc.answer_start, len(enc)):
            logits = handle.model(enc.input_ids[None, :t]).logits[0, -1]
            total += float(logits.log_softmax(-1)[enc.input_ids[t]])
            argmaxes.append(int(logits.argmax()))
    return total, argmaxes


@pytest.mark.parametrize("mode", [None, "zero", "uniform"])
def test_answer_logprob_matches_per_token_loop(llama, mode):
    samples = records(3, 3) + records(7, 3, seed=1)
    iv = None if mode is None else ablate(llama.spec, [(0, 1), (1, 2), (1, 3)], mode)
    scores = teacher_force(llama, samples, intervention=iv, batch_size=4)
    for sample, score in zip(samples, scores, strict=True):
        enc = sample.encode(llama.tokenizer)
        if iv is None:
            logprob, argmaxes = brute_force(llama, enc)
        else:
            with llama.edit(iv):
                logprob, argmaxes = brute_force(llama, enc)
        assert score.answer_logprob == pytest.approx(logprob, rel=1e-5, abs=1e-5)
        assert list(score.predicted) == argmaxes
        assert logprob < 0


def test_intervention_changes_scores_and_batching_does_not(llama):
    samples = records(3, 5) + records(8, 4, seed=3)
    iv = ablate(llama.spec, [(0, 0), (0, 3), (1, 1)], "uniform")
    one = teacher_force(llama, samples, intervention=iv, batch_size=1)
    many = teacher_force(llama, samples, intervention=iv, batch_size=4)
    plain = teacher_force(llama, samples, batch_size=4)
    for a, b in zip(one, many, strict=True):
        assert a.predicted == b.predicted
        assert a.answer_logprob == pytest.approx(b.answer_logprob, rel=1e-5, abs=1e-5)
    assert [s.answer_logprob for s in plain] != pytest.approx([s.answer_logprob for s in many])


def test_a_token_budget_splits_long_batches_without_changing_scores(llama, monkeypatch):
    import interp_seal.evaluation.teacher_forcing as tf

    samples = records(3, 5) + records(8, 4, seed=3)
    widths = sorted((len(s.encode(llama.tokenizer)) for s in samples), reverse=True)
    budget = 3 * widths[-1]  # wide rows go two by two, the narrowest three at a time
    shapes = []
    forward = tf.answer_logits

    def spy(handle, batch, intervention=None):
        shapes.append(tuple(batch.ids.shape))
        return forward(handle, batch, intervention)

    monkeypatch.setattr(tf, "answer_logits", spy)
    split = teacher_force(llama, samples, batch_size=9, max_batch_tokens=budget)
    assert all(rows * width <= budget for rows, width in shapes)
    assert [rows for rows, _ in shapes] == [2, 2, 2, 3] and shapes[0][1] == widths[0]
    shapes.clear()
    whole = teacher_force(llama, samples, batch_size=9)
    assert shapes == [(9, widths[0])]
    for a, b in zip(split, whole, strict=True):
        assert a.predicted == b.predicted
        assert a.answer_logprob == pytest.approx(b.answer_logprob, rel=1e-5, abs=1e-5)
    shapes.clear()
    teacher_force(llama, samples[:2], max_batch_tokens=1)  # a sample always runs, alone
    assert [rows for rows, _ in shapes] == [1, 1]


def test_refuses_samples_longer_than_the_window(llama):
    long = records(250, 1)  # ~2.5K tokens, the tiny checkpoints have 2048 positions
    assert len(long[0].encode(llama.tokenizer)) > llama.spec.max_positions
    with pytest.raises(ValueError, match=r"context window of 2048 positions.*shorter contexts"):
        teacher_force(llama, records(3, 2) + long)
    with pytest.raises(ValueError, match=r"^length 250: sample 0 is \d+ tokens long"):
        evaluate_lengths(llama, {3: records(3, 2), 250: long}, progress=False)


def test_refuses_bad_arguments(llama):
    batched = HeadIntervention(spec=llama.spec, scale=torch.ones(2, *llama.spec.shape))
    with pytest.raises(ValueError, match="one scale table"):
        teacher_force(llama, records(3, 2), intervention=batched)
    with pytest.raises(ValueError, match="batch_size"):
        teacher_force(llama, records(3, 2), batch_size=0)
    no_prompt = Encoded(input_ids=torch.tensor([5, 6]), answer_start=0)
    with pytest.raises(ValueError, match="empty prompt"):
        teacher_force(llama, [no_prompt])


def test_evaluate_line_retrieval_table(llama):
    iv = ablate(llama.spec, [(1, 0)], "zero")
    table = evaluate_line_retrieval(
        llama, [2, 5], n=6, seed=4, intervention=iv, batch_size=4, progress=False
    )
    assert tuple(table.columns) == ACCURACY_COLUMNS
    assert table["length"].tolist() == [2, 5]
    for row, num_lines in zip(table.itertuples(), [2, 5], strict=True):
        samples = line_retrieval.generate(
            line_retrieval.LineRetrievalConfig(num_lines=num_lines), 6, 4
        )
        scores = teacher_force(llama, samples, intervention=iv)
        assert row.n == 6
        assert row.n_tokens == sum(len(s.encode(llama.tokenizer)) for s in samples) / 6
        assert row.exact_match == sum(s.exact_match for s in scores) / 6
        assert row.first_token == sum(s.first_token for s in scores) / 6
        assert row.answer_logprob == pytest.approx(
            sum(s.answer_logprob for s in scores) / 6, rel=1e-6
        )


def test_accuracy_figure():
    table = pd.DataFrame(
        {
            "length": [20, 10],
            "n": [4, 4],
            "n_tokens": [230.0, 120.0],
            "exact_match": [0.25, 0.5],
            "first_token": [0.5, 0.75],
            "answer_logprob": [-9.0, -4.0],
        }
    )
    fig = accuracy_figure(table)
    assert [t.name for t in fig.data] == ["exact match", "first token correct"]
    assert list(fig.data[0].x) == [10, 20] and list(fig.data[0].y) == [0.5, 0.25]
    assert list(fig.data[1].y) == [0.75, 0.5]
    # 95 % Wilson interval of 2 / 4 by hand: 0.5 +- 0.34996, i.e. (0.15004, 0.84996)
    bars = fig.data[0].error_y
    np.testing.assert_allclose([bars.arrayminus[0], bars.array[0]], [0.34996, 0.34996], atol=1e-5)
    assert bars.array[1] > bars.arrayminus[1]  # 1 / 4 sits near 0: the interval is lopsided
    assert accuracy_figure(table, metrics=("answer_logprob",)).data[0].error_y.array is None
    with pytest.raises(ValueError, match="lacks columns"):
        accuracy_figure(table.drop(columns="n_tokens"))


def needle(depth: int, length: int, sample: Sample) -> Sample:
    return dataclasses.replace(
        sample, task="needle", meta={"depth_percent": depth, "context_length": length}
    )


def test_niah_grid_and_heatmap():
    base = records(2, 1)[0]
    cells = [
        (50, 1000, True),
        (0, 1000, False),
        (0, 2000, True),
        (50, 2000, True),
        (50, 2000, False),
    ]
    grid = niah_grid([needle(d, n, base) for d, n, _ in cells], [ok for *_, ok in cells])
    assert grid.index.tolist() == [0, 50] and grid.columns.tolist() == [1000, 2000]
    assert grid.to_numpy().tolist() == [[0.0, 1.0], [1.0, 0.5]]
    fig = niah_heatmap(grid)
    assert fig.data[0].z.tolist() == [[0.0, 1.0], [1.0, 0.5]]
    assert list(fig.data[0].y) == ["0", "50"] and list(fig.data[0].x) == ["1000", "2000"]
    assert fig.layout.yaxis.title.text == "needle depth (%)"
    with pytest.raises(ValueError, match=r"lacks meta \['context_length', 'depth_percent'\]"):
        niah_grid([base], [True])


def test_evaluate_niah(llama):
    samples = [
        needle(d, n, s)
        for (d, n), s in zip([(0, 3), (50, 3), (0, 5), (50, 5)], records(3, 4), strict=True)
    ]
    scores = teacher_force(llama, samples)
    expected = niah_grid(samples, [s.exact_match for s in scores])
    pd.testing.assert_frame_equal(evaluate_niah(llama, samples, progress=False), expected)


def test_normalize_answer():
    assert normalize_answer("The Eiffel  Tower!") == "eiffel tower"
    assert normalize_answer("An apple a day, the\tdoctor") == "apple day doctor"
    assert normalize_answer("U.S.A. (1776)") == "usa 1776"
    assert normalize_answer("Theatre anthem") == "theatre anthem"  # articles are whole words


def test_token_f1_hand_computed():
    # pred tokens {cat, sat, on, mat}, gold {cat, on, mat}: P = 3/4, R = 1, F1 = 6/7
    assert token_f1("The cat sat on the mat.", "a cat on a mat") == pytest.approx(6 / 7)
    # repeated tokens count once per gold occurrence: P = 1/2, R = 1
    assert token_f1("Paris paris", "Paris") == pytest.approx(2 / 3)
    assert token_f1("London", "Paris") == 0.0
    assert token_f1("", "Paris") == 0.0
    # best gold answer: F1(paris, "paris france") = 2 * 1 * 0.5 / 1.5
    assert qa_f1("Paris", ["London", "Paris, France"]) == pytest.approx(2 / 3)
    assert qa_f1("the Paris", ["London", "paris"]) == 1.0
    with pytest.raises(ValueError, match="at least one gold answer"):
        qa_f1("Paris", [])


def test_score_records():
    tasks = [
        {"expected_number": 123, "prompt": "..."},
        {"expected_number": 12, "prompt": "..."},
        {"answers": ["Paris, France"], "dataset": "hotpotqa"},
        {"answers": ["blue"]},
    ]
    preds = ["The <REGISTER_CONTENT> in line bold-oak is 123.", "12, no 45", "Paris", "Blue."]
    scores = score_records(tasks, preds)
    assert scores["task"].tolist() == ["longeval", "longeval", "hotpotqa", "qa"]
    assert scores["score"].tolist() == pytest.approx([1.0, 0.0, 2 / 3, 1.0])
    with pytest.raises(ValueError, match="same number of lines"):
        score_records(tasks, preds[:2])
    with pytest.raises(ValueError, match="neither 'expected_number'"):
        score_records([{"question": "?"}], ["x"])


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="interp-seal")
    evaluate_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_lines(llama_checkpoint, llama, tmp_path, capsys):
    out = tmp_path / "acc"
    argv = ["evaluate", "lines", "--model", llama_checkpoint, "--lengths", "2", "4", "--n", "5"]
    assert run_cli([*argv, "--seed", "1", "--ablate", "1.2", "--out", str(out)]) == 0
    table = pd.read_csv(out / "accuracy.csv")
    iv = ablate(llama.spec, [(1, 2)], "zero")
    expected = evaluate_line_retrieval(llama, [2, 4], n=5, seed=1, intervention=iv, progress=False)
    intervals = [
        "exact_match_ci_low",
        "exact_match_ci_high",
        "first_token_ci_low",
        "first_token_ci_high",
    ]
    assert list(table.columns) == [*expected.columns, "model", "seed", *intervals]  # new ones last
    pd.testing.assert_frame_equal(table[expected.columns], expected, check_dtype=False)
    assert (table.model == llama_checkpoint).all() and (table.seed == 1).all()
    assert 'src="plotly.min.js"' in (out / "accuracy.html").read_text()
    printed = capsys.readouterr().out
    assert "heads 1.2 ablated (zero)" in printed and "exact_match" in printed
    with pytest.raises(SystemExit):  # argparse: status 2, the flag and the format named
        run_cli([*argv, "--ablate", "1-2"])
    assert "argument --ablate: cannot read head '1-2'; write LAYER.HEAD" in capsys.readouterr().err


def test_cli_generated(tmp_path, capsys):
    tasks, preds = tmp_path / "tasks.jsonl", tmp_path / "preds.jsonl"
    tasks.write_text(
        "\n".join(json.dumps(r) for r in [{"expected_number": 7}, {"expected_number": 8}])
    )
    preds.write_text("\n".join(json.dumps({"pred": p}) for p in ["is 7.", "is 9."]))
    assert run_cli(["evaluate", "generated", str(tasks), "--predictions", str(preds)]) == 0
    assert capsys.readouterr().out.split() == ["task", "count", "mean", "longeval", "2", "0.5000"]
    with pytest.raises(ValueError, match="no 'output' field"):
        run_cli(
            ["evaluate", "generated", str(tasks), "--predictions", str(preds), "--field", "output"]
        )
