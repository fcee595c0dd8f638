"""Statistics for accuracy comparisons: intervals for error bars, paired tests for claims.

Every accuracy in this project is a mean of 0/1 exact-match outcomes over a fixed set of
records, so its uncertainty is binomial. ``wilson`` gives the Wilson score interval (Wilson
1927), which stays inside [0, 1] and keeps its coverage near 0 and 1, where the normal
approximation ``p +- z sqrt(p (1 - p) / n)`` collapses to a point.

Two methods evaluated on the *same* records (every method of a figure uses the same seeded
records) are compared record by record:

- ``mcnemar_exact``: does one method get more records right? (exact McNemar test);
- ``paired_bootstrap``: an interval for the difference of the two accuracies;
- ``tost_paired``: are the two accuracies within a stated margin of each other? (equivalence,
  the test a "comparable accuracy" claim needs);
- ``mcnemar_sample_size`` / ``equivalence_sample_size``: how many records would decide it.

Outcomes on *different* records (two context lengths) use ``fisher_two_proportions``,
``newcombe_interval`` and ``two_proportion_sample_size``; ``overlap_test`` asks whether two top-k head lists share more
heads than chance.

A gallery tests many claims at once; ``holm`` adjusts their p-values (Holm 1979) so that the
chance of calling any true null "supported" stays at the level, whatever the claims' overlap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom, fisher_exact, hypergeom, norm


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``k / n`` (95 % by default).

    ``n <= 0`` (no records) gives the uninformative ``(0, 1)``."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


# -- paired 0/1 outcomes ------------------------------------------------------------------------
#
# Two methods scored on the same records give pairs (x_i, y_i) of 0/1 outcomes. Their 2 x 2
# table is
#
#                  y = 1    y = 0
#        x = 1      a        b
#        x = 0      c        d
#
# and the difference of the two accuracies is (b - c) / n: the concordant pairs a and d carry
# no information about which method is better. Treating the two accuracies as independent
# samples (a two-proportion test) throws that pairing away and overstates the noise whenever
# the methods agree on most records, which is the usual case for two variants of one model.


def _pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(
            f"paired outcomes need two 1-D arrays of one length, got {x.shape}, {y.shape}"
        )
    if x.size == 0:
        raise ValueError("no pairs: give at least one record scored by both methods")
    return x, y


def _binary_pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = _pair(x, y)
    if not (np.isin(x, (0, 1)).all() and np.isin(y, (0, 1)).all()):
        raise ValueError("McNemar and the paired equivalence test take 0/1 outcomes (exact match)")
    return x, y


@dataclass(frozen=True, kw_only=True)
class McNemarResult:
    """An exact McNemar test of paired 0/1 outcomes ``x`` against ``y``.

    Attributes:
        n: number of pairs (records).
        b: pairs with ``x = 1, y = 0`` (only ``x`` right).
        c: pairs with ``x = 0, y = 1`` (only ``y`` right).
        difference: ``mean(x) - mean(y) = (b - c) / n``.
        p_value: two-sided exact binomial p of ``b`` among the ``b + c`` discordant pairs.
    """

    n: int
    b: int
    c: int
    difference: float
    p_value: float


def mcnemar_exact(x, y) -> McNemarResult:
    """Exact McNemar test (McNemar 1947) for paired 0/1 outcomes.

    Under the null hypothesis that both methods have the same accuracy, each discordant pair is
    equally likely to favour either method, so given ``m = b + c`` discordant pairs
    ``b ~ Binomial(m, 1/2)``. The two-sided exact p-value doubles the smaller tail,

        p = min(1, 2 * P[Binomial(m, 1/2) <= min(b, c)]),

    which for a symmetric binomial equals the sum of the probabilities of all outcomes no more
    likely than the one observed (scipy's ``binomtest``; Fagerland, Lydersen & Laake 2013,
    "The McNemar test for binary matched-pairs data", BMC Med. Res. Methodol. 13:91, recommend
    this exact form, or the mid-p variant, over the chi-squared approximation at small ``m``).
    With no discordant pair there is no evidence either way: ``p = 1``.
    """
    x, y = _binary_pair(x, y)
    b = int(((x == 1) & (y == 0)).sum())
    c = int(((x == 0) & (y == 1)).sum())
    m = b + c
    p = 1.0 if m == 0 else min(1.0, 2.0 * float(binom.cdf(min(b, c), m, 0.5)))
    return McNemarResult(n=int(x.size), b=b, c=c, difference=(b - c) / x.size, p_value=p)


@dataclass(frozen=True, kw_only=True)
class BootstrapInterval:
    """A percentile bootstrap interval of ``mean(x - y)`` over paired records.

    Attributes:
        difference: the observed ``mean(x - y)``.
        low, high: the interval's ends.
        se: standard deviation of the bootstrap means (the bootstrap standard error).
        confidence: the interval's nominal coverage.
        draws: number of bootstrap resamples.
    """

    difference: float
    low: float
    high: float
    se: float
    confidence: float
    draws: int


def paired_bootstrap(
    x, y, *, confidence: float = 0.95, draws: int = 10_000, seed: int = 0
) -> BootstrapInterval:
    """Percentile bootstrap interval of the difference of means of paired outcomes.

    The unit of resampling is the record: each draw picks ``n`` record indices with replacement
    and takes the mean of ``x_i - y_i`` over them, so the pairing is kept (resampling ``x`` and
    ``y`` separately would be the unpaired bootstrap). The interval is the ``(1 - confidence) / 2``
    and ``(1 + confidence) / 2`` quantiles of the ``draws`` resampled means (Efron & Tibshirani
    1993, "An Introduction to the Bootstrap", ch. 13). ``seed`` fixes the draws, so the same
    call gives the same interval. Works for any paired numbers (0/1 exact match, F1 scores).

    With few records the percentile interval is too narrow (it cannot be wider than the spread
    of the observed differences; all-equal differences give a zero-width interval): use it for
    error bars, and ``mcnemar_exact`` for the decision on 0/1 outcomes.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    x, y = _pair(x, y)
    d = x - y
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(draws, d.size))  # (draws, n) record indices
    means = d[idx].mean(axis=1)  # (draws,)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return BootstrapInterval(
        difference=float(d.mean()),
        low=float(low),
        high=float(high),
        se=float(means.std(ddof=1)) if draws > 1 else 0.0,
        confidence=confidence,
        draws=draws,
    )


