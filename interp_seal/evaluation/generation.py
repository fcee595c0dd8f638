"""Generate-then-score: the benchmarks' own protocol, beside teacher forcing.

Teacher forcing (``teacher_forcing.py``) decides in one forward whether greedy decoding
reproduces a *known answer string* token for token. The benchmarks judge generated text
instead: LongChat's LongEval greedily generates up to 100 tokens after the (conversation-
wrapped) prompt and counts a record correct iff the last integer in the output equals
``expected_number``; LongBench scores the generated answer by token F1 against the gold
answers. The two verdicts differ when a model answers in other words ("It is 12345",
"12345" without the full stop, a different capitalisation) or continues past the answer with
numbers. ``evaluate_generated`` runs both on the same samples and reports how often they agree.

Per sample (``records`` table, ``GENERATED_COLUMNS``):

- ``generated``: the greedy continuation of the prompt (at most ``max_new_tokens`` tokens,
  stopping at EOS, which is not part of the text); for samples with an answer prefix the prompt
  already ends with it, so the continuation is what follows it;
- ``score``: LongEval records (``expected_number`` in ``meta``) by the last integer (0 or 1);
  every other task by LongBench's QA F1 against ``meta["answers"]`` (LongBench records) or the
  sample's answer string (needles, synthetic passages);
- ``generated_correct``: LongEval's verdict, or F1 == 1 (the normalised output is a gold answer
  as a bag of words) for F1-scored tasks;
- ``exact_match``: the teacher-forced verdict on the sample's answer string;
- ``agree``: the two verdicts are equal.

``summary`` has one row per length (``num_lines`` for LongEval, ``context_length`` for needles,
LongBench's ``length`` field, else the sample's token count) with ``n``, ``exact_match``,
``generated_accuracy``, ``generated_score`` and ``agreement``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
from tqdm.auto import tqdm

from interp_seal.engine import greedy_decode
from interp_seal.evaluation.scoring import qa_f1
from interp_seal.evaluation.teacher_forcing import AnswerScore, encode_samples, teacher_force
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle
from interp_seal.tasks.line_retrieval import score_output
from interp_seal.tasks.sample import Sample

GENERATED_COLUMNS = (
    "sample",
    "length",
    "task",
    "n_tokens",
    "generated",
    "score",
    "generated_correct",
    "exact_match",
    "agree",
)
SUMMARY_COLUMNS = (
    "length",
    "n",
    "exact_match",
    "generated_accuracy",
    "generated_score",
    "agreement",
)


@dataclass(frozen=True, kw_only=True)
class GeneratedEvaluation:
    """Both protocols on the same samples: ``records`` (one row per sample) and ``summary``."""

    records: pd.DataFrame
    summary: pd.DataFrame


def score_generated(sample: Sample, text: str) -> float:
    """The benchmark's score of generated ``text`` for ``sample`` (see the module docstring)."""
    if "expected_number" in sample.meta:
        return float(score_output(text, sample.meta["expected_number"]))
    return qa_f1(text, sample.meta.get("answers") or [sample.answer])


def sample_length(sample: Sample, n_tokens: int) -> int:
    """The length a sample is grouped under: lines, context length, LongBench length, tokens."""
    for key in ("num_lines", "context_length", "length"):
        if isinstance(sample.meta.get(key), int):
            return sample.meta[key]
    return n_tokens


def generate_answers(
    handle: ModelHandle,
    samples: Sequence[Sample],
    *,
    max_new_tokens: int = 100,
    intervention: HeadIntervention | None = None,
    progress: bool = True,
) -> list[str]:
    """Greedy continuation of each sample's prompt, decoded (EOS dropped, special tokens kept)."""
    encoded = encode_samples(handle, samples)
    eos = handle.tokenizer.eos_token_id
    texts = []
    for enc in tqdm(encoded, desc="generating", disable=not progress, leave=False):
        new = greedy_decode(handle, enc.prompt_ids, max_new_tokens, intervention=intervention)
        texts.append(handle.tokenizer.decode([t for t in new if t != eos]))
    return texts


def evaluate_generated(
    handle: ModelHandle,
    samples: Sequence[Sample],
    *,
    max_new_tokens: int = 100,
    intervention: HeadIntervention | None = None,
    batch_size: int = 8,
    progress: bool = True,
    forced: Sequence[AnswerScore] | None = None,
) -> GeneratedEvaluation:
    """Teacher-forced exact match and generate-then-score on ``samples``, with their agreement.

    Args:
        handle: the model.
        samples: any task's samples (already wrapped in a chat template if the model needs
            one, ``interp_seal.tasks.chat.wrap_samples``).
        max_new_tokens: generation budget per sample (LongChat: 100).
        intervention: a head edit applied to both protocols.
        batch_size: samples per teacher-forced forward.
        progress: show progress bars.
        forced: the samples' teacher-forced scores if already computed (same order, same
            intervention); otherwise they are computed here.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not samples:
        raise ValueError("no samples to evaluate")
    if forced is None:
        forced = teacher_force(
            handle, samples, intervention=intervention, batch_size=batch_size, progress=progress
        )
    elif len(forced) != len(samples):
        raise ValueError(f"{len(forced)} teacher-forced scores for {len(samples)} samples")
    texts = generate_answers(
        handle,
        samples,
        max_new_tokens=max_new_tokens,
        intervention=intervention,
        progress=progress,
    )
    rows = []
    for i, (sample, tf, text) in enumerate(zip(samples, forced, texts, strict=True)):
        score = score_generated(sample, text)
        correct = score == 1.0
        rows.append(
            {
                "sample": i,
                "length": sample_length(sample, tf.n_tokens),
                "task": sample.task,
                "n_tokens": tf.n_tokens,
                "generated": text,
                "score": score,
                "generated_correct": correct,
                "exact_match": tf.exact_match,
                "agree": correct == tf.exact_match,
            }
        )
    records = pd.DataFrame(rows, columns=list(GENERATED_COLUMNS))
    summary = (
        records.groupby("length", sort=True)
        .agg(
            n=("sample", "size"),
            exact_match=("exact_match", "mean"),
            generated_accuracy=("generated_correct", "mean"),
            generated_score=("score", "mean"),
            agreement=("agree", "mean"),
        )
        .reset_index()
    )
    return GeneratedEvaluation(records=records, summary=summary[list(SUMMARY_COLUMNS)])
