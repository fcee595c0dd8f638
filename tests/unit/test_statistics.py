"""The statistics behind the claims table, against values computed by hand.

Each expected number below is worked out in the test's docstring from the formula the function
cites, so a test fails if the implementation drifts from the method it documents.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from interp_seal.analysis import statistics as S


def pairs(b: int, c: int, a: int = 0, d: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Paired 0/1 outcomes with the 2 x 2 cells a (1, 1), b (1, 0), c (0, 1), d (0, 0)."""
    x = np.r_[np.ones(a), np.ones(b), np.zeros(c), np.zeros(d)]
    y = np.r_[np.ones(a), np.zeros(b), np.ones(c), np.zeros(d)]
    return x, y


def test_mcnemar_exact_textbook_example():
    """Fagerland, Lydersen & Laake (2013, BMC Med. Res. Methodol. 13:91), airway
    hyper-responsiveness before / after treatment: n = 21 pairs, 1 and 7 discordant, exact
    conditional McNemar p = 0.070. By hand: m = 8 discordant pairs, b = 1,
    P[Bin(8, 1/2) <= 1] = (C(8,0) + C(8,1)) / 2^8 = 9 / 256, two-sided p = 18 / 256 = 0.0703125.
    """
    x, y = pairs(b=1, c=7, a=2, d=11)
    r = S.mcnemar_exact(x, y)
    assert (r.n, r.b, r.c) == (21, 1, 7)
    assert r.difference == pytest.approx((1 - 7) / 21)
    assert r.p_value == pytest.approx(18 / 256, abs=1e-12)


def test_mcnemar_more_hand_values_and_symmetry():
    """b = 8, c = 2: P[Bin(10, 1/2) <= 2] = (1 + 10 + 45) / 1024 = 56 / 1024, p = 112 / 1024.
    b = 9, c = 1: (1 + 10) / 1024, p = 22 / 1024. b = c: p = 1 (2 * P[X <= 5] > 1 is capped).
    No discordant pair: p = 1, the concordant records carry no evidence."""
    assert S.mcnemar_exact(*pairs(8, 2, a=20, d=20)).p_value == pytest.approx(112 / 1024)
    assert S.mcnemar_exact(*pairs(2, 8)).p_value == pytest.approx(112 / 1024)
    assert S.mcnemar_exact(*pairs(9, 1)).p_value == pytest.approx(22 / 1024)
    assert S.mcnemar_exact(*pairs(5, 5)).p_value == 1.0
    r = S.mcnemar_exact(*pairs(0, 0, a=30, d=20))
    assert r.p_value == 1.0 and r.difference == 0.0
    with pytest.raises(ValueError, match="0/1"):
        S.mcnemar_exact([0.5, 1], [1, 1])
    with pytest.raises(ValueError, match="one length"):
        S.mcnemar_exact([1, 0], [1])


def test_tost_paired_hand_example():
    """n = 50 records, b = 3, c = 2, margin 0.1. Agresti-Min cells: b' = 3.5, c' = 2.5,
    n' = 52. D = 1 / 52 = 0.019231; se^2 = (6 - 1 / 52) / 52^2 = 5.980769 / 2704 = 0.0022118,
    se = 0.047030. z_lower = (0.019231 + 0.1) / 0.047030 = 2.5352, p_lower = 0.005619;
    z_upper = (0.1 - 0.019231) / 0.047030 = 1.7174, p_upper = 0.042953. TOST p = 0.042953 < 0.05:
    equivalent within 0.1."""
    x, y = pairs(b=3, c=2, a=30, d=15)
    r = S.tost_paired(x, y, margin=0.1)
    assert r.n == 50
    assert r.difference == pytest.approx(1 / 52)
    assert r.se == pytest.approx(math.sqrt((6 - 1 / 52) / 52**2))
    assert r.se == pytest.approx(0.047030, abs=1e-6)
    assert r.p_lower == pytest.approx(0.005619, abs=1e-6)
    assert r.p_upper == pytest.approx(0.042953, abs=1e-6)
    assert r.p_value == r.p_upper and r.equivalent


def test_tost_needs_records_not_just_equal_means():
    """10 records, both methods right on all: b' = c' = 0.5, n' = 12, D = 0,
    se = sqrt(1 / 144) = 1/12, z = 0.1 * 12 = 1.2, p = 1 - Phi(1.2) = 0.11507: identical arms on
    10 records are NOT shown equivalent within 0.1. With 100 records: se = 1/102, z = 10.2,
    p ~ 1e-24: equivalent."""
    r = S.tost_paired(np.ones(10), np.ones(10), margin=0.1)
    assert r.difference == 0 and r.se == pytest.approx(1 / 12)
    assert r.p_value == pytest.approx(0.115070, abs=1e-6) and not r.equivalent
    assert S.tost_paired(np.ones(100), np.ones(100), margin=0.1).equivalent
    # a clear difference is never equivalent: b = 10, c = 0 of 20
    assert not S.tost_paired(*pairs(10, 0, d=10), margin=0.1).equivalent
    with pytest.raises(ValueError, match="margin"):
        S.tost_paired([1], [1], margin=0)


