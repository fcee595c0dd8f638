"""MuDAF passage scores, Retrieval Head copy-paste scores and the masking experiment.

Scores are checked on hand-computed tables and against brute-force computations on the full
eager attention pattern; bad inputs must fail with errors that say what is wrong.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import DISTINCT_FAMILIES, build_checkpoint
from transformers import AutoModelForCausalLM

from interp_seal.analysis.masking import (
    MaskingConfig,
    conditions,
    greedy_text,
    masking_experiment,
)
from interp_seal.analysis.retrieval_scores import (
    CopyPasteConfig,
    PassageScoreConfig,
    copy_hits,
    copy_paste_score,
    needle_retrieval_scores,
    passage_attention,
    passage_retrieval_scores,
    score_passages,
)
from interp_seal.analysis.statistics import wilson
from interp_seal.cli import main
from interp_seal.evaluation import teacher_force
from interp_seal.interventions import ablate
from interp_seal.models import load_model
from interp_seal.tasks import jsonl, needle, passages
from interp_seal.tasks.sample import Encoded, Sample
from interp_seal.viz.passages import head_score_heatmap, masking_bars, passage_heatmap


@pytest.fixture(scope="module")
def handle(llama_checkpoint):
    return load_model(llama_checkpoint)


@pytest.fixture(scope="module", params=DISTINCT_FAMILIES)
def family_pair(request, tmp_path_factory):
    """One checkpoint per family, loaded and as an eager twin (full patterns: the reference)."""
    path = build_checkpoint(tmp_path_factory.mktemp(f"scores_{request.param}"), request.param)
    eager = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    return load_model(path), eager


@pytest.fixture(scope="module")
def mdqa() -> list[Sample]:
    return passages.generate(passages.PassagesConfig(num_passages=4, filler_sentences=0), 3, 0)


# -- MuDAF passage score ----------------------------------------------------------------------

# five heads x four passages, golden = {1, 2}, eps = 0.3 (attended means strictly above eps)
TABLE = [
    [0.10, 0.40, 0.35, 0.05],  # attends {1, 2}: F1 1; top-2 {1, 2}: EM 1
    [0.50, 0.31, 0.10, 0.02],  # attends {0, 1}: P 1/2, R 1/2, F1 1/2; top-2 {0, 1}: EM 0
    [0.20, 0.20, 0.20, 0.20],  # attends nothing: F1 0; ties -> top-2 {0, 1}: EM 0
    [0.00, 0.90, 0.05, 0.01],  # attends {1}: P 1, R 1/2, F1 2/3; top-2 {1, 2}: EM 1
    [0.10, 0.30, 0.30, 0.30],  # 0.3 is not > 0.3: F1 0; ties -> top-2 {1, 2}: EM 1
]


def test_score_passages_hand_computed():
    f1, em = score_passages(torch.tensor(TABLE, dtype=torch.float64), golden=(2, 1), eps=0.3)
    np.testing.assert_allclose(f1.numpy(), [1.0, 0.5, 0.0, 2 / 3, 0.0])
    np.testing.assert_array_equal(em.numpy(), [1, 0, 0, 1, 1])
    # the official code ranks only attended passages: heads 3 and 4 miss golden passage 2
    _, em_code = score_passages(torch.tensor(TABLE), golden=(1, 2), eps=0.3, em_attended_only=True)
    np.testing.assert_array_equal(em_code.numpy(), [1, 0, 0, 0, 0])
    f1_low, _ = score_passages(torch.tensor(TABLE, dtype=torch.float64), golden=(1, 2), eps=0.15)
    # eps 0.15: head 2 attends all four (P 1/2, R 1, F1 2/3); head 4 attends {1, 2, 3} (F1 4/5)
    np.testing.assert_allclose(f1_low.numpy(), [1.0, 0.5, 2 / 3, 2 / 3, 0.8])


def brute_force_passage_attention(eager, sample: Sample, tokenizer) -> np.ndarray:
    """Last-token row of the full eager pattern, summed over passage token spans by loops."""
    enc = sample.encode(tokenizer)
    with torch.no_grad():
        patterns = eager(enc.prompt_ids[None], output_attentions=True).attentions
    out = np.zeros((len(patterns), patterns[0].shape[1], len(enc.passages)))
    for layer, pattern in enumerate(patterns):
        for head in range(pattern.shape[1]):
            for p, (start, end) in enumerate(enc.passages):
                out[layer, head, p] = sum(float(pattern[0, head, -1, t]) for t in range(start, end))
    return out


def test_passage_scores_match_brute_force(family_pair, mdqa, tmp_path):
    handle, eager = family_pair
    eps = 0.2
    scores = passage_retrieval_scores(handle, mdqa, PassageScoreConfig(eps=eps), progress=False)
    per_sample_f1, per_sample_em = [], []
    for sample, pa in zip(mdqa, scores.attention, strict=True):
        expected = brute_force_passage_attention(eager, sample, handle.tokenizer)
        np.testing.assert_allclose(pa.attention, expected, atol=1e-5)
        assert pa.golden == sample.golden
        f1, em = score_passages(torch.from_numpy(expected), sample.golden, eps)
        per_sample_f1.append(f1.numpy())
        per_sample_em.append(em.numpy())
    mean_f1, mean_em = np.mean(per_sample_f1, 0), np.mean(per_sample_em, 0)
    heads = scores.heads.sort_values(["layer", "head"])
    np.testing.assert_allclose(heads["f1"].to_numpy(), mean_f1.ravel())
    np.testing.assert_allclose(heads["em"].to_numpy(), mean_em.ravel())
    assert (scores.heads["f1"].diff().dropna() <= 0).all()  # ranked best first
    assert scores.heads["rank"].tolist() == list(range(1, 9))
    assert len(scores.per_sample) == 3 * 8
    # the prefix column is the attention before the first passage (MuDAF Fig. 10's "#0")
    enc = mdqa[0].encode(handle.tokenizer)
    with torch.no_grad():
        first = eager(enc.prompt_ids[None], output_attentions=True).attentions[0]
    np.testing.assert_allclose(
        scores.attention[0].prefix[0], first[0, :, -1, : enc.passages[0][0]].sum(-1), atol=1e-5
    )


def test_passage_scores_nnsight_backend(handle, mdqa):
    hf = passage_attention(handle, mdqa[0])
    traced = passage_attention(handle, mdqa[0], backend="nnsight")
    np.testing.assert_allclose(traced.attention, hf.attention, atol=1e-7)


def test_passage_scores_resume(handle, mdqa, tmp_path, monkeypatch):
    results = tmp_path / "per_sample.jsonl"
    first = passage_retrieval_scores(handle, mdqa[:2], results=results, progress=False)
    assert len(results.read_text().splitlines()) == 2
    with results.open("a") as f:
        f.write('{"key": "sample-2", "finger')  # a write cut short by a kill

    calls = []
    real = passage_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("interp_seal.analysis.retrieval_scores.passage_attention", counting)
    again = passage_retrieval_scores(handle, mdqa, results=results, progress=False)
    assert len(calls) == 1  # only the third sample was computed
    assert [json.loads(line)["sample"] for line in results.read_text().splitlines()] == [0, 1, 2]
    pd.testing.assert_frame_equal(
        again.per_sample[again.per_sample["sample"] < 2], first.per_sample, check_dtype=False
    )
    with pytest.raises(ValueError, match="different input"):
        passage_retrieval_scores(handle, mdqa[1:], results=results, progress=False)


def test_passage_bad_input(handle, mdqa):
    sample = mdqa[0]
    with pytest.raises(ValueError, match="outside the prompt"):
        Sample(task="passages", prompt="short", answer=" x", passages=((0, 3), (2, 40)))
    with pytest.raises(ValueError, match="empty or outside the prompt"):
        Sample(task="passages", prompt="some text", answer=" x", passages=((4, 4),))
    with pytest.raises(ValueError, match="has no passages"):
        passage_attention(handle, Sample(task="passages", prompt=sample.prompt, answer=" x"))
    last = len(sample.prompt)
    with pytest.raises(ValueError, match="ahead of its last token"):
        passage_attention(
            handle,
            Sample(
                task="passages",
                prompt=sample.prompt,
                answer=" x",
                passages=((last - 3, last),),
                golden=(0,),
            ),
        )
    no_golden = Sample(task="passages", prompt=sample.prompt, answer=" x", passages=sample.passages)
    with pytest.raises(ValueError, match="no golden passages"):
        passage_attention(handle, no_golden)
    with pytest.raises(ValueError, match=r"golden passage ids \[7\] are out of range"):
        score_passages(torch.tensor(TABLE), golden=(7,), eps=0.3)
    with pytest.raises(ValueError, match="out of range"):
        Sample(
            task="passages",
            prompt=sample.prompt,
            answer=" x",
            passages=sample.passages,
            golden=(len(sample.passages),),
        )
    with pytest.raises(ValueError, match="eps must be in"):
        PassageScoreConfig(eps=1.5)


# -- Retrieval Head copy-paste score ------------------------------------------------------


def test_copy_hits_hand_computed():
    ids = torch.tensor([2, 10, 11, 12, 11, 13])
    argmax = torch.tensor([[2, 4, 3], [1, 5, 2]])  # positions attended by each (layer, head)
    hits = copy_hits(argmax, token=11, ids=ids, needle=(1, 4))
    # position 2 holds 11 inside the needle; position 4 holds 11 but lies outside it
    assert hits.tolist() == [[True, False, False], [False, False, True]]


def copying_prompt(handle, seed: int = 0) -> torch.Tensor:
    """A prompt whose greedy continuation starts with the token repeated in its needle span.

    Random models do not copy by themselves: iterate "fill the needle with the token the model
    emits" until that token is a fixed point, so that some heads genuinely score.
    """
    gen = torch.Generator().manual_seed(seed)
    for _ in range(20):
        prefix = torch.randint(4, handle.spec.vocab_size, (8,), generator=gen)
        token, seen = int(prefix[0]), set()
        while token not in seen:
            seen.add(token)
            ids = torch.cat([torch.tensor([2]), prefix, torch.full((6,), token), prefix[:3]])
            with torch.no_grad():
                emitted = int(handle.model(ids[None]).logits[0, -1].argmax())
            if emitted == token:
                return ids
            token = emitted
    raise AssertionError("no copying prompt found")


def brute_force_copy_paste(eager, prompt: torch.Tensor, needle, steps: int) -> np.ndarray:
    """Wu et al.'s score with full eager patterns and no cache: one whole forward per step."""
    ids, score = prompt.clone(), None
    start, end = needle
    for _ in range(steps):
        with torch.no_grad():
            out = eager(ids[None], output_attentions=True)
        token = int(out.logits[0, -1].argmax())
        if score is None:
            score = np.zeros((len(out.attentions), out.attentions[0].shape[1]))
        for layer, pattern in enumerate(out.attentions):
            for head in range(pattern.shape[1]):
                j = int(pattern[0, head, -1].argmax())
                if start <= j < end and int(ids[j]) == token:
                    score[layer, head] += 1 / (end - start)
        ids = torch.cat([ids, ids.new_tensor([token])])
    return score


