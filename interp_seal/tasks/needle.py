"""Needle in a haystack (gkamradt's LLMTest_NeedleInAHaystack), as SEAL uses it.

A *needle* sentence is hidden in a long *haystack* text and the model is asked a question that
only the needle answers. The grid follows gkamradt's tester:

- context lengths (in tokens of the model's tokenizer) and needle depths (percent of the
  document, 0 = start, 100 = end) on linear grids, ``round(linspace(lo, hi, n))``
  (``linear_grid``);
- the haystack is cut to ``context_length - buffer - needle`` tokens, so that haystack +
  needle + question fit in ``context_length`` (``buffer`` = 200 by default, gkamradt's
  ``final_context_length_buffer``);
- the needle goes in at token ``int(len(haystack) * depth / 100)``, walked back to just after
  the previous token that ends a sentence (``'.'``); at depth 100 it is appended as is.

gkamradt inserts token ids; here the insertion point is computed on tokens and the needle is
inserted as text at the matching character offset, with one space on each side where the
haystack has none, so the needle's character span (``Sample.needle``) is exact.

SEAL (appendix B.2) trains on ten needles written by ChatGPT (``SEAL_NEEDLES``) and
evaluates on gkamradt's original San Francisco needle (``SAN_FRANCISCO``, Sec. 6.2). Its
answer string is the needle sentence itself; the prompt is the "story book" format of the
long-context NIAH evaluations SEAL's example comes from (Fu et al., Long-Context-Data-
Engineering; Wu et al., Retrieval_Head): ``... Based on the content of the book, Question:
...``. The haystack is any text (gkamradt uses Paul Graham's essays, which are not ours to
ship). Three are built in (``HAYSTACKS``), all original prose written for this project and
released with it under its licence (``data/README.md``):

- ``"long"`` (the default): thirty short essays, 13,396 words, 15,664 SmolLM2 tokens;
- ``"organism"``: nine short essays written in the model organism's word-level vocabulary
  (3,898 words, 4,502 organism tokens, none unknown), for the organism's needles up to 4K
  tokens;
- ``"essays"``: four short essays, 849 words, 970 SmolLM2 tokens, the text the model organism's
  vocabulary and filler were built from (``tasks.training_needles``).

A haystack shorter than the context is refused unless ``repeat`` is asked for. gkamradt's
tester repeats its text until long enough, but a repeated haystack changes the task: the
needle is then the one sentence the model has not already read in the context, which a model
can find by novelty, without retrieving anything. ``repeat=True`` keeps that behaviour for
results that were made with it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from interp_seal import defaults
from interp_seal.tasks.sample import Sample, Span

PROMPT = (
    "This is a very long story book: <book> {context} </book>.\n"
    "Based on the content of the book, Question: {question}\nAnswer:"
)
ANSWER = " {needle}"
ANSWERS = defaults.NEEDLE_ANSWERS
SENTENCE_END = "."


@dataclass(frozen=True, kw_only=True)
class Needle:
    """A needle sentence and the question it answers.

    Attributes:
        id: a short stable name, written to files and to ``Sample.meta["needle_id"]``.
        text: the sentence inserted in the haystack; also the expected answer (SEAL).
        question: the retrieval question.
        key: the needle's *key phrase*, the part of ``text`` the question asks for (``"the
            large oak table positioned beneath the chandelier"``); the answer when a grid is
            built with ``answer="key_phrase"``. ``None``: the needle has no key phrase.
    """

    id: str
    text: str
    question: str
    key: str | None = None

    def __post_init__(self):
        if not self.text.strip() or not self.question.strip():
            raise ValueError(f"needle {self.id!r} needs a non-empty text and question")
        if self.key is not None and (not self.key.strip() or self.key not in self.text):
            raise ValueError(
                f"needle {self.id!r}: key phrase {self.key!r} must be a non-empty part of its "
                f"text {self.text!r}"
            )


# SEAL appendix B.2, verbatim (line numbers of the PDF extraction removed)
SEAL_NEEDLES = (
    Needle(
        id="seal_01",
        text="Immediately noticeable upon entering the room is the large oak table positioned beneath the chandelier.",
        question="What is immediately noticeable upon entering the room?",
        key="the large oak table positioned beneath the chandelier",
    ),
    Needle(
        id="seal_02",
        text="A striking feature of the room is the tall bookshelf that spans the entire length of the far wall.",
        question="What is a striking feature of the room?",
        key="the tall bookshelf that spans the entire length of the far wall",
    ),
    Needle(
        id="seal_03",
        text="Dominating the center of the room is a grand piano, its polished surface reflecting the light from the windows.",
        question="What dominates the center of the room?",
        key="a grand piano, its polished surface reflecting the light from the windows",
    ),
    Needle(
        id="seal_04",
        text="Catching your eye as you step inside is the intricate tapestry hanging on the left wall, its colors vivid and bright.",
        question="What catches your eye as you step inside?",
        key="the intricate tapestry hanging on the left wall, its colors vivid and bright",
    ),
    Needle(
        id="seal_05",
        text="The first thing that draws your attention is the large framed photograph resting on the mantel.",
        question="What is the first thing that draws your attention?",
        key="the large framed photograph resting on the mantel",
    ),
    Needle(
        id="seal_06",
        text="Clearly visible as you enter is the large circular rug that covers most of the hardwood floor.",
        question="What is clearly visible as you enter?",
        key="the large circular rug that covers most of the hardwood floor",
    ),
    Needle(
        id="seal_07",
        text="What stands out immediately is the tall standing lamp positioned next to the armchair in the corner.",
        question="What stands out immediately in the room?",
        key="the tall standing lamp positioned next to the armchair in the corner",
    ),
    Needle(
        id="seal_08",
        text="The most noticeable item upon stepping inside is the antique grandfather clock, ticking rhythmically in the corner.",
        question="What is the most noticeable item upon stepping inside?",
        key="the antique grandfather clock, ticking rhythmically in the corner",
    ),
    Needle(
        id="seal_09",
        text="Your attention is immediately drawn to the stained glass window, casting colorful patterns of light across the floor.",
        question="What is your attention immediately drawn to?",
        key="the stained glass window, casting colorful patterns of light across the floor",
    ),
    Needle(
        id="seal_10",
        text="Visible as soon as you enter the room is a large painting of a landscape, mounted prominently on the main wall.",
        question="What is visible as soon as you enter the room?",
        key="a large painting of a landscape, mounted prominently on the main wall",
    ),
)

# gkamradt's needle; SEAL's evaluation target (Sec. 6.2)
SAN_FRANCISCO = Needle(
    id="san_francisco",
    text="The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.",
    question="What is the best thing to do in San Francisco?",
    key="eat a sandwich and sit in Dolores Park on a sunny day",
)


def linear_grid(start: int, stop: int, num: int) -> tuple[int, ...]:
    """gkamradt's grid: ``num`` integers evenly spaced from ``start`` to ``stop`` (inclusive)."""
    if num < 1:
        raise ValueError(f"a grid needs at least one point, got num={num}")
    if num == 1:
        return (int(start),)
    step = (stop - start) / (num - 1)
    return tuple(round(start + i * step) for i in range(num))