def test_paired_bootstrap_against_exact_enumeration():
    """Three records with differences d = (1, 0, 0). A resample of 3 records takes the 1 a
    Bin(3, 1/3) number of times, so the resampled mean is 0, 1/3, 2/3, 1 with probabilities
    8/27, 12/27, 6/27, 1/27 (cumulative 0.296, 0.741, 0.963, 1). The 2.5 % quantile is 0, the
    97.5 % quantile 1 (0.963 < 0.975), the 95 % quantile 2/3; the exact standard deviation of
    the resampled mean is sqrt(var(d) / 3) = sqrt((1/3)(2/3) / 3) = sqrt(2 / 27) = 0.2722."""
    # the brute force: all 27 ordered resamples
    means = [np.mean(c) for c in itertools.product([1, 0, 0], repeat=3)]
    assert np.std(means) == pytest.approx(math.sqrt(2 / 27))
    r95 = S.paired_bootstrap([1, 0, 0], [0, 0, 0], draws=20_000, seed=1)
    assert (r95.low, r95.high) == (0.0, 1.0)
    assert r95.difference == pytest.approx(1 / 3)
    assert r95.se == pytest.approx(math.sqrt(2 / 27), rel=0.03)
    r90 = S.paired_bootstrap([1, 0, 0], [0, 0, 0], confidence=0.9, draws=20_000, seed=1)
    assert (r90.low, r90.high) == pytest.approx((0.0, 2 / 3))
    # seeded: the same call gives the same interval
    assert S.paired_bootstrap([1, 0, 0], [0, 0, 0], draws=500, seed=3) == S.paired_bootstrap(
        [1, 0, 0], [0, 0, 0], draws=500, seed=3
    )


def test_paired_bootstrap_keeps_the_pairing():
    """y = x + 0.1 on every record: every paired resample has mean difference exactly -0.1,
    however much x varies (an unpaired bootstrap would spread by the spread of x)."""
    x = np.random.default_rng(0).random(40)
    r = S.paired_bootstrap(x, x + 0.1, draws=2_000)
    assert r.low == pytest.approx(-0.1) and r.high == pytest.approx(-0.1)
    assert r.se == pytest.approx(0.0, abs=1e-12)


def test_mcnemar_sample_size_connor_1987_by_hand():
    """delta = 0.1, psi = 0.2, alpha = 0.05, power = 0.8: z_0.975 = 1.959964, z_0.8 = 0.841621.
    1.959964 * sqrt(0.2) = 0.876523; 0.841621 * sqrt(0.2 - 0.01) = 0.366854; sum 1.243377,
    squared 1.545986, / 0.01 = 154.6 -> 155 pairs."""
    assert S.mcnemar_sample_size(0.1, 0.2) == 155
    assert S.mcnemar_sample_size(-0.1, 0.2) == 155  # the sign does not matter
    # noisier pairs at the same difference need more records
    assert S.mcnemar_sample_size(0.1, 0.4) > 155
    with pytest.raises(ValueError, match="cannot be detected"):
        S.mcnemar_sample_size(0.0, 0.2)
    with pytest.raises(ValueError, match="discordant"):
        S.mcnemar_sample_size(0.3, 0.2)


def test_equivalence_and_two_proportion_sample_sizes_by_hand():
    """Equivalence within 0.1 at true difference 0, psi = 0.2: z_0.95 = 1.644854,
    z_0.9 = 1.281552 (beta / 2 = 0.1), (2.926405)^2 * 0.2 / 0.01 = 171.28 -> 172 pairs.
    Two independent proportions 0.5 vs 0.3 (Fleiss): pbar = 0.4,
    1.959964 * sqrt(0.48) = 1.357903, 0.841621 * sqrt(0.25 + 0.21) = 0.570817, sum 1.928720,
    squared 3.719960, / 0.04 = 92.999 -> 93 per sample."""
    assert S.equivalence_sample_size(0.1, 0.2) == 172
    assert S.two_proportion_sample_size(0.5, 0.3) == 93


def test_fisher_and_overlap_by_hand():
    """Fisher's tea tasting: 3 of 4 vs 1 of 4. Tables with the observed margins have
    probabilities 1, 16, 36, 16, 1 (/ 70); those no more likely than 16/70: 1 + 16 + 16 + 1,
    p = 34 / 70 = 0.485714. Overlap of two top-4 lists out of 32 heads in at least 3:
    (C(4,3) C(28,1) + C(4,4)) / C(32,4) = (112 + 1) / 35960 = 0.0031424."""
    r = S.fisher_two_proportions(3, 4, 1, 4)
    assert r.p_value == pytest.approx(34 / 70) and r.difference == 0.5
    assert S.overlap_test(3, 4, 4, 32) == pytest.approx(113 / 35960)
    assert S.overlap_test(0, 4, 4, 32) == pytest.approx(1.0)


def test_newcombe_interval_published_example():
    """Newcombe (1998, Stat. Med. 17:873), Table II, method 10 (hybrid score): 56/70 vs 48/80
    gives 0.0524 to 0.3339. By hand: the Wilson intervals of 0.8 and 0.6 are (0.69183, 0.87695)
    and (0.49045, 0.70038); low = 0.2 - sqrt(0.10817^2 + 0.10038^2) = 0.2 - 0.14757 = 0.05243,
    high = 0.2 + sqrt(0.07695^2 + 0.10955^2) = 0.2 + 0.13387 = 0.33387."""
    low, high = S.newcombe_interval(56, 70, 48, 80)
    assert (low, high) == pytest.approx((0.0524, 0.3339), abs=5e-5)


def test_holm_adjusts_by_hand_and_leaves_untested_claims_out():
    from interp_seal.analysis.statistics import holm

    # sorted 0.01, 0.02, 0.04 of m = 3: 3 x 0.01, max(0.03, 2 x 0.02), max(0.04, 1 x 0.04)
    adjusted = holm([0.04, float("nan"), 0.01, 0.02])
    np.testing.assert_allclose(adjusted, [0.04, np.nan, 0.03, 0.04])
    np.testing.assert_allclose(holm([0.5, 0.6]), [1.0, 1.0])  # capped at 1, monotone
    assert holm([]).shape == (0,)