@dataclass(frozen=True, kw_only=True)
class EquivalenceResult:
    """A TOST equivalence test of paired 0/1 outcomes: is ``|mean(x) - mean(y)| < margin``?

    Attributes:
        n: pairs.
        margin: the equivalence margin (absolute difference of accuracies).
        difference: the adjusted difference ``(b - c) / (n + 2)`` (Agresti & Min 2005).
        se: its standard error.
        p_lower: p of the one-sided test of H0 ``difference <= -margin``.
        p_upper: p of the one-sided test of H0 ``difference >= margin``.
        p_value: ``max(p_lower, p_upper)``, the TOST p-value.
        equivalent: ``p_value < alpha``.
        alpha: the level of each one-sided test.
    """

    n: int
    margin: float
    difference: float
    se: float
    p_lower: float
    p_upper: float
    p_value: float
    equivalent: bool
    alpha: float


def tost_paired(x, y, *, margin: float, alpha: float = 0.05) -> EquivalenceResult:
    """Two one-sided tests (TOST; Schuirmann 1987, J. Pharmacokinet. Biopharm. 15:657) for the
    equivalence of two accuracies measured on the same records.

    "Comparable" is a claim about the *absence* of a difference, so it needs a test whose null
    hypothesis is a difference: H0 ``|p_x - p_y| >= margin`` against H1 ``|p_x - p_y| <
    margin``. TOST rejects H0 when both one-sided nulls are rejected at level ``alpha``:

        z_lower = (D + margin) / se     p_lower = 1 - Phi(z_lower)    (H0: D <= -margin)
        z_upper = (margin - D) / se     p_upper = 1 - Phi(z_upper)    (H0: D >= +margin)
        p = max(p_lower, p_upper);  equivalent iff p < alpha,

    which is the same as the ``1 - 2 alpha`` (90 %) interval of ``D`` lying inside
    ``(-margin, margin)``. A difference that is "not significant" is not evidence of
    equivalence: with few records TOST says "not equivalent" however close the two means are.

    ``D`` and ``se`` are the Wald estimates for matched proportions after adding 1/2 to each
    cell of the paired 2 x 2 table (Agresti & Min 2005, "Simple improved confidence intervals
    for comparing matched proportions", Stat. Med. 24:729): with ``b' = b + 1/2``,
    ``c' = c + 1/2``, ``n' = n + 2``,

        D = (b' - c') / n' = (b - c) / (n + 2),
        se^2 = ((b' + c') - (b' - c')^2 / n') / n'^2.

    The adjustment keeps ``se > 0`` when no record is discordant (the plain Wald ``se`` is then
    0 and would declare any two identical-looking arms equivalent at any ``n``).
    """
    if margin <= 0:
        raise ValueError(f"the equivalence margin must be > 0, got {margin}")
    x, y = _binary_pair(x, y)
    n = int(x.size)
    b = float(((x == 1) & (y == 0)).sum()) + 0.5
    c = float(((x == 0) & (y == 1)).sum()) + 0.5
    n2 = n + 2
    d = (b - c) / n2
    se = math.sqrt(((b + c) - (b - c) ** 2 / n2) / n2**2)
    p_lower = float(norm.sf((d + margin) / se))
    p_upper = float(norm.sf((margin - d) / se))
    p = max(p_lower, p_upper)
    return EquivalenceResult(
        n=n,
        margin=margin,
        difference=d,
        se=se,
        p_lower=p_lower,
        p_upper=p_upper,
        p_value=p,
        equivalent=p < alpha,
        alpha=alpha,
    )


