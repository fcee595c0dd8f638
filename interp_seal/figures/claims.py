"""The claims table: each qualitative claim of SEAL and MuDAF, tested on the measured numbers.

Every claim is a statement about exact match (or a retrieval score) measured on a fixed set of
records; the verdict is computed from the test the gallery's plan names (``figures.plan``,
written before any data) at level ``ALPHA`` (0.05), never written by hand:

- **paired records, 0/1 outcomes** (two methods on the same seeded records, which is how every
  figure compares methods): the exact McNemar test on the discordant records
  (``analysis.statistics.mcnemar_exact``), with a paired bootstrap 95 % interval of the
  difference of accuracies (``paired_bootstrap``). *supported*: p < 0.05 in the claimed
  direction; *contradicted*: p < 0.05 the other way; *not shown* otherwise;
- **"comparable" claims** (SEAL-H vs LoRA): equivalence is its own hypothesis. *supported*
  needs a TOST equivalence test within ``MARGIN`` (0.10 exact match, ``tost_paired``; the
  plan says why) AND both arms significantly above the baseline (McNemar): two arms that both
  stayed at the baseline are not "comparable accuracy" in the paper's sense;
- **different records** (two context lengths): Fisher's exact test, Newcombe's interval;
- **paired continuous scores** (retrieval F1 per question): Wilcoxon signed-rank; **per-record
  logit margins**: the exact sign test.

A row made of several tests (e.g. "SEAL-H and SEAL-C raise accuracy", each of the tuning runs)
is *supported* only if every test supports it (an intersection-union test: no multiplicity
correction is needed for that) and *contradicted* if any contradicts it; the row shows the
test that decides it. Across rows, Holm's step-down correction (``_corrected``) within each
family of claims as it was registered: the plan's (``PLAN_CLAIMS``, corrected together as
``plan.json`` says) and each amendment's (``AMENDMENT_1_CLAIMS`` to ``AMENDMENT_3_CLAIMS``,
added for issue 41's figures). An amendment adds a family rather than joining the plan's:
enlarging the plan's family afterwards would change the correction the plan registered for its
claims, and with it verdicts already read (``FAMILIES``). Each family holds its error rate at
``ALPHA``; the gallery as a whole at most ``ALPHA`` times the number of families (Bonferroni
over them).

Where claims are read: heads and records chosen on one set of records (the sweep's best
head, the retrieval heads, MuDAF's targets) are tested on fresh records or questions
(``figures.seal.FRESH_SEED``, ``figures.mudaf.FRESH_SEED``); SEAL Table 1's claims on fresh
records whose queried line is not the last (a model that copies the last line is right on 1/L
of all records whatever it retrieves), each tuned method in every one of its tuning runs;
Fig. 2d's claimed scaling on a replication of its own seed. No tuning set shares content with
any evaluation (``figures.heldout``).

A verdict is read only at the n the registered plan names (``PLANNED_N``, ``off_plan``): a
figure whose records on disk differ in number from the sizes of ``plan.json`` and its
amendments (an extended sample, a changed generator) gives an *off plan* row, untested.

When the verdict is *not shown*, ``n_needed`` says how many records the test would need to
decide it with 80 % power: Connor's (1987) McNemar sample size at the observed difference and
discordant rate (``mcnemar_sample_size``), the equivalence sample size for TOST, or Fleiss'
two-proportion formula. It is a planning number for a *new* plan on fresh seeds (the n at
which an effect of the observed size would be detected), not evidence; when no difference was
observed it is given for a difference of ``MIN_EFFECT``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.stats import binomtest, norm, pearsonr, wilcoxon

from interp_seal.analysis.statistics import (
    equivalence_sample_size,
    fisher_two_proportions,
    holm,
    mcnemar_exact,
    mcnemar_sample_size,
    newcombe_interval,
    paired_bootstrap,
    tost_paired,
    two_proportion_sample_size,
)

Tables = dict[str, pd.DataFrame]


class MissingData(KeyError):
    """A claim's figure (or the records of one of its arms) was not generated: the claim's
    row says so. Any other error in a claim is a bug and is raised."""


class Data(dict):
    """Figure name -> its tables (and ``"_sizes"``); a figure not generated raises
    ``MissingData``."""

    def __missing__(self, name: str):
        raise MissingData(f"figure {name} was not generated")


ALPHA = 0.05
MARGIN = 0.10  # equivalence margin of "comparable accuracy" (absolute exact match)
MIN_EFFECT = 0.10  # the difference n_needed plans for when none was observed
SEAL_ARMS = ("base", "seal-h", "seal-c")
COLUMNS = [
    "claim",
    "paper",
    "family",
    "measured",
    "test",
    "n",
    "difference",
    "low",
    "high",
    "p_value",
    "p_holm",
    "n_needed",
    "verdict",
]


@dataclass(frozen=True, kw_only=True)
class Check:
    """One claim (or one part of it) tested.

    Attributes:
        measured: the numbers, in words.
        test: the test that gave ``p_value``.
        n: records (pairs for paired tests; per arm otherwise).
        difference: the claimed direction's effect (positive supports the claim).
        low, high: 95 % interval of ``difference`` (NaN where none applies).
        p_value: the test's p (NaN where no test can be run).
        verdict: ``supported``, ``contradicted`` or ``not shown``.
        n_needed: records that would decide a *not shown* verdict ("" when decided).
    """

    measured: str
    test: str
    n: int
    difference: float
    low: float = math.nan
    high: float = math.nan
    p_value: float = math.nan
    verdict: str = "not shown"
    n_needed: str = ""


def decide(p: float, difference: float) -> str:
    """The verdict of a two-sided test at ``ALPHA`` whose claimed direction is positive."""
    if p < ALPHA and difference > 0:
        return "supported"
    if p < ALPHA and difference < 0:
        return "contradicted"
    return "not shown"


def combine(checks: list[Check], measured: str | None = None) -> Check:
    """One row from several tests: supported iff all support, contradicted if any contradicts.

    The row's test, n, difference, interval and p are those of the test that decides it, so
    they always belong together: the supporting test with the largest p (the
    intersection-union p) when all support, the contradicting test with the smallest p when
    one contradicts, else the undecided test with the largest p.
    """
    verdicts = [c.verdict for c in checks]
    by_p = sorted(checks, key=lambda c: -c.p_value if c.p_value == c.p_value else -2.0)
    if all(v == "supported" for v in verdicts):
        verdict, deciding = "supported", by_p[0]
    elif "contradicted" in verdicts:
        verdict, deciding = "contradicted", [c for c in by_p if c.verdict == "contradicted"][-1]
    else:
        verdict, deciding = "not shown", [c for c in by_p if c.verdict != "supported"][0]
    needed = [c.n_needed for c in checks if c.n_needed]
    return Check(
        measured=measured or "; ".join(c.measured for c in checks),
        test=deciding.test,
        n=deciding.n,
        difference=deciding.difference,
        low=deciding.low,
        high=deciding.high,
        p_value=deciding.p_value,
        verdict=verdict,
        n_needed="" if verdict != "not shown" else "; ".join(needed),
    )


# -- the tests ----------------------------------------------------------------------------------
def paired(x, y, label: str) -> Check:
    """``x`` better than ``y`` on the same records? Exact McNemar + paired bootstrap."""
    m = mcnemar_exact(x, y)
    ci = paired_bootstrap(x, y)
    verdict = decide(m.p_value, m.difference)
    needed = ""
    if verdict == "not shown":
        psi = (m.b + m.c) / m.n
        if m.b != m.c:
            n = mcnemar_sample_size(m.difference, psi)
            needed = f"{label}: {n} (effect {m.difference:+.2f}, discordant {psi:.2f})"
        else:
            n = mcnemar_sample_size(MIN_EFFECT, max(psi, MIN_EFFECT))
            needed = f"{label}: {n} (for a {MIN_EFFECT:.2f} effect; none observed)"
    return Check(
        measured=f"{label} {m.difference:+.2f} (b={m.b}, c={m.c})",
        test="exact McNemar (paired)",
        n=m.n,
        difference=m.difference,
        low=ci.low,
        high=ci.high,
        p_value=m.p_value,
        verdict=verdict,
        n_needed=needed,
    )


def unpaired(p1: float, n1: float, p2: float, n2: float, label: str, *, reason: str) -> Check:
    """``p1`` above ``p2``, outcomes on different records (or pairing not on disk): Fisher."""
    k1, k2, n1, n2 = round(p1 * n1), round(p2 * n2), int(n1), int(n2)
    r = fisher_two_proportions(k1, n1, k2, n2)
    low, high = newcombe_interval(k1, n1, k2, n2)
    verdict = decide(r.p_value, r.difference)
    needed = ""
    if verdict == "not shown":
        a = min(max(k1 / n1, 0.01), 0.99)
        b = min(max(k2 / n2, 0.01), 0.99)
        if a == b:  # no difference observed (or both at a bound): plan for MIN_EFFECT
            b = a - MIN_EFFECT if a - MIN_EFFECT >= 0.01 else a + MIN_EFFECT
        needed = f"{label}: {two_proportion_sample_size(a, b)} per arm"
    return Check(
        measured=f"{label} {r.difference:+.2f}",
        test=f"Fisher exact ({reason})",
        n=min(n1, n2),
        difference=r.difference,
        low=low,
        high=high,
        p_value=r.p_value,
        verdict=verdict,
        n_needed=needed,
    )


def outcomes(records: pd.DataFrame, column: str, value, **where) -> pd.Series:
    """0/1 outcomes of the rows with ``column == value`` (and ``where``), indexed by record."""
    rows = records[records[column] == value]
    for k, v in where.items():
        rows = rows[rows[k] == v]
    if rows.empty:
        raise MissingData(f"no records for {column}={value!r} {where}")
    keys = [k for k in ("length", "record") if k in rows]  # records repeat across lengths
    return rows.set_index(keys).exact_match.sort_index()


def paired_from(records: pd.DataFrame, column: str, a, b, label: str, **where) -> Check:
    x, y = outcomes(records, column, a, **where), outcomes(records, column, b, **where)
    if not x.index.equals(y.index):
        raise ValueError(f"{a} and {b} were scored on different records")
    return paired(x.to_numpy(), y.to_numpy(), label)


def compare(t: Tables, a: str, b: str, length: int | None, label: str) -> Check:
    """Method ``a`` above ``b``: paired McNemar on the figure's ``records`` table (every
    length pooled when ``length`` is None)."""
    where = {} if length is None else {"length": length}
    return paired_from(t["records"], "method", a, b, label, **where)


def _rate(t: Tables, method: str, length: int | None = None) -> str:
    where = {} if length is None else {"length": length}
    return f"{method} {outcomes(t['records'], 'method', method, **where).mean():.2f}"


# -- the claims ---------------------------------------------------------------------------------
def _confirm(d: Data) -> pd.DataFrame:
    """SEAL Table 1's claim records: every tuning run and the base model on fresh records,
    with the queried line's position (``figures.seal.table1_compute``)."""
    c = d["seal_table1_methods"].get("confirm")
    if c is None or not {"tuning_seed", "position"} <= set(c.columns):
        raise MissingData(
            "seal_table1_methods predates the held-out design (tuning runs, queried-line "
            "positions): regenerate it"
        )
    return c


