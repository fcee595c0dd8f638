"""MuDAF's figures and tables (Liu et al., 2025), each computed through the library.

Same shape as ``interp_seal.figures.seal``: ``compute(run)`` -> named tables, ``draw(tables)``
-> plotly figure, ``read(tables)`` -> one line. The data is MuDAF's setting (Sec. 3.1):
multi-document QA in LongBench's hotpotqa passage format, golden and distractor passages in
random order, here the synthetic 1-hop questions of ``interp_seal.tasks.passages`` with the
generator's golden passage, in the run's format (``FigureRun.samples``: the chat template of a
chat model). Evaluation questions are seed ``EVAL_SEED`` (0), the same for every method; the
MuDAF / SFT tuning data (``FigureRun.tuning_samples("passages")``) is another seed, so training
and evaluation never share a question. The heads these figures choose (the retrieval heads, the
targets) are chosen on the seed-0 questions, the pilot; the claims about them (Fig. 4, Fig. 5)
are tested again on ``fresh_questions`` fresh questions, seed ``FRESH_SEED``, stored in
chunks of ``QUESTION_CHUNK`` so that a killed run resumes. The task score (MuDAF reports QA F1,
Table 2) is the teacher-forced exact match of the answer, one forward per question
(``interp_seal.evaluation.teacher_force``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from interp_seal.analysis.masking import MaskingConfig, greedy_text, masking_experiment
from interp_seal.analysis.retrieval_scores import (
    PassageScoreConfig,
    needle_retrieval_scores,
    passage_retrieval_scores,
)
from interp_seal.evaluation import summarize, teacher_force
from interp_seal.figures.run import FigureRun
from interp_seal.figures.sizes import QUESTION_CHUNK
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Sample
from interp_seal.tuning.evaluate import retrieval_by_method
from interp_seal.viz import paper_figures as pv
from interp_seal.viz.passages import head_score_heatmap, masking_bars, ranked_score_curve
from interp_seal.viz.tuning import target_head_scores

Tables = dict[str, pd.DataFrame]
WEAK = 0.1  # MuDAF Sec. 4.4: heads with R_h < 0.1 are weak
EVAL_SEED = 0  # evaluation questions; tuning data uses figures.run.DATA_SEED
FRESH_SEED = 2  # the claims' fresh questions (``sizes.fresh_questions``)


def qa_samples(run: FigureRun, num_passages: int, n: int) -> list[Sample]:
    """``n`` 1-hop questions over ``num_passages`` passages (one golden), seed ``EVAL_SEED``."""
    return run.samples("passages", n, seed=EVAL_SEED, size=num_passages)


def eval_samples(run: FigureRun) -> list[Sample]:
    """The questions of every MuDAF figure but Fig. 10: ``retrieval_n`` x ``retrieval_passages``."""
    return qa_samples(run, run.sizes.retrieval_passages, run.sizes.retrieval_n)


def fresh_chunks(run: FigureRun) -> list[list[Sample]]:
    """``fresh_questions`` fresh questions (seed ``FRESH_SEED``) in chunks of
    ``QUESTION_CHUNK``."""
    s = run.sizes
    qs = run.samples("passages", s.fresh_questions, seed=FRESH_SEED, size=s.retrieval_passages)
    return [qs[i : i + QUESTION_CHUNK] for i in range(0, len(qs), QUESTION_CHUNK)]


def qa_exact_match(handle: ModelHandle, samples: list[Sample]) -> dict[str, float]:
    """Teacher-forced exact match of the answers (``n``, ``n_tokens``, ``exact_match``,
    ``first_token``, ``answer_logprob``: ``evaluation.summarize``)."""
    return {k: float(v) for k, v in summarize(teacher_force(handle, samples)).items()}


def qa_outcomes(handle: ModelHandle, samples: list[Sample]) -> dict:
    """``qa_exact_match`` and ``correct``: each question's 0/1 exact match, in order."""
    scores = teacher_force(handle, samples)
    summary = {k: float(v) for k, v in summarize(scores).items()}
    return summary | {"correct": [int(s.exact_match) for s in scores]}


