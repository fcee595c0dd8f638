"""The bundled model organism: shipped checkpoint properties (CI-sized) and training smoke.

The card (``interp_seal/organism/checkpoint/README.md``) holds the full measurements (50
samples per length); these tests re-check them on subsets, on the exact same samples as the
card (seed 0 prefixes), so the asserted margins are wide enough for float noise only.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from interp_seal.analysis.statistics import wilson
from interp_seal.cli import main
from interp_seal.evaluation import ACCURACY_COLUMNS, evaluate_line_retrieval
from interp_seal.evaluation.lengths import ACCURACY_PROPORTIONS
from interp_seal.interventions import ablate
from interp_seal.models import load_model
from interp_seal.models.load import ORGANISM_DIR
from interp_seal.organism.card import PARTS, LineSettings, measure_parts, reports
from interp_seal.organism.card_tasks import (
    TaskSettings,
    measure_needle,
    measure_passages,
    measure_retrieval,
)
from interp_seal.organism.mixture import (
    V1_DIR,
    MixtureConfig,
    grow_embeddings,
    lines_document,
    needle_document,
    passages_document,
    train_v2,
    v2_tokenizer,
)
from interp_seal.organism.train import OrganismConfig, organism_tokenizer, train
from interp_seal.tasks import passages
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, make_sample
from interp_seal.tasks.needle import (
    HAYSTACKS,
    SAN_FRANCISCO,
    SEAL_NEEDLES,
    NeedleConfig,
    read_haystack,
)
from interp_seal.tasks.needle import generate as needle_generate
from interp_seal.tasks.passages import PassagesConfig
from interp_seal.tasks.training_needles import make_haystack, make_needle

SHORT, LONG = 10, 200  # lines: the card's shortest and longest lengths
# v2's card (measurements.json): needles at 500 tokens, mean 0.69 and 0.4-0.9 per depth; QA F1
# 0.85 with 5 passages (1-hop). The thresholds leave room for float noise on the same samples
# (needles) and for the smaller sample (QA: 12 of the card's 20 questions).
NEEDLE_SHORT_MEAN, NEEDLE_SHORT_MIN = 0.5, 0.3
QA_F1_5 = 0.75


@pytest.fixture(scope="module")
def organism():
    torch.set_num_threads(1)
    return load_model("organism")


@pytest.fixture(scope="module")
def card():
    return json.loads((ORGANISM_DIR / "measurements.json").read_text())


def test_checkpoint_geometry_and_size(organism):
    spec = organism.spec
    assert spec.n_layers >= 4 and spec.n_heads >= 8
    assert spec.n_kv_heads < spec.n_heads  # grouped-query attention
    assert organism.model.config.model_type == "llama"
    size = sum(f.stat().st_size for f in ORGANISM_DIR.iterdir() if f.is_file())
    assert size <= 20 * 2**20
    # a line index is one token; digits are one token each
    assert len(organism.tokenizer(" humble-pebble", add_special_tokens=False)["input_ids"]) == 1
    assert len(organism.tokenizer(" 45041.", add_special_tokens=False)["input_ids"]) == 6


def exact_match(handle, num_lines: int, n: int, intervention=None) -> float:
    """Teacher-forced exact match on the card's samples (seed 0)."""
    table = evaluate_line_retrieval(
        handle, [num_lines], n=n, seed=0, intervention=intervention, progress=False
    )
    return float(table["exact_match"].iloc[0])


def test_accuracy_high_when_short_and_degrades_when_long(organism, card):
    """Measured here, not read from the card: the card's numbers are checked against a fresh
    measurement of the same samples."""
    short, long = exact_match(organism, SHORT, 40), exact_match(organism, LONG, 40)
    assert short >= 0.95
    assert 0.2 <= long <= 0.7  # the card's stated range at its longest length
    # the card's accuracy (200 samples, seed 0) contains these first 40 samples
    assert abs(card["accuracy"][str(SHORT)] - short) <= 0.05