def test_copy_paste_matches_brute_force(family_pair):
    handle, eager = family_pair
    for seed in range(10):  # a prompt on which some heads copy the needle token
        prompt = copying_prompt(handle, seed)
        expected = brute_force_copy_paste(eager, prompt, (9, 15), steps=4)
        if expected.sum() > 0:
            break
    enc = Encoded(
        input_ids=torch.cat([prompt, torch.tensor([5, 6, 7])]),
        answer_start=len(prompt),
        needle=(9, 15),
    )
    result = copy_paste_score(handle, enc, max_new_tokens=4)
    assert result.score.sum() > 0
    np.testing.assert_allclose(result.score, expected, atol=1e-12)
    assert len(result.generated) == 4 and result.generated[0] == int(prompt[9])
    assert len(copy_paste_score(handle, enc).generated) == 3  # default: the answer's length


def test_needle_scores_average_over_samples(handle, tmp_path):
    prompt = copying_prompt(handle)
    tok = handle.tokenizer
    pieces = [tok.decode([int(t)]) for t in prompt[1:]]
    text = "".join(pieces)
    start = sum(len(p) for p in pieces[:8])
    needle = (start, start + sum(len(p) for p in pieces[8:14]))
    copying = Sample(
        task="needle",
        prompt=text,
        answer=" a b",
        needle=needle,
        meta={"context_length": 18, "depth_percent": 50.0},
    )
    other = Sample(
        task="needle",
        prompt=text,
        answer=" a b",
        needle=(0, len(pieces[0])),
        meta={"context_length": 18, "depth_percent": 0.0},
    )
    assert copying.encode(tok).input_ids[: len(prompt)].tolist() == prompt.tolist()
    config = CopyPasteConfig(threshold=0.05)
    scores = needle_retrieval_scores(
        handle, [copying, other], config, results=tmp_path / "n.jsonl", progress=False
    )
    each = [copy_paste_score(handle, s).score for s in (copying, other)]
    heads = scores.heads.sort_values(["layer", "head"])
    np.testing.assert_allclose(heads["score"].to_numpy(), np.mean(each, 0).ravel())
    assert heads["retrieval_head"].tolist() == (np.mean(each, 0).ravel() > 0.05).tolist()
    assert scores.heads["rank"].iloc[0] == 1 and scores.heads["score"].iloc[0] > 0
    assert set(scores.per_sample["depth_percent"]) == {0.0, 50.0}


