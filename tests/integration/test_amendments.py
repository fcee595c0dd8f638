"""Plan amendments (``figures.plan``): figures and claims added to a gallery after its plan,
written before their data, refused when they differ, change the plan, or come after data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interp_seal.cli import main
from interp_seal.figures import FIGURES, QUICK, regenerate
from interp_seal.figures import claims as C
from interp_seal.figures import mudaf as M
from interp_seal.figures import plan as P
from interp_seal.figures.sizes import preset_sizes

NEW = "heads_definitions"  # an amended figure; its first step is MuDAF's passage scores


def stop(*args, **kwargs):
    raise RuntimeError("stop before any data")


@pytest.fixture
def started(tmp_path, monkeypatch):
    """A quick gallery directory where the amended figure began and stopped before any data."""
    out = tmp_path / "g"
    monkeypatch.setattr(M, "base_scores", stop)
    with pytest.raises(RuntimeError, match="stop before"):
        regenerate("organism", out, quick=True, progress=False, png=False, only=[NEW])
    return out


def test_a_fresh_directory_gets_the_plan_and_every_amendment_before_data(started):
    doc, second, third = P.gallery_amendments("organism", QUICK)
    assert (started / "plan_amendment_1.json").read_bytes() == P.plan_bytes(doc)
    assert (started / "plan_amendment_2.json").read_bytes() == P.plan_bytes(second)
    assert (started / "plan_amendment_3.json").read_bytes() == P.plan_bytes(third)
    assert not (started / "data" / f"{NEW}.json").exists()
    plan = json.loads((started / "plan.json").read_text())
    # run.json's identity stays the plan's hash; the amendment names it and adds to it
    run = json.loads((started / "run.json").read_text())
    assert run["plan_sha256"] == P.plan_hash(plan) == doc["amends"]
    assert doc["figures"] == ["heads_definitions", "kv_budget"]
    names = [c["claim"] for c in doc["claims"]]
    assert names == [c for c, _, _ in C.AMENDMENT_1_CLAIMS] and len(names) == 7
    assert all(c["test"] and c["population"] for c in doc["claims"])
    assert "this amendment's 7 claims, one family" in doc["correction"]
    assert len(C.CLAIMS) == 22
    assert [f for f, _ in C.FAMILIES] == ["plan", *(f"amendment {i}" for i in (1, 2, 3))]
    assert doc["sizes"]["kv_lengths"] == list(QUICK.kv_lengths)
    # amendment 2 adds duo's whole-KV-head masking on amendment 1's fresh questions
    assert second["figures"] == ["heads_duo_groups"] and second["amends"] == doc["amends"]
    assert [c["claim"] for c in second["claims"]] == [C.DUO_GROUPS_CLAIM]
    assert second["sizes"] == {"definition_questions": QUICK.definition_questions}
    # amendment 3 the same arm with the whole tie of gates at the cut
    assert third["figures"] == ["heads_duo_tied"] and third["amends"] == doc["amends"]
    assert [c["claim"] for c in third["claims"]] == [C.DUO_TIED_CLAIM]
    assert "every KV head whose gate ties the last of them" in third["claims"][0]["test"]


def test_a_gallery_with_the_amendment_accepts_resume(started, monkeypatch):
    monkeypatch.setattr(M, "base_scores", stop)
    args = ["figures", "--out", str(started), "--quick", "--resume", "--only", NEW]
    with pytest.raises(RuntimeError, match="stop before"):  # past every check, into the work
        main([*args, "--no-png"])


def test_an_amendment_that_differs_from_the_code_is_refused(started, monkeypatch):
    path = started / "plan_amendment_1.json"
    doc = json.loads(path.read_text())
    doc["claims"][0]["population"] = "the questions where it worked"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    monkeypatch.setattr(M, "base_scores", stop)
    with pytest.raises(ValueError, match="differs from plan amendment 1"):
        regenerate("organism", started, quick=True, progress=False, png=False, only=[NEW])


def test_an_amendment_may_only_add(tmp_path, monkeypatch):
    def changes_a_figure(model, sizes):
        doc = P.amendment_1(model, sizes)
        return doc | {"figures": [*doc["figures"], "mudaf_fig4_masking"]}

    def changes_a_claim(model, sizes):
        doc = P.amendment_1(model, sizes)
        claim = dict(doc["claims"][0], claim=C.PLAN_CLAIMS[0][0])
        return doc | {"claims": [claim, *doc["claims"][1:]]}

    monkeypatch.setattr(M, "base_scores", stop)
    for number, changed in enumerate((changes_a_figure, changes_a_claim)):
        monkeypatch.setattr(P, "AMENDMENTS", (changed,))
        out = tmp_path / str(number)
        with pytest.raises(ValueError, match="may only add figures and claims"):
            regenerate("organism", out, quick=True, progress=False, png=False, only=[NEW])
        assert not (out / "plan_amendment_1.json").exists()


def test_data_before_its_amendment_is_refused(started, monkeypatch):
    (started / "plan_amendment_1.json").unlink()  # as in a gallery made before the amendment
    (started / "data" / "kv_budget.json").write_text("{}")
    monkeypatch.setattr(M, "base_scores", stop)
    with pytest.raises(ValueError, match="data before its plan"):
        regenerate("organism", started, quick=True, progress=False, png=False, only=[NEW])
    assert not (started / "plan_amendment_1.json").exists()


def test_every_figure_is_in_the_plan_or_one_amendment():
    amended = [f for a in P.gallery_amendments("organism", QUICK) for f in a["figures"]]
    assert sorted([*P.PLAN_FIGURES, *amended]) == sorted(f.name for f in FIGURES)
    assert len(set(amended)) == len(amended) and not set(amended) & set(P.PLAN_FIGURES)


GALLERIES = sorted(p.parent for p in Path("figures").glob("*/run.json"))


@pytest.mark.parametrize("gallery", GALLERIES, ids=[g.name for g in GALLERIES])
def test_committed_galleries_keep_their_plans_identity(gallery):
    """Adding amendment 1 left the plan, and so ``run.json``'s identity, of every committed
    gallery as it was (its sizes are not part of the identity)."""
    run = json.loads((gallery / "run.json").read_text())
    if "plan_sha256" not in run:
        pytest.skip(f"{gallery} predates the pre-registered design")
    sizes = preset_sizes(run["model"], quick=run["sizes"].get("preset", "").endswith("quick"))
    assert json.loads(json.dumps(sizes.as_dict())) == run["sizes"]
    plan = P.gallery_plan(run["model"], sizes)
    assert P.plan_hash(plan) == run["plan_sha256"]
    assert (gallery / "plan.json").read_bytes() == P.plan_bytes(plan)
    P.check_amendments(gallery, plan, P.gallery_amendments(run["model"], sizes))