# -- sample sizes ---------------------------------------------------------------------------------


def mcnemar_sample_size(
    difference: float, discordant: float, *, alpha: float = 0.05, power: float = 0.8
) -> int:
    """Pairs (records) a two-sided McNemar test needs to detect ``difference`` with ``power``.

    Connor (1987), "Sample size for testing differences in proportions for the paired-sample
    design", Biometrics 43:207, eq. (3): with ``psi`` the probability that a pair is discordant
    (``(b + c) / n``) and ``delta`` the difference of the two accuracies (``(b - c) / n``),

        n = ( z_{1-alpha/2} sqrt(psi) + z_{power} sqrt(psi - delta^2) )^2 / delta^2,

    rounded up. ``|delta| <= psi`` always holds (a difference needs that many discordant pairs);
    a larger ``psi`` at the same ``delta`` means noisier pairs and a larger ``n``. Estimating
    ``psi`` and ``delta`` from the data at hand gives a planning number for the next run (the n
    at which an effect of the observed size would be detected 80 % of the time), not evidence.
    """
    delta = abs(float(difference))
    if delta == 0:
        raise ValueError("a difference of 0 cannot be detected at any n; give the effect to detect")
    if not delta <= discordant <= 1:
        raise ValueError(
            f"the discordant-pair rate ({discordant}) must lie in [|difference|, 1] "
            f"(|difference| = {delta})"
        )
    za, zb = norm.ppf(1 - alpha / 2), norm.ppf(power)
    n = (za * math.sqrt(discordant) + zb * math.sqrt(discordant - delta**2)) ** 2 / delta**2
    return math.ceil(n - 1e-9)


