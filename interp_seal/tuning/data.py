"""Training data for every tuner: encoded samples, right-padded batches, the answer loss.

SEAL tunes on ~50 generated samples that copy the task's *format* with random content (SEAL,
Sec. 4.1 and App. B): for line retrieval the LongEval prompt with the answer string "The
<REGISTER_CONTENT> in line <index> is <value>.", for the needle task a haystack with a synthetic
needle. The loss is causal-LM cross-entropy on the answer tokens only (teacher forcing): the
prompt is context, not target.

Each sample weighs the same: the batch loss is the mean over samples of each sample's mean
answer-token loss. With that definition a batch split over several processes (each averaging
its own samples, DDP averaging the gradients) gives the same gradient as the whole batch on one
process, which the two-process test checks.

Batches are right-padded (causal attention keeps real tokens blind to the padding) and the LM
head runs only on the last positions that hold answer targets (``logits_to_keep``), so a long
prompt never materialises ``T x vocab`` logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Int
from torch import Tensor, nn

from interp_seal import defaults
from interp_seal.defaults import TUNING_SAMPLES
from interp_seal.tasks.line_retrieval import parse_record
from interp_seal.tasks.sample import Encoded, Sample

Span = tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class TrainingBatch:
    """Right-padded training examples.

    Attributes:
        input_ids: prompt + answer ids, padded on the right.
        attention_mask: 1 on real tokens.
        answer_start: index of each row's first answer token.
        lengths: real length of each row.
        passages: per row, the token spans of its passages (MuDAF), else empty.
        golden: per row, indices into ``passages`` of the golden passages.
    """

    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    answer_start: Int[Tensor, " batch"]
    lengths: Int[Tensor, " batch"]
    passages: tuple[tuple[Span, ...], ...]
    golden: tuple[tuple[int, ...], ...]

    def to(self, device: torch.device | str) -> TrainingBatch:
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            answer_start=self.answer_start.to(device),
            lengths=self.lengths.to(device),
        )

    def answer_mask(self) -> Bool[Tensor, "batch pos"]:
        """True where the token is an answer token (a target of the loss)."""
        pos = torch.arange(self.input_ids.shape[1], device=self.input_ids.device)
        return (pos >= self.answer_start[:, None]) & (pos < self.lengths[:, None])


@dataclass(frozen=True, kw_only=True)
class Example:
    """One encoded training sample: the tokenised ``Sample`` and its golden passage ids."""

    encoded: Encoded
    golden: tuple[int, ...] = ()


def encode_examples(samples: Sequence[Sample], tokenizer) -> list[Example]:
    """Tokenise ``samples`` once (prompt ids + answer ids, passage token spans)."""
    return [Example(encoded=s.encode(tokenizer), golden=s.golden) for s in samples]


def check_window(examples: Sequence[Example], max_positions: int | None) -> None:
    """Raise ValueError if an example is longer than the model's context window.

    RoPE models see positions past ``max_position_embeddings`` only out of distribution; a
    tuner trained there learns from garbage attention without any error. ``None`` (a model
    without a declared window) checks nothing.
    """
    if max_positions is None:
        return
    for i, example in enumerate(examples):
        if len(example.encoded) > max_positions:
            raise ValueError(
                f"training sample {i} is {len(example.encoded)} tokens long (prompt + answer), "
                f"but the model's context window is {max_positions} positions "
                "(max_position_embeddings). Use shorter samples (fewer --num-lines, a smaller "
                "--tokens) or a model with a longer window."
            )


def collate(examples: Sequence[Example], pad_id: int) -> TrainingBatch:
    """Right-pad ``examples`` into one batch."""
    if not examples:
        raise ValueError("cannot build a batch from zero examples")
    lengths = [len(e.encoded) for e in examples]
    input_ids = torch.full((len(examples), max(lengths)), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, (e, n) in enumerate(zip(examples, lengths, strict=True)):
        input_ids[row, :n] = e.encoded.input_ids
        attention_mask[row, :n] = 1
    return TrainingBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        answer_start=torch.tensor([e.encoded.answer_start for e in examples]),
        lengths=torch.tensor(lengths),
        passages=tuple(e.encoded.passages for e in examples),
        golden=tuple(e.golden for e in examples),
    )


def answer_loss(model: nn.Module, batch: TrainingBatch) -> Tensor:
    """Mean over samples of the mean cross-entropy on each sample's answer tokens.

    The token at position ``t`` is predicted by the logits at ``t - 1``; only the last
    ``T - min(answer_start) + 1`` positions go through the LM head.
    """
    T = batch.input_ids.shape[1]
    keep = T - int(batch.answer_start.min()) + 1
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        logits_to_keep=keep,
        use_cache=False,  # training never decodes; layer recompute refuses a cache
    ).logits  # (B, keep, V): positions T-keep .. T-1
    first = T - keep
    targets = batch.input_ids[:, first + 1 :]  # token at t+1 for logits at t
    mask = batch.answer_mask()[:, first + 1 :]
    logits = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32))
    token_loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, keep-1)
    per_sample = (token_loss * mask).sum(1) / mask.sum(1)
    return per_sample.mean()


def with_line_passages(sample: Sample) -> Sample:
    """A line-retrieval sample whose lines are its passages and the queried line the golden one.

    This turns LongEval records into multi-passage retrieval data for MuDAF's contrastive loss
    and retrieval scores (each ``line <index>: REGISTER_CONTENT is <value>`` is a passage).
    """
    if sample.task != "line_retrieval":
        raise ValueError(f"expected a line_retrieval sample, got task {sample.task!r}")
    lines = parse_record(sample.prompt)
    spans = tuple((line.start, line.end) for line in lines)
    golden = int(sample.meta["random_idx"][1])
    return replace(sample, passages=spans, golden=(golden,))


TASKS = defaults.TASKS


def format_samples(
    task: str,
    tokenizer,
    n: int = TUNING_SAMPLES,
    *,
    num_lines: int | None = None,
    tokens: int | None = None,
    num_passages: int = 10,
    seed: int = 0,
    index_style: str = "adjective-noun",
) -> list[Sample]:
    """SEAL's training data: ``n`` samples in ``task``'s format with random content (Sec. 4.1).

    Args:
        task: ``"line_retrieval"`` (LongEval; size by ``num_lines`` or ``tokens``),
            ``"needle"`` (SEAL's 10 synthetic needles at evenly spread depths of a ``tokens``
            context) or ``"passages"`` (synthetic multi-document QA, ``num_passages`` each).
        tokenizer: the tuned model's tokenizer (sizes are in its tokens).
        n: samples (SEAL: 50).
        seed: seeds the content; use another seed than the evaluation data.
        index_style: line retrieval: the line indices (``line_retrieval.INDEX_STYLES``), as
            in the records the tuned model is evaluated on.
    """
    from interp_seal.tasks import line_retrieval, needle, passages

    if task == "line_retrieval":
        if (num_lines is None) == (tokens is None):
            raise ValueError("line_retrieval samples need exactly one of num_lines or tokens")
        if num_lines is None:
            num_lines = line_retrieval.num_lines_for_tokens(
                tokenizer, tokens, index_style=index_style, seed=seed
            )
        cfg = line_retrieval.LineRetrievalConfig(num_lines=num_lines, index_style=index_style)
        return line_retrieval.generate(cfg, n, seed=seed)
    if task == "needle":
        if tokens is None:
            raise ValueError("needle samples need tokens, the context length")
        cfg = needle.NeedleConfig(context_lengths=(tokens,), depths=needle.linear_grid(0, 100, n))
        return needle.generate(cfg, tokenizer, 1, seed=seed)
    if task == "passages":
        return passages.generate(passages.PassagesConfig(num_passages=num_passages), n, seed=seed)
    raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