HAYSTACKS = {
    "long": "data/haystack_long.txt",
    "organism": "data/haystack_organism.txt",
    "essays": "data/haystack.txt",
}
DEFAULT_HAYSTACK = "long"


def read_haystack(source: str | Path | None = None) -> str:
    """Haystack text: a built-in one by name (``HAYSTACKS``; ``None``: ``DEFAULT_HAYSTACK``),
    a text file, or a directory of ``*.txt``.

    A directory is read like gkamradt's ``haystack_dir``: its ``*.txt`` files in sorted order,
    concatenated.
    """
    source = DEFAULT_HAYSTACK if source is None else source
    if source in HAYSTACKS:
        return resources.files("interp_seal.tasks").joinpath(HAYSTACKS[source]).read_text("utf-8")
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"no haystack {source!r}: give a text file, a directory of *.txt, or one of the "
            f"built-in haystacks {sorted(HAYSTACKS)}"
        )
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise FileNotFoundError(f"haystack directory {path} has no *.txt files")
        return "".join(f.read_text(encoding="utf-8") for f in files)
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True, kw_only=True)
class NeedleConfig:
    """A needle-in-a-haystack grid.

    Attributes:
        context_lengths: total prompt budgets in tokens (gkamradt's ``context_lengths``).
        depths: needle depths in percent of the haystack, each in [0, 100].
        needles: the needles to draw from (one drawn per sample, seeded).
        haystack: the haystack text (default: the built-in ``"long"``; see ``read_haystack``).
        repeat: repeat a haystack shorter than a context until it fills it (gkamradt's
            tester); off by default, so a too-short haystack is refused (see module doc).
        buffer: tokens kept free for the question and the answer (gkamradt: 200).
        template: the prompt, with ``{context}`` and ``{question}`` placeholders.
        answer: ``"sentence"`` (SEAL: the whole needle sentence) or ``"key_phrase"`` (the
            needle's ``key``, the phrase the question asks for: the form in which a model
            trained to answer questions, like the model organism, states it).
    """

    context_lengths: tuple[int, ...]
    depths: tuple[int | float, ...] = linear_grid(0, 100, 11)
    needles: tuple[Needle, ...] = SEAL_NEEDLES
    haystack: str = field(default_factory=read_haystack, repr=False)
    repeat: bool = False
    buffer: int = 200
    template: str = PROMPT
    answer: str = "sentence"

    def __post_init__(self):
        if not self.context_lengths or min(self.context_lengths) < 1:
            raise ValueError(f"context_lengths must be positive, got {self.context_lengths}")
        if not self.depths or not all(0 <= d <= 100 for d in self.depths):
            raise ValueError(f"depths must be percentages in [0, 100], got {self.depths}")
        if not self.needles:
            raise ValueError("needles is empty")
        ids = [n.id for n in self.needles]
        if len(set(ids)) != len(ids):
            raise ValueError(f"needle ids must be unique, got {ids}")
        if not self.haystack.strip():
            raise ValueError("the haystack text is empty")
        if self.buffer < 0:
            raise ValueError(f"buffer must be >= 0, got {self.buffer}")
        for key in ("{context}", "{question}"):
            if self.template.count(key) != 1:
                raise ValueError(f"template must contain {key} exactly once: {self.template!r}")
        if self.answer not in ANSWERS:
            raise ValueError(f"answer must be one of {ANSWERS}, got {self.answer!r}")
        if self.answer == "key_phrase" and (missing := [n.id for n in self.needles if not n.key]):
            raise ValueError(
                f"answer='key_phrase' needs a key phrase on every needle; {missing} have none "
                "(set Needle.key to the part of the sentence the question asks for)"
            )


