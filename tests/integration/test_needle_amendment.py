"""Plan amendment 4 (``figures.plan``): a gallery registered with a repeated haystack moves its
needles to the long one, and exactly what read the needles is recomputed (``figures.run``:
needle rows fingerprinted by the amended sizes, the others by the registered ones)."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pandas as pd
import pytest

from interp_seal.figures import FIGURES, QUICK
from interp_seal.figures import driver as D
from interp_seal.figures import plan as P
from interp_seal.figures.run import FigureRun
from interp_seal.records import RecordStore, recompute_changed

REPEATED = replace(QUICK, haystack="essays", haystack_repeat=True)  # as SmolLM2's plan


def test_amendment_4_applies_only_to_a_repeated_haystack():
    assert [d["amendment"] for d in P.gallery_amendments("organism", QUICK)] == [1, 2, 3]
    docs = P.gallery_amendments("organism", REPEATED)
    fourth = docs[-1]
    assert [d["amendment"] for d in docs] == [1, 2, 3, 4]
    assert fourth["sizes"] == {"haystack": "long", "haystack_repeat": False}
    assert fourth["figures"] == [] and fourth["claims"] == []
    assert fourth["amends"] == P.plan_hash(P.gallery_plan("organism", REPEATED))
    amended = P.amended_sizes(REPEATED, docs)
    assert (amended.haystack, amended.haystack_repeat) == ("long", False)
    assert replace(amended, haystack="essays", haystack_repeat=True) == REPEATED
    assert P.amended_sizes(QUICK, P.gallery_amendments("organism", QUICK)) == QUICK


def test_the_page_says_what_a_size_amendment_changes(tmp_path):
    from interp_seal.figures.gallery import _amendments

    for doc in P.gallery_amendments("organism", REPEATED):
        (tmp_path / P.AMENDMENT.format(doc["amendment"])).write_bytes(P.plan_bytes(doc))
    text = "\n".join(_amendments(tmp_path))
    assert (
        "It adds no figure or claim; it sets the sizes haystack = 'long', haystack_repeat = False"
        in text
    )
    assert "It adds the figure `heads_duo_tied` and 1 claim" in text


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A directory whose plain and needle rows were stored under the repeated haystack."""
    out = tmp_path_factory.mktemp("amended")
    run = FigureRun("organism", REPEATED, out, progress=False)
    run.rows("plain", [{"k": 1}], lambda key: {"v": 1})
    needles = run.samples("needle", 1, seed=0)
    run.rows("needle_rows", [{"k": 1}], lambda key: {"prompt": needles[0].prompt}, needles=True)
    return out, needles[0].prompt


def test_an_amended_run_recomputes_the_needle_rows_and_keeps_the_others(stores):
    out, old_prompt = stores
    amended = P.amended_sizes(REPEATED, P.gallery_amendments("organism", REPEATED))
    run = FigureRun("organism", amended, out, registered=REPEATED, progress=False)

    def never(key):
        raise AssertionError("a row that read no needles was recomputed")

    assert run.rows("plain", [{"k": 1}], never).v.tolist() == [1]
    needles = run.samples("needle", 1, seed=0)
    assert needles[0].prompt != old_prompt  # the long haystack, not the essays
    with pytest.warns(UserWarning, match="computed on other inputs; computing it again"):
        rows = run.rows(
            "needle_rows", [{"k": 1}], lambda key: {"prompt": needles[0].prompt}, needles=True
        )
    assert rows.prompt.tolist() == [needles[0].prompt]
    # both records are kept; the later one is read, so a third run reuses it without a word
    assert len((out / "work/needle_rows/records.jsonl").read_text().splitlines()) == 2
    again = FigureRun("organism", amended, out, registered=REPEATED, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert again.rows("needle_rows", [{"k": 1}], never, needles=True).prompt.tolist() == [
            needles[0].prompt
        ]


def test_needle_samples_feed_only_declared_rows(stores, tmp_path):
    out, _ = stores
    run = FigureRun("organism", REPEATED, tmp_path, progress=False)
    with pytest.raises(RuntimeError, match="inside a row of 'undeclared'"):
        run.rows("undeclared", [{"k": 1}], lambda key: {"n": len(run.samples("needle", 1, seed=0))})
    run.start_figure()
    run.samples("needle", 1, seed=0)
    with pytest.raises(RuntimeError, match="'after' come after this figure's needle samples"):
        run.rows("after", [{"k": 1}], lambda key: {"v": 1})
    run.start_figure()  # the next figure made no needle samples
    assert run.rows("after", [{"k": 1}], lambda key: {"v": 2}).v.tolist() == [2]


def test_a_changed_record_is_refused_outside_recompute_changed(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.add({"key": "a", "fingerprint": "1", "v": 1})
    with pytest.raises(ValueError, match="computed on a different input"):
        RecordStore(tmp_path / "r.jsonl").get("a", "2")
    with recompute_changed(), pytest.warns(UserWarning, match="'a' was computed on other"):
        assert RecordStore(tmp_path / "r.jsonl").get("a", "2") is None
    store.add({"key": "a", "fingerprint": "2", "v": 2})
    assert RecordStore(tmp_path / "r.jsonl").get("a", "2")["v"] == 2


def test_figure_data_from_another_haystack_is_stale():
    registered = FigureRun.__new__(FigureRun)  # the sizes are all the check reads
    registered.registered, registered.sizes = REPEATED, REPEATED
    amended = FigureRun.__new__(FigureRun)
    amended.registered = REPEATED
    amended.sizes = replace(REPEATED, haystack="long", haystack_repeat=False)
    reads, plain = (next(f for f in FIGURES if f.needles is n) for n in (True, False))
    docs = {}, {"haystack": None}, {"haystack": ["essays", True]}, {"haystack": ["long", False]}
    # legacy data (no haystack recorded), data without needles, the old and the new haystack
    assert [D.needles_moved(d, registered, reads) for d in docs] == [0, 0, 0, 1]
    assert [D.needles_moved(d, amended, reads) for d in docs] == [1, 0, 1, 0]
    assert [D.needles_moved(d, amended, plain) for d in docs] == [0, 0, 1, 0]


def test_a_figure_that_makes_needles_undeclared_is_refused(tmp_path, monkeypatch):
    from interp_seal.figures import registry as R

    spec = next(f for f in FIGURES if f.name == "seal_fig5_needle")
    quiet = replace(
        spec,
        compute=lambda run: {"n": pd.DataFrame({"n": [len(run.samples("needle", 1, seed=0))]})},
        needles=False,
    )
    monkeypatch.setattr(R, "FIGURES", tuple(quiet if f is spec else f for f in R.FIGURES))
    with pytest.raises(RuntimeError, match="seal_fig5_needle made needle samples but"):
        D.regenerate(
            "organism", tmp_path, quick=True, progress=False, png=False, only=["seal_fig5_needle"]
        )
    assert not (tmp_path / "data" / "seal_fig5_needle.json").exists()
