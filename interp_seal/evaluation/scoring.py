"""Scoring generated text the way the original benchmarks do.

- **LongEval** (LongChat): an output is correct iff its last integer equals
  ``expected_number``; that judgement is ``interp_seal.tasks.line_retrieval.score_output``.
- **LongBench QA** (hotpotqa, 2wikimqa, musique; LongBench ``metrics.qa_f1_score``): both the
  prediction and each gold answer are normalised (lowercase, punctuation removed, the articles
  a / an / the removed, whitespace folded), split on spaces, and compared as bags of tokens:
  ``precision = common / len(pred)``, ``recall = common / len(gold)``,
  ``F1 = 2 P R / (P + R)`` (0 when nothing is shared). A prediction's score is the maximum over
  its gold answers. LongBench reports the mean x 100.

``score_records`` scores a task file (LongChat or LongBench JSONL fields) against predictions,
one row per record.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from interp_seal.tasks.line_retrieval import score_output

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """LongBench / SQuAD normalisation: lowercase, drop punctuation and articles, fold spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1 between the normalised ``prediction`` and ``gold``."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, answers: Iterable[str]) -> float:
    """LongBench QA score of one prediction: the best ``token_f1`` over the gold ``answers``."""
    answers = list(answers)
    if not answers:
        raise ValueError("qa_f1 needs at least one gold answer")
    return max(token_f1(prediction, gold) for gold in answers)


def score_records(records: Sequence[Mapping], predictions: Sequence[str]) -> pd.DataFrame:
    """Score ``predictions[i]`` against task record ``records[i]``.

    A record with ``expected_number`` (LongEval) is scored by the last integer (``score`` is
    0 or 1); one with ``answers`` (LongBench QA) by ``qa_f1``. Returns columns ``task``
    (``"longeval"`` or the record's ``dataset``, else ``"qa"``) and ``score``.
    """
    if len(records) != len(predictions):
        raise ValueError(
            f"{len(records)} task records but {len(predictions)} predictions; they are matched "
            "line by line, so the files must have the same number of lines"
        )
    rows = []
    for i, (record, prediction) in enumerate(zip(records, predictions, strict=True)):
        if not isinstance(prediction, str):
            raise TypeError(
                f"prediction {i} is {prediction!r:.40} ({type(prediction).__name__}), not the "
                "text a model generated; pass strings (a non-string would score 0 silently)"
            )
        if "expected_number" in record:
            task, score = "longeval", float(score_output(prediction, record["expected_number"]))
        elif "answers" in record:
            task, score = record.get("dataset") or "qa", qa_f1(prediction, record["answers"])
        else:
            raise ValueError(
                f"record {i} has neither 'expected_number' (LongEval) nor 'answers' (LongBench "
                f"QA); its fields are {sorted(record)}"
            )
        rows.append({"task": task, "score": score})
    return pd.DataFrame(rows, columns=["task", "score"])