def falls_with_length(d: Data) -> Check:
    """The base model at the shortest and the longest length, on fresh records whose queried
    line is not the last: a model that copies the last line is right on 1/L of all records,
    which alone makes accuracy fall with L; on the other records only retrieval answers."""
    c = _confirm(d)
    base = c[(c.method == "base") & (c.position == "other")]
    lengths = sorted(int(x) for x in base.length.unique())
    lo, hi = (base[base.length == L].exact_match for L in (lengths[0], lengths[-1]))
    check = unpaired(
        lo.mean(),
        len(lo),
        hi.mean(),
        len(hi),
        f"{lengths[0]} - {lengths[-1]} lines",
        reason="each length has its own records",
    )
    every = c[c.method == "base"].groupby("length").exact_match.mean()
    text = (
        f"base on fresh records whose queried line is not the last: {lengths[0]} lines "
        f"{lo.mean():.2f} (n={len(lo)}) vs {lengths[-1]} lines {hi.mean():.2f} (n={len(hi)}); "
        f"every record: {every[lengths[0]]:.2f} vs {every[lengths[-1]]:.2f}"
    )
    return replace(check, measured=text)


def pruning_both_ways(d: Data) -> Check:
    t = d["seal_fig2b_quadrants"]
    sw = t["sweep"][t["sweep"].metric == "exact_match"]
    wide = sw.pivot_table(index=["layer", "head"], columns="length", values="delta")
    x, y = wide.iloc[:, 0].to_numpy(), wide.iloc[:, -1].to_numpy()
    lengths = list(wide.columns)
    if x.std() > 0 and y.std() > 0 and len(x) > 2:
        r, p = pearsonr(x, y)
        z, s = math.atanh(min(r, 0.999999)), 1 / math.sqrt(len(x) - 3) if len(x) > 3 else math.inf
        low, high = math.tanh(z - 1.96 * s), math.tanh(z + 1.96 * s)
    else:
        r, p, low, high = 0.0, 1.0, math.nan, math.nan
    consistent = Check(
        measured=f"Pearson r of the deltas at {lengths[0]} and {lengths[-1]} lines {r:.2f} "
        f"over {len(x)} heads",
        test="Pearson r",
        n=len(x),
        difference=float(r),
        low=low,
        high=high,
        p_value=float(p),
        verdict=decide(float(p), float(r)),
    )
    c = t["confirm"]
    L = int(c.length.iloc[0])
    base = outcomes(c, "unit", "baseline")
    best, worst = outcomes(c, "unit", "best"), outcomes(c, "unit", "worst")
    name = {
        u: f"L{int(r.layer)}H{int(r['head'])}"
        for u, r in c[c.unit != "baseline"].groupby("unit").first().iterrows()
    }
    up = paired(best.to_numpy(), base.to_numpy(), f"pruning {name['best']} (best)")
    down = paired(base.to_numpy(), worst.to_numpy(), f"baseline over pruned {name['worst']}")
    text = (
        f"on {len(base)} fresh records at {L} lines (heads chosen on the sweep's): baseline "
        f"{base.mean():.2f}, best head {name['best']} pruned {best.mean():.2f}, worst "
        f"{name['worst']} pruned {worst.mean():.2f}; {consistent.measured}"
    )
    return combine([up, down, consistent], text)