def test_evaluate_lines_csv_says_where_its_numbers_come_from(tmp_path):
    """The Quick start's command, small: ``accuracy.csv`` ends with the model, the seed and
    each proportion's 95 % Wilson interval over its ``n`` records (the table's own ``n``)."""
    out, n = tmp_path / "results", 12
    argv = ["evaluate", "lines", "--lengths", str(SHORT), str(LONG), "--n", str(n), "--seed", "0"]
    assert main([*argv, "--out", str(out)]) == 0
    table = pd.read_csv(out / "accuracy.csv")
    intervals = [f"{c}_ci_{side}" for c in ACCURACY_PROPORTIONS for side in ("low", "high")]
    assert list(table.columns) == [*ACCURACY_COLUMNS, "model", "seed", *intervals]
    assert table.model.tolist() == ["organism"] * 2 and table.seed.tolist() == [0, 0]
    assert table.n.tolist() == [n, n]  # the records of each length
    assert 0 < table.exact_match.iloc[1] < 1  # at 200 lines: an interval on both sides
    for column in ACCURACY_PROPORTIONS:
        bounds = table[f"{column}_ci_low"], table[f"{column}_ci_high"]
        for p, low, high in zip(table[column], *bounds, strict=True):
            k = round(p * n)  # records answered right
            assert p == pytest.approx(k / n) and low <= p <= high
            assert (low, high) == pytest.approx(wilson(k, n), abs=1e-12)


def _pruning_moves_accuracy(organism, card, n: int, per_side: int) -> None:
    """The card's strongest heads in each direction (the card only picks them), re-measured
    here: pruning each moves exact match the way the card says."""
    delta = torch.tensor(card["prune_delta"])
    lines = card["prune_lines"]
    base = exact_match(organism, lines, n)
    order = delta.flatten().argsort()
    heads = organism.spec.n_heads
    picked = [(order[-1 - i], 1) for i in range(per_side)] + [
        (order[i], -1) for i in range(per_side)
    ]
    for flat, sign in picked:
        layer, head = divmod(int(flat), heads)
        pruned = exact_match(organism, lines, n, ablate(organism.spec, [(layer, head)], "zero"))
        assert sign * (pruned - base) > 0, (layer, head, pruned, base)


@pytest.mark.slow
def test_pruning_moves_accuracy_both_ways(organism, card):
    """Two heads each way on the card's sweep records (~40 s on one thread)."""
    _pruning_moves_accuracy(organism, card, n=card["prune_samples"], per_side=2)


def test_strongest_pruning_effects_hold(organism, card):
    """The default-selection variant: the strongest head each way, on the card's records."""
    _pruning_moves_accuracy(organism, card, n=card["prune_samples"], per_side=1)


def test_pruning_equals_zeroing_o_proj_columns(organism):
    """Independent check of the primitive on the real model: zero the head's weight columns."""
    layer, head, d = 0, 3, organism.spec.d_head
    via_primitive = exact_match(organism, LONG, 30, ablate(organism.spec, [(layer, head)], "zero"))
    weight = organism.proj(layer, "o_proj").weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight[:, head * d : (head + 1) * d] = 0
        via_weights = exact_match(organism, LONG, 30)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert via_primitive == via_weights
    assert via_primitive < exact_match(organism, LONG, 30)  # L0H3 is a retrieval head


# ------------------------------------------------- v2 task properties (needles, passages)


def card_tasks(card, **overrides) -> TaskSettings:
    """The card's task settings (``measurements.json``), with ``overrides``."""
    saved = card["tasks"]["settings"]
    settings = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()}
    return TaskSettings(**{**settings, **overrides})


