"""Train the model organism from scratch: an induction-head bootstrap plus a gap curriculum.

Command (the shipped checkpoint; see its README.md for the measured time)::

    interp-seal organism train --out runs/organism --seed 0

Why this recipe (``docs/organism.md``, the experimental record): trained on line retrieval alone, a
small model never learns key matching. The head that matches the question's key to a line
needs a head that has already copied each line's key into that line's value positions, and
neither gets a gradient without the other, so loss sits at chance for thousands of steps
(attempts 1 and 2). Two ingredients break the deadlock (attempt 3):

1. **Repeated random sequences.** Half the batches are random token sequences repeated once,
   with loss on the repeat. Copying them needs an induction head (previous-token head + a head
   that attends to the token after the earlier occurrence of the current token): the same
   two-head circuit that line retrieval needs, with a key-to-value gap of one token. The
   sequences must be *short* for this 4-layer model: with 24-48-token halves (the 2-layer
   recipe of docs/organism.md) repeat loss stayed at chance for 2,000 steps; with 6-12-token halves
   it fell from 6.1 to 3.1 nats within 250 steps (attention spread over fewer positions gives
   the matching head a stronger gradient).
2. **A gap curriculum.** Line data starts as pure associative recall (``happy-tiger 45041.``,
   question ``happy-tiger``), then the distance between a line's key and its first digit grows
   one format at a time up to the exact LongEval format. A batch uses the current level with
   probability ``p_current_level`` (else an earlier one); the level advances once the running
   first-digit accuracy on it passes ``advance_acc``.

Loss is on answer tokens only (the digits and the closing ``.``), the first digit weighted
``first_digit_weight`` times: it is the retrieval decision, the rest is copying. The LM head is
applied only at those positions (the vocabulary is ~2,600 tokens, full logits would dominate the
step). Determinism: the batch of step ``s`` is drawn from ``random.Random(f"...{seed}/{s}")``,
so resuming needs only weights, optimizer moments and the curriculum state, all saved as
safetensors + JSON in ``OUT/state`` every ``checkpoint_every`` steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from interp_seal.organism.loop import run_loop
from interp_seal.organism.tokenizer import build_tokenizer
from interp_seal.tasks.line_retrieval import (
    ADJECTIVES,
    ANSWER,
    ANSWER_PREFIX,
    NOUNS,
    VALUE_RANGE,
    LineRetrievalConfig,
    make_sample,
    parse_record,
)

KEYS = tuple(f"{a}-{n}" for a in ADJECTIVES for n in NOUNS)

# The gap curriculum: (line format, question format) per level; the answer is always
# ANSWER (" 45041."). Level 0 is pure induction (the answer repeats what followed the key);
# each later level puts one more token between a line's key and its value. The last level,
# FULL_LEVEL, is the exact LongEval prompt from ``tasks.line_retrieval``.
LEVELS = (
    (" {idx} {value}.\n", "\n {idx}"),
    (" {idx} <{value}>\n", "\n {idx} is"),
    ("line {idx} is <{value}>\n", ANSWER_PREFIX),
    ("line {idx}: REGISTER_CONTENT is <{value}>\n", ANSWER_PREFIX),
)
FULL_LEVEL = len(LEVELS)


@dataclass(frozen=True, kw_only=True)
class OrganismConfig:
    """The recipe: architecture, optimisation and data. Defaults train the shipped model.

    Attributes:
        seed: seeds the initialisation and every batch.
        n_layers, n_heads, n_kv_heads, d_head, d_model, d_mlp: Llama geometry (GQA: fewer KV
            heads than query heads). ``d_head`` 32 is what learned in docs/organism.md attempt 3.
        rope_theta, max_positions: RoPE base and the longest context the config allows.
        init_std: normal init of all weights (0.02; the bootstrap makes larger inits unneeded).
        steps: total optimizer steps; the schedule depends on it, so changing it changes the model.
        lr, betas, weight_decay, clip: AdamW and gradient clipping.
        warmup: linear warm-up steps; then constant, with a cosine decay to 0 over the last
            ``decay_frac`` of ``steps``.
        tokens_per_step: padded tokens per batch.
        p_repeat: probability that a batch is repeated random sequences, until the curriculum
            reaches the full format; ``p_repeat_final`` after.
        repeat_len: range of the random half's length.
        repeat_keys: draw repeat tokens from the digits and ``repeat_keys`` evenly spaced line
            indices only (``None``: all of them).
        p_current_level: probability that a line batch uses the current curriculum level.
        advance_acc: running first-digit accuracy that advances the level.
        ema: decay of the running accuracies.
        early_lines: lines per document below the full format.
        full_lines: lines per document in the full format.
        max_questions: questions per document (answers all supervised; the first question of a
            full-format document is exactly the evaluation prompt).
        first_digit_weight: loss weight of an answer's first token.
        checkpoint_every: steps between resumable checkpoints.
        threads: torch CPU threads (part of "same seed, same machine, same model").
        bf16: bfloat16 autocast for forward and backward.
    """

    seed: int = 0
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    d_head: int = 32
    d_model: int = 128
    d_mlp: int = 256
    rope_theta: float = 10000.0
    max_positions: int = 4096
    init_std: float = 0.02
    steps: int = 3000
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01
    clip: float = 1.0
    warmup: int = 100
    decay_frac: float = 0.25
    tokens_per_step: int = 4096
    p_repeat: float = 0.5
    p_repeat_final: float = 0.2
    repeat_len: tuple[int, int] = (6, 16)
    repeat_keys: int | None = 400
    p_current_level: float = 0.7
    advance_acc: float = 0.7
    ema: float = 0.9
    early_lines: tuple[int, int] = (2, 16)
    full_lines: tuple[int, int] = (2, 48)
    max_questions: int = 8
    first_digit_weight: float = 3.0
    checkpoint_every: int = 250
    threads: int = 1
    bf16: bool = True

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}"
            )
        for name in ("repeat_len", "early_lines", "full_lines"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
        if self.steps < 1 or self.checkpoint_every < 1:
            raise ValueError("steps and checkpoint_every must be >= 1")

    @classmethod
    def smoke(cls, **overrides) -> OrganismConfig:
        """A tiny configuration for CI: a few steps take seconds."""
        small = dict(
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            d_head=8,
            d_model=32,
            d_mlp=64,
            steps=6,
            warmup=2,
            tokens_per_step=512,
            early_lines=(2, 4),
            full_lines=(2, 4),
            max_questions=2,
            checkpoint_every=3,
        )
        return cls(**{**small, **overrides})


# ---------------------------------------------------------------------------------- tokenizer


def organism_tokenizer() -> PreTrainedTokenizerFast:
    """The organism's word-level tokenizer: every LongEval and curriculum piece, every key."""
    rng = random.Random("organism/tokenizer")
    corpus = [
        s.prompt + s.answer
        for s in (make_sample(LineRetrievalConfig(num_lines=3), rng) for _ in range(4))
    ]
    corpus += [line + question for line, question in LEVELS]
    return build_tokenizer(corpus, extra=[" " + k for k in KEYS])