def scaling_beats_baseline(d: Data) -> Check:
    """Fig. 2d at the long length, decided on the replication (``replicate``: the claimed
    scaling on ``replicate_n`` records of its own fresh seed); the fresh records' result and
    the Q3 x 0.9 control (the paper's: damping the heads that matter should not help) are
    reported beside it."""
    from interp_seal.figures.seal import CLAIMED_SCALING, _quadrants

    t = d["seal_fig2d_scaling"]
    L = int(d["_sizes"]["long"])
    rec = t["records"]
    first = paired_from(rec, "unit", CLAIMED_SCALING, "baseline", CLAIMED_SCALING, length=L)
    rep = t["replicate"]
    c = paired_from(rep, "unit", CLAIMED_SCALING, "baseline", CLAIMED_SCALING, length=L)
    rate = rec[rec.length == L].groupby("unit").exact_match.mean()
    control = "Q3 x 0.9"
    text = (
        f"replication on {c.n} fresh records at {L} lines (seed {int(rep.seed.iloc[0])}): "
        f"{CLAIMED_SCALING} {rep[rep.unit == CLAIMED_SCALING].exact_match.mean():.2f} vs "
        f"baseline {rep[rep.unit == 'baseline'].exact_match.mean():.2f}; on {first.n} other "
        f"fresh records: {CLAIMED_SCALING} {rate[CLAIMED_SCALING]:.2f}, baseline "
        f"{rate['baseline']:.2f}, McNemar p {first.p_value:.3g}"
    )
    if control in rate:
        text += f"; control {control} {rate[control]:.2f}"
    counts = _quadrants(d["seal_fig2b_quadrants"]["sweep"]).counts()
    text += f"; heads scaled: Q1 {counts['Q1']}, Q3 {counts['Q3']}"
    return replace(c, measured=text)


def _runs(c: pd.DataFrame, method: str) -> list[int]:
    return sorted(int(x) for x in c[c.method == method].tuning_seed.unique())


def _other(c: pd.DataFrame, method: str, seed: int) -> pd.Series:
    """A run's 0/1 outcomes on the records whose queried line is not the last, every length
    pooled (the paper's Avg. column: each record is scored by every method, so the pairs stay
    exact)."""
    return outcomes(c[c.position == "other"], "method", method, tuning_seed=seed)


def _mean_runs(c: pd.DataFrame, method: str) -> str:
    rates = [_other(c, method, k).mean() for k in _runs(c, method)]
    if len(rates) == 1:
        return f"{method} {rates[0]:.2f}"
    return f"{method} {np.mean(rates):.2f} ({min(rates):.2f}-{max(rates):.2f})"


def _scope(c: pd.DataFrame) -> str:
    lengths = sorted(int(x) for x in c.length.unique())
    n = int(c[c.method == "base"].groupby("length").record.nunique().min())
    runs = len(_runs(c, "seal-h"))
    return (
        f"over {lengths[0]}-{lengths[-1]} lines, {n} fresh records each, queried line not the "
        f"last; {runs} tuning runs per method (mean, range)"
    )


def seal_raises(d: Data) -> Check:
    """SEAL-H and SEAL-C each above the base model, in every tuning run."""
    c = _confirm(d)
    base = _other(c, "base", 0).to_numpy()
    parts = [
        paired(_other(c, m, k).to_numpy(), base, f"{m} run {k} - base")
        for m in ("seal-h", "seal-c")
        for k in _runs(c, m)
    ]
    text = f"{_scope(c)}: " + ", ".join(_mean_runs(c, m) for m in SEAL_ARMS)
    return combine(parts, text)


def seal_c_beats_h(d: Data) -> Check:
    """SEAL-C above SEAL-H (the paper's Table 1 average), run k against run k: a plain paired
    superiority test, no margin."""
    c = _confirm(d)
    runs = sorted(set(_runs(c, "seal-c")) & set(_runs(c, "seal-h")))
    parts = [
        paired(
            _other(c, "seal-c", k).to_numpy(),
            _other(c, "seal-h", k).to_numpy(),
            f"SEAL-C - SEAL-H run {k}",
        )
        for k in runs
    ]
    return combine(parts, f"{_scope(c)}: " + ", ".join(_mean_runs(c, m) for m in SEAL_ARMS[1:]))