def test_needles_found_at_the_shortest_length_and_lost_with_length(organism, card):
    """SEAL's ten needles in the shipped haystack (SEAL Fig. 5 layout), the card's first two
    context lengths re-measured on the card's own samples: the grid is drawn length-major,
    so its first columns' samples come first."""
    lengths = tuple(card["tasks"]["settings"]["niah_lengths"][:2])
    grid = measure_needle(organism, card_tasks(card, niah_lengths=lengths))
    per_cell = card["tasks"]["settings"]["niah_per_cell"]
    for depth, row in grid.items():
        for length, value in row.items():
            # the same samples: equal up to one needle flipping on float noise
            assert abs(value - card["tasks"]["niah"][depth][length]) <= 1 / per_cell + 1e-9
    short, longer = (float(np.mean([row[str(n)] for row in grid.values()])) for n in lengths)
    assert short >= NEEDLE_SHORT_MEAN
    assert min(row[str(lengths[0])] for row in grid.values()) >= NEEDLE_SHORT_MIN
    assert longer < short


def test_passage_qa_answered_and_falls_as_passages_are_added(organism):
    """LongBench-format synthetic QA (1-hop), greedy answers scored by token F1 (the card's
    measurement on the first questions of its seed)."""
    f1 = measure_passages(organism, TaskSettings(passage_counts=(5, 20), passage_samples=12))
    assert f1["1-hop"]["5"] >= QA_F1_5
    assert f1["1-hop"]["20"] < f1["1-hop"]["5"]
    assert f1["2-hop"]["20"] <= f1["2-hop"]["5"]


def test_retrieval_heads_found_and_masking_them_loses_the_answers(organism, card):
    """MuDAF's passage-retrieval F1 (Sec. 3.1, eps 0.3) and masking (Fig. 4) on the first 10 of
    the card's questions: the card's retrieval heads (F1 >= 0.5) score >= 0.5 here too, and
    zeroing the top 4 costs more QA F1 than zeroing 4 random heads."""
    f1, masking = measure_retrieval(organism, card_tasks(card, retrieval_samples=10))
    f1 = np.array(f1)
    card_f1 = np.array(card["tasks"]["retrieval_f1"])
    strong = [tuple(h) for h in np.argwhere(card_f1 >= 0.5)]
    assert len(strong) == 3  # the card's count (its specification asked for 4)
    assert all(f1[h] >= 0.5 for h in strong)
    qa = {(row["strategy"], row["seed"]): row["qa_f1"] for row in masking}
    randoms = [v for (strategy, _), v in qa.items() if strategy == "random"]
    assert qa["none", -1] >= 0.7
    assert qa["retrieval", -1] < float(np.mean(randoms)) and qa["retrieval", -1] <= 0.1


def test_training_resumes_to_the_same_model(tmp_path):
    torch.set_num_threads(1)
    cfg = OrganismConfig.smoke()
    train(cfg, tmp_path / "straight", progress=False)
    train(cfg, tmp_path / "resumed", stop_at=3, progress=False)
    assert not (tmp_path / "resumed" / "model.safetensors").exists()
    assert json.loads((tmp_path / "resumed" / "state" / "trainer.json").read_text())["step"] == 3
    train(cfg, tmp_path / "resumed", resume=True, progress=False)
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_cli_smoke_trains_a_loadable_checkpoint(tmp_path):
    assert main(["organism", "train", "--out", str(tmp_path), "--smoke"]) == 0
    handle = load_model(tmp_path)
    assert handle.spec.n_kv_heads < handle.spec.n_heads


# ------------------------------------------------------------------------------ v2 recipe


@pytest.fixture(scope="module")
def v2_tok():
    return v2_tokenizer()


