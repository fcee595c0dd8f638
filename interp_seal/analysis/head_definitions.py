"""Which heads are "retrieval heads"? The definitions in use, compared on one model.

Five definitions of a retrieval head are computed by this toolkit, each from its paper:

- ``copy_paste``: Wu et al. 2024 (Retrieval Head, arXiv 2404.15574): how often a head's
  strongest attention, while the model writes a needle, points at the needle token being
  copied (``retrieval_scores.needle_retrieval_scores``);
- ``passage``: MuDAF (Liu et al. 2025, Sec. 3.1): whether the last token's attention, summed
  per passage, puts the golden passages on top (F1 / EM, ``passage_retrieval_scores``);
- ``qr``: QRHead (Zhang et al. 2025): the attention mass the query's tokens put on the golden
  passages, calibrated against a null query (``qrhead.qr_scores``);
- ``causal``: what an ablation does: the loss of the answer's log-probability (or exact match)
  when the head alone is zeroed (``sweeps.head_sweep``, ranked by ``sweep_ranking``);
- ``duo``: DuoAttention (Xiao et al. 2024): a gate per KV head between full and sink + window
  attention, learned by distilling the full model's hidden states with an L1 pull towards
  streaming (``tuning.duo_gates``, ranked by ``gate_ranking``: each query head carries its KV
  head's gate).

Each paper compares at most two of these. ``compare_rankings`` puts any number side by side on
the same heads:

- **Spearman's rank correlation** between every two rankings, over all heads, on each
  definition's own ``score`` where the table has one: heads of equal score share their average
  rank, as in scipy's ``spearmanr``. A ``rank`` column alone breaks ties by head index (the
  query heads of one KV head under DuoAttention's gates, the many heads a copy-paste or passage
  score leaves at 0), and two rankings that both fall back on index order correlate by that
  order alone: on the organism that inflated copy_paste vs duo from +0.28 to +0.56;
- **top-k overlap**: the share of the top ``k`` heads two rankings have in common, at the
  paper-typical ``k`` of 5 % of the heads (Wu et al. and MuDAF's Fig. 4 take about 5 %: 50 of
  Llama-3.1-8B's 1,024), with the hypergeometric p of an overlap at least this large between
  two random sets of ``k`` (``statistics.overlap_test``);
- **ties at the cut** (``tie_at_cut``): where the ``k``-th and the ``k + 1``-th heads score the
  same, the top set is index order, not the definition (DuoAttention's gates tie the query
  heads of a KV head: its top 2 of 32 heads are 2 of 4 equals). ``RankingComparison.cut``
  names such rankings; what their top set does is not evidence about the definition.

``mask_rankings`` asks what each set is *for*: the top ``k`` heads of every ranking are zeroed
on the same records (``masking.masking_experiment``: one baseline, one condition per
definition, random sets of ``k`` heads drawn outside the first ranking's top set, one per
seed), and ``masking_effects`` tests each definition against every random draw with the exact
McNemar test on the paired records: a definition's set "hurts more than random" only if it
does against every draw (an intersection-union test), and Holm's correction runs across the
definitions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from interp_seal.analysis.masking import MaskingConfig, masking_experiment, top_ranked
from interp_seal.analysis.retrieval_scores import rank_heads
from interp_seal.analysis.statistics import holm, mcnemar_exact, overlap_test
from interp_seal.interventions import Head
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Sample

TOP_SHARE = 0.05  # the paper-typical share of heads called retrieval heads


def top_k(n_heads: int, share: float = TOP_SHARE) -> int:
    """The number of heads in a top ``share`` of ``n_heads`` (rounded up; at least one)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must lie in (0, 1], got {share}")
    return max(1, math.ceil(share * n_heads - 1e-9))


def sweep_ranking(sweep: pd.DataFrame, metric: str = "answer_logprob") -> pd.DataFrame:
    """Heads ranked by what zeroing each one costs: ``score`` is minus the mean ``delta`` of
    ``metric`` over the sweep's lengths (``head_sweep``'s table), so the head whose removal
    hurts most is rank 1."""
    rows = sweep[(sweep["metric"] == metric) & sweep["channel"].isna()]
    if rows.empty:
        raise ValueError(f"the sweep has no head rows of metric {metric!r}")
    cost = rows.groupby(["layer", "head"], as_index=False)["delta"].mean()
    heads = pd.DataFrame(
        {
            "layer": cost["layer"].astype(int),
            "head": cost["head"].astype(int),
            "score": -cost["delta"],
        }
    )
    return rank_heads(heads, ["score"])