def seal_h_parameters(d: Data) -> Check:
    """SEAL-H within ``MARGIN`` of LoRA (TOST, run k against run k) and both above the base
    model, in every tuning run. ``MARGIN`` (0.10 exact match) is the paper's own resolution:
    SEAL Table 1 reports accuracy on 50 records per length, where one record is 0.02 and a
    95 % interval spans about +-0.1; differences inside it are what it calls comparable."""
    t, c = d["seal_table1_methods"], _confirm(d)
    p = t["params"].set_index("method").trainable
    base = _other(c, "base", 0).to_numpy()
    parts = []
    for k in sorted(set(_runs(c, "seal-h")) & set(_runs(c, "seal-l"))):
        x, y = _other(c, "seal-h", k).to_numpy(), _other(c, "seal-l", k).to_numpy()
        e, m, ci = tost_paired(x, y, margin=MARGIN), mcnemar_exact(x, y), paired_bootstrap(x, y)
        if e.equivalent:
            v = "supported"
        elif m.p_value < ALPHA and m.difference < 0:
            v = "contradicted"  # SEAL-H significantly below LoRA
        else:
            v = "not shown"
        needed = ""
        if v == "not shown":
            psi = max((m.b + m.c) / m.n, abs(m.difference), 1 / m.n)
            needed = f"SEAL-H ~ LoRA within {MARGIN} (run {k}): " + (
                f"{equivalence_sample_size(MARGIN, psi, difference=m.difference)}"
                if abs(m.difference) < MARGIN
                else "no n (observed difference beyond the margin)"
            )
        parts.append(
            Check(
                measured=f"SEAL-H - LoRA run {k} {m.difference:+.2f}",
                test=f"TOST equivalence, margin {MARGIN} (paired)",
                n=m.n,
                difference=m.difference,
                low=ci.low,
                high=ci.high,
                p_value=e.p_value,
                verdict=v,
                n_needed=needed,
            )
        )
        parts.append(paired(x, base, f"SEAL-H run {k} - base"))
        parts.append(paired(y, base, f"LoRA run {k} - base"))
    text = f"LoRA / SEAL-H parameters {p['seal-l'] / p['seal-h']:.0f}x (paper ~4000x); " + (
        f"{_scope(c)}: " + ", ".join(_mean_runs(c, m) for m in ("base", "seal-h", "seal-l"))
    )
    return combine(parts, text)


def extension_recovers(d: Data) -> Check:
    """Each extension + SEAL-C above the extension alone, paired per record over every length
    past the window pooled (like Table 1's Avg. column; each length's records are scored by
    every method)."""
    t = d["seal_table2_extension"]
    lengths = sorted(int(x) for x in t["accuracy"].length.unique())
    parts = [
        compare(t, f"{e} + SEAL-C", e, None, f"{e} + SEAL-C - {e}") for e in ("NTK", "Self-Extend")
    ]
    methods = ("NTK", "NTK + SEAL-C", "Self-Extend", "Self-Extend + SEAL-C")
    unit = "tokens (needles)" if d["_sizes"].get("extension_task") == "needle" else "lines"
    where = f"over {', '.join(map(str, lengths))} {unit} pooled"
    return combine(parts, f"{where}: " + ", ".join(_rate(t, m) for m in methods))


def signed_rank(x: np.ndarray, y: np.ndarray, label: str) -> Check:
    """``x`` above ``y``, paired continuous scores (one pair per question): the two-sided
    Wilcoxon signed-rank test (exact for small n without ties), the mean difference and its
    paired bootstrap 95 % interval."""
    diff = np.asarray(x, float) - np.asarray(y, float)
    p = float(wilcoxon(diff).pvalue) if np.any(diff != 0) else 1.0
    ci = paired_bootstrap(np.asarray(x, float), np.asarray(y, float))
    verdict = decide(p, float(diff.mean()))
    needed = ""
    if verdict == "not shown":
        sd = float(diff.std(ddof=1)) if len(diff) > 1 else 0.0
        observed = abs(float(diff.mean())) > 1e-12  # not rounding noise of equal scores
        effect = abs(float(diff.mean())) if observed else MIN_EFFECT
        z = norm.ppf(1 - ALPHA / 2) + norm.ppf(0.8)  # paired t approximation, 80 % power
        needed = f"{label}: {math.ceil((z * max(sd, 1e-9) / effect) ** 2)} questions"
        if not observed:
            needed += f" (for a {MIN_EFFECT:.2f} effect; none observed)"
    return Check(
        measured=f"{label} {diff.mean():+.3f}",
        test="Wilcoxon signed-rank (paired per question)",
        n=len(diff),
        difference=float(diff.mean()),
        low=ci.low,
        high=ci.high,
        p_value=p,
        verdict=verdict,
        n_needed=needed,
    )


def mudaf_targets(d: Data) -> Check:
    """The targets' F1 under MuDAF above Vanilla SFT, per fresh question (the targets were
    chosen on the pilot's questions)."""
    t = d["mudaf_fig5_targets"]
    from interp_seal.figures.mudaf import target_gain

    g = target_gain(t)
    m, s, b = g.get("mudaf", 0.0), g.get("sft", 0.0), g.get("base", 0.0)
    n = t["questions"].record.nunique()
    q = t["confirm"][t["confirm"].group == "mudaf"]
    x, y = (q[q.method == k].sort_values("record").f1.to_numpy() for k in ("mudaf", "sft"))
    c = signed_rank(x, y, "MuDAF - SFT")
    text = (
        f"on {len(x)} fresh questions (seed {int(q.seed.iloc[0])}), targets' mean F1: SFT "
        f"{y.mean():.2f}, MuDAF {x.mean():.2f}; pilot ({n} questions): base {b:.2f}, SFT "
        f"{s:.2f}, MuDAF {m:.2f}"
    )
    return replace(c, measured=text)


def masking_hurts(d: Data) -> Check:
    """Every random draw above the retrieval heads, question by question, on the fresh
    questions (the heads were ranked on the pilot's)."""
    t = d["mudaf_fig4_masking"]
    z = t["masking"][t["masking"]["mode"] == "zero"]
    ret = float(z[z.strategy == "retrieval"].exact_match.mean())
    rnd = z[z.strategy == "random"].exact_match
    r = t["confirm"]
    rates = r[r["mode"] == "zero"].groupby(["strategy", "seed"]).exact_match.mean()
    text = (
        f"on {r.record.nunique()} fresh questions (seed {int(r.questions_seed.iloc[0])}), "
        f"zeroing top retrieval heads {rates['retrieval'].mean():.2f} vs random heads "
        f"{rates['random'].mean():.2f} (mean of {len(rates['random'])} draws); pilot: "
        f"{ret:.2f} vs {rnd.mean():.2f} (n={int(z.n_samples.iloc[0])} questions)"
    )
    r = r[r["mode"] == "zero"]
    seeds = sorted(r[r.strategy == "random"].seed.unique())
    parts = [
        paired_from(r[r.seed.isin([seed, -1])], "strategy", "random", "retrieval", f"draw {seed}")
        for seed in seeds
    ]
    c = combine(parts, text)
    return replace(c, test=c.test + f"; each of {len(seeds)} random draws must beat it")