def test_v2_tokenizer_keeps_v1_ids_and_round_trips_every_format(v2_tok):
    v1 = organism_tokenizer().get_vocab()
    grown = v2_tok.get_vocab()
    assert all(grown[piece] == i for piece, i in v1.items())
    rng = random.Random(0)
    cfg = MixtureConfig()
    texts = [
        "".join(lines_document(cfg, rng)[0]),
        "".join(needle_document(cfg, v2_tok, rng, reach=0.1)[0]),
        "".join(passages_document(cfg, rng)[0]),
    ]
    niah = NeedleConfig(
        context_lengths=(600,),
        needles=(*SEAL_NEEDLES, SAN_FRANCISCO),
        haystack=read_haystack("essays"),  # the organism's haystack: its words are in v2's
    )
    texts += [s.prompt + s.answer for s in needle_generate(niah, v2_tok, 1, seed=0)]
    texts += [s.prompt + s.answer for s in passages.generate(PassagesConfig(hops=2), 3, seed=0)]
    for text in texts:
        ids = v2_tok(text)["input_ids"]
        assert v2_tok.unk_token_id not in ids
        assert v2_tok.decode(ids, skip_special_tokens=True) == text
    # real words and the passages' made-up names are one token; other made-up words split
    assert len(v2_tok(" chandelier", add_special_tokens=False)["input_ids"]) == 1
    pieces = v2_tok.convert_ids_to_tokens
    assert all(
        pieces(v2_tok(text, add_special_tokens=False)["input_ids"]) == [text]
        for name in passages.NAMES
        for text in (name, " " + name)
    )
    assert pieces(v2_tok(" Kalomi Renese", add_special_tokens=False)["input_ids"]) == [
        " Kalo",
        "##mi",
        " Ren",
        "##ese",
    ]


def test_training_needles_are_never_the_evaluation_ones():
    rng = random.Random(0)
    generated = [make_needle(rng) for _ in range(2000)]
    seal = {n.text for n in (*SEAL_NEEDLES, SAN_FRANCISCO)}
    questions = {n.question for n in (*SEAL_NEEDLES, SAN_FRANCISCO)}
    assert not seal & {n.text for n in generated}
    assert not questions & {n.question for n in generated}
    openings = {
        n.text[: n.text.index(n.key)].strip().lower() for n in (*SEAL_NEEDLES, SAN_FRANCISCO)
    }
    assert not openings & {n.text[: n.text.index(n.key)].strip().lower() for n in generated}
    assert len({n.text for n in generated}) > 1900  # hundreds of thousands of combinations
    # no 6-word run of a shipped haystack appears in a generated haystack
    hay = make_haystack(rng, n_words=3000, avoid=generated[0]).split()
    for name in HAYSTACKS:
        words = read_haystack(name).split()
        runs = {" ".join(words[i : i + 6]) for i in range(len(words) - 5)}
        assert not runs & {" ".join(hay[i : i + 6]) for i in range(len(hay) - 5)}
    # distractors never ask the needle's question
    for _ in range(50):
        assert make_needle(rng, avoid=generated[0]).question != generated[0].question
    # each generated needle states its key phrase right after the phrase its question asks for
    for n in generated[:200]:
        assert n.text.endswith(n.key + ".") and n.key[0].islower()


