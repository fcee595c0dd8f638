"""Issue 41's two figures: retrieval heads by five definitions, and what they are good for.

Added to the galleries by plan amendment 1 (``figures.plan``), with their claims pre-registered
before any of their data. Same shape as ``figures.seal`` / ``figures.mudaf``: ``compute(run)``
-> named tables, ``draw(tables)`` -> plotly figure, ``read(tables)`` -> one line.

**Five rankings of every head** (``analysis.head_definitions``), each from its paper, all on
the run's own data:

- ``copy_paste`` (Wu et al. 2024): needle copy-paste scores on SEAL's needles, the very scores
  MuDAF Fig. 4 ranks its NIAH heads by (``mudaf.niah_scores``: reused when the run has them);
- ``passage`` (MuDAF Sec. 3.1): the retrieval scores of MuDAF Fig. 3 on the detection questions
  (``retrieval_n`` questions, seed ``mudaf.EVAL_SEED``; ``mudaf.base_scores``: reused);
- ``qr`` (QRHead): query-focused scores calibrated by a null query, on the same questions;
- ``causal``: each head zeroed alone on the first ``causal_n`` detection questions
  (``sweeps.head_sweep``), ranked by the answer's log-probability lost (``sweep_ranking``);
- ``duo`` (DuoAttention): gates trained on ``tune_n`` line records of ``duo_lines`` lines from
  the tuning seed (``FigureRun.tuning_samples``: a tuning set of the held-out ledger, so no
  evaluation may share a record with it), with the streaming side of the KV figure
  (``kv_sink``, ``kv_window``); ranked by ``gate_ranking``.

``heads_definitions`` compares them (Spearman's rho, top-5 % overlaps with their hypergeometric
p, ``compare_rankings``) and zeroes each ranking's top 5 % on ``definition_questions`` FRESH
passage questions (seed ``mudaf.FRESH_SEED``; never the detection questions) beside the run's
``mask_seeds`` random sets of the same size drawn outside ``passage``'s top set, as MuDAF Fig. 4
draws them (``mask_rankings``). ``kv_budget`` keeps the best ``m`` KV heads of each ranking
full and streams the rest (sink + recent window) for each ``m`` of ``kv_full_counts`` plus the
claims' budget (a quarter of the KV heads, rounded up), beside random KV-head orders (one per
mask seed), all streaming and all full, on ``kv_n`` fresh line records per length of
``kv_lengths`` (seed ``KV_SEED``), with each record's queried-line token span: the compression
claims are read on the records whose queried line lies entirely before the recent window at
every answer position (a streaming head cannot see it), chosen by position, never by outcome.

``heads_duo_groups`` (plan amendment 2) masks DuoAttention's heads as its gates choose them,
whole KV heads: one gate per KV head ties its query heads, so a top 5 % that is not a multiple
of the group size (14 of SmolLM2's 270 heads, 3 per KV head) always cuts a tie and
``heads_definitions`` cannot read it. The set is the top 5 % rounded up to whole KV heads
(``duo_groups_k``: 15 heads, 5 KV heads, on SmolLM2; 4 heads, one KV head, on the organism),
zeroed on the same fresh questions beside ``mask_seeds`` random sets of as many heads drawn
outside it (MuDAF Fig. 4's control, as in ``heads_definitions``). ``heads_duo_tied`` (plan
amendment 3) does the same with that set extended to every KV head whose gate ties its last
(``duo_tied_k``): the paper's clamped gates saturate at 1, and on SmolLM2 7 KV heads tie there,
so amendment 2's 5 are again index order.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from interp_seal.analysis.head_definitions import (
    compare_rankings,
    mask_rankings,
    masking_effects,
    scored,
    sweep_ranking,
    tie_at_cut,
    top_k,
)
from interp_seal.analysis.kv_compression import compression_curve, kv_tie_at_cut
from interp_seal.analysis.qrhead import qr_scores
from interp_seal.analysis.sweeps import SweepOptions, head_sweep
from interp_seal.figures import mudaf as M
from interp_seal.figures.run import FigureRun
from interp_seal.tasks.sample import Sample
from interp_seal.viz.passages import compression_curves, definition_comparison

Tables = dict[str, pd.DataFrame]
DEFINITIONS = ("copy_paste", "passage", "qr", "causal", "duo")
KV_SEED = 4  # the KV figure's fresh line records (seeds 0-3 are the SEAL figures')
BUDGET_SHARE = 0.25  # the compression claims' budget: this share of the KV heads kept full


def claim_budget(kv_heads: int) -> int:
    """Full KV heads at the compression claims' budget: ``BUDGET_SHARE`` of them, rounded up."""
    return math.ceil(BUDGET_SHARE * kv_heads - 1e-9)