def build_model(cfg: OrganismConfig, vocab_size: int, tokenizer) -> LlamaForCausalLM:
    """A freshly initialised Llama with the config's geometry (untied embeddings)."""
    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_mlp,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.d_head,
        max_position_embeddings=cfg.max_positions,
        rope_theta=cfg.rope_theta,
        initializer_range=cfg.init_std,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


# --------------------------------------------------------------------------------------- data


@dataclass(kw_only=True)
class Batch:
    """Padded token ids and the positions whose next token is supervised.

    ``rows``/``cols`` index the *predicting* positions (target at ``cols + 1``); ``weights``
    carry the first-digit up-weighting; ``first`` marks each answer's first token.
    """

    input_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    weights: torch.Tensor
    first: torch.Tensor
    answer_id: torch.Tensor  # which answer (question) each supervised position belongs to
    kind: str  # "repeat" or "level<k>"


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _document(level: int, n_lines: int, n_questions: int, rng: random.Random):
    """Text segments of one document and the answer segment indices.

    Returns ``(segments, answers)``: ``segments`` concatenate to the document; ``answers`` are
    the indices of the answer segments (`` 45041.``).
    """
    if level == FULL_LEVEL:
        sample = make_sample(LineRetrievalConfig(num_lines=n_lines), rng)
        lines = [(x.index, str(x.value)) for x in parse_record(sample.prompt)]
        segments = [sample.prompt, sample.answer]
        question = ANSWER_PREFIX
    else:
        line_fmt, question = LEVELS[level]
        lines = [(k, str(rng.randint(*VALUE_RANGE))) for k in rng.sample(KEYS, n_lines)]
        segments = ["".join(line_fmt.format(idx=k, value=v) for k, v in lines)]
    for idx, value in rng.sample(lines, min(n_questions, len(lines)) - (level == FULL_LEVEL)):
        segments += [question.format(idx=idx), ANSWER.format(value=value)]
    first_answer = 1 if level == FULL_LEVEL else 2
    return segments, list(range(first_answer, len(segments), 2))


