"""Retrieval-head definitions compared: rank correlations, top-k overlaps, masking, each
against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from interp_seal.analysis.head_definitions import (
    compare_rankings,
    mask_rankings,
    masking_effects,
    sweep_ranking,
    tie_at_cut,
    top_k,
)
from interp_seal.analysis.statistics import holm
from interp_seal.evaluation import teacher_force
from interp_seal.interventions import ablate
from interp_seal.models import load_model
from interp_seal.tasks import passages

HEADS = [(layer, head) for layer in range(2) for head in range(4)]  # the tiny llama's 8 heads


def ranking(order: list[tuple[int, int]]) -> pd.DataFrame:
    """A ranked head table listing ``order`` best first (rows in a shuffled order)."""
    table = pd.DataFrame({"layer": [h[0] for h in order], "head": [h[1] for h in order]}).assign(
        rank=range(1, len(order) + 1)
    )
    return table.sample(frac=1, random_state=0).reset_index(drop=True)


def brute_overlap_p(shared: int, k: int, total: int) -> float:
    """P[two random k-sets of total items share >= shared], by counting."""
    ways = sum(math.comb(k, s) * math.comb(total - k, k - s) for s in range(shared, k + 1))
    return ways / math.comb(total, k)


def test_top_k_is_the_paper_share_rounded_up():
    assert [top_k(n) for n in (8, 20, 21, 270, 1024)] == [1, 1, 2, 14, 52]
    assert top_k(8, 0.25) == 2
    with pytest.raises(ValueError, match="share must lie"):
        top_k(8, 0)


def test_compare_rankings_against_scipy_and_counting():
    rng = np.random.default_rng(3)
    orders = {name: [HEADS[i] for i in rng.permutation(8)] for name in ("a", "b", "c")}
    orders["a_again"] = list(orders["a"])
    orders["reversed"] = orders["a"][::-1]
    result = compare_rankings({n: ranking(o) for n, o in orders.items()}, share=0.25)
    assert result.k == 2
    assert result.sets == {n: o[:2] for n, o in orders.items()}
    for x in orders:
        for y in orders:
            rank_x = [orders[x].index(h) for h in HEADS]
            rank_y = [orders[y].index(h) for h in HEADS]
            rho = spearmanr(rank_x, rank_y).statistic
            assert result.spearman.loc[x, y] == pytest.approx(rho, abs=1e-12)
            shared = len(set(orders[x][:2]) & set(orders[y][:2]))
            assert result.overlap.loc[x, y] == shared / 2
            assert result.overlap_p.loc[x, y] == pytest.approx(brute_overlap_p(shared, 2, 8))
    assert result.spearman.loc["a", "reversed"] == pytest.approx(-1.0)
    assert result.overlap.loc["a", "a_again"] == 1.0 and result.overlap.loc["a", "reversed"] == 0


def scored(scores: dict[tuple[int, int], float]) -> pd.DataFrame:
    """A ranked head table as ``rank_heads`` writes it: ``score`` descending, ties broken by
    head index."""
    table = pd.DataFrame(
        [{"layer": h[0], "head": h[1], "score": v} for h, v in scores.items()]
    ).sort_values(["score", "layer", "head"], ascending=[False, True, True])
    return table.assign(rank=range(1, len(table) + 1)).reset_index(drop=True)


def test_spearman_gives_tied_scores_their_average_rank_not_index_order():
    # two definitions that both leave most heads at one score (DuoAttention's gates tie the
    # query heads of a KV head; copy-paste scores are 0 for most heads): their rank columns
    # break those ties by head index alike, which alone correlates them
    a = scored({h: 1.0 if h == (1, 3) else 0.0 for h in HEADS})
    b = scored({h: 0.9 if h[0] == 0 else 0.1 for h in HEADS})
    result = compare_rankings({"a": a, "b": b}, share=0.25)
    expected = spearmanr([-1.0 * (h == (1, 3)) for h in HEADS], [-0.9 + 0.8 * h[0] for h in HEADS])
    assert result.spearman.loc["a", "b"] == pytest.approx(expected.statistic, abs=1e-12)
    assert result.spearman.loc["a", "b"] < 0  # the rank columns alone gave +0.33
    # without a score column the ranks are taken as given
    plain = compare_rankings({"a": a.drop(columns="score"), "b": b.drop(columns="score")})
    ranks = [[t.set_index(["layer", "head"])["rank"][h] for h in HEADS] for t in (a, b)]
    assert plain.spearman.loc["a", "b"] == pytest.approx(spearmanr(*ranks).statistic)


def test_a_top_set_cut_from_a_tie_is_named():
    gates = scored({h: [0.99, 0.5][h[0]] for h in HEADS})  # one KV head per layer, 4 queries
    clear = scored({h: 8 - i for i, h in enumerate(HEADS)})
    assert tie_at_cut(gates, 2) == (2, 4) and tie_at_cut(clear, 2) == (1, 1)
    assert tie_at_cut(gates, 4) == (4, 4)  # the whole tie inside: fixed by the scores
    assert tie_at_cut(gates.drop(columns="score"), 2) == (0, 0)
    result = compare_rankings({"gates": gates, "clear": clear}, share=0.25)
    assert result.k == 2 and result.cut == {"gates": (2, 4)}
    assert compare_rankings({"gates": gates, "clear": clear}, share=0.5).cut == {}


def test_compare_rankings_refuses_rankings_of_other_heads():
    good = ranking(HEADS)
    with pytest.raises(ValueError, match="at least two"):
        compare_rankings({"a": good})
    with pytest.raises(ValueError, match="same heads"):
        compare_rankings({"a": good, "b": ranking(HEADS[:7])})
    with pytest.raises(ValueError, match="more than once"):
        compare_rankings({"a": good, "b": ranking([HEADS[0], *HEADS[:7]])})
    with pytest.raises(ValueError, match="lacks columns"):
        compare_rankings({"a": good, "b": good.drop(columns="rank")})


def test_sweep_ranking_orders_heads_by_what_zeroing_them_costs():
    sweep = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1, 0, 0, 1, 1, 0],
            "head": [0, 1, 0, 1, 0, 1, 0, 1, 0],
            "channel": [pd.NA] * 8 + [3],
            "length": [5, 5, 5, 5, 9, 9, 9, 9, 9],
            "metric": ["answer_logprob"] * 9,
            "delta": [-1.0, 0.5, -3.0, 0.0, -2.0, 0.5, 0.0, -0.2, -99.0],
        }
    )
    ranked = sweep_ranking(sweep)
    # mean deltas: L0H0 -1.5, L0H1 0.5, L1H0 -1.5, L1H1 -0.1 (the channel row is not a head's)
    assert list(zip(ranked["layer"], ranked["head"], strict=True)) == [
        (0, 0),
        (1, 0),
        (1, 1),
        (0, 1),
    ]
    np.testing.assert_allclose(ranked.score, [1.5, 1.5, 0.1, -0.5])
    assert ranked["rank"].tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="no head rows"):
        sweep_ranking(sweep, "exact_match")


def test_masking_effects_hand_computed():
    def row(strategy, seed, correct):
        return {
            "strategy": strategy,
            "seed": seed,
            "heads": "",
            "exact_match": float(np.mean(correct)),
            "n_samples": len(correct),
            "correct": correct,
        }

    ones = [1] * 10
    frame = pd.DataFrame(
        [
            row("none", -1, ones),
            row("random", 0, ones),
            row("random", 1, [1] * 9 + [0]),
            row("hurts", -1, [0] * 10),  # vs draws: 10 and 9 discordant pairs, all one way
            row("helps", -1, ones),  # never below a draw, above one by a record
            row("mixed", -1, [0] * 8 + [1] * 2),
        ]
    )
    table = masking_effects(frame).set_index("definition")
    # hurts: McNemar p = 2 * 0.5**10 vs draw 0, 2 * 0.5**9 vs draw 1: the larger decides
    assert table.loc["hurts", "p_value"] == pytest.approx(2 * 0.5**9)
    assert table.loc["hurts", "difference"] == pytest.approx(0.9)
    assert table.loc["helps", "p_value"] == 1.0  # no draw is beaten either way by all
    assert table.loc["mixed", "difference"] == pytest.approx(0.7)
    np.testing.assert_allclose(table["p_holm"], holm(table["p_value"].to_numpy()))
    assert table.loc["hurts", "verdict"] == "supported"
    assert table.loc["helps", "verdict"] == "not shown"
    assert (table["random_exact_match"] == 0.95).all() and (table["draws"] == 2).all()
    assert (table["unmasked_exact_match"] == 1.0).all()


def test_mask_rankings_equals_direct_ablation(llama_checkpoint, tmp_path):
    handle = load_model(llama_checkpoint)
    samples = passages.generate(passages.PassagesConfig(num_passages=4, filler_sentences=0), 4, 1)
    orders = {"qr": HEADS, "causal": HEADS[::-1], "passage": HEADS[2:] + HEADS[:2]}
    frame = mask_rankings(
        handle,
        samples,
        {n: ranking(o) for n, o in orders.items()},
        k=2,
        seeds=(0, 1),
        results=tmp_path / "masking.jsonl",
        progress=False,
    )
    assert sorted(frame.strategy) == sorted(["none", "qr", "causal", "passage", "random", "random"])
    rows = frame.set_index(["strategy", "seed"])
    assert rows.loc[("qr", -1), "heads"] == "0.0 0.1"
    assert rows.loc[("causal", -1), "heads"] == "1.3 1.2"
    for seed in (0, 1):  # random draws avoid the first ranking's top set
        assert not {"0.0", "0.1"} & set(rows.loc[("random", seed), "heads"].split())
    for (_, _), r in rows.iterrows():
        heads = [tuple(map(int, h.split("."))) for h in r["heads"].split()]
        iv = ablate(handle.spec, heads, "zero") if heads else None
        direct = teacher_force(handle, samples, intervention=iv)
        assert r["correct"] == [int(s.exact_match) for s in direct]
        assert r["answer_logprob"] == pytest.approx(np.mean([s.answer_logprob for s in direct]))
    effects = masking_effects(frame)
    assert set(effects.definition) == {"qr", "causal", "passage"}


def test_compare_command_writes_the_library_numbers(llama_checkpoint, tmp_path, capsys):
    from interp_seal.analysis.retrieval_scores import rank_heads
    from interp_seal.cli import main
    from interp_seal.tasks.jsonl import write_samples

    samples = passages.generate(passages.PassagesConfig(num_passages=4, filler_sentences=0), 3, 2)
    write_samples(tmp_path / "mdqa.jsonl", samples)
    rng = np.random.default_rng(0)
    files, rankings = [], {}
    for name in ("passage", "qr"):
        table = rank_heads(
            pd.DataFrame({"layer": [h[0] for h in HEADS], "head": [h[1] for h in HEADS]}).assign(
                score=rng.normal(size=8)
            ),
            ["score"],
        )
        table.to_csv(tmp_path / f"{name}.csv", index=False)
        files.append(f"{name}={tmp_path / f'{name}.csv'}")
        rankings[name] = table
    sweep = pd.DataFrame(
        {"layer": [h[0] for h in HEADS], "head": [h[1] for h in HEADS], "channel": pd.NA}
    ).assign(metric="answer_logprob", length=0, delta=rng.normal(size=8))
    sweep.to_csv(tmp_path / "sweep.csv", index=False)
    rankings["causal"] = sweep_ranking(sweep)
    out = tmp_path / "out"
    argv = ["retrieval", "compare", "--model", llama_checkpoint, "--rankings", *files]
    argv += ["--sweep", f"causal={tmp_path / 'sweep.csv'}", "--share", "0.25"]
    argv += ["--samples", str(tmp_path / "mdqa.jsonl"), "--seeds", "0", "1", "--out", str(out)]
    assert main(argv) == 0
    expected = compare_rankings(rankings, share=0.25).pairs()
    written = pd.read_csv(out / "pairs.csv")
    pd.testing.assert_frame_equal(written[expected.columns], expected, check_dtype=False)
    masked = mask_rankings(
        load_model(llama_checkpoint), samples, rankings, k=2, seeds=(0, 1), progress=False
    )
    effects = masking_effects(masked)
    table = pd.read_csv(out / "masking.csv")
    np.testing.assert_allclose(table["exact_match"], effects["exact_match"])
    np.testing.assert_allclose(table["p_value"], effects["p_value"])
    assert table["verdict"].tolist() == effects["verdict"].tolist()
    sets = pd.read_csv(out / "sets.csv")
    assert sets[sets.definition == "causal"][["layer", "head"]].values.tolist() == [
        list(h) for h in compare_rankings(rankings, share=0.25).sets["causal"]
    ]
    assert (out / "compare.html").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rankings", "qr"], "give NAME=FILE"),
        (["--rankings", "a=x.csv", "a=y.csv"], "'a' is given twice"),
        (["--rankings", "random=x.csv"], "names a masking condition"),
        (["--rankings", "a=missing.csv", "b=missing.csv"], "missing.csv"),
    ],
)
def test_compare_command_refuses_bad_rankings(tmp_path, capsys, args, message):
    from interp_seal.cli import main

    out = tmp_path / "out"
    assert main(["retrieval", "compare", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())


def test_tables_are_compared_on_the_column_they_were_ranked_by():
    # the toolkit's tables as written (the CLI reads them back so): passage ranks by f1 (many
    # heads at 0), DuoAttention by gate (a KV head's readers tie), QRHead by qr_score; scipy's
    # spearmanr on those columns averages the ties, and so must the comparison
    from scipy.stats import spearmanr

    from interp_seal.analysis.retrieval_scores import rank_heads

    heads = pd.DataFrame({"layer": [h[0] for h in HEADS], "head": [h[1] for h in HEADS]})
    columns = {
        "passage": ("f1", [0.5, 0.0, 0.0, 0.2, 0.0, 0.0, 0.9, 0.0]),
        "duo": ("gate", [0.9, 0.9, 0.4, 0.4, 0.7, 0.7, 0.1, 0.1]),
        "qr": ("qr_score", [0.3, -0.1, 0.8, 0.05, 0.6, 0.2, 0.7, -0.4]),
    }
    tables = {n: rank_heads(heads.assign(**{c: v}), [c]) for n, (c, v) in columns.items()}
    pairs = compare_rankings(tables, share=0.25).pairs().set_index(["a", "b"])
    value = {
        n: t.set_index(["layer", "head"])[columns[n][0]].reindex(HEADS) for n, t in tables.items()
    }
    for (a, b), row in pairs.iterrows():
        assert row.spearman == pytest.approx(spearmanr(value[a], value[b])[0], abs=1e-12)
    # by their index-broken ranks the same tables would correlate otherwise
    broken = {n: t.drop(columns=columns[n][0]) for n, t in tables.items()}
    assert compare_rankings(broken, share=0.25).pairs().spearman.tolist() != pairs.spearman.tolist()