# -- results that go against the papers -------------------------------------------------------
SIGN_TEST_N = 6  # the fewest records at which a two-sided exact sign test can reach p < 0.05


def sign_test(change: np.ndarray, label: str) -> Check:
    """The changes ``change`` (one per record) positive more often than chance: the exact
    two-sided sign test (binomial, p = 1/2) on the non-zero changes."""
    up, down = int((change > 0).sum()), int((change < 0).sum())
    p = float(binomtest(up, up + down, 0.5).pvalue) if up + down else 1.0
    verdict = decide(p, up - down)
    needed = ""
    if verdict == "not shown":
        needed = f"{label}: >= {SIGN_TEST_N} records all moving one way (now {up} up, {down} down)"
    return Check(
        measured=f"{label}: up on {up}, down on {down} of {len(change)}",
        test="exact sign test (paired)",
        n=len(change),
        difference=float(np.mean(change)),
        p_value=p,
        verdict=verdict,
        n_needed=needed,
    )


def dla_flips(d: Data) -> Check:
    """The margin logit(correct) - logit(strongest wrong) rises under SEAL-H and SEAL-C, per
    fresh record, records not chosen on any model's answer (``figures.seal.fig4_compute``)."""
    r = d["seal_fig4_dla"]["records"]
    diff = r.pivot_table(index="record", columns="method", values="logit_diff", sort=False)
    ok = r.pivot_table(index="record", columns="method", values="top_is_correct", sort=False)
    parts = [
        sign_test((diff[m] - diff["base"]).to_numpy(), f"{m} - base")
        for m in ("seal-h", "seal-c")
        if m in diff
    ]
    means = ", ".join(f"{m} {v:+.2f}" for m, v in diff.mean().items())
    right = ", ".join(f"{m} {int(ok[m].sum())}" for m in ok.columns)
    text = (
        f"margin logit(correct) - logit(strongest wrong) at the first answer digit on "
        f"{len(diff)} fresh records, mean: {means}; correct token on top: {right}"
    )
    return combine(parts, text)


def needle_recovered(d: Data) -> Check:
    g = d["seal_fig5_needle"]["records"]  # one row per needle (several per cell)
    methods = [m for m in ("seal-h", "seal-c", "seal-l", "seal-d") if m in set(g.method)]
    parts = [paired_from(g, "method", m, "base", f"{m} - base") for m in methods]
    means = g.groupby("method", sort=False).exact_match.mean()
    text = f"mean needle exact match over {int((g.method == 'base').sum())} needles: " + ", ".join(
        f"{m} {v:.2f}" for m, v in means.items()
    )
    return combine(parts, text)


def mudaf_task_score(d: Data) -> Check:
    t = d["mudaf_table2_methods"]
    methods = [m for m in ("mudaf", "mudaf-weak") if m in set(t["accuracy"].method)]
    parts = [compare(t, m, "sft", None, f"{m} - SFT") for m in methods]
    names = ("base", "sft", *methods)
    n = int(t["accuracy"].n.iloc[0])
    text = (
        "passage QA exact match (teacher-forced): "
        + ", ".join(_rate(t, m) for m in names)
        + f" (n={n} questions)"
    )
    return combine(parts, text)


def niah_heads_differ(d: Data) -> Check:
    """MuDAF Sec. 3.1: the heads that retrieve passages are not the needle (NIAH) heads, so
    zeroing the top ``mask_k`` (5 %) NIAH heads hurts passage QA less than zeroing as many
    MDQA retrieval heads. Decided on the fresh questions, both sets chosen on the pilot's
    questions and needles; their overlap is reported beside it (at 5 % of the heads chance
    overlap is below one head, so an overlap test could never find "fewer than chance")."""
    t = d["mudaf_fig4_masking"]
    z = t["masking"][t["masking"]["mode"] == "zero"]
    sets = {
        s: {"L{}H{}".format(*h.split(".")) for h in str(z[z.strategy == s].heads.iloc[0]).split()}
        for s in ("retrieval", "niah")
    }
    k, total = len(sets["retrieval"]), len(t["niah"])
    shared = len(sets["retrieval"] & sets["niah"])
    r = t["confirm"]
    r = r[r["mode"] == "zero"]
    if "niah" not in set(r.strategy):
        raise MissingData("mudaf_fig4_masking has no NIAH arm on fresh questions: regenerate it")
    c = paired_from(r, "strategy", "niah", "retrieval", "NIAH-zeroed - retrieval-zeroed")
    rates = r.groupby("strategy").exact_match.mean()
    text = (
        f"on {c.n} fresh questions, QA exact match with the top-{k} NIAH heads zeroed "
        f"{rates['niah']:.2f} vs the top-{k} MDQA retrieval heads zeroed "
        f"{rates['retrieval']:.2f}; the sets (NIAH {sorted(sets['niah'])} / MDQA "
        f"{sorted(sets['retrieval'])}) share {shared} of their {k} heads (by chance "
        f"{k * k / total:.1f} of {total})"
    )
    return replace(c, measured=text)


# -- plan amendment 1 (issue 41): retrieval-head definitions and KV compression ---------------
def masking_claim(definition: str) -> str:
    """The claim's name for ``definition``'s masked top 5 %."""
    return f"Masking the top 5 % of heads by {definition} hurts passage QA more than random heads"


DUO_CLAIM = "Full KV for DuoAttention-gated heads beats random heads at the same KV budget"
CAUSAL_CLAIM = "Causally chosen full-KV heads beat every score-chosen set at the same KV budget"