def equivalence_sample_size(
    margin: float,
    discordant: float,
    *,
    difference: float = 0.0,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int:
    """Pairs a TOST at level ``alpha`` (``tost_paired``) needs to show equivalence within
    ``margin`` with ``power``, when the true difference is ``difference``.

    Normal approximation for a paired difference (Chow, Shao & Wang 2008, "Sample Size
    Calculations in Clinical Research", 2nd ed., Sec. 3.2.3): the per-pair variance of
    ``x - y`` is ``psi - delta^2`` (``psi`` the discordant rate), and

        n = (z_{1-alpha} + z_{1-beta/2})^2 (psi - delta^2) / (margin - |delta|)^2   if delta = 0,
        n = (z_{1-alpha} + z_{1-beta})^2   (psi - delta^2) / (margin - |delta|)^2   otherwise,

    rounded up (``beta = 1 - power``; at ``delta = 0`` both one-sided tests can fail, hence
    ``beta / 2``).
    """
    delta = abs(float(difference))
    if margin <= delta:
        raise ValueError(f"a true difference {delta} >= margin {margin} is never shown equivalent")
    if not delta <= discordant <= 1:
        raise ValueError(f"the discordant-pair rate ({discordant}) must lie in [{delta}, 1]")
    beta = 1 - power
    zb = norm.ppf(1 - beta / 2) if delta == 0 else norm.ppf(1 - beta)
    n = (norm.ppf(1 - alpha) + zb) ** 2 * (discordant - delta**2) / (margin - delta) ** 2
    return max(1, math.ceil(n - 1e-9))


# -- independent samples --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TwoProportionResult:
    """Fisher's exact test of two proportions measured on different records.

    Attributes:
        k1, n1, k2, n2: successes and trials of each sample.
        difference: ``k1 / n1 - k2 / n2``.
        p_value: two-sided Fisher exact p.
    """

    k1: int
    n1: int
    k2: int
    n2: int
    difference: float
    p_value: float


def fisher_two_proportions(k1: int, n1: int, k2: int, n2: int) -> TwoProportionResult:
    """Fisher's exact test (two-sided) of ``k1 / n1`` against ``k2 / n2``, for outcomes on
    *different* records (e.g. two context lengths, whose records differ). Conditional on the
    margins of the 2 x 2 table, ``k1`` is hypergeometric under the null; the p-value sums the
    tables no more likely than the observed one (scipy's ``fisher_exact``)."""
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2 and n1 > 0 and n2 > 0):
        raise ValueError(f"need 0 <= k <= n and n > 0, got {k1}/{n1}, {k2}/{n2}")
    p = float(fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue)
    return TwoProportionResult(k1=k1, n1=n1, k2=k2, n2=n2, difference=k1 / n1 - k2 / n2, p_value=p)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int, z: float = 1.96) -> tuple[float, float]:
    """Interval of ``k1 / n1 - k2 / n2`` for independent samples: Newcombe's hybrid score
    interval (Newcombe 1998, "Interval estimation for the difference between independent
    proportions", Stat. Med. 17:873, method 10). With Wilson intervals ``(l_i, u_i)`` of each
    proportion and ``d = p1 - p2``,

        (d - sqrt((p1 - l1)^2 + (u2 - p2)^2),  d + sqrt((u1 - p1)^2 + (p2 - l2)^2)).
    """
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson(k1, n1, z), wilson(k2, n2, z)
    d = p1 - p2
    return (d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2))


def two_proportion_sample_size(
    p1: float, p2: float, *, alpha: float = 0.05, power: float = 0.8
) -> int:
    """Records per sample a two-sided test of two independent proportions needs (Fleiss,
    Levin & Paik 2003, "Statistical Methods for Rates and Proportions", eq. 4.14, without
    continuity correction): with ``pbar = (p1 + p2) / 2``,

        n = ( z_{1-alpha/2} sqrt(2 pbar (1 - pbar)) + z_power sqrt(p1 (1-p1) + p2 (1-p2)) )^2
            / (p1 - p2)^2.
    """
    if p1 == p2:
        raise ValueError("equal proportions cannot be told apart at any n")
    pbar = (p1 + p2) / 2
    za, zb = norm.ppf(1 - alpha / 2), norm.ppf(power)
    num = za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(p1 * (1 - p1) + p2 * (1 - p2))
    return math.ceil(num**2 / (p1 - p2) ** 2 - 1e-9)


def overlap_test(overlap: int, k1: int, k2: int, total: int) -> float:
    """One-sided p that two random sets of ``k1`` and ``k2`` out of ``total`` items share at
    least ``overlap`` items: the hypergeometric upper tail ``P[X >= overlap]``, ``X ~
    Hypergeometric(total, k1, k2)`` (the overlap test of two top-k head lists)."""
    if not (0 <= overlap <= min(k1, k2) and max(k1, k2) <= total):
        raise ValueError(f"overlap {overlap} of {k1} and {k2} out of {total} is impossible")
    return float(hypergeom.sf(overlap - 1, total, k1, k2))


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given; NaN entries (no
    test) are left out of the family and stay NaN.

    Sorted ascending, the i-th smallest of ``m`` p-values becomes ``max_{j <= i} min(1,
    (m - j + 1) p_(j))``: rejecting where the adjusted p is below ``alpha`` controls the
    family-wise error rate at ``alpha``.
    """
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    m = len(tested)
    order = tested[np.argsort(p[tested], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out
