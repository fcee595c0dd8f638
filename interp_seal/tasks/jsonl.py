"""Task files: one JSON object per line, in each task's native format, read back as ``Sample``.

One task per file; ``read_samples`` tells the task from the first record's fields.

- **line_retrieval**: LongChat's LongEval test-case fields ``random_idx`` (``[line index,
  0-based line number]``; the index is an integer in LongChat's integer style, a string in the
  others), ``expected_number``, ``num_lines``, ``correct_line`` (with its newline, as LongChat
  writes it; ``Sample.meta`` keeps it without) and ``prompt`` (LongChat's prompt, without an
  answer prefix), plus ours: ``answer``, ``answer_prefix`` (the part of the SEAL answer string
  forced after the prompt, ``""`` for none) and ``index_style``. A file written by LongChat's
  ``generate_testcases.py`` (no ``answer``; its extra ``token_size`` and ``prompt_length`` are
  ignored; its published files end the question with one extra space) reads with the SEAL
  answer string split as ``line_retrieval`` does by default (``force_prefix=True``). The fields
  must agree: ``correct_line`` is line ``random_idx[1]`` of the prompt and holds
  ``random_idx[0]`` and ``expected_number``, the prompt has ``num_lines`` lines and asks for
  ``random_idx[0]``. ``write_longchat`` writes LongChat's own layout (its five fields, in its
  order, as its ``json.dump`` writes them).
- **needle**: ``prompt``, ``answer``, ``needle`` (the sentence), ``needle_span`` (its
  ``[start, end)`` characters in ``prompt``), ``needle_id``, ``question``, ``depth_percent``,
  ``context_length``; optionally ``haystack``, a digest of the haystack text the needle was
  hidden in (``needle.haystack_digest``).
- **passages**: LongBench's fields (``input``, ``context``, ``answers``, ``length``,
  ``dataset``, ``language``, ``all_classes``, ``_id``), plus ``golden`` (0-based passage ids)
  when known. LongBench's own files read as they are; golden ids can come from a separate
  file (``read_golden``), e.g. MuDAF's hand annotations of HotpotQA.

A malformed line (bad JSON, a missing field, a field of the wrong type, a span that does not
point at its text, golden ids out of range; a line past 16 MiB, nested too deep or holding a
lone surrogate: ``interp_seal.inputs.parse_json``) raises ``ValueError("{path}:{line}: ...")``
naming the field; a path that is not a regular file is refused before it is opened.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from interp_seal.inputs import MAX_JSON_BYTES, check_input_file, parse_json, read_json
from interp_seal.outputs import atomic_path, write_text
from interp_seal.tasks import line_retrieval, longbench
from interp_seal.tasks.sample import Sample

Golden = Mapping[str, tuple[int, ...]]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# JSON value kinds, by the name errors use
KINDS: dict[str, Callable[[object], bool]] = {
    "a string": lambda v: isinstance(v, str),
    "an integer": _is_int,
    "a number": lambda v: _is_int(v) or isinstance(v, float),
    "a list of strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "a list of integers": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
    "a list or null": lambda v: v is None or isinstance(v, list),
    "a [line index, line number] pair (a string or integer, then an integer)": lambda v: (
        isinstance(v, list)
        and len(v) == 2
        and (isinstance(v[0], str) or _is_int(v[0]))
        and _is_int(v[1])
    ),
    "a [start, end] pair of integers, 0 <= start <= end": lambda v: (
        isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v) and 0 <= v[0] <= v[1]
    ),
    "a number from 0 to 100": lambda v: (
        (_is_int(v) or isinstance(v, float)) and math.isfinite(v) and 0 <= v <= 100
    ),
    "an integer >= 1": lambda v: _is_int(v) and v >= 1,
    "an integer >= 0": lambda v: _is_int(v) and v >= 0,
}


@dataclass(frozen=True, kw_only=True)
class _Format:
    """A task's record fields (name -> ``KINDS`` key) and its record <-> ``Sample`` converters."""

    required: dict[str, str]
    optional: dict[str, str]
    to_record: Callable[[Sample], dict]
    from_record: Callable[[dict], Sample]


def _line_to_record(sample: Sample) -> dict:
    m = sample.meta
    prefix = (
        line_retrieval.ANSWER_PREFIX.format(idx=m["random_idx"][0]) if m["force_prefix"] else ""
    )
    record = {k: m[k] for k in ("random_idx", "expected_number", "num_lines")}
    record["correct_line"] = m["correct_line"] + "\n"
    record["prompt"] = sample.prompt[: len(sample.prompt) - len(prefix)]
    record.update(answer=sample.answer, answer_prefix=prefix)
    return record | ({"index_style": m["index_style"]} if "index_style" in m else {})


_QUESTION = re.compile(r"Tell me what is the <REGISTER_CONTENT> in line (.+)\? I need the number")


