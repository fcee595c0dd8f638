"""Evaluation: greedy exact match by teacher forcing, accuracy vs length, NIAH grids, QA F1.

- ``teacher_forcing.py``: ``teacher_force`` scores answers in one forward per sample.
- ``lengths.py``: ``evaluate_lengths`` / ``evaluate_line_retrieval``, accuracy per length.
- ``niah.py``: ``niah_grid`` / ``evaluate_niah``, depth x context-length tables.
- ``generation.py``: ``evaluate_generated``, generate-then-score beside teacher forcing.
- ``scoring.py``: scoring generated text (LongEval last integer, LongBench QA token F1).
"""

from interp_seal.evaluation.generation import (
    GENERATED_COLUMNS,
    GeneratedEvaluation,
    evaluate_generated,
    generate_answers,
    score_generated,
)
from interp_seal.evaluation.lengths import (
    ACCURACY_COLUMNS,
    accuracy_table,
    evaluate_lengths,
    evaluate_line_retrieval,
    line_retrieval_samples,
    score_lengths,
    summarize,
)
from interp_seal.evaluation.niah import evaluate_niah, niah_grid
from interp_seal.evaluation.scoring import normalize_answer, qa_f1, score_records, token_f1
from interp_seal.evaluation.teacher_forcing import AnswerScore, encode_samples, teacher_force

__all__ = [
    "ACCURACY_COLUMNS",
    "GENERATED_COLUMNS",
    "AnswerScore",
    "GeneratedEvaluation",
    "encode_samples",
    "evaluate_generated",
    "accuracy_table",
    "evaluate_lengths",
    "evaluate_line_retrieval",
    "evaluate_niah",
    "generate_answers",
    "line_retrieval_samples",
    "niah_grid",
    "normalize_answer",
    "qa_f1",
    "score_generated",
    "score_records",
    "score_lengths",
    "summarize",
    "teacher_force",
    "token_f1",
]
