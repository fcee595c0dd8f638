"""Organism v2: continue v1 on a mixture of lines, needles in haystacks and multi-document QA.

The shipped organism (``checkpoint/``) was trained by this module; its commands, phases and
measured CPU time are on its card (``interp_seal/organism/checkpoint/README.md``). One phase::

    interp-seal organism train --v2 --out runs/organism-v2 --seed 0

v1 (``train.py``) learned LongEval line retrieval through an induction-head bootstrap; its
induction and key-matching heads are exactly what the two other formats of the toolkit need
(copy the needle sentence once its start is found; copy a name out of the golden passage).
So v2 does not start from scratch: it grows v1's vocabulary (``v2_tokenizer``: every old id
kept, new words appended, each made-up passage name one token) and embedding rows
(``grow_embeddings``), then trains on a mixture. Each batch is, with probabilities ``p_*``:

- **repeat**: short random sequences of any vocabulary words, repeated once (keeps the
  induction head general over the new tokens);
- **lines**: the exact LongEval prompt (``tasks.line_retrieval``), 2-150 lines, several
  questions per document;
- **needle**: the toolkit's NIAH prompt (``tasks.needle``) with a *generated* needle (the
  style of SEAL's ten, appendix B.2: a statement whose opening phrase is the question) in a
  *generated* haystack of filler sentences that also hides needle-like distractors, so the
  question must be matched (``tasks.training_needles``); SEAL's needles and the shipped
  haystack are for evaluation only;
- **passages**: LongBench's hotpotqa prompt with synthetic passages (``tasks.passages``,
  drawn from the training seed stream), 1- and 2-hop questions, 5-40 passages.

Documents run up to ~2,300 tokens (v1 saw ~640), which moves the length at which retrieval
degrades out to the second half of the 4,096-token window. Loss, step, schedule, resumable
state and determinism are v1's (``train.train_step``, ``train.run_loop``).
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from interp_seal.organism.loop import run_loop
from interp_seal.organism.tokenizer import SPECIALS, build_tokenizer
from interp_seal.organism.train import (
    FULL_LEVEL,
    LEVELS,
    Batch,
    Curriculum,
    _document,
    organism_tokenizer,
    pack_documents,
    repeat_batch,
)
from interp_seal.tasks import longbench, passages, training_needles
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, make_sample
from interp_seal.tasks.needle import (
    PROMPT,
    SAN_FRANCISCO,
    SEAL_NEEDLES,
    NeedleConfig,
    read_haystack,
)
from interp_seal.tasks.needle import make_sample as needle_sample


@dataclass(frozen=True, kw_only=True)
class MixtureConfig:
    """The v2 recipe: continue a v1 checkpoint on the task mixture (see module doc).

    Attributes:
        seed: seeds the new embedding rows and every batch.
        base: the v1 checkpoint directory to continue (``None``: ``V1_DIR``).
        steps, lr, betas, weight_decay, clip, warmup, decay_frac: AdamW and the schedule of
            ``train.learning_rate``.
        tokens_per_step: padded tokens per batch.
        p_repeat, p_lines, p_needle: batch-kind probabilities; passages take the rest.
        repeat_len: half-length range of repeat sequences.
        lines: lines per LongEval document.
        needle_tokens: needle context lengths (``tasks.needle``'s token budget).
        passages: passages per QA document.
        max_questions: questions per line document.
        first_digit_weight: loss weight of each answer's first token.
        reach0: the fraction of each size range used while a task's running first-token
            accuracy is 0 (see ``draw``).
        ema: decay of the running accuracies (progress bar, saved state, curriculum).
        checkpoint_every, threads, bf16: as in ``OrganismConfig``.
    """

    seed: int = 0
    base: str | None = None
    steps: int = 1300
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01
    clip: float = 1.0
    warmup: int = 100
    decay_frac: float = 0.3
    tokens_per_step: int = 2048
    p_repeat: float = 0.15
    p_lines: float = 0.2
    p_needle: float = 0.35
    repeat_len: tuple[int, int] = (6, 16)
    lines: tuple[int, int] = (2, 150)
    needle_tokens: tuple[int, int] = (300, 2400)
    passages: tuple[int, int] = (2, 30)
    max_questions: int = 8
    first_digit_weight: float = 3.0
    reach0: float = 0.05
    ema: float = 0.95
    checkpoint_every: int = 250
    threads: int = 1
    bf16: bool = True

    def __post_init__(self):
        if min(self.p_repeat, self.p_lines, self.p_needle) < 0 or (
            self.p_repeat + self.p_lines + self.p_needle > 1
        ):
            raise ValueError(
                "p_repeat, p_lines and p_needle must be >= 0 and sum to at most 1 (passages "
                f"take the rest), got {self.p_repeat}, {self.p_lines}, {self.p_needle}"
            )
        for name in ("repeat_len", "lines", "needle_tokens", "passages"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
        if self.passages[0] < 2:
            raise ValueError(f"passages must start at >= 2, got {self.passages}")
        if self.steps < 1 or self.checkpoint_every < 1:
            raise ValueError("steps and checkpoint_every must be >= 1")

    @classmethod
    def smoke(cls, **overrides) -> MixtureConfig:
        """A CI-sized configuration: short documents, a few steps."""
        small = dict(
            steps=6, warmup=2, tokens_per_step=512, lines=(2, 4), needle_tokens=(250, 280),
            passages=(2, 3), max_questions=2, checkpoint_every=3,
        )  # fmt: skip
        return cls(**{**small, **overrides})


# ---------------------------------------------------------------------------------- tokenizer


def v2_corpus() -> list[str]:
    """Every text whose words v2 must know as single tokens (after v1's own corpus)."""
    rng = random.Random("organism/v2/tokenizer")
    lines = [s.prompt + s.answer for s in (make_sample(LineRetrievalConfig(num_lines=3), rng),)]
    lines += [line + question for line, question in LEVELS]
    texts = [PROMPT, longbench.PROMPT, longbench.PASSAGE, read_haystack()]
    texts += [n.text + " " + n.question for n in (*SEAL_NEEDLES, SAN_FRANCISCO)]
    texts += [*passages.TEXT.values(), *passages.OCCUPATIONS, *passages.SIDES]
    texts += [t for group in passages.FILLER.values() for t in group]
    texts += [t for group in passages.ONE_HOP.values() for t, _ in group]
    texts += [t for t, _ in passages.TWO_HOP]
    texts += [*passages.NAMES, *training_needles.vocabulary()]
    return lines + [re.sub(r"\{\w+\}", "", t) for t in texts]


def v2_tokenizer(base: PreTrainedTokenizerFast | None = None) -> PreTrainedTokenizerFast:
    """``base``'s tokenizer (default: v1's) grown: same ids for its pieces, new words appended.

    Real words are single tokens (with and without a leading space, and capitalised where a
    sentence or title can start with them), and so is each of the 784 made-up names of
    ``tasks.passages`` (`` Kalo``); a language is its name plus ``##ese``, and any other
    made-up word splits into syllables. Growing a v2 tokenizer again (continuing a v2 run after
    the generators gained words) keeps every id it had.
    """
    old = base if base is not None else organism_tokenizer()
    words = sorted(
        {w for text in v2_corpus() for w in text.replace("\n", " ").split() if w.isalpha()}
    )
    variants = [v for w in words for v in (w, " " + w, w.capitalize(), " " + w.capitalize())]
    syllables = [s.capitalize() for s in passages.SYLLABLES]
    firsts = [p for s in syllables for p in (s, " " + s)]
    vocab = old.get_vocab()
    old_pieces = [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1])][len(SPECIALS) :]
    tok = build_tokenizer(
        [*v2_corpus(), *variants, *firsts],
        extra=old_pieces,  # verbatim, in id order (v1's line-index keys among them)
        subwords=[*passages.SYLLABLES, "ese"],
    )
    grown = tok.get_vocab()
    assert all(grown[p] == i for p, i in vocab.items()), "a grown tokenizer must keep the old ids"
    return tok


