"""Retrieval accuracy as a function of context length (SEAL Fig. 1 and Table 1, LongEval).

The generic driver ``evaluate_lengths`` takes samples grouped by length (any task: number of
lines for LongEval, context tokens for needles) and teacher-forces each group
(``teacher_forcing.py``), optionally under a head intervention, into one tidy row per length.
``evaluate_line_retrieval`` is the LongEval wrapper: it generates ``n`` records per line count
and calls the driver.

Columns of the result (``ACCURACY_COLUMNS``): ``length``, ``n`` (samples), ``n_tokens`` (mean
prompt + answer tokens), ``exact_match`` (fraction whose greedy output reproduces the answer),
``first_token`` (fraction with the first answer token right) and ``answer_logprob`` (mean
summed log-probability of the answer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

from interp_seal.defaults import RECORDS_PER_LENGTH
from interp_seal.evaluation.teacher_forcing import AnswerScore, encode_samples, teacher_force
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle
from interp_seal.tasks import line_retrieval
from interp_seal.tasks.chat import check_template, wrap_samples
from interp_seal.tasks.sample import Sample

ACCURACY_COLUMNS = ("length", "n", "n_tokens", "exact_match", "first_token", "answer_logprob")
ACCURACY_PROPORTIONS = ("exact_match", "first_token")
"""The columns of the accuracy table that are fractions of its ``n`` records (binomial)."""


def summarize(scores: Sequence[AnswerScore]) -> dict[str, int | float]:
    """Means over ``scores``: ``n``, ``n_tokens``, ``exact_match``, ``first_token``, ``answer_logprob``."""
    if not scores:
        raise ValueError("no scores to summarise")
    n = len(scores)
    return {
        "n": n,
        "n_tokens": sum(s.n_tokens for s in scores) / n,
        "exact_match": sum(s.exact_match for s in scores) / n,
        "first_token": sum(s.first_token for s in scores) / n,
        "answer_logprob": sum(s.answer_logprob for s in scores) / n,
    }


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_lengths(lengths: Iterable[int]) -> list[int]:
    """``lengths`` as a list of distinct integers >= 1; raises with what is wrong otherwise.

    Raises ValueError for no lengths, a length below 1 or a repeated length, TypeError for an
    entry that is not an integer (e.g. ``"10"`` read from a command line and not converted).
    """
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise TypeError(f"lengths must be a list of integers such as [20, 40], got {lengths!r}")
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths is empty: pass at least one length, e.g. [20, 40]")
    for length in lengths:
        if not _is_int(length):
            raise TypeError(
                f"lengths must be integers, got {length!r} ({type(length).__name__}); convert "
                "them first, e.g. [int(x) for x in lengths]"
            )
        if length < 1:
            raise ValueError(f"every length must be >= 1, got {length}")
    if len(set(lengths)) != len(lengths):
        raise ValueError(f"lengths {lengths} repeat a value; each length is one row of the table")
    return lengths


def evaluate_lengths(
    handle: ModelHandle,
    samples_by_length: Mapping[int, Sequence[Sample]],
    *,
    intervention: HeadIntervention | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> pd.DataFrame:
    """Teacher-forced accuracy per length: one row per key of ``samples_by_length``."""
    scores = score_lengths(
        handle,
        samples_by_length,
        intervention=intervention,
        batch_size=batch_size,
        progress=progress,
    )
    return accuracy_table(scores)


def accuracy_table(scores_by_length: Mapping[int, Sequence[AnswerScore]]) -> pd.DataFrame:
    """One row per length: ``ACCURACY_COLUMNS`` summarised from its scores."""
    rows = [{"length": length, **summarize(s)} for length, s in scores_by_length.items()]
    return pd.DataFrame(rows, columns=list(ACCURACY_COLUMNS))


def score_lengths(
    handle: ModelHandle,
    samples_by_length: Mapping[int, Sequence[Sample]],
    *,
    intervention: HeadIntervention | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> dict[int, list[AnswerScore]]:
    """Teacher-forced scores of every sample, by length.

    Every group is tokenised and checked against the context window before any forward runs,
    so a length that does not fit fails at once, not after the shorter ones have run.
    """
    encoded = {}
    for length, samples in samples_by_length.items():
        if not samples:
            raise ValueError(f"length {length} has no samples")
        try:
            encoded[length] = encode_samples(handle, samples)
        except ValueError as err:
            raise ValueError(f"length {length}: {err}") from err
    scores = {}
    bar = tqdm(encoded.items(), desc="lengths", disable=not progress)
    for length, group in bar:
        scores[length] = teacher_force(
            handle, group, intervention=intervention, batch_size=batch_size, progress=progress
        )
        exact = summarize(scores[length])["exact_match"]
        bar.set_postfix(length=length, exact_match=f"{exact:.2f}")
    return scores


def line_retrieval_samples(
    tokenizer,
    lengths: Iterable[int],
    *,
    n: int = RECORDS_PER_LENGTH,
    seed: int = 0,
    index_style: str = "adjective-noun",
    chat_template: str = "none",
) -> dict[int, list[Sample]]:
    """``n`` LongEval records per number of lines in ``lengths``, wrapped in ``chat_template``.

    Records come from ``line_retrieval.generate`` with ``seed``, so the same call gives the
    same records every time. ``chat_template`` wraps each record in a conversation
    (``interp_seal.tasks.chat``: ``"none"``, ``"tokenizer"`` for the model's own template, or
    ``"vicuna"``, LongChat's).
    """
    check_template(chat_template, tokenizer)
    lengths = check_lengths(lengths)
    if not _is_int(n) or n < 1:
        raise ValueError(f"n (records per length) must be an integer >= 1, got {n!r}")
    return {
        num_lines: wrap_samples(
            line_retrieval.generate(
                line_retrieval.LineRetrievalConfig(num_lines=num_lines, index_style=index_style),
                n,
                seed,
            ),
            chat_template,
            tokenizer,
        )
        for num_lines in lengths
    }


def evaluate_line_retrieval(
    handle: ModelHandle,
    lengths: Iterable[int],
    *,
    n: int = RECORDS_PER_LENGTH,
    seed: int = 0,
    index_style: str = "adjective-noun",
    intervention: HeadIntervention | None = None,
    batch_size: int = 8,
    progress: bool = True,
    chat_template: str = "none",
) -> pd.DataFrame:
    """LongEval accuracy per number of lines: ``n`` records per entry of ``lengths``.

    The records are ``line_retrieval_samples(handle.tokenizer, lengths, ...)``, so the same call
    gives the same table every time; ``length`` is the number of lines.
    """
    samples = line_retrieval_samples(
        handle.tokenizer,
        lengths,
        n=n,
        seed=seed,
        index_style=index_style,
        chat_template=chat_template,
    )
    return evaluate_lengths(
        handle, samples, intervention=intervention, batch_size=batch_size, progress=progress
    )