def test_needle_bad_input(handle):
    with pytest.raises(ValueError, match="no needle span"):
        copy_paste_score(handle, Sample(task="needle", prompt="line one two", answer=" two"))
    outside = Encoded(input_ids=torch.tensor([2, 5, 6, 7, 8]), answer_start=3, needle=(2, 5))
    with pytest.raises(ValueError, match="not inside the prompt"):
        copy_paste_score(handle, outside)
    with pytest.raises(ValueError, match="empty or outside the prompt"):
        Sample(task="needle", prompt="abc", answer=" x", needle=(2, 9))


# -- masking (MuDAF Fig. 4) ---------------------------------------------------------------


def test_masking_matches_direct_ablation(family_pair, mdqa, tmp_path):
    handle, _ = family_pair
    ranked = pd.DataFrame(
        {"layer": [1, 0, 1, 0, 0, 0, 1, 1], "head": [2, 3, 0, 0, 1, 2, 1, 3], "rank": range(1, 9)}
    )
    niah = ranked.assign(rank=ranked["rank"][::-1].to_numpy())
    config = MaskingConfig(ks=(2,), seeds=(0, 1), qa_f1=True, max_new_tokens=3)
    frame = masking_experiment(
        handle,
        mdqa,
        ranked,
        others={"niah": niah},
        config=config,
        results=tmp_path / "c.jsonl",
        progress=False,
    )
    assert len(frame) == 1 + 2 * 4  # baseline + 2 modes x (top, 2 random, niah)
    rows = frame.set_index(["strategy", "mode", "seed"])
    assert rows.loc[("retrieval", "zero", -1), "heads"] == "1.2 0.3"
    assert rows.loc[("niah", "uniform", -1), "heads"] == "1.3 1.1"
    for seed in (0, 1):
        assert not {"1.2", "0.3"} & set(rows.loc[("random", "zero", seed), "heads"].split())
    for (_, mode, _), row in rows.iterrows():
        heads = [tuple(map(int, h.split("."))) for h in row["heads"].split()]
        iv = ablate(handle.spec, heads, mode) if heads else None
        direct = teacher_force(handle, mdqa, intervention=iv)
        assert row["exact_match"] == np.mean([s.exact_match for s in direct])
        assert row["correct"] == [int(s.exact_match) for s in direct]
        assert row["answer_logprob"] == pytest.approx(np.mean([s.answer_logprob for s in direct]))
    zero, uniform = rows.loc[("retrieval", "zero", -1)], rows.loc[("retrieval", "uniform", -1)]
    assert zero["answer_logprob"] != uniform["answer_logprob"]
    assert rows["qa_f1"].between(0, 1).all()
    # resuming reads every condition back instead of recomputing it
    again = masking_experiment(
        handle,
        mdqa,
        ranked,
        others={"niah": niah},
        config=config,
        results=tmp_path / "c.jsonl",
        progress=False,
    )
    pd.testing.assert_frame_equal(again, frame)
    assert masking_bars(frame).data[0].y is not None