def line_batch(cfg: OrganismConfig, tokenizer, level: int, rng: random.Random) -> Batch:
    """Documents of one curriculum level, as many as fit ``tokens_per_step`` padded tokens."""
    lo, hi = cfg.full_lines if level == FULL_LEVEL else cfg.early_lines

    def draw():
        return _document(level, rng.randint(lo, hi), rng.randint(1, cfg.max_questions), rng)

    return pack_documents(cfg, tokenizer, draw, f"level{level}")


def pack_documents(cfg, tokenizer, draw, kind: str) -> Batch:
    """Documents from ``draw()`` (``(segments, answer indices)``) packed into one batch.

    Documents are drawn until the next one would push the padded batch past
    ``cfg.tokens_per_step`` tokens (at least one is always kept); the answer segments' tokens
    are supervised, their first token weighted ``cfg.first_digit_weight``.
    """
    docs: list[tuple[list[int], list[list[int]]]] = []
    longest = 0
    while True:
        segments, answers = draw()
        ids, spans = [tokenizer.bos_token_id], []
        for i, seg in enumerate(segments):
            piece = _encode(tokenizer, seg)
            if i in answers:
                spans.append(list(range(len(ids), len(ids) + len(piece))))
            ids += piece
        if docs and (len(docs) + 1) * max(longest, len(ids)) > cfg.tokens_per_step:
            break
        docs.append((ids, spans))
        longest = max(longest, len(ids))
    input_ids = torch.full((len(docs), longest), tokenizer.pad_token_id, dtype=torch.long)
    rows, cols, first, answer_id = [], [], [], []
    spans = [(b, span) for b, (_, doc_spans) in enumerate(docs) for span in doc_spans]
    for b, (ids, _) in enumerate(docs):
        input_ids[b, : len(ids)] = torch.tensor(ids)
    for a, (b, span) in enumerate(spans):
        rows += [b] * len(span)
        cols += [pos - 1 for pos in span]
        first += [j == 0 for j in range(len(span))]
        answer_id += [a] * len(span)
    return _batch(cfg, input_ids, rows, cols, first, answer_id, kind)


