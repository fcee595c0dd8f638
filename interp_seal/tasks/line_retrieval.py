"""LongEval line retrieval (LongChat), faithful to the original format.

The prompt is a header, ``num_lines`` lines ``line <index>: REGISTER_CONTENT is <<value>>``
with values drawn from 1..50000, and a footer asking for the value of one line; a model is
judged correct iff the last integer of its output equals ``expected_number``. SEAL trains on
the answer string ``The <REGISTER_CONTENT> in line <index> is <value>.`` (SEAL, Sec. 4).

For teacher-forced evaluation the SEAL answer string is split in two: by default
(``force_prefix=True``) ``"\nThe <REGISTER_CONTENT> in line <index> is"`` is appended to the
prompt and the answer is ``" <value>."``, so exact match scores the number itself (and the
full stop that ends it); with ``force_prefix=False`` the whole answer string is the answer.

Line indices come in LongChat's four styles, drawn as LongChat's generator
(``longeval/utils.py``, ``generate_line_index``) draws them; only the random draws differ:

- ``"integers"`` (LongChat's ``LRT``): ``1..n`` in order; the queried line is drawn as
  ``randint(1, n)`` and ``random_idx`` is a pair of integers ``[index, index - 1]``;
- ``"letters"`` (``LRT-ABCindex``): the first ``n`` strings of the ordered product of
  ``"ABCDEF"`` taken 6 at a time (``AAAAAA``, ``AAAAAB``, ...; 7 at a time beyond 6**6 lines);
- ``"uuid"`` (``LRT-UUID``): a random version-4 UUID per line;
- ``"adjective-noun"`` (``LRT-NL``, the default): ``<adjective>-<noun>``. LongChat draws ``n``
  adjectives and ``n`` nouns from wonderwords' lists, no word twice in a record, so indices
  can be multi-word, capitalised or non-ASCII (``"well known-São Paulo"``).
  ``LineRetrievalConfig.longchat`` does the same from this project's own lists
  (``longchat_words``: 892 adjectives and 837 nouns, ``data/line_index_words.json``). The
  default config draws from 50 x 50 one-token words the model organism knows (``ADJECTIVES``,
  ``NOUNS``): each line gets a distinct pair, words repeat, so records of up to 2500 lines fit.

Per record the draws come in LongChat's order: the indices, one value per line, then the
queried line. Given the same ``random.Random``, the integer and letter styles reproduce
LongChat's records exactly. Files are JSONL with LongChat's fields (``random_idx``,
``expected_number``, ``num_lines``, ``correct_line``, ``prompt``), see
``interp_seal.tasks.jsonl``.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from interp_seal import defaults
from interp_seal.tasks.sample import Sample

HEADER = (
    "Below is a record of lines I want you to remember. Each line begins with 'line <line "
    "index>' and contains a '<REGISTER_CONTENT>' at the end of the line as a numerical value. "
    "For each line index, memorize its corresponding <REGISTER_CONTENT>. At the end of the "
    "record, I will ask you to retrieve the corresponding <REGISTER_CONTENT> of a certain line "
    "index. Now the record start:\n\n"
)
LINE = "line {idx}: REGISTER_CONTENT is <{value}>\n"
FOOTER = (
    "\nNow the record is over. Tell me what is the <REGISTER_CONTENT> in line {idx}? "
    "I need the number."
)
ANSWER_PREFIX = "\nThe <REGISTER_CONTENT> in line {idx} is"
ANSWER = " {value}."
VALUE_RANGE = (1, 50000)

ADJECTIVES = (
    "able", "bold", "brave", "bright", "calm", "clever", "cold", "cool", "crisp", "curious",
    "daring", "dark", "eager", "early", "fair", "fancy", "fast", "fierce", "gentle", "glad",
    "golden", "grand", "happy", "honest", "humble", "jolly", "keen", "kind", "lively", "loud",
    "lucky", "mighty", "modern", "noble", "odd", "plain", "proud", "quick", "quiet", "rapid",
    "rare", "shy", "silent", "smart", "steady", "swift", "tall", "tiny", "warm", "wild",
)  # fmt: skip
NOUNS = (
    "apple", "badger", "bear", "beaver", "bison", "camel", "canyon", "cedar", "cloud", "comet",
    "coral", "crane", "desert", "dolphin", "eagle", "falcon", "forest", "fox", "garden", "glacier",
    "harbor", "hawk", "island", "jaguar", "lake", "lemon", "lion", "maple", "meadow", "moon",
    "mountain", "oak", "otter", "owl", "panda", "pebble", "pine", "planet", "river", "rocket",
    "salmon", "shark", "spider", "stone", "storm", "tiger", "tulip", "valley", "whale", "wolf",
)  # fmt: skip
INDEX_STYLES = defaults.INDEX_STYLES
LETTERS = "ABCDEF"


@cache
def longchat_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """This project's LongChat-like index vocabulary: ``(adjectives, nouns)``."""
    path = resources.files("interp_seal.tasks").joinpath("data/line_index_words.json")
    words = json.loads(path.read_text(encoding="utf-8"))
    return tuple(words["adjectives"]), tuple(words["nouns"])