def test_masking_bars_wilson_intervals_over_pooled_draws():
    frame = pd.DataFrame(
        {
            "strategy": ["none", "retrieval", "random", "random"],
            "mode": ["zero"] * 4,
            "k": [0, 2, 2, 2],
            "exact_match": [0.8, 0.0, 0.2, 0.6],
            "n_samples": [10] * 4,
        }
    )
    fig = masking_bars(frame)
    retrieval, random, draws = fig.data
    assert list(random.y) == pytest.approx([0.4])
    # each draw a marker on its own bar (the same offset group), not text squeezed into it
    assert (draws.type, list(draws.x), list(draws.y)) == ("scatter", ["zero", "zero"], [0.2, 0.6])
    assert draws.offsetgroup == random.offsetgroup != retrieval.offsetgroup
    assert fig.layout.scattermode == "group" and random.text is None
    low, high = wilson(8, 20)  # both draws' 20 questions pooled
    assert [random.error_y.arrayminus[0], random.error_y.array[0]] == pytest.approx(
        [0.4 - low, high - 0.4]
    )
    assert retrieval.error_y.array[0] == pytest.approx(wilson(0, 10)[1])
    band = fig.layout.shapes[0]  # the unmasked model's interval
    assert (band.y0, band.y1) == pytest.approx(wilson(8, 10))
    spread = masking_bars(frame, metric="k").data[1].error_y  # not a proportion: sd of draws
    assert spread.array[0] == 0.0 and spread.arrayminus is None
    # panels side by side (a pilot, fresh questions): each its own bars and unmasked band, one
    # legend, one colour per strategy whatever order a table lists them in
    fresh = frame.iloc[[0, 3, 2, 1]].assign(n_samples=100)
    fig = masking_bars({"pilot": frame, "fresh": fresh})
    assert [(t.name, t.xaxis, t.showlegend) for t in fig.data] == [
        ("retrieval (k=2)", "x", True),
        ("random (k=2)", "x", True),
        ("one random draw", "x", True),
        ("retrieval (k=2)", "x2", False),
        ("random (k=2)", "x2", False),
        ("one random draw", "x2", False),
    ]
    assert fig.data[0].marker.color == fig.data[3].marker.color != fig.data[1].marker.color
    assert list(fig.data[4].y) == pytest.approx([0.4])
    assert fig.data[4].error_y.array[0] == pytest.approx(wilson(80, 200)[1] - 0.4)
    assert list(fig.data[5].y) == [0.6, 0.2]  # the fresh table lists its draws the other way
    bands = [b for b in fig.layout.shapes if b.type == "rect"]
    assert [b.xref for b in bands] == ["x domain", "x2 domain"]
    edges = [edge for b in bands for edge in (b.y0, b.y1)]
    assert edges == pytest.approx([*wilson(8, 10), *wilson(80, 100)])