def _check_line_record(record: dict) -> None:
    """Raise ValueError naming the field when a LongEval record's fields disagree."""
    idx, number = record["random_idx"]
    n = record["num_lines"]
    if not 0 <= number < n:
        raise ValueError(
            f"field 'random_idx': line number {number} is outside 0..{n - 1} (num_lines is {n})"
        )
    expected = line_retrieval.LINE.format(idx=idx, value=record["expected_number"])
    if record["correct_line"].rstrip("\n") + "\n" != expected:
        raise ValueError(
            f"field 'correct_line': {record['correct_line']!r:.80} is not {expected!r:.80}, the "
            "line that random_idx and expected_number give"
        )
    lines = [
        record["prompt"][x.start : x.end] for x in line_retrieval.parse_record(record["prompt"])
    ]
    if len(lines) != n:
        raise ValueError(
            f"field 'num_lines': {n}, but the prompt has {len(lines)} 'line <index>: "
            "REGISTER_CONTENT is <value>' lines"
        )
    if lines[number] + "\n" != expected:
        found = [i for i, line in enumerate(lines) if line + "\n" == expected]
        if found:
            raise ValueError(
                f"field 'random_idx': line number {number}, but correct_line is line {found[0]} "
                "of the prompt"
            )
        raise ValueError(f"field 'prompt': no line of the prompt is correct_line {expected!r:.80}")
    asked = _QUESTION.findall(record["prompt"])
    if not asked or asked[-1] != str(idx):
        raise ValueError(
            f"field 'prompt': the question asks for line {asked[-1] if asked else None!r:.60}, "
            f"not random_idx[0] {str(idx)!r:.60}"
        )


def _line_from_record(record: dict) -> Sample:
    _check_line_record(record)
    idx = record["random_idx"][0]
    if "answer" in record:
        prefix, answer = record.get("answer_prefix", ""), record["answer"]
    else:  # LongChat's own test case
        prefix = line_retrieval.ANSWER_PREFIX.format(idx=idx)
        answer = line_retrieval.ANSWER.format(value=record["expected_number"])
    meta = {k: record[k] for k in ("random_idx", "expected_number", "num_lines")}
    meta["correct_line"] = record["correct_line"].rstrip("\n")
    meta["force_prefix"] = bool(prefix)
    if "index_style" in record:
        meta["index_style"] = record["index_style"]
    return Sample(task="line_retrieval", prompt=record["prompt"] + prefix, answer=answer, meta=meta)


def _needle_to_record(sample: Sample) -> dict:
    start, end = sample.needle
    return {
        "prompt": sample.prompt,
        "answer": sample.answer,
        "needle": sample.prompt[start:end],
        "needle_span": [start, end],
        **sample.meta,
    }


def _needle_from_record(record: dict) -> Sample:
    start, end = record["needle_span"]
    found = record["prompt"][start:end] if 0 <= start < end else ""
    if found != record["needle"]:
        raise ValueError(
            f"field 'needle_span': prompt[{start}:{end}] is {found[:60]!r}, not the needle "
            f"{record['needle'][:60]!r}"
        )
    meta_fields = ("needle_id", "question", "depth_percent", "context_length", "haystack")
    return Sample(
        task="needle",
        prompt=record["prompt"],
        answer=record["answer"],
        needle=(start, end),
        meta={k: record[k] for k in meta_fields if k in record},
    )


def _passages_from_record(record: dict) -> Sample:
    return longbench.sample_from_record(record, record.get("golden", ()))


FORMATS: dict[str, _Format] = {
    "line_retrieval": _Format(
        required={
            "random_idx": "a [line index, line number] pair (a string or integer, then an integer)",
            "expected_number": "an integer",
            "num_lines": "an integer >= 1",
            "correct_line": "a string",
            "prompt": "a string",
        },
        optional={"answer": "a string", "answer_prefix": "a string", "index_style": "a string"},
        to_record=_line_to_record,
        from_record=_line_from_record,
    ),
    "needle": _Format(
        required={
            "prompt": "a string",
            "answer": "a string",
            "needle": "a string",
            "needle_span": "a [start, end] pair of integers, 0 <= start <= end",
            "needle_id": "a string",
            "question": "a string",
            "depth_percent": "a number from 0 to 100",
            "context_length": "an integer >= 1",
        },
        optional={"haystack": "a string"},
        to_record=_needle_to_record,
        from_record=_needle_from_record,
    ),
    "passages": _Format(
        required={
            "input": "a string",
            "context": "a string",
            "answers": "a list of strings",
            "length": "an integer >= 0",
            "dataset": "a string",
            "language": "a string",
            "all_classes": "a list or null",
            "_id": "a string",
        },
        optional={"golden": "a list of integers"},
        to_record=longbench.record_from_sample,
        from_record=_passages_from_record,
    ),
}
# the field that tells each task's records apart
_SIGNATURE = {"line_retrieval": "expected_number", "needle": "needle_span", "passages": "context"}


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number in the file, object) for each non-blank line of a JSONL file."""
    check_input_file(path, "JSONL file")
    with path.open("rb") as f:
        lineno = 0
        while raw := f.readline(MAX_JSON_BYTES + 1):  # a line past the limit is refused whole
            lineno += 1
            if not raw.strip():
                continue
            fix = "each line must hold one complete JSON object"
            record = parse_json(raw, f"{path}:{lineno}", fix=fix)
            if not isinstance(record, dict):
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}"
                )
            yield lineno, record


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON objects of a JSONL file, blank lines skipped.

    Errors name the file and its line number (counting blank lines), as editors show them.
    """
    return [record for _, record in _records(Path(path))]