@dataclass(frozen=True, kw_only=True)
class LineRetrievalConfig:
    """How to generate line-retrieval samples.

    Attributes:
        num_lines: lines per record.
        index_style: one of ``INDEX_STYLES``.
        force_prefix: put the SEAL answer string's prefix in the prompt (see module doc).
        adjectives, nouns: word lists for the ``"adjective-noun"`` style.
        distinct_words: draw ``num_lines`` distinct adjectives and ``num_lines`` distinct nouns
            (LongChat's draw) instead of ``num_lines`` distinct adjective-noun pairs.
    """

    num_lines: int
    index_style: str = "adjective-noun"
    force_prefix: bool = True
    adjectives: tuple[str, ...] = field(default=ADJECTIVES, repr=False)
    nouns: tuple[str, ...] = field(default=NOUNS, repr=False)
    distinct_words: bool = False

    def __post_init__(self):
        if self.num_lines < 1:
            raise ValueError(f"num_lines must be >= 1, got {self.num_lines}")
        if self.index_style not in INDEX_STYLES:
            raise ValueError(
                f"unknown index_style {self.index_style!r}; choose one of {INDEX_STYLES}"
            )
        if self.index_style == "adjective-noun":
            n_adj, n_noun = len(self.adjectives), len(self.nouns)
            available = min(n_adj, n_noun) if self.distinct_words else n_adj * n_noun
            if self.num_lines > available:
                raise ValueError(
                    f"num_lines={self.num_lines} exceeds the {available} adjective-noun indices "
                    f"that {n_adj} adjectives and {n_noun} nouns give "
                    f"({'no word reused' if self.distinct_words else 'distinct pairs'}); "
                    "pass longer word lists or another index_style"
                )

    @classmethod
    def longchat(
        cls, num_lines: int, *, index_style: str = "adjective-noun", force_prefix: bool = True
    ) -> LineRetrievalConfig:
        """Records drawn as LongChat's generator draws them, in any index style.

        The adjective-noun style uses ``longchat_words()`` with no word reused in a record.
        """
        adjectives, nouns = longchat_words()
        return cls(
            num_lines=num_lines,
            index_style=index_style,
            force_prefix=force_prefix,
            adjectives=adjectives,
            nouns=nouns,
            distinct_words=True,
        )


def _indices(cfg: LineRetrievalConfig, rng: random.Random) -> list[str] | list[int]:
    """``cfg.num_lines`` distinct line indices in ``cfg.index_style`` (see the module doc)."""
    n = cfg.num_lines
    if cfg.index_style == "integers":
        return list(range(1, n + 1))
    if cfg.index_style == "letters":
        width = 6
        while len(LETTERS) ** width < n:
            width += 1
        return ["".join(p) for p in itertools.islice(itertools.product(LETTERS, repeat=width), n)]
    if cfg.index_style == "uuid":
        return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]
    if cfg.distinct_words:
        pairs = zip(rng.sample(cfg.adjectives, n), rng.sample(cfg.nouns, n), strict=True)
        return [f"{adjective}-{noun}" for adjective, noun in pairs]
    pairs = rng.sample(range(len(cfg.adjectives) * len(cfg.nouns)), n)
    return [f"{cfg.adjectives[p // len(cfg.nouns)]}-{cfg.nouns[p % len(cfg.nouns)]}" for p in pairs]


def make_sample(cfg: LineRetrievalConfig, rng: random.Random) -> Sample:
    """One LongEval record with a uniformly chosen queried line.

    ``random_idx`` is ``[index, line number]`` (0-based line number), as LongChat writes it.
    """
    indices = _indices(cfg, rng)
    values = [rng.randint(*VALUE_RANGE) for _ in indices]
    target = rng.randrange(cfg.num_lines)  # the same draw as LongChat's randint(1, n) - 1
    return render(
        indices, values, target, index_style=cfg.index_style, force_prefix=cfg.force_prefix
    )


def render(
    indices: Sequence[str | int],
    values: Sequence[int],
    target: int,
    *,
    index_style: str = "adjective-noun",
    force_prefix: bool = True,
) -> Sample:
    """The record of ``indices`` and ``values`` asking for line ``target`` (0-based)."""
    lines = [LINE.format(idx=i, value=v) for i, v in zip(indices, values, strict=True)]
    idx, value = indices[target], values[target]
    prompt = HEADER + "".join(lines) + FOOTER.format(idx=idx)
    prefix = ANSWER_PREFIX.format(idx=idx)
    answer = ANSWER.format(value=value)
    if force_prefix:
        prompt, answer = prompt + prefix, answer
    else:
        answer = prefix.lstrip("\n") + answer
    return Sample(
        task="line_retrieval",
        prompt=prompt,
        answer=answer,
        meta={
            "random_idx": [idx, target],
            "expected_number": value,
            "num_lines": len(lines),
            "correct_line": lines[target].rstrip("\n"),
            "index_style": index_style,
            "force_prefix": force_prefix,
        },
    )