def test_masking_pool_draws_like_mudaf_fig4(handle):
    ranked = pd.DataFrame(
        {"layer": [1, 0, 1, 0, 0, 0, 1, 1], "head": [2, 3, 0, 0, 1, 2, 1, 3], "rank": range(1, 9)}
    )
    config = MaskingConfig(ks=(2,), modes=("zero",), seeds=(0, 1, 2), pool=4)
    conds = conditions(handle, ranked, {"niah": ranked.assign(rank=range(8, 0, -1))}, config)
    pool, niah_pool = {(1, 2), (0, 3), (1, 0), (0, 0)}, {(1, 3), (1, 1), (0, 2), (0, 1)}
    by = {(c["strategy"], c["seed"]): set(c["heads"]) for c in conds}
    assert len(conds) == 1 + 3 * 3
    for seed in (0, 1, 2):
        assert len(by["retrieval", seed]) == 2 and by["retrieval", seed] <= pool
        assert by["niah", seed] <= niah_pool
        assert len(by["random", seed]) == 2 and not by["random", seed] & pool
    assert len({frozenset(by["retrieval", seed]) for seed in (0, 1, 2)}) > 1
    with pytest.raises(ValueError, match="smaller than the largest k"):
        MaskingConfig(ks=(5,), pool=4)


def test_greedy_text_equals_generate(handle, mdqa):
    prompt = mdqa[0].encode(handle.tokenizer).prompt_ids
    ours = greedy_text(handle, prompt, 5)
    ref = handle.model.generate(prompt[None], max_new_tokens=5, do_sample=False)[0, len(prompt) :]
    tokens = []
    for t in ref.tolist():
        if t == handle.tokenizer.eos_token_id or "\n" in handle.tokenizer.decode([t]):
            break
        tokens.append(t)
    assert ours == handle.tokenizer.decode(tokens)


def test_masking_bad_config(handle, mdqa):
    with pytest.raises(ValueError, match="modes must be taken from"):
        MaskingConfig(modes=("mean",))
    with pytest.raises(ValueError, match="lacks columns"):
        masking_experiment(handle, mdqa, pd.DataFrame({"layer": [0]}), progress=False)
    ranked = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "rank": [1, 2]})
    with pytest.raises(ValueError, match="top 3 heads of a table of 2"):
        masking_experiment(handle, mdqa, ranked, config=MaskingConfig(ks=(3,)), progress=False)


# -- figures and command line ---------------------------------------------------------------


