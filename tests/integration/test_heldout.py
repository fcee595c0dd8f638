"""Held out by construction (``figures.heldout``), the pre-registered plan (``figures.plan``)
and head sets that mean what their names say (``figures.mudaf.target_sets``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from interp_seal.figures import QUICK, regenerate
from interp_seal.figures import mudaf as M
from interp_seal.figures.heldout import LeakError, Ledger, units
from interp_seal.figures.plan import gallery_plan, plan_hash
from interp_seal.figures.run import DATA_SEED, FigureRun
from interp_seal.tasks.needle import SEAL_NEEDLES, read_haystack


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return FigureRun("organism", QUICK, tmp_path_factory.mktemp("heldout"), progress=False)


def test_a_planted_line_leak_is_refused_in_either_order(run, tmp_path):
    run.ledger = Ledger(tmp_path / "a")
    run.ledger.figure = "table1"
    run.samples("line_retrieval", 3, seed=0, size=10)
    # tuning data drawn from the evaluation's own seed: the leak the ledger exists for
    with pytest.raises(LeakError, match="shares 3 content unit"):
        run.tuning_samples("planted", n=3, lines=10, seed=-DATA_SEED)
    run.ledger = Ledger(tmp_path / "b")
    run.tuning_samples("planted", n=3, lines=10, seed=-DATA_SEED)
    with pytest.raises(LeakError, match="'planted'"):
        run.samples("line_retrieval", 2, seed=0, size=10)
    # the proper tuning seed shares nothing with the same evaluation
    run.ledger = Ledger(tmp_path / "c")
    run.samples("line_retrieval", 3, seed=0, size=10)
    assert len(run.tuning_samples("proper", n=3, lines=10)) == 3


def test_the_ledger_remembers_earlier_runs(run, tmp_path):
    run.ledger = Ledger(tmp_path)
    run.ledger.figure = "fig"
    run.samples("passages", 2, seed=0, size=4)
    later = Ledger(tmp_path)  # a resumed run
    leak = run.samples("passages", 2, seed=0, size=4)
    with pytest.raises(LeakError):
        later.tuned("mudaf", leak)


def test_needle_tuning_uses_generated_needles_in_generated_haystacks(run, tmp_path):
    run.ledger = Ledger(tmp_path)
    run.ledger.figure = "fig5"
    evaluated = run.samples("needle", 1, seed=0, size=300)
    tuned = run.tuning_samples("seal-h", "needle", n=4, tokens=300)
    seal = {n.text for n in SEAL_NEEDLES}
    haystack = read_haystack(run.sizes.haystack)
    for x in tuned:
        needle = x.prompt[slice(*x.needle)]
        assert needle not in seal and x.meta["question"] not in {n.question for n in SEAL_NEEDLES}
        assert haystack[:200] not in x.prompt  # not hidden in the evaluation's essays
    assert {x.meta["haystack"] for x in tuned}.isdisjoint({x.meta["haystack"] for x in evaluated})
    # a needle tuned in the evaluation haystack is a leak even with another needle
    with pytest.raises(LeakError, match="seal-h"):
        run.ledger.tuned("seal-h", run.samples("needle", 1, seed=5, size=300))


def test_units_tell_records_apart_and_ignore_chance_lines(run):
    a, b = (run._generate("line_retrieval", 5, seed, 10) for seed in (0, 1))
    assert len(set().union(*map(units, a))) == 5
    assert set().union(*map(units, a)).isdisjoint(set().union(*map(units, b)))
    q = run._generate("passages", 2, 0, 4)[0]
    assert len(units(q)) == 1 + 4  # the question with its answer, and each passage


def test_plan_is_written_before_the_data_and_hashed_into_run_json(tmp_path, monkeypatch):
    out = tmp_path / "g"
    seen = {}

    def fail_at_first_compute(*args, **kwargs):
        seen["plan"] = (out / "plan.json").read_bytes()
        raise RuntimeError("stop before any data")

    monkeypatch.setattr(M, "base_scores", fail_at_first_compute)
    with pytest.raises(RuntimeError, match="stop before"):
        regenerate(
            "organism", out, quick=True, progress=False, png=False, only=["mudaf_fig3_scores"]
        )
    plan = json.loads(seen["plan"])
    assert plan == json.loads(json.dumps(gallery_plan("organism", QUICK)))
    assert json.loads((out / "run.json").read_text())["plan_sha256"] == plan_hash(plan)
    assert not (out / "data" / "mudaf_fig3_scores.json").exists()
    names = [c["claim"] for c in plan["claims"]]
    assert len(names) == len(set(names)) == 13 and all(c["population"] for c in plan["claims"])


def test_another_plan_in_the_same_directory_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "g"
    monkeypatch.setattr(M, "base_scores", lambda run: (_ for _ in ()).throw(KeyError("stop")))
    with pytest.raises(KeyError):
        regenerate(
            "organism", out, quick=True, progress=False, png=False, only=["mudaf_fig3_scores"]
        )
    import interp_seal.figures.claims as C

    monkeypatch.setattr(C, "MARGIN", 0.2)  # a changed equivalence margin is another plan
    with pytest.raises(ValueError, match="plan_sha256"):
        regenerate(
            "organism", out, quick=True, progress=False, png=False, only=["mudaf_fig3_scores"]
        )


def _heads(f1: list[float]) -> pd.DataFrame:
    return pd.DataFrame([{"layer": i // 4, "head": i % 4, "f1": v} for i, v in enumerate(f1)])


def test_strong_targets_are_the_top_heads_and_score_above_the_weak(run, monkeypatch):
    f1 = [0.0] * 20 + [0.05, 0.2, 0.15, 0.01]  # compressed scores, like SmolLM2's
    monkeypatch.setattr(M, "base_scores", lambda r: _heads(f1))
    sets = M.target_sets(run)
    assert sets["mudaf"] == ((5, 1), (5, 2))  # the two best, not a temperature draw
    strong = [f1[a * 4 + b] for a, b in sets["mudaf"]]
    weak = [f1[a * 4 + b] for a, b in sets["mudaf-weak"]]
    assert min(strong) > max(weak) and max(weak) < M.WEAK
    monkeypatch.setattr(M, "base_scores", lambda r: _heads([0.0] * 24))
    with pytest.raises(ValueError, match="do not score above the weak"):
        M.target_sets(run)


GALLERIES = sorted(p.parent for p in Path("figures").glob("*/plan.json"))


@pytest.mark.parametrize("gallery", GALLERIES, ids=[g.name for g in GALLERIES])
def test_committed_galleries_strong_targets_score_above_the_weak(gallery):
    """Every gallery of the pre-registered design: the head sets drawn from its stored base
    scores (MuDAF Fig. 3) put the strong targets above the weak, and a figure that stored its
    targets stored these."""
    from interp_seal.figures.tables import load_tables

    heads = load_tables(gallery / "data" / "mudaf_fig3_scores.json")[0]["heads"]
    k = json.loads((gallery / "run.json").read_text())["sizes"].get("mudaf_k", 4)
    sets = M.head_sets(heads, k)
    f1 = heads.set_index(["layer", "head"]).f1
    strong, weak = ([f1[h] for h in sets[g]] for g in ("mudaf", "mudaf-weak"))
    assert min(strong) > max(weak), (strong, weak)
    path = gallery / "data" / "mudaf_fig5_targets.json"
    if path.exists():
        stored = load_tables(path)[0]["targets"]
        for group, hs in sets.items():
            rows = stored[stored.group == group]
            assert set(zip(rows.layer, rows["head"], strict=True)) == set(hs)
            np.testing.assert_allclose(
                rows.f1, [f1[(a, b)] for a, b in zip(rows.layer, rows["head"], strict=True)]
            )


def test_at_least_the_smollm2_gallery_is_of_the_new_design():
    assert Path("figures/smollm2") in GALLERIES


def test_a_figure_counts_the_samples_it_scored_not_the_units_they_add(run, tmp_path):
    """Fifty needles share ten sentences and one haystack: the count is of samples (a figure
    scored at two lengths counted one), and a resumed run that scores nothing keeps it."""
    run.ledger = Ledger(tmp_path)
    run.ledger.figure = "fig5"
    short = run.samples("needle", 2, seed=0, size=300)
    longer = run.samples("needle", 2, seed=0, size=400)  # other samples, no unit of their own
    grid = short + longer
    shared = set().union(*map(units, grid))
    assert shared == set().union(*map(units, short))  # the case the count got wrong
    distinct = len({x.prompt for x in grid})  # a cell may draw one needle twice: one sample
    assert distinct == 2 * len({x.prompt for x in short}) > 2
    tuned = run.tuning_samples("seal-h", "needle", n=4, tokens=300)
    run.samples("needle", 2, seed=0, size=300)  # the same samples again: nothing new
    assert run.ledger.summary("fig5") == {
        "evaluation": {"samples": distinct, "units": len(shared)},
        "tuning": {"seal-h": {"samples": 4, "units": len(set().union(*map(units, tuned)))}},
        "overlap": 0,
    }
    again = Ledger(tmp_path)  # a resumed run whose rows are all stored makes no samples
    assert again.summary("fig5")["evaluation"] == {"samples": distinct, "units": len(shared)}
    again.evaluated("fig5", grid[:3])
    assert again.summary("fig5")["evaluation"]["samples"] == distinct


def test_a_ledger_file_without_sample_ids_keeps_its_count(tmp_path):
    (tmp_path / "tuning-old.json").write_text(
        json.dumps({"kind": "tuning", "name": "old", "samples": 20, "units": ["u"]})
    )
    ledger = Ledger(tmp_path)
    ledger.used("old")
    ledger.figure = "f"
    ledger.used("old")
    assert ledger.summary("f")["tuning"] == {"old": {"samples": 20, "units": 1}}


def test_a_figure_drawn_from_stored_needle_rows_records_their_haystack(run):
    """SEAL Table 2 drawn again from its stored rows makes no needle sample; its data must still
    say which haystack those rows read, or a later amendment would keep it (it read None)."""
    from interp_seal.figures.driver import needles_read

    def row(key):
        return {"n": len(run.samples("needle", 1, seed=0, size=key["length"]))}

    for _ in range(2):  # computed, then read back from the store
        run.start_figure()
        run.rows("needle_rows", [{"length": 300}], row, needles=True)
        assert needles_read(run) == [run.sizes.haystack, run.sizes.haystack_repeat]
    assert not run.made_needles  # the second time the row was stored
    run.start_figure()
    run.rows("line_rows", [{"lines": 3}], lambda key: {"n": 1})
    assert needles_read(run) is None