def _offsets(tokenizer, text: str) -> list[tuple[int, int]]:
    """Character span of each token of ``text`` (no special tokens)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [tuple(o) for o in enc["offset_mapping"]]


def insert_needle(
    haystack: str,
    needle: str,
    tokenizer,
    *,
    context_length: int,
    depth: float,
    buffer: int,
    repeat: bool = False,
) -> tuple[str, Span]:
    """The haystack cut to budget with ``needle`` inserted; returns (context, needle char span).

    The haystack is cut to ``context_length - buffer - len(needle tokens)`` tokens (with
    ``repeat``, first repeated, paragraph-separated, until it has enough; without, a shorter
    haystack is a ``ValueError``), and the needle is inserted at token ``int(n * depth / 100)``
    walked back to the previous sentence end (see module doc).
    """
    n_needle = len(_offsets(tokenizer, needle))
    budget = context_length - buffer - n_needle
    if budget < 1:
        raise ValueError(
            f"context_length={context_length} leaves no room for the haystack: buffer {buffer} "
            f"+ needle {n_needle} tokens"
        )
    unit = haystack.strip()
    have = len(_offsets(tokenizer, unit))
    if have < budget and not repeat:
        raise ValueError(
            f"the haystack has {have} tokens, but a {context_length}-token context needs "
            f"{budget} (after the buffer and the needle); give a longer haystack, or pass "
            "repeat=True (--repeat-haystack) to repeat it, knowing that a needle in a repeated "
            "text is the one sentence not seen before"
        )
    copies = -(-budget // have) + 1
    long = "\n\n".join([unit] * copies)
    offsets = _offsets(tokenizer, long)[:budget]
    text = long[: offsets[-1][1]]

    if depth >= 100:
        pos = len(text)
    else:
        i = int(len(offsets) * depth / 100)
        while i > 0 and not text[slice(*offsets[i - 1])].rstrip().endswith(SENTENCE_END):
            i -= 1
        pos = offsets[i - 1][1] if i > 0 else 0
    before = " " if pos > 0 and not text[pos - 1].isspace() else ""
    after = " " if pos < len(text) and not text[pos].isspace() else ""
    start = pos + len(before)
    context = text[:pos] + before + needle + after + text[pos:]
    return context, (start, start + len(needle))


def haystack_digest(text: str) -> str:
    """A short content digest of a haystack text (``Sample.meta["haystack"]``): which text a
    needle was hidden in, so that a tuning haystack can be told from an evaluation one."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_sample(
    cfg: NeedleConfig, tokenizer, *, context_length: int, depth: float, needle: Needle
) -> Sample:
    """One prompt: ``needle`` at ``depth`` percent of a ``context_length``-token context."""
    context, (start, end) = insert_needle(
        cfg.haystack,
        needle.text,
        tokenizer,
        context_length=context_length,
        depth=depth,
        buffer=cfg.buffer,
        repeat=cfg.repeat,
    )
    head, _, tail = cfg.template.partition("{context}")
    head = head.replace("{question}", needle.question)
    return Sample(
        task="needle",
        prompt=head + context + tail.replace("{question}", needle.question),
        answer=ANSWER.format(needle=needle.text if cfg.answer == "sentence" else needle.key),
        needle=(len(head) + start, len(head) + end),
        meta={
            "needle_id": needle.id,
            "question": needle.question,
            "depth_percent": depth,
            "context_length": context_length,
            "haystack": haystack_digest(cfg.haystack),
        },
    )


