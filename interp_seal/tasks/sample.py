"""``Sample``: one task instance, whatever the task.

A sample knows its prompt, the answer the model should produce right after it, and the
character spans that analyses need (passages for multi-document QA, the needle for NIAH).
``Sample.encode(tokenizer)`` turns it into token ids with the answer's token span and the
passage / needle token spans, so teacher-forced evaluation and retrieval scores never
re-derive positions by hand.

Token ids are ``tokenizer(prompt)`` (with the tokenizer's special tokens, e.g. BOS) followed
by ``tokenizer(answer, add_special_tokens=False)``: exactly what greedy decoding from the
prompt would have to produce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

Span = tuple[int, int]


def check_golden_ids(golden: Sequence[int], n_passages: int) -> tuple[int, ...]:
    """``golden`` as ints, each a passage id in ``0..n_passages-1`` and listed once."""
    golden = tuple(int(g) for g in golden)
    bad = [g for g in golden if not 0 <= g < n_passages]
    if bad:
        raise ValueError(
            f"golden passage ids {bad} are out of range: the sample has {n_passages} passages "
            f"(ids 0..{n_passages - 1})"
        )
    if len(set(golden)) != len(golden):
        raise ValueError(f"golden passage ids {list(golden)} repeat")
    return golden


@dataclass(frozen=True, kw_only=True)
class Encoded:
    """A tokenised sample.

    Attributes:
        input_ids: prompt ids followed by answer ids.
        answer_start: index of the first answer token (``len(prompt ids)``).
        passages: half-open token spans of the passages, in prompt order.
        needle: half-open token span of the needle, if any.
    """

    input_ids: torch.Tensor
    answer_start: int
    passages: tuple[Span, ...] = ()
    needle: Span | None = None

    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.input_ids[: self.answer_start]

    @property
    def answer_ids(self) -> torch.Tensor:
        return self.input_ids[self.answer_start :]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One task instance.

    Attributes:
        task: ``"line_retrieval"``, ``"needle"`` or ``"passages"``.
        prompt: the model input up to the answer.
        answer: the continuation a correct model produces (scored token by token).
        passages: character spans of passages inside ``prompt`` (multi-document QA).
        golden: indices into ``passages`` of the passages that hold the answer.
        needle: character span of the needle inside ``prompt`` (NIAH).
        meta: task fields (e.g. LongChat's ``expected_number``, the needle depth) kept for
            scoring and for writing files in the task's native format.
    """

    task: str
    prompt: str
    answer: str
    passages: tuple[Span, ...] = ()
    golden: tuple[int, ...] = ()
    needle: Span | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        for start, end in (*self.passages, *([self.needle] if self.needle else [])):
            if not 0 <= start < end <= len(self.prompt):
                raise ValueError(
                    f"span ({start}, {end}) is empty or outside the prompt (length "
                    f"{len(self.prompt)}); spans must be non-empty and inside the prompt"
                )
        check_golden_ids(self.golden, len(self.passages))

    def encode(self, tokenizer) -> Encoded:
        """Token ids of prompt + answer with the answer, passage and needle token spans."""
        enc = tokenizer(self.prompt, return_offsets_mapping=bool(self.passages or self.needle))
        prompt_ids = list(enc["input_ids"])
        answer_ids = tokenizer(self.answer, add_special_tokens=False)["input_ids"]
        if not answer_ids:
            raise ValueError(f"the answer {self.answer!r} tokenises to nothing")
        spans = [self._token_span(enc["offset_mapping"], s) for s in self.passages]
        needle = self._token_span(enc["offset_mapping"], self.needle) if self.needle else None
        return Encoded(
            input_ids=torch.tensor(prompt_ids + list(answer_ids), dtype=torch.long),
            answer_start=len(prompt_ids),
            passages=tuple(spans),
            needle=needle,
        )

    @staticmethod
    def _token_span(offsets, span: Span) -> Span:
        """Tokens whose characters overlap ``span`` (special tokens have empty offsets)."""
        start, end = span
        inside = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
        if not inside:
            raise ValueError(f"character span {span} covers no token of the prompt")
        return inside[0], inside[-1] + 1