def test_figures_hold_the_scores(handle, mdqa):
    pa = passage_attention(handle, mdqa[0])
    fig = passage_heatmap(pa, layers=[1])
    np.testing.assert_allclose(np.asarray(fig.data[0].z)[:, 0], pa.prefix[1])
    np.testing.assert_allclose(np.asarray(fig.data[0].z)[:, 1:], pa.attention[1])
    assert list(fig.data[0].x) == ["#0", "#1", "#2", "#3", "#4"]
    assert [s.x0 for s in fig.layout.shapes] == [g + 0.5 for g in pa.golden]
    heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "f1": [0.1, 0.2, 0.3, 0.4]})
    np.testing.assert_allclose(head_score_heatmap(heads).data[0].z, [[0.1, 0.2], [0.3, 0.4]])
    with pytest.raises(ValueError, match="not in 0..1"):
        passage_heatmap(pa, layers=[2])


def test_cli_passage_scores_needle_scores_and_masking(llama_checkpoint, mdqa, tmp_path, capsys):
    data = tmp_path / "mdqa.jsonl"
    jsonl.write_samples(data, mdqa)
    out = tmp_path / "mudaf"
    args = [
        "retrieval",
        "passage-scores",
        "--model",
        llama_checkpoint,
        "--samples",
        str(data),
        "--out",
        str(out),
        "--eps",
        "0.2",
        "--threads",
        "1",
    ]
    assert main(args) == 0
    heads = pd.read_csv(out / "head_scores.csv")
    provenance = ["model", "n", "em_ci_low", "em_ci_high"]  # samples from a file: no seed
    assert list(heads.columns) == ["layer", "head", "f1", "em", "rank", *provenance]
    assert len(heads) == 8 and (heads.model == llama_checkpoint).all() and (heads.n == 3).all()
    for row in heads.itertuples():
        assert (row.em_ci_low, row.em_ci_high) == pytest.approx(wilson(round(row.em * 3), 3))
    lines = (out / "per_sample.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["golden"] == list(mdqa[0].golden)
    assert main(args) == 2  # an earlier run's results are not reused silently
    assert "holds the results of an earlier run" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0  # resumed: nothing recomputed, nothing appended
    assert (out / "per_sample.jsonl").read_text().splitlines() == lines
    assert (out / "passage_attention.html").exists() and (out / "head_scores.html").exists()

    golden = tmp_path / "golden.json"  # LongBench files take golden ids from a separate file
    golden.write_text(json.dumps({s.meta["_id"]: [0] for s in mdqa}))
    assert main([*args[:6], "--golden", str(golden), "--out", str(tmp_path / "lb")]) == 0
    lines = (tmp_path / "lb" / "per_sample.jsonl").read_text().splitlines()
    assert [json.loads(line)["golden"] for line in lines] == [[0]] * 3

    masked = tmp_path / "masking"
    assert (
        main(
            [
                "retrieval",
                "masking",
                "--model",
                llama_checkpoint,
                "--samples",
                str(data),
                "--scores",
                str(out / "head_scores.csv"),
                "--ks",
                "1",
                "--seeds",
                "0",
                "--out",
                str(masked),
            ]
        )
        == 0
    )
    masking = pd.read_csv(masked / "masking.csv")
    assert len(masking) == 1 + 2 * 2 and (masking.n == masking.n_samples).all()
    assert (masking.exact_match_ci_low <= masking.exact_match).all()

    assert (
        main(
            [
                "retrieval",
                "needle-scores",
                "--model",
                llama_checkpoint,
                "--samples",
                str(data),
                "--out",
                str(tmp_path / "niah"),
            ]
        )
        == 2
    )
    assert "sample 0 is a passages sample without a needle span" in capsys.readouterr().err
    cfg = needle.NeedleConfig(context_lengths=(150,), depths=(0, 100), buffer=40)
    jsonl.write_samples(
        tmp_path / "niah.jsonl", needle.generate(cfg, load_model(llama_checkpoint).tokenizer)
    )
    assert (
        main(
            [
                "retrieval",
                "needle-scores",
                "--model",
                llama_checkpoint,
                "--samples",
                str(tmp_path / "niah.jsonl"),
                "--out",
                str(tmp_path / "niah"),
            ]
        )
        == 0
    )
    per_sample = pd.read_csv(tmp_path / "niah" / "per_sample_scores.csv")
    assert sorted(set(per_sample["depth_percent"])) == [0, 100] and len(per_sample) == 2 * 8