RANKED_BY = ("score", "qr_score", "f1", "gate")  # the column each toolkit table ranks by


def scored(rankings: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Each ranked head table as ``layer``, ``head``, ``score``, ``rank``, best first, ``score``
    being the column the table was ranked by: the first of ``RANKED_BY`` it has (copy-paste and
    causal ``score``, QRHead ``qr_score``, passage ``f1``, DuoAttention ``gate``; a table
    written by the CLI keeps its columns). ``compare_rankings`` reads it to average the ranks of
    tied heads and to name a top set cut from a tie. A table with none of them is kept as it is
    and compared by its ``rank`` (ties then broken by head index)."""
    out = {}
    for name, table in rankings.items():
        column = next((c for c in RANKED_BY if c in table.columns), None)
        if column is None or not {"layer", "head", "rank"} <= set(table.columns):
            out[name] = table
            continue
        out[name] = pd.DataFrame(
            {
                "layer": table["layer"].astype(int),
                "head": table["head"].astype(int),
                "score": table[column].astype(float),
                "rank": table["rank"].astype(int),
            }
        ).sort_values("rank", ignore_index=True)
    return out


@dataclass(frozen=True, kw_only=True)
class RankingComparison:
    """Rankings of the same heads compared (module docstring).

    Attributes:
        k: heads in each top set.
        sets: each ranking's top ``k`` heads, best first.
        spearman: rankings x rankings, Spearman's rho over all heads.
        overlap: rankings x rankings, shared top-``k`` heads / ``k``.
        overlap_p: rankings x rankings, the overlap's hypergeometric p (one-sided).
        cut: rankings whose top ``k`` is cut from a tie of scores (``tie_at_cut``): name ->
            (heads of the tie inside the top set, heads tied); the set is index order there.
    """

    k: int
    sets: dict[str, list[Head]]
    spearman: pd.DataFrame
    overlap: pd.DataFrame
    overlap_p: pd.DataFrame
    cut: dict[str, tuple[int, int]] = field(default_factory=dict)

    def pairs(self) -> pd.DataFrame:
        """One row per two rankings (each pair once): rho, shared heads, overlap and its p."""
        names = list(self.spearman.index)
        return pd.DataFrame(
            [
                {
                    "a": a,
                    "b": b,
                    "spearman": float(self.spearman.loc[a, b]),
                    "shared": int(round(self.overlap.loc[a, b] * self.k)),
                    "k": self.k,
                    "overlap": float(self.overlap.loc[a, b]),
                    "overlap_p": float(self.overlap_p.loc[a, b]),
                }
                for i, a in enumerate(names)
                for b in names[i + 1 :]
            ]
        )


def tie_at_cut(ranking: pd.DataFrame, k: int) -> tuple[int, int]:
    """Is ``ranking``'s top ``k`` fixed by its ``score``? ``(inside, tied)``: of the heads
    scoring exactly what the ``k``-th best head scores, how many are in the top ``k`` and how
    many there are. The set is the definition's iff ``inside == tied``; ``(0, 0)`` when the
    table has no ``score`` column (its ``rank`` is taken as given)."""
    if "score" not in ranking.columns or k >= len(ranking):
        return (0, 0)
    ordered = ranking.sort_values("rank")["score"].to_numpy(dtype=float)
    tied = ordered == ordered[k - 1]
    return (int(tied[:k].sum()), int(tied.sum()))


def _ranks(rankings: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Heads x rankings, each ranking's rank of each head (checked: the same heads, once each):
    from its ``score`` (higher first, ties sharing their average rank) where the table has one,
    else its ``rank``."""
    if len(rankings) < 2:
        raise ValueError(f"compare at least two rankings, got {len(rankings)}")
    columns, heads = {}, None
    for name, table in rankings.items():
        missing = {"layer", "head", "rank"} - set(table.columns)
        if missing:
            raise ValueError(f"ranking {name!r} lacks columns {sorted(missing)}")
        index = pd.MultiIndex.from_arrays(
            [table["layer"].astype(int), table["head"].astype(int)], names=["layer", "head"]
        )
        if index.has_duplicates:
            raise ValueError(f"ranking {name!r} lists a head more than once")
        if heads is not None and set(index) != heads:
            raise ValueError(f"ranking {name!r} does not rank the same heads as the others")
        heads = set(index)
        if "score" in table.columns:
            values = (-table["score"].astype(float)).rank(method="average").to_numpy()
        else:
            values = table["rank"].to_numpy(dtype=float)
        columns[name] = pd.Series(values, index=index)
    return pd.DataFrame(columns).sort_index()


def compare_rankings(
    rankings: Mapping[str, pd.DataFrame], *, share: float = TOP_SHARE
) -> RankingComparison:
    """Spearman's rho and top-``k`` overlaps between every two of ``rankings`` (name -> a
    ranked head table with ``layer``, ``head`` and ``rank``, as every score of the toolkit
    writes; all of the same heads), ``k`` being the top ``share`` of the heads. The column a
    table was ranked by (``scored``; higher first), where it has one, gives Spearman's ranks
    with ties averaged and marks a top set cut from a tie (``cut``)."""
    rankings = scored(rankings)
    ranks = _ranks(rankings)
    names, total = list(ranks.columns), len(ranks)
    k = top_k(total, share)
    sets = {name: top_ranked(rankings[name], k) for name in names}
    # Spearman's rho is Pearson's r of the ranks (average ranks for ties, as scipy's spearmanr)
    spearman = ranks.rank().corr(method="pearson")
    shared = np.array([[len(set(sets[a]) & set(sets[b])) for b in names] for a in names])
    p = np.array([[overlap_test(int(s), k, k, total) for s in row] for row in shared])
    frame = lambda values: pd.DataFrame(values, index=names, columns=names)  # noqa: E731
    return RankingComparison(
        k=k,
        sets=sets,
        spearman=spearman.loc[names, names],
        overlap=frame(shared / k),
        overlap_p=frame(p),
        cut={name: tie for name in names if (tie := tie_at_cut(rankings[name], k))[0] != tie[1]},
    )


def mask_rankings(
    handle: ModelHandle,
    samples: Sequence[Sample],
    rankings: Mapping[str, pd.DataFrame],
    *,
    k: int,
    seeds: Sequence[int] = (0, 1, 2),
    mode: str = "zero",
    batch_size: int = 1,
    results: str | Path | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Task scores of ``samples`` with each ranking's top ``k`` heads masked, and with
    ``len(seeds)`` random sets of ``k`` heads outside the *first* ranking's top set
    (``masking_experiment``'s table; ``strategy`` is the ranking's name, ``"random"`` or
    ``"none"``; ``correct`` holds each sample's 0/1 exact match). ``results`` makes it
    resumable."""
    if not rankings:
        raise ValueError("no rankings to mask")
    first, *rest = rankings
    config = MaskingConfig(ks=(k,), modes=(mode,), seeds=tuple(seeds), batch_size=batch_size)
    frame = masking_experiment(
        handle,
        samples,
        rankings[first],
        others={name: rankings[name] for name in rest},
        config=config,
        results=results,
        progress=progress,
    )
    return frame.assign(strategy=frame["strategy"].replace({"retrieval": first}))


def masking_effects(frame: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Does masking each ranking's set hurt more than masking random heads? One row per
    ranking of ``mask_rankings``' table: its exact match, the random draws' mean, the unmasked
    model's, the smallest
    paired difference (random - ranking) over the draws, the largest McNemar p over the draws
    (the intersection-union test's p: every draw must be beaten), its Holm-adjusted p across
    the rankings, and the verdict at ``alpha`` (``supported``: hurts more than every random
    draw; ``contradicted``: hurts less than every one; ``not shown`` otherwise)."""
    randoms = frame[frame["strategy"] == "random"]
    named = frame[~frame["strategy"].isin(["none", "random"])]
    unmasked = frame.loc[frame["strategy"] == "none", "exact_match"]
    if randoms.empty or named.empty:
        raise ValueError("the table needs random draws and at least one ranking's condition")
    rows = []
    for row in named.itertuples():
        tests = [mcnemar_exact(r.correct, row.correct) for r in randoms.itertuples()]
        diffs = [t.difference for t in tests]
        direction = 1 if min(diffs) > 0 else (-1 if max(diffs) < 0 else 0)
        rows.append(
            {
                "definition": row.strategy,
                "heads": row.heads,
                "exact_match": row.exact_match,
                "random_exact_match": float(randoms["exact_match"].mean()),
                "unmasked_exact_match": float(unmasked.iloc[0]) if len(unmasked) else np.nan,
                "draws": len(tests),
                "n": int(row.n_samples),
                "difference": min(diffs) if direction >= 0 else max(diffs),
                "p_value": max(t.p_value for t in tests) if direction else 1.0,
                "direction": direction,
            }
        )
    table = pd.DataFrame(rows)
    table["p_holm"] = holm(table["p_value"].to_numpy())
    verdict = np.where(table["direction"] > 0, "supported", "contradicted")
    table["verdict"] = np.where(table["p_holm"] < alpha, verdict, "not shown")
    return table.drop(columns="direction")
