"""SEAL Table 3 and Sec. 8: do the learned head scales generalise, and what do they cost?

SEAL (arXiv 2501.15225) tunes one scale per head (SEAL-H) or per head channel (SEAL-C) on a
few dozen samples of *one* task format, LongEval line retrieval. Sec. 8 asks two questions of
those scales:

1. **Do they help retrieval outside their format?** SEAL takes the LongChat-7B scales tuned on
   line retrieval (Sec. 6.1) and scores LongBench's single- and multi-document QA with them
   (Table 3, "out-of-domain"); then, for comparison, scales tuned on LongBench QA itself
   ("in-domain"). Out of domain the QA scores hold or rise a little; in domain they rise more.
   The reading: the scales move heads that retrieve in general, not only the format's.
2. **Do they cost general ability?** Scaling heads that matter for retrieval could damage
   what the model knows. SEAL measures MMLU with the line-retrieval scales: 42.53 (base),
   42.34 (SEAL-H), 42.17 (SEAL-C), i.e. essentially unchanged.

Here, on the run's model and format (``FigureRun.samples``):

- **QA**: the passage questions every MuDAF figure scores (``figures.mudaf.eval_samples``:
  LongBench's hotpotqa prompt over synthetic passages, seed 0), teacher-forced exact match of
  the answer per question (``figures.mudaf.qa_outcomes``). Five variants, each a model: the
  base; SEAL-H and SEAL-C with the gallery's line-retrieval scales (``run.seal_scales``, the
  same files as SEAL Table 1: out of domain); SEAL-H and SEAL-C tuned on ``tune_n`` passage
  questions of the same format drawn from the tuning seed (``FigureRun.tuning_samples
  ("passages")``, ``figures.run.DATA_SEED``: in domain, never the evaluated questions).
  Scales are folded into ``o_proj`` (``tuning.merge.merged_model``, exact), so the QA
  primitive runs on each variant unchanged. Every variant answers the same questions, so the
  comparisons are paired: exact McNemar on the discordant questions
  (``analysis.statistics.mcnemar_exact``).
- **General ability, a stand-in for MMLU**: no MMLU (nor any knowledge benchmark) is
  reachable offline, so this figure does not measure what MMLU measures. It measures a
  broader and cruder sign of damage that can be measured here, the perplexity of held-out
  prose (a model whose edits hurt what it knows of language predicts it worse): the four
  short essays bundled as the needle task's haystack (``tasks/data/haystack.txt``). No tuning
  data of these variants contains them (line records and passage questions only); the model
  organism never saw them as text either (its training used only their words, in random
  order). Perplexity is ``exp`` of the mean negative log-likelihood of every token after the
  first of each essay, read from the forward engine by teacher forcing the whole essay as an
  "answer" (``evaluation.teacher_force``). A short closed-book fact set is not included: the
  project generates no facts a model could know (the passage generator invents its facts per
  seed, so a question without its passage has no answer, and with it the question is the QA
  task above).

The data is three tables: ``accuracy`` (one row per variant: ``variant``, ``method``,
``domain``, ``n``, ``exact_match`` and the QA primitive's other means), ``records`` (one row
per variant and question, its 0/1 exact match) and ``ability`` (``variant``, ``perplexity``,
``tokens`` scored, and ``uniform``: the vocabulary size, the perplexity of a uniform guess; a
model above it does not model the text at all, and then the stand-in shows nothing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import torch

from interp_seal.analysis.statistics import mcnemar_exact
from interp_seal.evaluation import teacher_force
from interp_seal.figures.mudaf import eval_samples, qa_outcomes
from interp_seal.figures.run import FigureRun
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle
from interp_seal.tasks.needle import read_haystack
from interp_seal.tasks.sample import Encoded
from interp_seal.tuning.merge import merged_model
from interp_seal.viz import paper_figures as pv

Tables = dict[str, pd.DataFrame]
OUT, IN = "out-of-domain", "in-domain"
# variant -> (method, domain, SEAL granularity, tuning task); the base is tuned on nothing
VARIANTS = {
    "base": ("base", "untuned", None, None),
    "seal-h lines": ("seal-h", OUT, "head", "line_retrieval"),
    "seal-c lines": ("seal-c", OUT, "channel", "line_retrieval"),
    "seal-h QA": ("seal-h", IN, "head", "passages"),
    "seal-c QA": ("seal-c", IN, "channel", "passages"),
}
GROUPS = {OUT: "line retrieval<br>(out-of-domain)", IN: "passage QA<br>(in-domain)"}
COLORS = {"base": "#495057", "seal-h": "#1c7ed6", "seal-c": "#e8590c"}
LABELS = {"base": "base", "seal-h": "SEAL-H", "seal-c": "SEAL-C"}


# -- general ability: perplexity of held-out prose -------------------------------------------
def heldout_essays(text: str | None = None) -> list[str]:
    """The bundled ``"essays"`` haystack (``needle.read_haystack``) cut into its essays: a paragraph with no
    sentence-ending punctuation is a title and starts the next essay."""
    essays: list[list[str]] = []
    for para in (p.strip() for p in (text or read_haystack("essays")).strip().split("\n\n")):
        if not para:
            continue
        if not essays or not para.endswith((".", "!", "?", '"')):
            essays.append([])
        essays[-1].append(para)
    return ["\n\n".join(e) for e in essays]


@dataclass(frozen=True, kw_only=True)
class Perplexity:
    """Perplexity of some texts.

    Attributes:
        perplexity: ``exp(nll)``.
        nll: mean negative log-likelihood per scored token (nats).
        tokens: tokens scored (each text's tokens after its first).
    """

    perplexity: float
    nll: float
    tokens: int


def text_perplexity(
    handle: ModelHandle, texts: Sequence[str], *, intervention: HeadIntervention | None = None
) -> Perplexity:
    """Perplexity of ``texts`` (pooled over their tokens) under ``handle``.

    Each text is tokenised as the model reads it (with the tokenizer's special tokens) and fed
    once by teacher forcing, every token after the first taken as an answer token: the forward
    engine's answer log-probabilities are then the log-likelihoods of the text, the same tokens
    a ``labels=`` loss scores.
    """
    encoded = [
        Encoded(input_ids=torch.tensor(handle.tokenizer(t)["input_ids"]), answer_start=1)
        for t in texts
    ]
    scores = teacher_force(handle, encoded, intervention=intervention)
    tokens = sum(len(s.token_correct) for s in scores)
    nll = -sum(s.answer_logprob for s in scores) / tokens
    return Perplexity(perplexity=math.exp(nll), nll=nll, tokens=tokens)


# -- compute / draw / read -------------------------------------------------------------------
def scales(run: FigureRun) -> dict[str, HeadIntervention | None]:
    """Each variant's scales (None: the base model), tuned once per run and kept in ``work/``."""
    return {
        v: None if g is None else run.seal_scales(g, task=task)
        for v, (_, _, g, task) in VARIANTS.items()
    }


def compute(run: FigureRun) -> Tables:
    """QA per question and held-out perplexity for the five variants (the module docstring)."""
    ivs = scales(run)
    questions = eval_samples(run)
    essays = heldout_essays()

    def one(key):
        iv = ivs[key["variant"]]
        handle = run.handle if iv is None else merged_model(run.handle, iv.scale)
        ppl = text_perplexity(handle, essays)
        return qa_outcomes(handle, questions) | {"perplexity": ppl.perplexity, "tokens": ppl.tokens}

    rows = run.rows("seal_table3", [{"variant": v} for v in VARIANTS], one)
    rows.insert(1, "method", [VARIANTS[v][0] for v in rows.variant])
    rows.insert(2, "domain", [VARIANTS[v][1] for v in rows.variant])
    records = pd.DataFrame(
        [
            {"variant": r.variant, "record": i, "exact_match": int(ok)}
            for r in rows.itertuples()
            for i, ok in enumerate(r.correct)
        ]
    )
    ability = rows[["variant", "method", "domain", "perplexity", "tokens"]].assign(
        uniform=run.handle.spec.vocab_size  # the perplexity of a uniform guess
    )
    accuracy = rows.drop(columns=["correct", "perplexity", "tokens"])
    return {"accuracy": accuracy, "records": records, "ability": ability}


def draw(t: Tables) -> go.Figure:
    """SEAL Table 3's figure (``viz.paper_figures.generalization_bars``)."""
    return pv.generalization_bars(
        t["accuracy"], t["ability"], groups=GROUPS, labels=LABELS, colors=COLORS
    )


def paired_p(records: pd.DataFrame, a: str, b: str) -> float:
    """Exact McNemar p of variants ``a`` and ``b`` on the questions both answered."""
    x = records[records.variant == a].set_index("record").exact_match
    y = records[records.variant == b].set_index("record").exact_match
    if not x.index.equals(y.index):
        raise ValueError(f"{a} and {b} were scored on different questions")
    return mcnemar_exact(x.to_numpy(), y.to_numpy()).p_value


def read(t: Tables) -> str:
    acc = t["accuracy"].set_index("variant")
    ppl = t["ability"].set_index("variant").perplexity
    em = acc.exact_match

    def arm(v: str) -> str:
        name = LABELS[VARIANTS[v][0]]
        return f"{name} {em[v]:.2f} (McNemar p = {paired_p(t['records'], v, 'base'):.2g})"

    out = [v for v in VARIANTS if VARIANTS[v][1] == OUT]
    inn = [v for v in VARIANTS if VARIANTS[v][1] == IN]
    uniform = float(t["ability"].uniform.iloc[0])
    worse = (
        f", above a uniform guess ({uniform:,.0f}): this model does not model prose, so the "
        "stand-in cannot show a loss of general ability here"
        if ppl.min() > uniform
        else f" (a uniform guess: {uniform:,.0f})"
    )
    return (
        f"Passage QA exact match on {int(acc.n.iloc[0])} questions: base {em['base']:.2f}; "
        f"line-retrieval scales (out-of-domain) {', '.join(arm(v) for v in out)}; "
        f"QA-tuned scales (in-domain) {', '.join(arm(v) for v in inn)}; held-out essay "
        f"perplexity (MMLU stand-in, {int(t['ability'].tokens.iloc[0])} tokens) base "
        f"{pv.compact_number(ppl['base'])}, "
        + ", ".join(
            f"{LABELS[VARIANTS[v][0]]} {VARIANTS[v][1]} {pv.compact_number(ppl[v])}"
            for v in out + inn
        )
        + worse
        + "."
    )