# -- the five rankings ------------------------------------------------------------------------
def duo_gates(run: FigureRun) -> torch.Tensor:
    """DuoAttention's gates (layers x KV heads) trained once per run on tuning line records."""
    from interp_seal.tuning.duo_gates import DEFAULT_LR, DuoConfig, train_gates
    from interp_seal.tuning.loop import TrainConfig

    s = run.sizes
    name = f"duo_gates_n{s.tune_n}_lines{s.duo_lines}_sink{s.kv_sink}_w{s.kv_window}_seed0"
    samples = run.tuning_samples(name, "line_retrieval", lines=s.duo_lines, seed=0)
    with run.timed(name) as folder:
        path = folder / "gates.pt"
        if not path.exists():
            config = DuoConfig(sink=s.kv_sink, window=s.kv_window)
            gates, _ = train_gates(
                run.handle,
                samples,
                config,
                TrainConfig(lr=DEFAULT_LR, seed=0, checkpoint_every=10),
                out=folder / "train",
            )
            torch.save(gates, path)
    return torch.load(path, weights_only=True)  # a tensor: no pickled code is run


def rankings(run: FigureRun) -> dict[str, pd.DataFrame]:
    """Every head ranked by each definition (module docstring), ``passage`` first (random
    masking sets are drawn outside the first ranking's top set); each table has ``layer``,
    ``head``, ``score`` (the definition's own score; higher ranks first) and ``rank``."""
    from interp_seal.tuning.duo_gates import gate_ranking

    s = run.sizes
    detect = M.eval_samples(run)
    with run.timed("definitions_qr") as out:
        qr = qr_scores(run.handle, detect, results=out / "log.jsonl", progress=run.progress)
    with run.timed("definitions_causal") as out:
        options = SweepOptions(out=out, resume=True, progress=run.progress)
        chosen = detect[: s.causal_n] if s.causal_n else detect
        sweep = head_sweep(run.handle, {s.retrieval_passages: chosen}, options=options)
    found = {
        "passage": M.base_scores(run),
        "copy_paste": M.niah_scores(run),
        "qr": qr.heads,
        "causal": sweep_ranking(sweep),
        "duo": gate_ranking(duo_gates(run), run.handle.spec.n_heads),
    }
    return scored(found)


def _split(t: Tables) -> dict[str, pd.DataFrame]:
    """The ``rankings`` table back into one ranking per definition (gallery order)."""
    r = t["rankings"]
    names = [d for d in ("passage", *DEFINITIONS) if d in set(r.definition)]
    return {d: r[r.definition == d].drop(columns="definition") for d in dict.fromkeys(names)}


