"""Right-padded batches of answered samples, and how their answers are scored.

Every forward that scores answers (teacher-forced evaluation, ablation sweeps, the dashboard,
exact ablation for attribution patching) pads samples the same way: on the right, with the
model's pad id. Causal attention keeps every real token blind to the padding on its right and
position ids stay ``0 .. T-1``, so each row computes what it would alone (up to float
rounding); no padding mask is needed.

Exact match by teacher forcing (SEAL evaluates greedy decoding; one forward decides it): greedy
decoding reproduces an answer ``a_1 .. a_n`` iff the argmax of the logits at the position
before ``a_i`` is ``a_i`` for every ``i``. If it is, greedy decoding emits ``a_1``, its input is
then exactly the teacher-forced prefix, it emits ``a_2``, and so on; if the argmax differs at
``i``, greedy decoding leaves the answer there. So the logits at the answer-predicting
positions decide exact match, and give the answer's log-probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp_seal.tasks.sample import Encoded


def pad_id_of(tokenizer) -> int:
    """The id used for right padding: the tokenizer's pad token, else EOS, else 0.

    The value never changes a result (real tokens never attend to padding on their right);
    one rule keeps batches reproducible across the library.
    """
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0


@dataclass(frozen=True, kw_only=True, eq=False)
class AnswerScores:
    """Teacher-forced scores of the rows of a batch.

    Attributes:
        exact: greedy decoding reproduces the whole answer.
        logprob: ``sum_i log p(a_i | prompt, a_<i)`` (natural log).
        correct: per answer slot, whether the argmax is the answer token (False on padding).
        predicted: the argmax token at each answer slot.
    """

    exact: Bool[Tensor, " row"]
    logprob: Float[Tensor, " row"]
    correct: Bool[Tensor, "row answer"]
    predicted: Int[Tensor, "row answer"]


@dataclass(frozen=True, kw_only=True, eq=False)
class AnswerBatch:
    """Right-padded samples and where their answers are.

    Attributes:
        ids: prompt + answer ids, right-padded.
        query: positions whose next token is an answer token, padded by repeating the last one.
        target: the answer token each query position predicts.
        valid: which ``query`` entries are real (answers differ in length).
    """

    ids: Int[Tensor, "sample pos"]
    query: Int[Tensor, "sample answer"]
    target: Int[Tensor, "sample answer"]
    valid: Bool[Tensor, "sample answer"]

    @classmethod
    def from_encoded(cls, batch: Sequence[Encoded], *, pad_id: int) -> AnswerBatch:
        if not batch:
            raise ValueError("an AnswerBatch needs at least one sample")
        width = max(len(enc) for enc in batch)
        n_answer = max(len(enc) - enc.answer_start for enc in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        query = torch.zeros((len(batch), n_answer), dtype=torch.long)
        valid = torch.zeros((len(batch), n_answer), dtype=torch.bool)
        for row, enc in enumerate(batch):
            ids[row, : len(enc)] = enc.input_ids
            positions = torch.arange(enc.answer_start - 1, len(enc) - 1)
            query[row] = positions[-1]
            query[row, : len(positions)] = positions
            valid[row, : len(positions)] = True
        return cls(ids=ids, query=query, target=ids.gather(1, query + 1), valid=valid)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def score(self, logits: Float[Tensor, "row answer vocab"]) -> AnswerScores:
        """Scores of each row of ``logits``; rows cycle over the samples (``a * S + s`` is
        sample ``s`` under the ``a``-th edit of a batched run)."""
        reps = logits.shape[0] // len(self)
        target = self.target.repeat(reps, 1).to(logits.device)
        valid = self.valid.repeat(reps, 1).to(logits.device)
        logits = logits.float()
        logprob = logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]
        predicted = logits.argmax(-1)
        correct = (predicted == target) & valid
        return AnswerScores(
            exact=(correct | ~valid).all(-1),
            logprob=torch.where(valid, logprob, 0.0).sum(-1),
            correct=correct,
            predicted=predicted,
        )
