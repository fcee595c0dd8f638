"""LongBench multi-document QA records (hotpotqa, 2wikimqa, musique) as ``Sample`` objects.

A LongBench record (THUDM/LongBench, ``data/<dataset>.jsonl``) has the fields ``input`` (the
question), ``context``, ``answers`` (gold answers), ``length`` (words), ``dataset``,
``language``, ``all_classes`` (``null`` for QA) and ``_id``. In the multi-document QA sets
the context is a sequence of passage blocks ``Passage N:\\n{title}\\n{text}`` numbered from 1,
and the model input is LongBench's prompt for these three datasets (``PROMPT``, from
LongBench's ``dataset2prompt``).

``Sample.passages`` are the character spans of the blocks (from ``Passage N:`` to the end of
the text, trailing whitespace excluded), found by parsing the markers; ``Sample.golden`` are
0-based indices into them (``Passage N`` has index ``N - 1``). LongBench has no golden-passage
labels: MuDAF annotated them by hand (appendix A.1) and they come from a separate file (see
``interp_seal.tasks.jsonl.read_golden``). The answer for teacher forcing is the first gold
answer after a space (it follows ``Answer:``); all gold answers are in ``meta["answers"]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from interp_seal.tasks.sample import Sample, Span

PROMPT = (
    "Answer the question based on the given passages. Only give me the answer and do not "
    "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
    "question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nQuestion: {input}\nAnswer:"
)
PASSAGE = "Passage {number}:\n{title}\n{text}"
PASSAGE_SEPARATOR = "\n"
FIELDS = ("input", "context", "answers", "length", "dataset", "language", "all_classes", "_id")
_MARKER = re.compile(r"^Passage (\d+):(?:\n|$)", re.MULTILINE)


def format_context(passages: Sequence[tuple[str, str]]) -> str:
    """A LongBench context from ``(title, text)`` pairs, numbered from 1."""
    return PASSAGE_SEPARATOR.join(
        PASSAGE.format(number=i, title=title, text=text)
        for i, (title, text) in enumerate(passages, start=1)
    )


def passage_spans(context: str) -> tuple[Span, ...]:
    """Character spans of the ``Passage N:`` blocks of ``context``, checked to be 1, 2, 3, ...

    Raises ValueError (naming the field ``context``) when there is no marker, text before the
    first one, a number out of sequence, or a block with nothing after its marker.
    """
    markers = list(_MARKER.finditer(context))
    if not markers:
        raise ValueError("field 'context': no 'Passage N:' blocks found")
    if context[: markers[0].start()].strip():
        raise ValueError("field 'context': text before the first 'Passage N:' block")
    spans = []
    for i, m in enumerate(markers):
        if int(m.group(1)) != i + 1:
            raise ValueError(
                f"field 'context': Passage {i + 1} is missing (block {i + 1} is "
                f"'Passage {m.group(1)}:')"
            )
        end = markers[i + 1].start() if i + 1 < len(markers) else len(context)
        if not context[m.end() : end].strip():
            raise ValueError(f"field 'context': Passage {i + 1} is empty")
        spans.append((m.start(), m.start() + len(context[m.start() : end].rstrip())))
    return tuple(spans)


def sample_from_record(record: dict, golden: Sequence[int] = ()) -> Sample:
    """The ``Sample`` of a LongBench record (fields already type-checked), with golden ids."""
    spans = passage_spans(record["context"])
    if not record["answers"]:
        raise ValueError("field 'answers': no gold answer")
    head, _, tail = PROMPT.partition("{context}")
    offset = len(head)
    try:
        return Sample(
            task="passages",
            prompt=head + record["context"] + tail.replace("{input}", record["input"]),
            answer=" " + record["answers"][0],
            passages=tuple((offset + s, offset + e) for s, e in spans),
            golden=tuple(sorted(golden)),
            meta={
                **{k: record[k] for k in FIELDS if k != "context"},
                "context_span": (offset, offset + len(record["context"])),
            },
        )
    except ValueError as err:
        raise ValueError(f"record {record['_id']!r}: {err}") from None


def record_from_sample(sample: Sample) -> dict:
    """The LongBench record of a passages ``Sample`` (``golden`` added when there are any)."""
    start, end = sample.meta["context_span"]
    record = {k: sample.prompt[start:end] if k == "context" else sample.meta[k] for k in FIELDS}
    if sample.golden:
        record["golden"] = list(sample.golden)
    return record