def cut_ties(t: Tables, kv: tuple[int, int] | None = None) -> dict[str, tuple[int, int]]:
    """The definitions whose chosen set is cut from a tie of their scores: name -> (heads of
    the tie in the set, heads tied). The set is each ranking's top 5 % of heads
    (``tie_at_cut``), or with ``kv = (KV heads, budget)`` its ``budget`` full KV heads
    (``kv_compression.kv_tie_at_cut``; ``kv_budget`` ranks by these rankings). DuoAttention's
    gates give every query head of a KV head the same score, so a set smaller than the tie is
    index order, and what it does says nothing about the definition."""
    out = {}
    for name, ranking in _split(t).items():
        if kv is None:
            inside, tied = tie_at_cut(ranking, top_k(len(ranking)))
        else:
            inside, tied = kv_tie_at_cut(ranking, len(ranking) // kv[0], kv[1])
        if inside != tied:
            out[name] = (inside, tied)
    return out


# -- heads_definitions ------------------------------------------------------------------------
def definitions_compute(run: FigureRun) -> Tables:
    s = run.sizes
    ranked = rankings(run)
    comparison = compare_rankings(ranked)
    fresh = run.samples(
        "passages", s.definition_questions, seed=M.FRESH_SEED, size=s.retrieval_passages
    )
    with run.timed("definitions_masking") as out:
        frame = mask_rankings(
            run.handle,
            fresh,
            ranked,
            k=comparison.k,
            seeds=s.mask_seeds,
            results=out / "log.jsonl",
            progress=run.progress,
        )
    effects = masking_effects(frame)
    return {
        "rankings": pd.concat(
            [t.assign(definition=d) for d, t in ranked.items()], ignore_index=True
        ),
        "pairs": comparison.pairs(),
        "masking": frame.drop(columns="correct").assign(heads=frame.heads.astype(str)),
        "records": M.masking_records(frame).assign(questions_seed=M.FRESH_SEED),
        "effects": effects.assign(heads=effects.heads.astype(str)),
    }


def definitions_draw(t: Tables):
    fig = definition_comparison(compare_rankings(_split(t)), t["effects"])
    fig.update_layout(title="Retrieval heads by five definitions: agreement and masking")
    return fig


def definitions_read(t: Tables) -> str:
    # from the rankings, as ``definitions_draw`` does: a ``pairs`` table stored before tied
    # scores shared their rank would keep rho from head-index order
    pairs = compare_rankings(_split(t)).pairs()
    effects = t["effects"].set_index("definition")
    k = int(pairs.k.iloc[0])
    sets = {
        d: " ".join(f"L{int(r.layer)}H{int(r['head'])}" for _, r in g.head(k).iterrows())
        for d, g in _split(t).items()
    }
    n = int(effects.n.iloc[0])
    return (
        f"top {k} heads: "
        + "; ".join(f"{d} {h}" for d, h in sets.items())
        + f". Spearman's rho {pairs.spearman.min():+.2f} to {pairs.spearman.max():+.2f}. "
        f"On {n} fresh questions, exact match with each top set zeroed: "
        + ", ".join(f"{d} {r.exact_match:.2f}" for d, r in effects.iterrows())
        + f" (random sets {effects.random_exact_match.iloc[0]:.2f}, none zeroed "
        f"{effects.unmasked_exact_match.iloc[0]:.2f})."
        + "".join(
            f" {d}'s top {k} are {a} of {b} heads tied at one score, taken in head-index "
            "order: not the definition's set."
            for d, (a, b) in cut_ties(t).items()
        )
    )


# -- heads_duo_groups (plan amendment 2) -------------------------------------------------------
def duo_groups_k(n_heads: int, group: int) -> int:
    """Heads in DuoAttention's masked set: the top 5 % of ``n_heads`` (``top_k``) rounded up
    to whole KV heads of ``group`` query heads each."""
    return group * math.ceil(top_k(n_heads) / group)


def duo_tied_k(ranking: pd.DataFrame, group: int) -> int:
    """Heads in DuoAttention's masked set of plan amendment 3: ``duo_groups_k``'s whole KV
    heads and every KV head whose gate ties the last of them. Gates are clamped to ``[0, 1]``
    at every step (the paper's training), so the KV heads that need the full context most
    saturate at 1 together (SmolLM2: 7 of 90), and a top set smaller than that tie is index
    order; the whole tie is the set the gates name."""
    ordered = ranking.sort_values("rank")["score"].to_numpy(dtype=float)
    cut = ordered[duo_groups_k(len(ranking), group) - 1]
    return int((ordered >= cut).sum())


def duo_groups_compute(run: FigureRun) -> Tables:
    return _duo_masking(run, whole_tie=False)


def duo_tied_compute(run: FigureRun) -> Tables:
    return _duo_masking(run, whole_tie=True)


def _duo_masking(run: FigureRun, *, whole_tie: bool) -> Tables:
    """Duo's whole KV heads (amendment 2's set, or with ``whole_tie`` amendment 3's) and as
    many random heads drawn outside them, zeroed on the fresh questions."""
    from interp_seal.tuning.duo_gates import gate_ranking

    s, spec = run.sizes, run.handle.spec
    group = spec.n_heads // spec.n_kv_heads
    duo = scored({"duo": gate_ranking(duo_gates(run), spec.n_heads)})["duo"]
    k = duo_tied_k(duo, group) if whole_tie else duo_groups_k(len(duo), group)
    ranking = duo.assign(group=group, k=k)
    if duo_groups_cut({"ranking": ranking}):  # index order, which the plan does not read
        return {"ranking": ranking}
    fresh = run.samples(
        "passages", s.definition_questions, seed=M.FRESH_SEED, size=s.retrieval_passages
    )
    with run.timed("duo_tied_masking" if whole_tie else "duo_groups_masking") as out:
        frame = mask_rankings(
            run.handle,
            fresh,
            {"duo": duo},
            k=k,
            seeds=s.mask_seeds,
            results=out / "log.jsonl",
            progress=run.progress,
        )
    effects = masking_effects(frame)
    return {
        "ranking": ranking,
        "masking": frame.drop(columns="correct"),
        "records": M.masking_records(frame).assign(questions_seed=M.FRESH_SEED),
        "effects": effects,
    }


def duo_groups_cut(t: Tables) -> tuple[int, int] | None:
    """``(inside, tied)`` where Duo's set cuts a tie of gates (two KV heads with one gate
    value across the cut; then nothing was masked), else None."""
    ranking = t["ranking"]
    inside, tied = tie_at_cut(ranking, int(ranking.k.iloc[0]))
    return None if inside == tied else (inside, tied)


def duo_groups_draw(t: Tables):
    from interp_seal.viz.passages import gate_cut, masking_bars

    k, group = int(t["ranking"].k.iloc[0]), int(t["ranking"].group.iloc[0])
    if "masking" not in t:
        return gate_cut(t["ranking"], k=k, group=group)
    return masking_bars(
        t["masking"],
        title=f"DuoAttention's top KV heads ({k // group}, {k} heads) zeroed vs {k} random heads",
    )


def duo_groups_read(t: Tables) -> str:
    k, group = int(t["ranking"].k.iloc[0]), int(t["ranking"].group.iloc[0])
    kv = k // group
    top = f"DuoAttention's top {kv} KV head{'s' * (kv > 1)} ({k} heads"
    if cut := duo_groups_cut(t):
        return (
            f"{top}) are {cut[0]} of {cut[1]} heads whose KV heads share one gate, taken in "
            "index order: the set is not the gates', so it was not masked and its claim is "
            "not read."
        )
    e = t["effects"].iloc[0]
    heads = " ".join(f"L{h.replace('.', 'H')}" for h in str(e.heads).split())
    return (
        f"{top}: {heads}) zeroed on {int(e.n)} fresh questions: exact match "
        f"{e.exact_match:.2f} vs {k} random heads {e.random_exact_match:.2f} (mean of "
        f"{int(e.draws)} draws), none zeroed {e.unmasked_exact_match:.2f}."
    )


# -- kv_budget --------------------------------------------------------------------------------
def query_position(sample: Sample, tokenizer, *, sink: int, window: int) -> dict:
    """The queried line's token span in ``sample``'s prompt, the prompt's token count, and
    whether a streaming head sees none of the line at any answer position: the first answer
    token is predicted at position ``prompt_tokens - 1``, whose window begins at
    ``prompt_tokens - window``, so the line is dropped iff it ends at or before that and
    starts after the sinks."""
    line = sample.meta["correct_line"]
    start = sample.prompt.find(line)
    if start < 0 or sample.prompt.find(line, start + 1) >= 0:
        raise ValueError(f"the queried line {line!r} is not once in the prompt")
    enc = tokenizer(sample.prompt, return_offsets_mapping=True)
    first, end = Sample._token_span(enc["offset_mapping"], (start, start + len(line)))
    total = len(enc["input_ids"])
    return {
        "line_start": first,
        "line_end": end,
        "prompt_tokens": total,
        "before_window": bool(first >= sink and end <= total - window),
    }


def kv_compute(run: FigureRun) -> Tables:
    s, spec = run.sizes, run.handle.spec
    ranked = rankings(run)
    records = {L: run.samples("line_retrieval", s.kv_n, seed=KV_SEED, size=L) for L in s.kv_lengths}
    budget = claim_budget(spec.n_layers * spec.n_kv_heads)
    with run.timed("kv_budget") as out:
        curve = compression_curve(
            run.handle,
            records,
            ranked,
            full_counts=sorted({*s.kv_full_counts, budget}),
            sink=s.kv_sink,
            window=s.kv_window,
            random_seeds=s.mask_seeds,
            results=out / "log.jsonl",
            progress=run.progress,
        )
    positions = pd.DataFrame(
        [
            {"length": L, "record": i}
            | query_position(x, run.handle.tokenizer, sink=s.kv_sink, window=s.kv_window)
            for L, batch in records.items()
            for i, x in enumerate(batch)
        ]
    )
    outcomes = pd.DataFrame(
        [
            {
                "definition": r.definition,
                "random_seed": r.random_seed,
                "full_kv_heads": r.full_kv_heads,
                "length": r.length,
                "record": i,
                "exact_match": v,
            }
            for r in curve.itertuples()
            for i, v in enumerate(r.correct)
        ]
    )
    return {
        "curve": curve.drop(columns="correct").assign(budget=budget),
        "positions": positions,
        "records": outcomes,
    }


def kv_draw(t: Tables):
    fig = compression_curves(t["curve"])
    budget = int(t["curve"].budget.iloc[0])
    total = int(t["curve"].full_kv_heads.max())
    fig.update_layout(title=f"Accuracy vs KV budget (claims at {budget} of {total} KV heads full)")
    return fig


def kv_read(t: Tables) -> str:
    curve, pos = t["curve"], t["positions"]
    budget, L = int(curve.budget.iloc[0]), int(curve.length.max())
    keep = set(pos[(pos.length == L) & pos.before_window].record)
    rec = t["records"]
    rec = rec[(rec.length == L) & rec.record.isin(keep)]
    at = rec[rec.full_kv_heads == budget].groupby("definition").exact_match.mean()
    ends = rec[rec.definition.isin(["all full", "all streaming"])]
    ends = ends.groupby("definition").exact_match.mean()
    share = curve[(curve.full_kv_heads == budget) & (curve.length == L)].kv_share.mean()
    return (
        f"At {L} lines, on the {len(keep)} of {int((pos.length == L).sum())} records whose "
        f"queried line lies before the recent window, with {budget} KV heads full "
        f"({share:.0%} of the cache): "
        + ", ".join(f"{d} {v:.2f}" for d, v in at.items())
        + f"; all full {ends.get('all full', float('nan')):.2f}, all streaming "
        f"{ends.get('all streaming', float('nan')):.2f}."
    )