def base_scores(run: FigureRun) -> pd.DataFrame:
    """Every head's MuDAF retrieval score (F1, EM, rank; Sec. 3.1) on the base model (resumable)."""
    with run.timed("retrieval_base") as out:
        return passage_retrieval_scores(
            run.handle,
            eval_samples(run),
            PassageScoreConfig(),
            results=out / "log.jsonl",
            progress=run.progress,
        ).heads


def top_heads(heads: pd.DataFrame, k: int) -> tuple[tuple[int, int], ...]:
    """The ``k`` heads with the highest F1 retrieval score (ties: lower layer, then head)."""
    ranked = heads.sort_values(["f1", "layer", "head"], ascending=[False, True, True])
    return tuple(sorted((int(a), int(b)) for a, b in ranked.head(k)[["layer", "head"]].values))


def target_sets(run: FigureRun) -> dict[str, tuple]:
    """``head_sets`` on the base model's retrieval scores at ``mudaf_k``."""
    return head_sets(base_scores(run), run.sizes.mudaf_k)


def head_sets(heads: pd.DataFrame, k: int) -> dict[str, tuple]:
    """MuDAF's strong targets and its weak control (Sec. 4.2, 4.4), by a rule relative to the
    model's own scores (``heads``: every head's ``f1``).

    *Strong*: the ``k`` highest-scoring heads. The paper draws them with
    P ~ softmax(R_h / 0.05); on Llama-3.1-8B, whose best heads score ~0.9 and most near 0,
    that draw all but always returns the top heads. On a model whose scores are compressed
    (SmolLM2's best F1 is ~0.2) the same temperature spreads the draw over heads scoring 0,
    so the draw would no longer mean "strong": the top k is what the paper's draw amounts to
    where scores separate, and stays so where they do not.
    *Weak*: ``k`` heads drawn (seed 0) from those with R_h < 0.1 (the paper's threshold), or,
    where fewer score below it, from the lower half of the ranking.

    Refuses sets whose mean score does not put strong above weak (no contrast to test).
    """
    strong = top_heads(heads, k)
    chosen = set(strong)
    pool = heads[[(int(a), int(b)) not in chosen for a, b in heads[["layer", "head"]].values]]
    weak = pool[pool.f1 < WEAK]
    if len(weak) < k:
        weak = pool.sort_values(["f1", "layer", "head"]).head(max(k, len(pool) // 2))
    weak = weak.sort_values(["layer", "head"])
    pick = np.random.default_rng(0).choice(len(weak), size=min(k, len(weak)), replace=False)
    weak_heads = tuple(
        sorted((int(a), int(b)) for a, b in weak.iloc[pick][["layer", "head"]].values)
    )
    f1 = heads.set_index(["layer", "head"]).f1
    means = {
        n: float(np.mean([f1[h] for h in hs]))
        for n, hs in (("strong", strong), ("weak", weak_heads))
    }
    if not means["strong"] > means["weak"]:
        raise ValueError(
            f"MuDAF's strong targets (mean F1 {means['strong']:.3f}) do not score above the "
            f"weak ones ({means['weak']:.3f}): this model's retrieval scores give the "
            "comparison no contrast; score more questions (retrieval_n) or passages"
        )
    return {"mudaf": strong, "mudaf-weak": weak_heads}


# -- Fig. 3: every head's retrieval score ----------------------------------------------------
def fig3_compute(run: FigureRun) -> Tables:
    return {"heads": base_scores(run)}


def fig3_draw(t: Tables):
    return ranked_score_curve(t["heads"], title="MuDAF Fig. 3: retrieval scores of all heads")


def fig3_read(t: Tables) -> str:
    h = t["heads"].sort_values("rank")
    top = ", ".join(f"L{int(r.layer)}H{int(r['head'])} {r.f1:.2f}" for _, r in h.head(4).iterrows())
    return (
        f"Top heads by F1 retrieval score: {top}; {int((h.f1 >= WEAK).sum())} of {len(h)} "
        f"heads score >= {WEAK}."
    )


# -- Fig. 5-6 and 9: target heads before / after MuDAF vs Vanilla SFT ------------------------
def group_f1(handle: ModelHandle, samples: list[Sample], sets: dict[str, tuple]) -> dict:
    """Each head group's mean retrieval F1 per question (paired across methods) over
    ``samples``, and every head's score (``heads``)."""
    res = passage_retrieval_scores(handle, samples, progress=False)
    per = res.per_sample.set_index(["layer", "head"])
    questions = {
        g: per.loc[list(hs)].groupby("sample").f1.mean().tolist() for g, hs in sets.items() if hs
    }
    return {"heads": res.heads, "questions": questions}


def _fig5_models(run: FigureRun) -> tuple[dict[str, tuple], dict[str, ModelHandle]]:
    sets = target_sets(run)
    handles = {"base": run.handle, "sft": run.tuned_model("sft")}
    handles |= {m: run.tuned_model("mudaf", heads=h) for m, h in sets.items() if h}
    return sets, handles


def _per_question(rows: pd.DataFrame, offset: int = 0) -> pd.DataFrame:
    """Stored ``questions`` ({group: [F1 per question]}) -> one row per method, group, record."""
    return pd.DataFrame(
        [
            {"method": r.method, "group": g, "record": offset * r.chunk + i, "f1": v}
            for r in rows.assign(chunk=rows.get("chunk", 0)).itertuples()
            for g, vs in r.questions.items()
            for i, v in enumerate(vs)
        ]
    )


def fig5_pilot(run: FigureRun, models=None) -> Tables:
    """Every head's retrieval score per method on the pilot (seed-0) questions (``scores``),
    the target and weak heads (``targets``), each group's mean F1 per question
    (``questions``). ``models``: ``_fig5_models(run)`` where the caller has it."""
    sets, handles = models or _fig5_models(run)
    samples = eval_samples(run)

    def one(key):
        res = group_f1(handles[key["method"]], samples, sets)
        return {"heads": res["heads"].to_dict("records"), "questions": res["questions"]}

    rows = run.rows("mudaf_fig5_questions", [{"method": m} for m in handles], one)
    table = pd.DataFrame([dict(method=r.method, **h) for r in rows.itertuples() for h in r.heads])
    f1 = base_scores(run).set_index(["layer", "head"]).f1
    targets = pd.DataFrame(
        [
            {"group": g, "layer": a, "head": b, "f1": float(f1[(a, b)])}
            for g, hs in sets.items()
            for a, b in hs
        ]
    )
    return {"scores": table, "targets": targets, "questions": _per_question(rows)}


def fig5_compute(run: FigureRun) -> Tables:
    """``fig5_pilot``, and the claim's two arms, MuDAF and Vanilla SFT, on the fresh
    questions (``confirm``: the MuDAF targets' mean F1 per question)."""
    sets, handles = models = _fig5_models(run)
    out = fig5_pilot(run, models)
    if not sets["mudaf"]:
        return out
    chunks, claimed = fresh_chunks(run), {"mudaf": sets["mudaf"]}

    def chunk(key):
        res = group_f1(handles[key["method"]], chunks[key["chunk"]], claimed)
        return {"questions": res["questions"]}

    keys = [{"method": m, "chunk": c} for m in ("mudaf", "sft") for c in range(len(chunks))]
    fresh = run.rows("mudaf_fig5_fresh", keys, chunk)
    out["confirm"] = _per_question(fresh, QUESTION_CHUNK).assign(seed=FRESH_SEED)
    return out


def fig5_draw(t: Tables):
    targets = set(zip(t["targets"].layer, t["targets"]["head"], strict=True))
    table = t["scores"].assign(
        target=[
            (a, b) in targets for a, b in zip(t["scores"].layer, t["scores"]["head"], strict=True)
        ]
    )
    return target_head_scores(
        table, title="MuDAF Fig. 5-6: target and weak heads' retrieval scores (labels: rank)"
    )


def target_gain(t: Tables, group: str = "mudaf") -> dict[str, float]:
    """Mean F1 of ``group``'s target heads per method."""
    heads = t["targets"][t["targets"].group == group]
    keys = set(zip(heads.layer, heads["head"], strict=True))
    sc = t["scores"]
    mask = [(a, b) in keys for a, b in zip(sc.layer, sc["head"], strict=True)]
    return sc[mask].groupby("method").f1.mean().to_dict()


def fig5_read(t: Tables) -> str:
    g, w = target_gain(t), target_gain(t, "mudaf-weak")
    sets = "; ".join(
        f"{name} ({group}): "
        + ", ".join(f"L{int(r.layer)}H{int(r['head'])} {r.f1:.2f}" for _, r in rows.iterrows())
        for group, name in (("mudaf", "strong targets"), ("mudaf-weak", "weak heads"))
        for rows in [t["targets"][t["targets"].group == group]]
    )
    text = f"Base-model F1 of the sets, {sets}. " + (
        f"Mean F1 of MuDAF's targets: base {g.get('base', 0):.2f}, SFT {g.get('sft', 0):.2f}, "
        f"MuDAF {g.get('mudaf', 0):.2f}; weak heads: base {w.get('base', 0):.2f}, "
        f"MuDAF-weak {w.get('mudaf-weak', 0):.2f}."
    )
    if "confirm" in t:  # the claim's test: the same targets on fresh questions
        c = t["confirm"][t["confirm"].group == "mudaf"]
        f1 = c.groupby("method").f1.mean()
        text += (
            f" On {c.record.nunique()} fresh questions (seed {c.seed.iloc[0]}): "
            f"SFT {f1['sft']:.2f}, MuDAF {f1['mudaf']:.2f}."
        )
    return text


def fig9_compute(run: FigureRun) -> Tables:
    """MuDAF minus SFT per head on the pilot questions; ``selected``: MuDAF's targets."""
    sc = fig5_pilot(run)["scores"]
    wide = sc.pivot_table(index=["layer", "head"], columns="method", values="f1").reset_index()
    wide["diff"] = wide["mudaf"] - wide["sft"]
    chosen = set(target_sets(run)["mudaf"])
    wide["selected"] = [
        (int(a), int(b)) in chosen for a, b in zip(wide.layer, wide["head"], strict=True)
    ]
    return {"diff": wide[["layer", "head", "mudaf", "sft", "diff", "selected"]]}


def fig9_draw(t: Tables):
    """The heatmap with the selected heads (MuDAF's targets) outlined."""
    d = t["diff"]
    fig = head_score_heatmap(
        d, value="diff", title="MuDAF Fig. 9: retrieval score, MuDAF minus Vanilla SFT"
    )
    for r in d[d.selected.astype(bool)].itertuples():
        fig.add_shape(
            type="rect",
            x0=r.head - 0.5,
            x1=r.head + 0.5,
            y0=r.layer - 0.5,
            y1=r.layer + 0.5,
            line={"color": "black", "width": 2.5},
        )
    fig.add_annotation(
        text="outlined: MuDAF's selected heads",
        x=0,
        xref="paper",
        y=1.02,
        yref="paper",
        xanchor="left",
        yanchor="bottom",
        showarrow=False,
    )
    return fig


def fig9_read(t: Tables) -> str:
    d = t["diff"]
    top = d.loc[d["diff"].idxmax()]
    return (
        f"Largest gain over SFT: L{int(top.layer)}H{int(top['head'])} {top['diff']:+.2f}; "
        f"mean over all heads {d['diff'].mean():+.3f}."
    )


# -- Fig. 7 / Table 4: number of selected heads; Table 2: task score by method ---------------
def fig7_compute(run: FigureRun) -> Tables:
    heads_table = base_scores(run)
    samples = eval_samples(run)

    def one(key):
        heads = top_heads(heads_table, key["k"]) if key["k"] else ()
        model = run.tuned_model("mudaf", heads=heads) if heads else run.tuned_model("sft")
        table = retrieval_by_method({"m": model}, samples, targets=heads, progress=False)
        acc = qa_exact_match(model, samples)
        tf1 = float(table[table.target].f1.mean()) if heads else float("nan")
        return {"target_f1": tf1, "mean_f1": float(table.f1.mean()), **acc}

    keys = [{"k": k} for k in (0, *run.sizes.head_counts)]
    return {"heads": run.rows("mudaf_fig7", keys, one)}


def fig7_draw(t: Tables):
    return pv.head_count_curves(t["heads"])


def fig7_read(t: Tables) -> str:
    h = t["heads"]
    return (
        "Passage QA, teacher-forced exact match of the answer by number of heads: "
        + ", ".join(f"{int(r.k)}: {r.exact_match:.2f}" for _, r in h.iterrows())
        + f" (n={int(h.n.iloc[0])} questions)."
    )


def table2_compute(run: FigureRun) -> Tables:
    sets = target_sets(run)
    models = {"base": run.handle, "sft": run.tuned_model("sft")}
    models |= {m: run.tuned_model("mudaf", heads=h) for m, h in sets.items() if h}
    samples = eval_samples(run)
    keys = [{"method": m} for m in models]
    rows = run.rows(
        "mudaf_table2_paired", keys, lambda k: qa_outcomes(models[k["method"]], samples)
    )
    records = [
        {"method": r.method, "record": i, "exact_match": int(v)}
        for r in rows.itertuples()
        for i, v in enumerate(r.correct)
    ]
    return {"accuracy": rows.drop(columns="correct"), "records": pd.DataFrame(records)}


def table2_draw(t: Tables):
    return pv.method_bars(t["accuracy"], title="MuDAF Table 2: passage QA by method")


def table2_read(t: Tables) -> str:
    a = t["accuracy"]
    return (
        "Passage QA, teacher-forced exact match of the answer: "
        + ", ".join(f"{r.method} {r.exact_match:.2f}" for _, r in a.iterrows())
        + f" (n={int(a.n.iloc[0])} questions)."
    )


# -- Fig. 4: masking retrieval heads vs random vs NIAH heads ---------------------------------
def niah_scores(run: FigureRun) -> pd.DataFrame:
    """Every head's needle retrieval score on the base model (Wu et al.'s NIAH heads)."""
    with run.timed("needle_scores") as out:
        return needle_retrieval_scores(
            run.handle,
            run.samples("needle", 1, seed=0),
            results=out / "log.jsonl",
            progress=run.progress,
        ).heads


def fig4_compute(run: FigureRun) -> Tables:
    s = run.sizes
    niah = niah_scores(run)
    samples, ranked = eval_samples(run), base_scores(run)
    mcfg = MaskingConfig(ks=(s.mask_k,), modes=("zero", "uniform"), seeds=s.mask_seeds)
    with run.timed("masking") as out:
        frame = masking_experiment(
            run.handle,
            samples,
            ranked,
            others={"niah": niah},
            config=mcfg,
            results=out / "log.jsonl",
            progress=run.progress,
        )
    masking = frame.drop(columns="correct").assign(heads=frame.heads.astype(str))
    return {
        "masking": masking,
        "niah": niah,
        "records": masking_records(frame),
        "confirm": masking_confirm(run),
    }


def masking_records(frame: pd.DataFrame, offset: int = 0) -> pd.DataFrame:
    """``masking_experiment``'s rows -> one row per condition and question (0/1 exact match)."""
    return pd.DataFrame(
        [
            {
                "strategy": r.strategy,
                "mode": r.mode,
                "seed": r.seed,
                "record": offset + i,
                "exact_match": v,
            }
            for r in frame.itertuples()
            for i, v in enumerate(r.correct)
        ]
    )


def masking_confirm(run: FigureRun) -> pd.DataFrame:
    """The claims' conditions (no heads, the top ``mask_k`` retrieval heads, the top
    ``mask_k`` NIAH heads, ``mask_seeds`` random draws; zeroed) on the fresh questions, the
    heads ranked on the pilot's questions and needles."""
    s = run.sizes
    config = MaskingConfig(ks=(s.mask_k,), modes=("zero",), seeds=s.mask_seeds)
    parts, ranked, niah = [], base_scores(run), niah_scores(run)
    chunks = fresh_chunks(run)
    with run.timed("masking_fresh") as out:
        for c in tqdm(range(len(chunks)), desc="masking, fresh", disable=not run.progress):
            frame = masking_experiment(
                run.handle,
                chunks[c],
                ranked,
                others={"niah": niah},
                config=config,
                results=out / f"chunk{c}.jsonl",
                progress=False,
            )
            parts.append(masking_records(frame, c * QUESTION_CHUNK))
    return pd.concat(parts, ignore_index=True).assign(questions_seed=FRESH_SEED)


def fig4_draw(t: Tables):
    """The pilot's conditions and, beside them, the fresh questions the claim is tested on."""
    title = "MuDAF Fig. 4: masking retrieval / random / NIAH heads"
    pilot = t["masking"]
    if "confirm" not in t:
        return masking_bars(pilot, title=title)
    fresh = fresh_conditions(t["confirm"], k=int(pilot.k.max()))
    n, seed = int(fresh.n_samples.iloc[0]), int(t["confirm"].questions_seed.iloc[0])
    panels = {
        f"pilot: {int(pilot.n_samples.iloc[0])} questions": pilot,
        f"fresh: {n:,} questions (seed {seed}), heads zeroed": fresh,
    }
    return masking_bars(panels, title=title)


def fresh_conditions(confirm: pd.DataFrame, k: int) -> pd.DataFrame:
    """``masking_confirm``'s per-question records -> one row per condition, as ``masking``."""
    rows = confirm.groupby(["strategy", "mode", "seed"], sort=False).exact_match
    out = rows.agg(["mean", "size"]).reset_index()
    out = out.rename(columns={"mean": "exact_match", "size": "n_samples"})
    return out.assign(k=np.where(out.strategy == "none", 0, k))


def fig4_read(t: Tables) -> str:
    m = t["masking"]
    z = m[m["mode"] == "zero"].groupby("strategy").exact_match.mean()
    text = "Passage QA exact match (teacher-forced) with heads zeroed (random: mean of draws): "
    text += ", ".join(f"{k} {v:.2f}" for k, v in z.items()) + "."
    if t["niah"].score.max() == 0:
        text += " No head has a copy-paste (NIAH) score on this model: its 'niah' set is tie order."
    if "confirm" in t:  # the claim's test: the same heads on fresh questions
        c = t["confirm"]
        em = c.groupby(["strategy", "seed"]).exact_match.mean()
        draws = " / ".join(f"{v:.2f}" for v in em["random"])
        text += (
            f" On {c.record.nunique()} fresh questions (seed {c.questions_seed.iloc[0]}): "
            f"no masking {em['none'].iloc[0]:.2f}, retrieval {em['retrieval'].iloc[0]:.2f}, "
            f"random draws {draws}."
        )
    return text


# -- Fig. 10-11: case study, passage-level attention of Vanilla SFT vs MuDAF -----------------
# MuDAF's case study (Appendix E) sets each model's output beside its last-token attention per
# passage in three layers, for two questions; Fig. 11's golden passages (#1 and #9 of 10) are
# not at the end. Here: the first evaluation question, and the first later one whose golden
# passage is not the last (a golden passage at the end cannot tell retrieval from recency).
ANSWER_TOKENS = 10  # greedy tokens of the shown answer (it stops earlier at EOS or a newline)
CASE_SEARCH = 50  # questions searched for the second case
FIG10_MODELS = {"sft": "Vanilla SFT", "mudaf": "MuDAF"}


def fig10_cases(run: FigureRun) -> list[tuple[int, Sample]]:
    """The case study's two questions with their index among the seeded questions: the first
    (Fig. 10) and the first later one whose golden passage is not the last (Fig. 11)."""
    pool = qa_samples(run, run.sizes.heatmap_passages, CASE_SEARCH)
    later = (i for i in range(1, len(pool)) if len(pool[i].passages) - 1 not in pool[i].golden)
    second = next(later, None)
    if second is None:
        raise ValueError(
            f"none of the first {CASE_SEARCH} questions of {run.sizes.heatmap_passages} "
            "passages has its golden passage before the last"
        )
    return [(0, pool[0]), (second, pool[second])]


def fig10_compute(run: FigureRun) -> Tables:
    models = {
        "sft": run.tuned_model("sft"),
        "mudaf": run.tuned_model("mudaf", heads=target_sets(run)["mudaf"]),
    }
    layers = list(range(run.handle.spec.n_layers))[-3:]
    rows, cases, golden = [], [], []
    for case, (index, sample) in enumerate(fig10_cases(run), 1):
        golden += [{"case": case, "passage": g + 1} for g in sample.golden]
        for name, handle in models.items():
            att = passage_retrieval_scores(handle, [sample], progress=False).attention[0]
            shown = att.attention[layers]  # (3, H, P)
            prompt = sample.encode(handle.tokenizer).prompt_ids
            cases.append(
                {
                    "case": case,
                    "model": name,
                    "question_index": index,
                    "question": sample.meta.get("input", ""),
                    "gold": sample.answer,
                    "answer": greedy_text(handle, prompt, ANSWER_TOKENS),
                    "exact_match": int(teacher_force(handle, [sample])[0].exact_match),
                    "golden_attention": float(shown[:, :, list(att.golden)].sum(-1).mean()),
                    "prefix_attention": float(att.prefix[layers].mean()),
                }
            )
            for layer in layers:
                for head in range(att.attention.shape[1]):
                    vals = [att.prefix[layer, head], *att.attention[layer, head]]
                    rows += [
                        {
                            "case": case,
                            "model": name,
                            "layer": layer,
                            "head": head,
                            "passage": p,
                            "attention": float(v),
                        }
                        for p, v in enumerate(vals)
                    ]
    return {
        "attention": pd.DataFrame(rows),
        "golden": pd.DataFrame(golden),
        "cases": pd.DataFrame(cases),
    }


def fig10_draw(t: Tables):
    cases = t["cases"].assign(model=t["cases"].model.map(FIG10_MODELS))
    return pv.passage_grid(
        t["attention"].assign(model=t["attention"].model.map(FIG10_MODELS)),
        t["golden"],
        cases,
    )


def fig10_read(t: Tables) -> str:
    c = t["cases"]
    parts = []
    for case, rows in c.groupby("case"):
        by = rows.set_index("model")
        golden = ", ".join(f"#{p}" for p in t["golden"][t["golden"].case == case].passage)
        answers = ", ".join(
            f"{FIG10_MODELS[m]} {r.answer.strip()!r} ({'correct' if r.exact_match else 'wrong'})"
            for m, r in by.iterrows()
        )
        parts.append(
            f"case {case} (golden {golden}): golden passage {by.golden_attention['sft']:.3f} "
            f"under SFT vs {by.golden_attention['mudaf']:.3f} under MuDAF "
            f"(#0: {by.prefix_attention['sft']:.3f} vs {by.prefix_attention['mudaf']:.3f}); "
            f"answers {answers}"
        )
    return (
        "Last-token attention on the golden passage, mean over the shown heads (fraction of "
        "each head's attention): " + "; ".join(parts) + "."
    )


# -- Table 3: layers of the selected heads ----------------------------------------------------
TABLE3_STRATEGIES = {"mudaf": "MuDAF (strong)", "mudaf-weak": "MuDAF-weak"}


def table3_compute(run: FigureRun) -> Tables:
    sets = target_sets(run)
    rows = [
        {
            "strategy": strategy,
            "layer": layer,
            "heads": sum(a == layer for a, _ in sets[strategy]),
            "names": " ".join(f"L{a}H{b}" for a, b in sorted(sets[strategy]) if a == layer),
        }
        for strategy in TABLE3_STRATEGIES
        for layer in range(run.handle.spec.n_layers)
    ]
    return {"layers": pd.DataFrame(rows)}


def table3_draw(t: Tables):
    table = t["layers"].assign(strategy=t["layers"].strategy.map(TABLE3_STRATEGIES))
    return pv.layer_counts(
        table, title="MuDAF Table 3: layers of the selected heads, by selection strategy"
    )


def table3_read(t: Tables) -> str:
    a = t["layers"][t["layers"].heads > 0]
    parts = []
    for strategy, label in TABLE3_STRATEGIES.items():
        rows = a[a.strategy == strategy]
        where = ", ".join(
            f"layer {int(r.layer)}: {int(r.heads)} ({r.names})" for r in rows.itertuples()
        )
        parts.append(f"{label} {where or 'no heads'}")
    shared = sorted(set(a[a.strategy == "mudaf"].layer) & set(a[a.strategy == "mudaf-weak"].layer))
    both = ", ".join(str(int(v)) for v in shared) or "none"
    return f"Selected heads by layer: {'; '.join(parts)}; layers with both: {both}."