def grow_embeddings(model: LlamaForCausalLM, vocab_size: int, seed: int) -> LlamaForCausalLM:
    """Append rows to the (untied) input and output embeddings; old rows stay as they are.

    New input rows are drawn with the trained rows' standard deviation (so new words enter
    the residual stream at the scale the layers expect); new output rows with std 0.02.
    """
    gen = torch.Generator().manual_seed(seed)
    emb = model.get_input_embeddings().weight.data
    n_old, d = emb.shape
    if vocab_size < n_old:
        raise ValueError(f"cannot shrink the vocabulary from {n_old} to {vocab_size}")
    new_in = torch.randn(vocab_size - n_old, d, generator=gen) * emb.std()
    new_out = torch.randn(vocab_size - n_old, d, generator=gen) * 0.02
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    model.get_input_embeddings().weight.data[n_old:] = new_in
    model.lm_head.weight.data[n_old:] = new_out
    model.config.vocab_size = vocab_size
    return model


# --------------------------------------------------------------------------------------- data


def upto(rng: random.Random, bounds: tuple[int, int], reach: float) -> int:
    """A size in ``bounds``, drawn from its first ``reach`` fraction (the length curriculum)."""
    lo, hi = bounds
    return rng.randint(lo, lo + round((hi - lo) * min(reach, 1.0)))


