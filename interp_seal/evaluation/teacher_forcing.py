"""Greedy exact match by teacher forcing: one forward per sample instead of ``generate()``.

Greedy decoding emits, at each step, the argmax of the next-token distribution given the
prompt and everything emitted so far. Take an answer ``a_1 .. a_n`` and feed prompt + answer
through the model once (teacher forcing): the logits at the position before ``a_i`` are the
next-token distribution given prompt + ``a_1 .. a_{i-1}``. If the argmax there is ``a_i`` for
every ``i``, greedy decoding emits ``a_1`` first, then (its input now being exactly the
teacher-forced prefix) ``a_2``, and so on: it reproduces the answer. If the argmax differs
at some ``i``, greedy decoding agrees with the answer up to ``a_{i-1}`` and then emits that
argmax instead. Hence (the design notes, ``docs/design.md`` Sec. 4)::

    greedy(prompt)[:n] == answer  <=>  argmax logits[t - 1] == input_ids[t] at every answer position t

and one causal forward decides exact match. The same forward gives the answer's
log-probability ``sum_i log p(a_i | prompt, a_<i)`` and first-token correctness: whether the
argmax is right at the first answer token that carries content (on LongEval the first digit of
the value: the retrieval decision, the other digits are copying). Byte-level BPE tokenizers
(SmolLM2, Llama 3, Qwen2) often split the answer " 12345." as a bare space then digits; that
space is right for every model, so ``first_token`` skips answer tokens that decode to
whitespace only (under teacher forcing they are fed, as usual). Per-token
correctness after the first error is teacher-forced accuracy, not what greedy decoding would
emit (it has already left the answer by then); ``predicted`` holds the greedy tokens up to and
including the first error.

Batching: samples are grouped by length (longest first, so an out-of-memory error shows at
once) and right-padded (``interp_seal.engine.batch``), so each row computes what it would
alone (up to float rounding), and ``HeadIntervention``'s uniform mode (a running mean from
position 0) stays exact. The forward is the engine's ``answer_logits``: the last layer, the
final norm and the unembedding run at answer positions only, so the ``T x vocab`` logits of a
long context are never built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from interp_seal.engine import AnswerBatch, answer_logits, pad_id_of
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Encoded, Sample

MAX_BATCH_TOKENS = 32_768
"""Padded tokens per teacher-forced forward (``teacher_force``'s default)."""


@dataclass(frozen=True, kw_only=True)
class AnswerScore:
    """The teacher-forced score of one sample.

    Attributes:
        token_correct: per answer token, whether the argmax at its position is that token.
        predicted: the argmax token id at each answer position.
        answer_logprob: ``sum_i log p(a_i | prompt, a_<i)`` (natural log).
        n_tokens: prompt + answer tokens (the sequence the model read).
        first_content: index of the first answer token that is not whitespace only (0 when
            all are).
    """

    token_correct: tuple[bool, ...]
    predicted: tuple[int, ...]
    answer_logprob: float
    n_tokens: int
    first_content: int = 0

    @property
    def exact_match(self) -> bool:
        """Greedy decoding reproduces the whole answer."""
        return all(self.token_correct)

    @property
    def first_token(self) -> bool:
        """The argmax is right at the first answer token that carries content."""
        return self.token_correct[self.first_content]


def first_content(tokenizer, answer_ids) -> int:
    """Index of the first of ``answer_ids`` that decodes to more than whitespace (else 0)."""
    for i, token in enumerate(answer_ids):
        if tokenizer.decode([int(token)]).strip():
            return i
    return 0


def encode_samples(handle: ModelHandle, samples: Sequence[Sample | Encoded]) -> list[Encoded]:
    """Tokenise ``samples`` (``Encoded`` ones pass through) and check they fit the model.

    Raises ValueError for a sample longer than the model's context window (RoPE models produce
    garbage past it, silently), with no prompt token, or with no answer token.
    """
    encoded = [s.encode(handle.tokenizer) if isinstance(s, Sample) else s for s in samples]
    window = handle.spec.max_positions
    for i, enc in enumerate(encoded):
        if len(enc) > window:
            raise ValueError(
                f"sample {i} is {len(enc)} tokens long (prompt + answer) but "
                f"{handle.name_or_path} has a context window of {window} positions "
                "(max_position_embeddings). Use shorter contexts (fewer lines, a smaller context "
                "length) or a model with a longer window."
            )
        if enc.answer_start < 1:
            raise ValueError(
                f"sample {i} has an empty prompt: teacher forcing needs at least one token "
                "(e.g. BOS) before the answer"
            )
        if enc.answer_start >= len(enc):
            raise ValueError(f"sample {i} has no answer tokens")
    return encoded


def teacher_force(
    handle: ModelHandle,
    samples: Sequence[Sample | Encoded],
    *,
    intervention: HeadIntervention | None = None,
    batch_size: int = 8,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
    progress: bool = False,
) -> list[AnswerScore]:
    """Score every sample's answer under teacher forcing, in the order given.

    Args:
        handle: the model.
        samples: ``Sample`` objects (tokenised with ``handle.tokenizer``) or ``Encoded`` ones.
        intervention: a head edit applied during the forwards (one ``(L, H, D)`` table for all
            samples), e.g. ``ablate(handle.spec, [(3, 5)])``. Teacher forcing is the
            long-context path, so it always runs on the HF backend (sdpa, hooks).
        batch_size: samples per forward.
        max_batch_tokens: padded tokens per forward (rows x the longest row); a sample
            longer than this runs alone. Long contexts thus run a few rows at a time: on CUDA
            in float32 with grouped-query attention, torch's sdpa takes its math kernel, whose
            T x T weights for 8 rows of SmolLM2 at 12K tokens would need 38 GiB.
        progress: show a progress bar over batches.
    """
    if batch_size < 1 or max_batch_tokens < 1:
        raise ValueError(
            f"batch_size and max_batch_tokens must be >= 1, got {batch_size}, {max_batch_tokens}"
        )
    if intervention is not None and intervention.batched:
        raise ValueError(
            "teacher_force applies one scale table to every sample; evaluate each table of a "
            "batched (B, L, H, D) intervention separately"
        )
    encoded = encode_samples(handle, samples)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    batches: list[list[int]] = []
    for i in order:  # longest first: a batch's first row sets its width
        if batches and len(batches[-1]) < batch_size:
            width = len(encoded[batches[-1][0]])
            if (len(batches[-1]) + 1) * width <= max_batch_tokens:
                batches[-1].append(i)
                continue
        batches.append([i])
    scores: list[AnswerScore | None] = [None] * len(encoded)
    pad_id = pad_id_of(handle.tokenizer)
    for rows in tqdm(batches, desc="teacher forcing", disable=not progress, leave=False):
        batch = AnswerBatch.from_encoded([encoded[i] for i in rows], pad_id=pad_id)
        scored = batch.score(answer_logits(handle, batch, intervention))
        for row, i in enumerate(rows):
            n = len(encoded[i]) - encoded[i].answer_start
            scores[i] = AnswerScore(
                token_correct=tuple(scored.correct[row, :n].tolist()),
                predicted=tuple(scored.predicted[row, :n].tolist()),
                answer_logprob=float(scored.logprob[row]),
                n_tokens=len(encoded[i]),
                first_content=first_content(handle.tokenizer, encoded[i].answer_ids),
            )
    return scores
