"""Greedy exact match by teacher forcing: one forward per sample instead of ``generate()``.

Greedy decoding emits, at each step, the argmax of the next-token distribution given the
prompt and everything emitted so far. Take an answer ``a_1 .. a_n`` and feed prompt + answer
through the model once (teacher forcing): the logits at the position before ``a_i`` are the
next-token distribution given prompt + ``a_1 .. a_{i-1}``. If the argmax there is ``a_i`` for
every ``i``, greedy decoding emits ``a_1`` first, then (its input now being exactly the
teacher-forced prefix) ``a_2``, and so on: it reproduces the answer. If the argmax differs
at some ``i``, greedy decoding agrees with the answer up to ``a_{i-1}`` and then emits that
argmax instead. Hence (DESIGN.md Sec. 4)::

    greedy(prompt)[:n] == answer  <=>  argmax logits[t - 1] == input_ids[t] at every answer position t

and one causal forward decides exact match. The same forward gives the answer's
log-probability ``sum_i log p(a_i | prompt, a_<i)`` and first-token correctness (on LongEval
the first digit of the value: the retrieval decision, the other digits are copying). Per-token
correctness after the first error is teacher-forced accuracy, not what greedy decoding would
emit (it has already left the answer by then); ``predicted`` holds the greedy tokens up to and
including the first error.

Batching: samples are grouped by length (longest first, so an out-of-memory error shows at
once) and right-padded. Causal attention keeps every real token blind to the padding on its
right and position ids stay ``0 .. T-1``, so each row computes what it would alone (up to
float rounding), and ``HeadIntervention``'s uniform mode (a running mean from position 0) stays
exact. Only answer positions are unembedded: the decoder's final (normalised) hidden states are
gathered there and only those rows go through ``lm_head``, so the ``T x vocab`` logits of a
long context are never built.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_seal.interventions import HeadIntervention, intervene
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Encoded, Sample


@dataclass(frozen=True, kw_only=True)
class AnswerScore:
    """The teacher-forced score of one sample.

    Attributes:
        token_correct: per answer token, whether the argmax at its position is that token.
        predicted: the argmax token id at each answer position.
        answer_logprob: ``sum_i log p(a_i | prompt, a_<i)`` (natural log).
        n_tokens: prompt + answer tokens (the sequence the model read).
    """

    token_correct: tuple[bool, ...]
    predicted: tuple[int, ...]
    answer_logprob: float
    n_tokens: int

    @property
    def exact_match(self) -> bool:
        """Greedy decoding reproduces the whole answer."""
        return all(self.token_correct)

    @property
    def first_token(self) -> bool:
        """Greedy decoding gets the first answer token right."""
        return self.token_correct[0]


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
        progress: show a progress bar over batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if intervention is not None and intervention.batched:
        raise ValueError(
            "teacher_force applies one scale table to every sample; evaluate each table of a "
            "batched (B, L, H, D) intervention separately"
        )
    encoded = encode_samples(handle, samples)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    scores: list[AnswerScore | None] = [None] * len(encoded)
    hooks = nullcontext() if intervention is None else intervene(handle, intervention, "hf")
    with hooks, torch.no_grad():
        for batch in tqdm(batches, desc="teacher forcing", disable=not progress, leave=False):
            for i, score in zip(
                batch, _score_batch(handle, [encoded[i] for i in batch]), strict=True
            ):
                scores[i] = score
    return scores


def _score_batch(handle: ModelHandle, batch: list[Encoded]) -> list[AnswerScore]:
    """One right-padded forward over ``batch``; logits only at answer-predicting positions."""
    ids, predicts = _right_pad(batch, pad_id=handle.tokenizer.pad_token_id or 0)
    hidden = handle.model.base_model(input_ids=ids.to(handle.device), use_cache=False)
    hidden = hidden.last_hidden_state  # (batch, pos, d_model), after the final norm
    logits = handle.unembed()(hidden[predicts.to(handle.device)]).float()  # (answer_tok, vocab)
    targets = ids.roll(-1, dims=1)[predicts].to(logits.device)  # the answer token each row predicts
    logprobs = logits.log_softmax(-1).gather(-1, targets[:, None])[:, 0]  # (answer_tok,)
    argmax = logits.argmax(-1)
    sizes = [len(enc) - enc.answer_start for enc in batch]
    return [
        AnswerScore(
            token_correct=tuple((pred == tgt).tolist()),
            predicted=tuple(pred.tolist()),
            answer_logprob=float(lp.sum()),
            n_tokens=len(enc),
        )
        for enc, pred, tgt, lp in zip(
            batch, argmax.split(sizes), targets.split(sizes), logprobs.split(sizes), strict=True
        )
    ]


def _right_pad(
    batch: list[Encoded], *, pad_id: int
) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
    """Right-padded ids and the mask of positions whose next token is an answer token.

    The pad id is irrelevant: real tokens never attend to the padding on their right.
    """
    width = max(len(enc) for enc in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    predicts = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, enc in enumerate(batch):
        ids[row, : len(enc)] = enc.input_ids
        predicts[row, enc.answer_start - 1 : len(enc) - 1] = True
    return ids, predicts
