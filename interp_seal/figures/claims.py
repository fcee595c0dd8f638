"""The claims table: each qualitative claim of SEAL and MuDAF, checked on the measured numbers.

A claim compares two measured proportions (exact match over ``n`` records, or a retrieval score
averaged over ``n`` questions). The difference ``d`` gets the standard error of a difference of
two independent proportions, with the Agresti-Caffo adjustment ``(k + 1) / (n + 2)`` so that
0 / n and n / n still carry uncertainty (conservative for the paired comparisons here: the
same records are used for both sides). The verdict is computed, never written:

- ``supported``: ``d > 2 se`` in the claimed direction;
- ``contradicted``: ``d < -2 se``;
- ``not shown``: within two standard errors (the organism's numbers cannot tell).

Masking compares one head set with the mean over random draws: the standard error of that
mean (draws' standard deviation / sqrt(draws)) is added to the binomial error.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

Tables = dict[str, pd.DataFrame]
Data = dict[str, Tables]  # figure name -> its tables


def se_diff(p1: float, n1: float, p2: float, n2: float) -> float:
    """Standard error of ``p1 - p2`` for proportions over ``n1`` and ``n2`` trials."""
    a, b = (p1 * n1 + 1) / (n1 + 2), (p2 * n2 + 1) / (n2 + 2)
    return math.sqrt(a * (1 - a) / (n1 + 2) + b * (1 - b) / (n2 + 2))


def verdict(d: float, se: float) -> str:
    if d > 2 * se:
        return "supported"
    if d < -2 * se:
        return "contradicted"
    return "not shown"


def _combine(*vs: str) -> str:
    if all(v == "supported" for v in vs):
        return "supported"
    return "contradicted" if "contradicted" in vs else "not shown"


def _at(acc: pd.DataFrame, method: str, length: int) -> tuple[float, float]:
    row = acc[(acc.method == method) & (acc.length == length)].iloc[0]
    return float(row.exact_match), float(row.n)


def _cmp(acc, a: str, b: str, L: int) -> tuple[float, float, str]:
    (p1, n1), (p2, n2) = _at(acc, a, L), _at(acc, b, L)
    se = se_diff(p1, n1, p2, n2)
    return p1 - p2, se, f"{a} {p1:.2f} vs {b} {p2:.2f} (n={int(n1)}/{int(n2)})"


def falls_with_length(d: Data):
    acc = d["seal_table1_methods"]["accuracy"]
    base = acc[acc.method == "base"].sort_values("length")
    (p1, n1), (p2, n2) = base.iloc[0][["exact_match", "n"]], base.iloc[-1][["exact_match", "n"]]
    diff, se = p1 - p2, se_diff(p1, n1, p2, n2)
    lo, hi = int(base.length.iloc[0]), int(base.length.iloc[-1])
    return (
        f"{lo} lines {p1:.2f} vs {hi} lines {p2:.2f} (n={int(n1)} each)",
        diff,
        se,
        verdict(diff, se),
    )


def pruning_both_ways(d: Data):
    sw = d["seal_fig2b_quadrants"]["sweep"]
    sw = sw[sw.metric == "exact_match"]
    L = sw.length.max()
    at = sw[sw.length == L]
    n = float(d["_sizes"]["sweep_n"])
    base = float(at.baseline.iloc[0])
    up, down = at.delta.max(), at.delta.min()
    se_up, se_down = se_diff(base + up, n, base, n), se_diff(base + down, n, base, n)
    wide = sw.pivot_table(index=["layer", "head"], columns="length", values="delta")
    x, y = wide.iloc[:, 0].to_numpy(), wide.iloc[:, -1].to_numpy()
    r = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")
    k = len(x)
    se_r = math.sqrt((1 - r * r) / (k - 2)) if k > 2 and not math.isnan(r) else float("inf")
    v = _combine(
        verdict(up, se_up), verdict(-down, se_down), verdict(r if not math.isnan(r) else 0.0, se_r)
    )
    text = (
        f"at {L} lines best delta {up:+.2f}, worst {down:+.2f} (baseline {base:.2f}); "
        f"Pearson r of deltas at two lengths {r:.2f} over {k} heads"
    )
    return text, min(up, -down), max(se_up, se_down), v


def scaling_beats_baseline(d: Data):
    sw = d["seal_fig2d_scaling"]["sweep"]
    sw = sw[sw.metric == "exact_match"]
    L = int(d["_sizes"]["long"]) if (sw.length == d["_sizes"]["long"]).any() else sw.length.max()
    n = float(d["_sizes"]["n"])
    at = sw[sw.length == L].set_index("table")
    name = "Q1 x 0.9 + Q3 x 1.1" if "Q1 x 0.9 + Q3 x 1.1" in at.index else at.index[0]
    p, b = float(at.loc[name, "value"]), float(at.loc[name, "baseline"])
    se = se_diff(p, n, b, n)
    text = f"{name} {p:.2f} vs baseline {b:.2f} at {L} lines (n={int(n)})"
    if "seal_fig2b_quadrants" in d:
        from interp_seal.figures.seal import _quadrants

        counts = _quadrants(d["seal_fig2b_quadrants"]["sweep"]).counts()
        text += f"; heads scaled: Q1 {counts['Q1']}, Q3 {counts['Q3']}"
    return text, p - b, se, verdict(p - b, se)


def seal_raises(d: Data):
    acc = d["seal_table1_methods"]["accuracy"]
    L = int(acc.length.max())
    h, c, ch = (
        _cmp(acc, "seal-h", "base", L),
        _cmp(acc, "seal-c", "base", L),
        _cmp(acc, "seal-c", "seal-h", L),
    )
    ge = "supported" if ch[0] >= -2 * ch[1] else "contradicted"
    v = _combine(verdict(h[0], h[1]), verdict(c[0], c[1]), ge)
    return f"at {L} lines: {h[2]}; {c[2]}; C - H {ch[0]:+.2f}", min(h[0], c[0]), max(h[1], c[1]), v


def seal_h_parameters(d: Data):
    p = d["seal_table1_methods"]["params"].set_index("method").trainable
    acc = d["seal_table1_methods"]["accuracy"]
    L = int(acc.length.max())
    diff, se, text = _cmp(acc, "seal-h", "seal-l", L)
    ratio = p["seal-l"] / p["seal-h"]
    comparable = "supported" if abs(diff) <= 2 * se or diff > 0 else "contradicted"
    return f"LoRA / SEAL-H parameters {ratio:.0f}x (paper ~4000x); {text}", diff, se, comparable


def extension_recovers(d: Data):
    acc = d["seal_table2_extension"]["accuracy"]
    L = int(acc.length.max())
    parts, vs, ses, diffs = [], [], [], []
    for ext in ("NTK", "Self-Extend"):
        diff, se, text = _cmp(acc, f"{ext} + SEAL-C", ext, L)
        parts.append(text)
        vs.append(verdict(diff, se))
        ses.append(se)
        diffs.append(diff)
    return f"at {L} lines: " + "; ".join(parts), min(diffs), max(ses), _combine(*vs)


def mudaf_targets(d: Data):
    t = d["mudaf_fig5_targets"]
    n = float(d["_sizes"]["retrieval_n"])
    from interp_seal.figures.mudaf import target_gain

    g = target_gain(t)
    m, s, b = g.get("mudaf", 0.0), g.get("sft", 0.0), g.get("base", 0.0)
    se = se_diff(m, n, s, n)
    text = f"targets' mean F1: base {b:.2f}, SFT {s:.2f}, MuDAF {m:.2f} (n={int(n)} questions)"
    return text, m - s, se, verdict(m - s, se)


def masking_hurts(d: Data):
    m = d["mudaf_fig4_masking"]["masking"]
    z = m[m["mode"] == "zero"]
    n = float(z.n_samples.iloc[0])
    ret = float(z[z.strategy == "retrieval"].exact_match.mean())
    rnd = z[z.strategy == "random"].exact_match
    # binomial error of the two scores plus the standard error of the random draws' mean
    spread = float(rnd.std(ddof=1)) / math.sqrt(len(rnd)) if len(rnd) > 1 else 0.0
    se = math.sqrt(se_diff(ret, n, float(rnd.mean()), n) ** 2 + spread**2)
    diff = float(rnd.mean()) - ret
    text = (
        f"passage QA exact match, zeroing top retrieval heads {ret:.2f} vs random heads "
        f"{rnd.mean():.2f} (mean of {len(rnd)} draws, n={int(n)} questions)"
    )
    return text, diff, se, verdict(diff, se)


CLAIMS: tuple[tuple[str, str, Callable], ...] = (
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
    ("SEAL-H and SEAL-C raise long-context accuracy, C >= H", "SEAL Table 1", seal_raises),
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
        "MuDAF raises target heads' retrieval scores more than Vanilla SFT",
        "MuDAF Fig. 5",
        mudaf_targets,
    ),
    ("Masking retrieval heads hurts more than masking random heads", "MuDAF Fig. 4", masking_hurts),
)


def claims_table(data: Data) -> pd.DataFrame:
    """One row per claim whose figures are present: measured numbers, difference, se, verdict."""
    rows = []
    for claim, source, fn in CLAIMS:
        try:
            text, diff, se, v = fn(data)
        except KeyError:  # a figure this claim needs was not generated (--only)
            continue
        rows.append(
            {
                "claim": claim,
                "paper": source,
                "measured": text,
                "difference": round(float(diff), 4),
                "se": round(float(se), 4),
                "verdict": v,
            }
        )
    return pd.DataFrame(rows, columns=["claim", "paper", "measured", "difference", "se", "verdict"])