def definition_masking(d: Data, definition: str, figure: str = "heads_definitions") -> Check:
    """Every random draw above ``definition``'s top 5 % of heads zeroed, question by question,
    on the fresh questions (``figures.definitions``; the heads ranked on the detection
    questions). Where that top set is cut from a tie of the definition's scores
    (``definitions.cut_ties``: DuoAttention's gates tie the query heads of a KV head) the set
    is head-index order, not the definition's, and the row is *not shown* whatever the test
    says, with no p to correct (a claim without a test). ``figure`` ``heads_duo_groups`` or
    ``heads_duo_tied``: duo's set of whole KV heads (plan amendments 2 and 3), read the same
    way."""
    from interp_seal.figures.definitions import cut_ties, duo_groups_cut

    tables = d[figure]
    if figure == "heads_definitions":
        cut = cut_ties(tables).get(definition) if "rankings" in tables else None  # hand-made
    else:
        cut = duo_groups_cut(tables) if "ranking" in tables else None
    if "records" not in tables and cut is not None:  # not masked (``definitions``)
        return Check(
            measured=f"{definition}'s top KV heads are {cut[0]} of {cut[1]} heads tied at one "
            "gate, taken in index order: not masked",
            test="none (the set is not fixed by the gates)",
            n=0,
            difference=math.nan,
            n_needed="none: the top set is not fixed by the definition's scores",
        )
    r = tables["records"]
    r = r[r["mode"] == "zero"]
    if definition not in set(r.strategy):
        raise MissingData(f"{figure} has no {definition} arm")
    seeds = sorted(r[r.strategy == "random"].seed.unique())
    parts = [
        paired_from(
            r[r.seed.isin([seed, -1])],
            "strategy",
            "random",
            definition,
            f"draw {seed} - {definition}",
        )
        for seed in seeds
    ]
    rates = r.groupby(["strategy", "seed"]).exact_match.mean()
    what = f"the top 5 % by {definition}"
    if figure != "heads_definitions":
        what = f"{definition}'s top KV heads (all their query heads)"
    text = (
        f"on {r.record.nunique()} fresh questions, QA exact match with {what} "
        f"zeroed {rates[definition].mean():.2f} vs random heads "
        f"{rates['random'].mean():.2f} (mean of {len(seeds)} draws)"
    )
    c = combine(parts, text)
    c = replace(c, test=c.test + f"; each of {len(seeds)} random draws must beat it")
    if cut is None:
        return c
    inside, tied = cut
    return unread(
        c,
        f"its top set is {inside} of {tied} heads tied at one score, taken in head-index order",
        "the top set",
    )


def unread(c: Check, why: str, what: str) -> Check:
    """``c`` not read: ``what`` (a head set) is not fixed by its definition's scores, ``why``
    says how, so the row is *not shown* with no p (Holm counts it as p = 1) whatever its
    test gave, which ``measured`` keeps for the record."""
    return replace(
        c,
        measured=f"{c.measured}; but {why} (McNemar p {c.p_value:.3g} for that set)",
        p_value=math.nan,
        verdict="not shown",
        n_needed=f"none: {what} is not fixed by the definition's scores",
    )


def copy_paste_masking(d: Data) -> Check:
    return definition_masking(d, "copy_paste")


def passage_masking(d: Data) -> Check:
    return definition_masking(d, "passage")


def qr_masking(d: Data) -> Check:
    return definition_masking(d, "qr")


def causal_masking(d: Data) -> Check:
    return definition_masking(d, "causal")


def duo_masking(d: Data) -> Check:
    return definition_masking(d, "duo")


def duo_groups_masking(d: Data) -> Check:
    return definition_masking(d, "duo", "heads_duo_groups")


def duo_tied_masking(d: Data) -> Check:
    return definition_masking(d, "duo", "heads_duo_tied")


DUO_TIED_CLAIM = (
    "Masking DuoAttention's top KV heads whole, with every KV head tied with them, hurts passage "
    "QA more than as many random heads"
)
DUO_GROUPS_CLAIM = (
    "Masking DuoAttention's top KV heads whole hurts passage QA more than as many random heads"
)


def kv_unfixed(d: Data, c: Check, names: list[str]) -> Check:
    """``c``, or *not shown* where one of ``names`` keeps a full-KV set at the claims' budget
    that its scores do not fix (``definitions.cut_ties``: the budget cuts a tie of KV-head
    scores, so the set is layer / head order and what it does says nothing about the
    definition; as ``definition_masking`` reads a tie-cut top set). Without stored rankings
    (hand-made tables) ``c`` stands."""
    from interp_seal.figures.definitions import claim_budget, cut_ties

    if "heads_definitions" not in d or "rankings" not in d["heads_definitions"]:
        return c
    curve = d["kv_budget"]["curve"]
    total = int(curve[curve.definition == "all full"].full_kv_heads.iloc[0])
    budget = claim_budget(total)
    cut = cut_ties(d["heads_definitions"], kv=(total, budget))
    said = [f"{n} keeps {cut[n][0]} of {cut[n][1]} tied KV heads" for n in names if n in cut]
    if not said:
        return c
    why = f"at {budget} full KV heads {', '.join(said)}, taken in layer / head order"
    return unread(c, why, "a full-KV set")


def kv_population(d: Data) -> tuple[pd.DataFrame, int, int]:
    """The compression claims' records (the plan's population): at the longest length and
    the claims' budget, those whose queried line lies before the recent window (decided by
    token position, ``figures.definitions.query_position``); with the budget and length."""
    from interp_seal.figures.definitions import claim_budget

    t = d["kv_budget"]
    curve, pos, rec = t["curve"], t["positions"], t["records"]
    budget = claim_budget(int(curve[curve.definition == "all full"].full_kv_heads.iloc[0]))
    length = int(curve.length.max())
    keep = set(pos[(pos.length == length) & pos.before_window.astype(bool)].record)
    rec = rec[(rec.length == length) & (rec.full_kv_heads == budget) & rec.record.isin(keep)]
    if rec.empty:
        raise MissingData(f"no kv_budget records at {budget} full KV heads before the window")
    return rec, budget, length


def _kv_arm(rec: pd.DataFrame, definition: str, seed: int = -1) -> pd.Series:
    return outcomes(rec[rec.random_seed == seed], "definition", definition)


def _kv_check(rec: pd.DataFrame, a: tuple[str, int], b: tuple[str, int], label: str) -> Check:
    x, y = _kv_arm(rec, *a), _kv_arm(rec, *b)
    if not x.index.equals(y.index):
        raise ValueError(f"{a} and {b} were scored on different records")
    return paired(x.to_numpy(), y.to_numpy(), label)


def duo_beats_random(d: Data) -> Check:
    """DuoAttention's gated heads kept full above each random KV-head order at the same
    budget, paired per record, on the plan's population."""
    rec, budget, length = kv_population(d)
    seeds = sorted(int(s) for s in rec[rec.definition == "random"].random_seed.unique())
    parts = [_kv_check(rec, ("duo", -1), ("random", s), f"duo - random {s}") for s in seeds]
    rate = rec.groupby("definition").exact_match.mean()
    text = (
        f"at {length} lines, {budget} KV heads full, on {rec.record.nunique()} records whose "
        f"queried line lies before the window: duo {rate['duo']:.2f} vs random "
        f"{rate['random']:.2f} (mean of {len(seeds)} orders)"
    )
    c = combine(parts, text)
    c = replace(c, test=c.test + f"; each of {len(seeds)} random orders must lose")
    return kv_unfixed(d, c, ["duo"])