def lead_in(sample: Sample) -> str:
    """The words of a needle's sentence before its key phrase, e.g. ``" Immediately noticeable
    upon entering the room is"`` for a sample answered by ``" the large oak table positioned
    beneath the chandelier"``.

    Forced after the prompt (``chat.force_prefix``), they turn the question into a completion
    that the key phrase finishes, as LongEval's answer prefix does for a line's value. ``""``
    when the answer is the whole sentence or the key phrase opens it.
    """
    text = sample.prompt[slice(*sample.needle)]
    at = text.find(sample.answer.strip())
    return " " + text[:at].rstrip() if at > 0 else ""


def generate(cfg: NeedleConfig, tokenizer, n_per_cell: int = 1, seed: int = 0) -> list[Sample]:
    """``n_per_cell`` samples per (context length, depth) cell, each with a seeded random needle.

    Samples come length-major (all depths of the first length, then the next length), the
    order of gkamradt's tester. Evaluate on one fixed needle with ``needles=(SAN_FRANCISCO,)``.
    """
    if n_per_cell < 1:
        raise ValueError(f"n_per_cell must be >= 1, got {n_per_cell}")
    rng = random.Random(f"needle/{seed}")
    return [
        make_sample(
            cfg, tokenizer, context_length=length, depth=depth, needle=rng.choice(cfg.needles)
        )
        for length in cfg.context_lengths
        for depth in cfg.depths
        for _ in range(n_per_cell)
    ]
