"""The claims table's family-wise correction and how a row of several tests is read."""

from __future__ import annotations

import math

from interp_seal.figures import claims as C


def check(verdict: str, p: float, difference: float, test: str = "t") -> C.Check:
    return C.Check(
        measured=test, test=test, n=10, difference=difference, p_value=p, verdict=verdict
    )


def test_a_row_shows_the_numbers_of_the_test_that_decides_it():
    both = C.combine([check("supported", 0.001, 0.3, "a"), check("supported", 0.03, 0.1, "b")])
    assert (both.verdict, both.test, both.p_value, both.difference) == ("supported", "b", 0.03, 0.1)
    against = C.combine([check("not shown", 0.9, 0.0, "a"), check("contradicted", 0.01, -0.2, "b")])
    assert (against.verdict, against.test, against.p_value) == ("contradicted", "b", 0.01)
    open_ = C.combine([check("supported", 0.01, 0.2, "a"), check("not shown", 0.4, 0.05, "b")])
    assert (open_.verdict, open_.test, open_.p_value) == ("not shown", "b", 0.4)


def missing(data):
    raise C.MissingData("figure x was not generated")


def test_verdicts_stand_only_after_holms_correction(monkeypatch):
    rows = [("one", 0.001, "supported"), ("two", 0.01, "supported"), ("three", 0.5, "not shown")]
    fake = [(name, "paper", lambda d, p=p, v=v: check(v, p, 0.1)) for name, p, v in rows] + [
        ("none", "paper", lambda d: (_ for _ in ()).throw(C.MissingData("fig")))
    ]
    monkeypatch.setattr(C, "CLAIMS", fake)
    table = C.claims_table({}).set_index("claim")
    # m = 4 claims, the untested one entering with p = 1 (the plan's family, not the tested
    # part of it): 0.001 x 4 = 0.004, max(0.004, 0.01 x 3) = 0.03, 0.5 x 2 -> 1
    assert table.p_holm.tolist()[:3] == [0.004, 0.03, 1.0]
    assert table.loc["two", "verdict"] == "supported"
    monkeypatch.setattr(
        C,
        "CLAIMS",
        [*fake[:1], ("two", "paper", lambda d: check("supported", 0.03, 0.1)), *fake[2:]],
    )
    table = C.claims_table({}).set_index("claim")
    assert table.loc["two", "verdict"] == "not shown"  # 0.03 alone, 0.09 after Holm
    assert (
        "supported at p 0.03 alone; not after Holm's correction across 4 claims"
        in (table.loc["two", "n_needed"])
    )
    assert table.loc["none", "verdict"] == "not shown" and math.isnan(table.loc["none", "p_holm"])


def test_any_other_error_in_a_claim_is_raised(monkeypatch):
    def broken(d):
        return {}["no such table"]

    monkeypatch.setattr(C, "CLAIMS", [("broken", "paper", broken)])
    try:
        C.claims_table({})
    except KeyError as err:
        assert not isinstance(err, C.MissingData)
    else:
        raise AssertionError("a bug inside a claim became a 'no data' row")