def causal_beats_scores(d: Data) -> Check:
    """The causal ranking's full-KV heads above each score-based definition's at the same
    budget, paired per record, on the plan's population."""
    rec, budget, length = kv_population(d)
    others = ("copy_paste", "passage", "qr", "duo")
    parts = [_kv_check(rec, ("causal", -1), (o, -1), f"causal - {o}") for o in others]
    rate = rec.groupby("definition").exact_match.mean()
    text = (
        f"at {length} lines, {budget} KV heads full, on {rec.record.nunique()} records whose "
        "queried line lies before the window: "
        + ", ".join(f"{o} {rate[o]:.2f}" for o in ("causal", *others))
    )
    c = combine(parts, text)
    c = replace(c, test=c.test + "; all four must lose")
    return kv_unfixed(d, c, ["causal", *others])


PLAN_CLAIMS: tuple[tuple[str, str, Callable[[Data], Check]], ...] = (
    ("Accuracy falls with context length", "SEAL Table 1", falls_with_length),
    (
        "Single-head pruning moves accuracy both ways, consistently across lengths",
        "SEAL Fig. 2b",
        pruning_both_ways,
    ),
    (
        "Group scaling (Q1 x 0.9 + Q3 x 1.1) beats the baseline at long length",
        "SEAL Fig. 2d",
        scaling_beats_baseline,
    ),
    ("SEAL-H and SEAL-C raise long-context accuracy", "SEAL Table 1", seal_raises),
    ("SEAL-C beats SEAL-H", "SEAL Table 1", seal_c_beats_h),
    (
        "SEAL-H uses ~1/4000 of LoRA's parameters at comparable accuracy",
        "SEAL Sec. 6.1",
        seal_h_parameters,
    ),
    (
        "NTK / Self-Extend + SEAL-C recover beyond the trained length",
        "SEAL Table 2",
        extension_recovers,
    ),
    (
        "After SEAL the final logit moves from the wrong to the correct token",
        "SEAL Fig. 4",
        dla_flips,
    ),
    ("SEAL-H / C / L / D recover needles the baseline misses", "SEAL Fig. 5", needle_recovered),
    (
        "MuDAF raises target heads' retrieval scores more than Vanilla SFT",
        "MuDAF Fig. 5",
        mudaf_targets,
    ),
    ("Masking retrieval heads hurts more than masking random heads", "MuDAF Fig. 4", masking_hurts),
    (
        "MDQA retrieval heads differ from NIAH retrieval heads",
        "MuDAF Sec. 3.1, Fig. 4",
        niah_heads_differ,
    ),
    ("MuDAF and MuDAF-weak beat Vanilla SFT on the task", "MuDAF Table 2", mudaf_task_score),
)
AMENDMENT_1_CLAIMS: tuple[tuple[str, str, Callable[[Data], Check]], ...] = (
    (masking_claim("copy_paste"), "Wu et al. 2024 (Retrieval Head)", copy_paste_masking),
    (masking_claim("passage"), "MuDAF Sec. 3.1", passage_masking),
    (masking_claim("qr"), "QRHead (Zhang et al. 2025)", qr_masking),
    (masking_claim("causal"), "causal ablation", causal_masking),
    (masking_claim("duo"), "DuoAttention (Xiao et al. 2024)", duo_masking),
    (DUO_CLAIM, "DuoAttention (Xiao et al. 2024)", duo_beats_random),
    (CAUSAL_CLAIM, "issue 41", causal_beats_scores),
)
AMENDMENT_2_CLAIMS: tuple[tuple[str, str, Callable[[Data], Check]], ...] = (
    (DUO_GROUPS_CLAIM, "DuoAttention (Xiao et al. 2024)", duo_groups_masking),
)
AMENDMENT_3_CLAIMS: tuple[tuple[str, str, Callable[[Data], Check]], ...] = (
    (DUO_TIED_CLAIM, "DuoAttention (Xiao et al. 2024)", duo_tied_masking),
)
# the gallery's claims by Holm family: the plan's, then each amendment's (``figures.plan``)
FAMILIES: tuple[tuple[str, tuple[tuple[str, str, Callable[[Data], Check]], ...]], ...] = (
    ("plan", PLAN_CLAIMS),
    ("amendment 1", AMENDMENT_1_CLAIMS),
    ("amendment 2", AMENDMENT_2_CLAIMS),
    ("amendment 3", AMENDMENT_3_CLAIMS),
)
CLAIMS = tuple(claim for _, claims in FAMILIES for claim in claims)


# -- the n each claim is read at, against the registered plan ----------------------------------
def _count(d: Data, figure: str, table: str, **where) -> int:
    """Records (one per ``(length, record)``) of ``figure``'s ``table`` with ``where``."""
    rows = d[figure][table]
    for k, v in where.items():
        rows = rows[rows[k] == v]
    keys = [k for k in ("length", "record") if k in rows]
    return len(rows.drop_duplicates(keys)) if keys else len(rows)


def _table1(methods: tuple[str, ...]) -> Callable:
    """SEAL Table 1's population: ``confirm_n`` fresh records per length for the base model
    and for each of ``tuning_seeds`` runs of every tuned method (before the position filter,
    which is fixed by the seed, not by outcomes)."""

    def planned(d: Data, s) -> list[tuple[str, int, int]]:
        c, per = _confirm(d), s.confirm_n * len(s.lengths)
        rows = [("base records", _count(d, "seal_table1_methods", "confirm", method="base"), per)]
        for m in methods:
            rows.append((f"{m} tuning runs", len(_runs(c, m)), s.tuning_seeds))
            rows += [
                (f"{m} run {k} records", int(((c.method == m) & (c.tuning_seed == k)).sum()), per)
                for k in _runs(c, m)
            ]
        return rows

    return planned


def _extension(d: Data, s) -> list[tuple[str, int, int]]:
    per_length = len(s.needle_depths) * s.needle_n if s.extension_task == "needle" else s.n
    got = _count(d, "seal_table2_extension", "records", method="NTK + SEAL-C")
    return [("records per method", got, per_length * len(s.extension_lengths))]


def _fresh_masking(figure: str, column: str, value: str, planned: str) -> Callable:
    table = "confirm" if figure.startswith("mudaf_") else "records"

    def count(d: Data, s) -> list[tuple[str, int, int]]:
        got = _count(d, figure, table, **{column: value})
        return [("fresh questions", got, getattr(s, planned))]

    return count