def _check(record: dict, required: dict[str, str], optional: dict[str, str]) -> None:
    """Raise ValueError naming the first missing or mistyped field (fields -> ``KINDS`` keys)."""
    for name in required:
        if name not in record:
            raise ValueError(f"missing field {name!r}")
    for name, kind in (required | optional).items():
        if name in record and not KINDS[kind](record[name]):
            raise ValueError(f"field {name!r} must be {kind}, got {record[name]!r:.60}")


def _detect(record: dict) -> str:
    for task, key in _SIGNATURE.items():
        if key in record:
            return task
    raise ValueError(
        "cannot tell the task: no field "
        + ", ".join(f"{key!r} ({task})" for task, key in _SIGNATURE.items())
    )


def write_samples(path: str | Path, samples: Iterable[Sample]) -> None:
    """Write samples of one task to ``path`` as JSONL in the task's format."""
    samples = list(samples)
    tasks = sorted({s.task for s in samples})
    if len(tasks) > 1:
        raise ValueError(f"one task per file, got {tasks}")
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for sample in samples:
            f.write(json.dumps(FORMATS[sample.task].to_record(sample), ensure_ascii=False) + "\n")


LONGCHAT_FIELDS = ("random_idx", "expected_number", "num_lines", "correct_line", "prompt")


def write_longchat(path: str | Path, samples: Iterable[Sample]) -> None:
    """Write line-retrieval samples as LongChat's ``generate_testcases.py`` writes its files.

    Only LongChat's fields, in its order, through ``json.dumps`` defaults (non-ASCII escaped,
    as its ``json.dump`` does). The SEAL answer string and ``index_style`` are not kept: the
    file reads back as LongChat's own files do (``force_prefix=True``).
    """
    samples = list(samples)
    others = sorted({s.task for s in samples} - {"line_retrieval"})
    if others:
        raise ValueError(
            f"LongChat test files hold line_retrieval samples only, got {others}; write other "
            "tasks with write_samples"
        )
    lines = []
    for sample in samples:
        record = _line_to_record(sample)
        lines.append(json.dumps({k: record[k] for k in LONGCHAT_FIELDS}) + "\n")
    write_text(path, "".join(lines))


def read_samples(
    path: str | Path, *, task: str | None = None, golden: Golden | None = None
) -> list[Sample]:
    """Read a task file; ``task`` defaults to the one the first record's fields show.

    ``golden`` (``_id`` -> golden passage ids, see ``read_golden``) overrides the records'
    ``golden`` fields of a passages file; every record must then have an entry.
    """
    if task is not None and task not in FORMATS:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(FORMATS)}")
    path = Path(path)
    samples = []
    for lineno, record in _records(path):
        try:
            task = task or _detect(record)
            if golden is not None and task != "passages":
                raise ValueError(f"golden passage ids given for a {task} file")
            fmt = FORMATS[task]
            _check(record, fmt.required, fmt.optional)
            if golden is not None:
                if record["_id"] not in golden:
                    raise ValueError(f"field '_id': {record['_id']!r} is not in the golden-id file")
                record = record | {"golden": list(golden[record["_id"]])}
            samples.append(fmt.from_record(record))
        except ValueError as err:
            raise ValueError(f"{path}:{lineno}: {err}") from None
    return samples


def read_golden(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Golden passage ids per LongBench ``_id`` (0-based: ``Passage N`` is id ``N - 1``).

    ``*.jsonl``: one ``{"_id": ..., "golden": [...]}`` per line; otherwise one JSON object
    ``{"<_id>": [...], ...}``.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        golden: dict[str, tuple[int, ...]] = {}
        for lineno, record in _records(path):
            try:
                _check(record, {"_id": "a string", "golden": "a list of integers"}, {})
                if record["_id"] in golden:
                    raise ValueError(f"field '_id': {record['_id']!r} appears twice")
            except ValueError as err:
                raise ValueError(f"{path}:{lineno}: {err}") from None
            golden[record["_id"]] = tuple(record["golden"])
        return golden
    mapping = read_json(path, "golden-id file", fix="expected a JSON object of _id -> golden ids")
    if not isinstance(mapping, dict):
        raise ValueError(f"{path}: expected a JSON object of _id -> golden ids")
    for key, ids in mapping.items():
        if not KINDS["a list of integers"](ids):
            raise ValueError(f"{path}: field {key!r} must be a list of integers, got {ids!r:.60}")
    return {key: tuple(ids) for key, ids in mapping.items()}


def load_longbench(path: str | Path, golden_path: str | Path | None = None) -> list[Sample]:
    """LongBench multi-document QA samples, with golden ids from ``golden_path`` if given."""
    golden = read_golden(golden_path) if golden_path is not None else None
    return read_samples(path, task="passages", golden=golden)