def lines_document(cfg: MixtureConfig, rng: random.Random, reach: float = 1.0):
    """A LongEval document and its answer segments (``train._document``, full format)."""
    n_lines = upto(rng, cfg.lines, reach)
    return _document(FULL_LEVEL, n_lines, rng.randint(1, cfg.max_questions), rng)


def needle_document(cfg: MixtureConfig, tokenizer, rng: random.Random, reach: float = 1.0):
    """A NIAH prompt (the toolkit's format) with a generated needle in a generated haystack."""
    length = upto(rng, cfg.needle_tokens, reach)
    needle = training_needles.make_needle(rng)
    haystack = training_needles.make_haystack(rng, n_words=int(length * 0.9) + 40, avoid=needle)
    ncfg = NeedleConfig(
        context_lengths=(length,), needles=(needle,), haystack=haystack, answer="key_phrase"
    )
    depth = rng.uniform(0, 100)
    sample = needle_sample(ncfg, tokenizer, context_length=length, depth=depth, needle=needle)
    return [sample.prompt, sample.answer], [1]


def passages_document(cfg: MixtureConfig, rng: random.Random, reach: float = 1.0):
    """A LongBench-format QA prompt over synthetic passages (``tasks.passages``), its answer
    followed by a newline: QA F1 scores a greedy answer up to the first newline (LongBench
    models end theirs), so the organism learns to end its answer."""
    pcfg = passages.PassagesConfig(
        num_passages=upto(rng, cfg.passages, reach),
        hops=rng.choice((1, 2)),
        filler_sentences=rng.randint(0, 2),
    )
    sample = passages.make_sample(pcfg, rng, "train")
    return [sample.prompt, sample.answer + "\n"], [1]


@functools.cache
def _pool(tokenizer) -> tuple[int, ...]:
    rng = random.Random("organism-v2/repeat-pool")
    texts = [training_needles.make_needle(rng).text for _ in range(300)]
    texts += [n.text for n in (*SEAL_NEEDLES, SAN_FRANCISCO)]
    cfg = passages.PassagesConfig(num_passages=10, filler_sentences=2)
    texts += [s.prompt + s.answer for s in passages.generate(cfg, 20, seed=12345)]
    texts.append(" ".join(passages.NAMES))
    return tuple(sorted({i for t in texts for i in _ids(tokenizer, t)}))


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def repeat_pool(tokenizer) -> list[int]:
    """Token ids that repeat batches draw from: those of generated needles and passages.

    The tokens the new tasks must copy (needle words, name syllables, digits), so that the
    induction head v1 grew on digits and line indices extends to them (with every vocabulary
    token instead, repeat accuracy stayed at 0 for 500 steps: most rows are rare). The words of
    the evaluation needles are in the pool too (as single words in random order, never their
    sentences): a word that is never a target keeps its random output row and cannot be copied.
    """
    return list(_pool(tokenizer))