def repeat_batch(cfg: OrganismConfig, tokenizer, rng: random.Random, pool=None) -> Batch:
    """Random sequences of digit and key tokens repeated once; loss on the repeat.

    ``pool`` (token ids) replaces the digits-and-keys pool (the v2 mixture repeats any word).
    """
    if pool is None:
        vocab = tokenizer.get_vocab()
        pool = sorted({vocab[d] for d in "0123456789"} | {vocab[" " + d] for d in "0123456789"})
        stride = len(KEYS) // cfg.repeat_keys if cfg.repeat_keys else 1
        pool += [vocab[" " + k] for k in KEYS[::stride]]
    half = rng.randint(*cfg.repeat_len)
    n = max(1, cfg.tokens_per_step // (2 * half + 1))
    seqs = [[rng.choice(pool) for _ in range(half)] for _ in range(n)]
    input_ids = torch.tensor([[tokenizer.bos_token_id, *s, *s] for s in seqs])
    rows = [b for b in range(n) for _ in range(half)]
    cols = [half + j for _ in range(n) for j in range(half)]
    first = [j == 0 for _ in range(n) for j in range(half)]
    answer_id = [b for b in range(n) for _ in range(half)]
    return _batch(cfg, input_ids, rows, cols, first, answer_id, "repeat")


def _batch(cfg, input_ids, rows, cols, first, answer_id, kind) -> Batch:
    first_t = torch.tensor(first)
    weights = (
        torch.where(first_t, cfg.first_digit_weight, 1.0)
        if kind != "repeat"
        else torch.ones(len(first))
    )
    return Batch(
        input_ids=input_ids,
        rows=torch.tensor(rows),
        cols=torch.tensor(cols),
        weights=weights,
        first=first_t,
        answer_id=torch.tensor(answer_id),
        kind=kind,
    )


# ---------------------------------------------------------------------------------- training


@dataclass(kw_only=True)
class Curriculum:
    """Mutable curriculum state: the current level and running accuracies (saved as JSON)."""

    level: int = 0
    first_acc: dict[str, float] = field(default_factory=dict)  # running first-token accuracy
    exact: dict[str, float] = field(default_factory=dict)  # running exact match per answer

    def p_repeat(self, cfg: OrganismConfig) -> float:
        return cfg.p_repeat_final if self.level == FULL_LEVEL else cfg.p_repeat

    def draw(self, cfg: OrganismConfig, tokenizer, rng: random.Random) -> Batch:
        """The next batch: repeat sequences, the current level, or an earlier level."""
        if rng.random() < self.p_repeat(cfg):
            return repeat_batch(cfg, tokenizer, rng)
        level = self.level
        if level > 0 and rng.random() >= cfg.p_current_level:
            level = rng.randrange(self.level)
        return line_batch(cfg, tokenizer, level, rng)

    def update(self, cfg: OrganismConfig, kind: str, first_acc: float, exact: float) -> None:
        """Fold a batch's accuracies into the running ones; advance the level if passed."""
        for store, value in ((self.first_acc, first_acc), (self.exact, exact)):
            store[kind] = cfg.ema * store.get(kind, value) + (1 - cfg.ema) * value
        if (
            kind == f"level{self.level}"
            and self.level < FULL_LEVEL
            and self.first_acc[kind] > cfg.advance_acc
        ):
            self.level += 1


def train(
    cfg: OrganismConfig,
    out: str | Path,
    *,
    resume: bool = False,
    stop_at: int | None = None,
    max_minutes: float | None = None,
    progress: bool = True,
) -> Path:
    """Train (or resume) the organism into ``out``; returns ``out``.

    A resumable checkpoint is written to ``out/state`` every ``checkpoint_every`` steps and when
    training stops; when all ``cfg.steps`` are done, the final model and tokenizer are saved to
    ``out`` with ``save_pretrained``. ``stop_at`` (a step) and ``max_minutes`` interrupt early,
    exactly like a crash after a checkpoint: ``resume=True`` continues to the same model.
    """
    out = Path(out)
    torch.set_num_threads(cfg.threads)
    tokenizer = organism_tokenizer()
    model = build_model(cfg, len(tokenizer), tokenizer)
    return run_loop(
        cfg,
        out,
        model,
        tokenizer,
        Curriculum(),
        Curriculum.draw,
        resume=resume,
        stop_at=stop_at,
        max_minutes=max_minutes,
        progress=progress,
    )