# -- reading records back --------------------------------------------------------------------
RECORD_LINE = re.compile(r"^line (.+): REGISTER_CONTENT is <(\d+)>$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class RecordLine:
    """One line of a record: its index, its value and its character span in the prompt
    (``prompt[start:end]`` is the line without its newline)."""

    index: str
    value: int
    start: int
    end: int


def parse_record(prompt: str) -> list[RecordLine]:
    """The record lines of a LongEval prompt, in order (the one parser of the format)."""
    return [
        RecordLine(index=m.group(1), value=int(m.group(2)), start=m.start(), end=m.end())
        for m in RECORD_LINE.finditer(prompt)
    ]


CORRUPTIONS = defaults.CORRUPTIONS


def corruptions(sample: Sample, corrupt: str, rng: random.Random) -> list[Sample]:
    """Records that differ from ``sample`` in one detail, in ``rng``'s order (for activation
    patching's corrupted runs).

    ``"key"``: the same record asking for another line (one whose value differs);
    ``"value"``: the same question, the queried line's number with another first digit.
    Each is rendered from the parsed record, so only that detail changes.
    """
    if sample.task != "line_retrieval":
        raise ValueError(f"expected a line_retrieval sample, got task {sample.task!r}")
    lines = parse_record(sample.prompt)
    target = int(sample.meta["random_idx"][1])
    style = sample.meta.get("index_style", "adjective-noun")
    indices = [int(x.index) if style == "integers" else x.index for x in lines]
    values = [x.value for x in lines]
    if not 0 <= target < len(lines) or values[target] != int(sample.meta["expected_number"]):
        raise ValueError("the sample's meta does not match its record; regenerate the sample")
    keep = {"index_style": style, "force_prefix": bool(sample.meta.get("force_prefix", True))}
    if corrupt == "key":
        others = [i for i, v in enumerate(values) if v != values[target]]
        rng.shuffle(others)
        return [render(indices, values, i, **keep) for i in others]
    if corrupt == "value":
        digits = str(values[target])
        firsts = [d for d in "123456789" if d != digits[0]]
        rng.shuffle(firsts)
        out = []
        for d in firsts:
            changed = list(values)
            changed[target] = int(d + digits[1:])
            out.append(render(indices, changed, target, **keep))
        return out
    raise ValueError(f"unknown corruption {corrupt!r}; choose one of {CORRUPTIONS}")


def generate(cfg: LineRetrievalConfig, n_samples: int, seed: int = 0) -> list[Sample]:
    """``n_samples`` records, reproducible from ``seed``."""
    if not isinstance(n_samples, int) or isinstance(n_samples, bool):
        raise TypeError(f"n_samples must be an integer (records), got {n_samples!r}")
    if n_samples < 0:
        raise ValueError(
            f"n_samples must be >= 0 (records), got {n_samples}; e.g. generate(cfg, 50)"
        )
    rng = random.Random(f"line_retrieval/{seed}/{cfg.num_lines}/{cfg.index_style}")
    return [make_sample(cfg, rng) for _ in range(n_samples)]


def num_lines_for_tokens(
    tokenizer, target_tokens: int, *, index_style: str = "adjective-noun", seed: int = 0
) -> int:
    """The number of lines whose prompt is closest to ``target_tokens`` tokens with ``tokenizer``.

    LongChat sizes records by lines (on Llama, 200 lines ~ 4.8K tokens, 600 ~ 14.1K,
    1350 ~ 31K); this finds the line count for a token budget on any tokenizer.
    """

    def n_tokens(n: int) -> int:
        sample = generate(LineRetrievalConfig(num_lines=n, index_style=index_style), 1, seed)[0]
        return len(sample.encode(tokenizer))

    base = n_tokens(1)
    per_line = max((n_tokens(21) - base) / 20, 1e-9)
    n = max(1, round((target_tokens - base) / per_line) + 1)
    while n > 1 and n_tokens(n) > target_tokens:
        n -= 1
    while n_tokens(n + 1) <= target_tokens:
        n += 1
    return n


_INT = re.compile(r"\d+")


def score_output(output: str, expected_number: int) -> bool:
    """LongEval's judgement: the last integer in ``output`` equals ``expected_number``."""
    found = _INT.findall(output)
    return bool(found) and int(found[-1]) == int(expected_number)