def draw(cur: Curriculum, cfg: MixtureConfig, tokenizer, rng: random.Random) -> Batch:
    """The next batch of the mixture, its document sizes set by a competence curriculum.

    A task's documents are drawn from the first ``reach`` fraction of their size range, with
    ``reach = reach0 + running first-token accuracy`` of that task (``cur.first_acc``): a new
    task starts on short documents and reaches the longest ones once its first answer token
    (the retrieval decision) is right ``1 - reach0`` of the time.
    """
    u = rng.random()
    if u < cfg.p_repeat:
        return repeat_batch(cfg, tokenizer, rng, pool=repeat_pool(tokenizer))
    kind = (
        "lines" if u < cfg.p_repeat + cfg.p_lines
        else "needle" if u < cfg.p_repeat + cfg.p_lines + cfg.p_needle
        else "passages"
    )  # fmt: skip
    reach = cfg.reach0 + cur.first_acc.get(kind, 0.0)
    documents = {
        "lines": lambda: lines_document(cfg, rng, reach),
        "needle": lambda: needle_document(cfg, tokenizer, rng, reach),
        "passages": lambda: passages_document(cfg, rng, reach),
    }
    return pack_documents(cfg, tokenizer, documents[kind], kind)


# ---------------------------------------------------------------------------------- training


# The v1 organism (line retrieval only), kept beside the shipped v2 as the base v2 continues.
V1_DIR = Path(__file__).resolve().parent / "checkpoint_v1"


def base_tokenizer(cfg: MixtureConfig) -> PreTrainedTokenizerFast | None:
    """The tokenizer saved with ``cfg.base`` (None: v1's, rebuilt by ``organism_tokenizer``)."""
    if cfg.base is None or not (Path(cfg.base) / "tokenizer.json").exists():
        return None
    return PreTrainedTokenizerFast.from_pretrained(cfg.base)


def base_model(cfg: MixtureConfig, tokenizer) -> LlamaForCausalLM:
    """The v1 checkpoint (``cfg.base`` or ``V1_DIR``), its vocabulary grown for v2."""
    base = Path(cfg.base) if cfg.base else V1_DIR
    if not (base / "config.json").exists():
        raise FileNotFoundError(
            f"no v1 checkpoint at {base} (config.json missing): pass --base DIR pointing at a "
            "directory written by `interp-seal organism train`"
        )
    model = LlamaForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    if model.config.vocab_size > len(tokenizer):
        raise ValueError(
            f"{base} has {model.config.vocab_size} embedding rows, more than the v2 tokenizer's "
            f"{len(tokenizer)}: it is not a v1 organism checkpoint"
        )
    return grow_embeddings(model, len(tokenizer), cfg.seed)


def train_v2(
    cfg: MixtureConfig,
    out: str | Path,
    *,
    resume: bool = False,
    stop_at: int | None = None,
    max_minutes: float | None = None,
    progress: bool = True,
) -> Path:
    """Continue v1 on the mixture into ``out`` (resumable exactly like ``train.train``)."""
    out = Path(out)
    torch.set_num_threads(cfg.threads)
    tokenizer = v2_tokenizer(base_tokenizer(cfg))
    model = base_model(cfg, tokenizer)
    cur = Curriculum(level=FULL_LEVEL)
    return run_loop(
        cfg, out, model, tokenizer, cur, draw, resume=resume, stop_at=stop_at,
        max_minutes=max_minutes, progress=progress, desc="organism-v2",
    )  # fmt: skip