def test_grown_model_scores_old_tokens_exactly_as_v1(v2_tok):
    """New embedding rows change nothing for text made of v1's tokens."""
    from transformers import LlamaForCausalLM

    v1 = LlamaForCausalLM.from_pretrained(V1_DIR)
    grown = grow_embeddings(LlamaForCausalLM.from_pretrained(V1_DIR), len(v2_tok), seed=0)
    sample = make_sample(LineRetrievalConfig(num_lines=5), random.Random(0))
    ids = v2_tok(sample.prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        old, new = v1(ids).logits, grown(ids).logits
    assert new.shape[-1] == len(v2_tok) > old.shape[-1]
    torch.testing.assert_close(new[..., : old.shape[-1]], old, rtol=0, atol=0)


def test_v2_training_resumes_to_the_same_model(tmp_path):
    torch.set_num_threads(1)
    cfg = MixtureConfig.smoke(base=str(V1_DIR))
    train_v2(cfg, tmp_path / "straight", progress=False)
    train_v2(cfg, tmp_path / "resumed", stop_at=3, progress=False)
    train_v2(cfg, tmp_path / "resumed", resume=True, progress=False)
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    state = json.loads((tmp_path / "resumed" / "state" / "trainer.json").read_text())
    assert set(state["curriculum"]["exact"]) <= {"repeat", "lines", "needle", "passages"}


def test_cli_recipe_overrides_reach_the_run_and_bad_ones_are_refused(tmp_path, capsys):
    args = ["organism", "train", "--v2", "--smoke", "--out", str(tmp_path / "m"), "--set"]
    sets = ["p_needle=0.25", "p_lines=0.15", "passages=2,3", "bf16=false"]
    assert main([*args, *sets]) == 0
    config = json.loads((tmp_path / "m" / "state" / "trainer.json").read_text())["config"]
    assert (config["p_needle"], config["p_lines"], config["passages"], config["bf16"]) == (
        0.25,
        0.15,
        [2, 3],
        False,
    )
    args[args.index("--out") + 1] = str(tmp_path / "bad")  # m holds a run now
    for bad, message in [
        ("p_neeedle=0.2", "expected FIELD=VALUE"),
        ("steps=5", "have their own options"),
        ("p_needle=lots", "is not a float"),
    ]:
        with pytest.raises(SystemExit, match=message):
            main([*args, bad])
    capsys.readouterr()
    assert main([*args, "p_needle=0.9"]) != 0
    assert "sum to at most 1" in capsys.readouterr().err


# ------------------------------------------------------------------ card writer (any checkpoint)


def test_card_parts_are_checked_before_any_work():
    lines = LineSettings(lengths=(5,), prune_lines=5, n_samples=2, prune_samples=2)
    with pytest.raises(ValueError, match="unknown card parts"):
        measure_parts(None, lines, TaskSettings(), parts=["lines", "heatmap"])
    with pytest.raises(ValueError, match=r"not measured yet: run them \(--parts prune"):
        reports({"lines": {"5": 1.0}}, lines, TaskSettings())
    with pytest.raises(ValueError, match="niah_lengths must lie in"):
        TaskSettings(niah_lengths=(100,))


@pytest.mark.slow
def test_card_is_assembled_from_parts_measured_separately(tmp_path):
    """Parts run in two processes' worth of calls share one results file; --write-card reads
    them back (nothing recomputed) into README.md and measurements.json."""
    torch.set_num_threads(1)
    model = train_v2(MixtureConfig.smoke(), tmp_path / "m", progress=False)
    (model / "README.md").write_text("# card\n<!-- measurements -->\n<!-- /measurements -->\n")
    args = [
        "organism",
        "evaluate",
        "--model",
        str(model),
        "--lines",
        "3",
        "5",
        "--samples",
        "3",
        "--prune-lines",
        "3",
        "--prune-samples",
        "2",
        "--niah-lengths",
        "260",
        "--niah-per-cell",
        "1",
        "--passages",
        "3",
        "--qa-samples",
        "2",
        "--seal-lines",
        "3",
        "--seal-samples",
        "2",
        "--threads",
        "1",
        "--results",
        str(tmp_path / "r.jsonl"),
    ]
    assert main([*args, "--parts", "lines", "prune", "needle"]) == 0
    assert main([*args, "--parts", "passages", "retrieval", "seal"]) == 0
    assert main([*args, "--write-card"]) == 0
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in records) == sorted(PARTS)  # each part measured once
    value = {r["key"]: r["value"] for r in records}
    card = json.loads((model / "measurements.json").read_text())
    assert card["accuracy"] == value["lines"]
    assert card["tasks"]["niah"] == value["needle"]
    assert card["tasks"]["seal"] == value["seal"]
    text = (model / "README.md").read_text()
    assert text.startswith("# card\n<!-- measurements -->\nMeasured with `interp-seal ")
    assert text.endswith("<!-- /measurements -->\n")
    assert "| depth % \\ tokens | 260 |" in text and "SEAL-H on line retrieval at 3 lines" in text