def _duo_n(figure: str) -> Callable:
    """The fresh questions of a Duo whole-KV-head arm; none where its set was cut from a tie
    and not masked (nothing was read, so nothing can be off plan)."""
    count = _fresh_masking(figure, "strategy", "none", "definition_questions")
    return lambda d, s: count(d, s) if "records" in d[figure] else []


def _dla(d: Data, s) -> list[tuple[str, int, int]]:
    from interp_seal.figures.seal import DLA_RECORDS

    return [("fresh records", _count(d, "seal_fig4_dla", "records", method="base"), DLA_RECORDS)]


def _kv(d: Data, s) -> list[tuple[str, int, int]]:
    pos = d["kv_budget"]["positions"]
    return [("records at the longest length", int((pos.length == max(s.kv_lengths)).sum()), s.kv_n)]


# claim function -> (what, records on disk, records the registered plan names) per population
PLANNED_N: dict[Callable, Callable] = {
    falls_with_length: _table1(()),
    pruning_both_ways: lambda d, s: [
        (
            "fresh records",
            _count(d, "seal_fig2b_quadrants", "confirm", unit="baseline"),
            s.confirm_n,
        )
    ],
    scaling_beats_baseline: lambda d, s: [
        (
            "replication records",
            _count(d, "seal_fig2d_scaling", "replicate", unit="baseline"),
            s.replicate_n,
        )
    ],
    seal_raises: _table1(("seal-h", "seal-c")),
    seal_c_beats_h: _table1(("seal-h", "seal-c")),
    seal_h_parameters: _table1(("seal-h", "seal-l")),
    extension_recovers: _extension,
    dla_flips: _dla,
    needle_recovered: lambda d, s: [
        (
            "needles",
            _count(d, "seal_fig5_needle", "records", method="base"),
            len(s.needle_lengths) * len(s.needle_depths) * s.needle_n,
        )
    ],
    mudaf_targets: _fresh_masking("mudaf_fig5_targets", "method", "mudaf", "fresh_questions"),
    masking_hurts: _fresh_masking("mudaf_fig4_masking", "strategy", "retrieval", "fresh_questions"),
    niah_heads_differ: _fresh_masking("mudaf_fig4_masking", "strategy", "niah", "fresh_questions"),
    mudaf_task_score: lambda d, s: [
        ("questions", _count(d, "mudaf_table2_methods", "records", method="sft"), s.retrieval_n)
    ],
    **{
        fn: _fresh_masking("heads_definitions", "strategy", "none", "definition_questions")
        for _, _, fn in AMENDMENT_1_CLAIMS[:5]
    },
    duo_beats_random: _kv,
    causal_beats_scores: _kv,
    duo_groups_masking: _duo_n("heads_duo_groups"),
    duo_tied_masking: _duo_n("heads_duo_tied"),
}


def off_plan(d: Data, fn: Callable) -> str:
    """Where ``fn``'s records on disk differ in number from what the registered plan named
    (``data["_planned"]``: ``figures.plan.registered_sizes``), in words; "" where they agree.
    A verdict is read only at the planned n: a figure computed on more or fewer records (an
    extended sample, a changed generator) is not this plan's test."""
    s = d.get("_planned")
    if s is None:  # hand-made tables without a plan (the claims' own unit tests)
        return ""
    off = [f"{what} {got} (plan: {want})" for what, got, want in PLANNED_N[fn](d, s) if got != want]
    return "; ".join(off)


def claims_table(data: Data) -> pd.DataFrame:
    """One row per claim: measured numbers, the test, n, difference with its interval, p, the
    n a power calculation says would decide a *not shown* verdict, and the verdict. A claim
    whose figures are not in ``data`` gets a row saying so; any other error is raised."""
    rows, data = [], Data(data)
    for family, claim, source, fn in ((f, *c) for f, claims in FAMILIES for c in claims):
        try:
            c = fn(data)
            if off := off_plan(data, fn):
                c = Check(
                    measured=f"off plan: {off}",
                    test="none (not the registered test)",
                    n=0,
                    difference=math.nan,
                    n_needed="regenerate the figure at the plan's sizes",
                )
        except MissingData as err:  # a figure (or an arm's records) was not generated
            c = Check(
                measured=f"no data: {str(err).strip(chr(39))}",
                test="none",
                n=0,
                difference=math.nan,
                n_needed="generate the figure",
            )
        rows.append(
            {
                "claim": claim,
                "paper": source,
                "measured": c.measured,
                "test": c.test,
                "n": int(c.n),
                "difference": _round(c.difference),
                "low": _round(c.low),
                "high": _round(c.high),
                "p_value": float(f"{c.p_value:.3g}"),
                "n_needed": c.n_needed,
                "verdict": c.verdict,
                "raw_p": c.p_value,
                "family": family,
            }
        )
    table = pd.DataFrame(rows)
    corrected = [
        _corrected(group.reset_index(drop=True)) for _, group in table.groupby("family", sort=False)
    ]
    return pd.concat(corrected, ignore_index=True)[COLUMNS]


def _corrected(table: pd.DataFrame) -> pd.DataFrame:
    """Holm's correction across one family's claims, all of them as registered: a
    claim without a test yet (its figure not computed) enters with p = 1, which gives every
    tested claim the largest multiplier it could get, so a verdict read from a partial gallery
    cannot be overturned by the claims still to come. A verdict stands only where its adjusted
    p is below ``ALPHA``; one significant before the correction but not after is *not shown*,
    and says so."""
    raw = table["raw_p"].to_numpy(dtype=float)
    adjusted = holm(np.where(np.isnan(raw), 1.0, raw))
    adjusted = np.where(np.isnan(raw), np.nan, adjusted)
    table = table.assign(p_holm=[float(f"{p:.3g}") if p == p else math.nan for p in adjusted])
    m = len(table)
    for i, p in enumerate(adjusted):
        if table.at[i, "verdict"] in ("supported", "contradicted") and not p < ALPHA:
            was = table.at[i, "verdict"]
            table.at[i, "verdict"] = "not shown"
            table.at[i, "n_needed"] = (
                f"{was} at p {table.at[i, 'p_value']:.3g} alone; not after Holm's correction "
                f"across the {m} claims of the {table.at[i, 'family']} (p {p:.3g})"
            )
    return table


def _round(x: float, digits: int = 4) -> float:
    return float(np.round(float(x), digits)) if x == x else math.nan
