"""Synthetic multi-document QA in LongBench's passage format (MuDAF's MDQA setting).

Each sample is a LongBench-style record (see ``interp_seal.tasks.longbench``) about made-up
countries and people, so that no answer can come from world knowledge (the same concern as
SEAL's synthetic data, Sec. 4.1). A *country* passage gives its capital and official language;
a *person* passage gives their occupation, birth country and birth year. Questions:

- 1 hop: one fact of one passage (``What is the capital of Velmor?``), one golden passage;
- 2 hops: a person's birth country, then that country's capital or language (``What is the
  capital of the country where Sali Renvel was born?``), two golden passages, as in
  HotpotQA-style bridge questions.

The other passages are distractors of the same two kinds, and passages are shuffled, as in
MuDAF's retrieval-score setup (golden and irrelevant passages "in random order", Sec. 3.1).
Samples go through ``longbench.sample_from_record``, so generated prompts and spans are exactly
what loading the written file gives back.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from interp_seal.tasks import longbench
from interp_seal.tasks.sample import Sample

SYLLABLES = (
    "ka", "lo", "mi", "ren", "dor", "vel", "sa", "tin", "bra", "qui", "mor", "an", "te", "vis",
    "ol", "ru", "pen", "zan", "ek", "ma", "sor", "li", "gan", "thu", "ra", "bel", "no", "cas",
)  # fmt: skip
OCCUPATIONS = (
    "painter", "botanist", "composer", "sculptor", "chemist", "poet", "cartographer", "historian",
    "weaver", "potter", "novelist", "violinist", "mapmaker", "glassblower", "surveyor",
)  # fmt: skip
# Every made-up word (country, capital, language stem, sea, first and last name) is two
# syllables: 28**2 = 784 of them, each one token of the organism's vocabulary, so that matching a
# question's name against a passage's is one token against one token, as a line index is.
NAMES = tuple(a.capitalize() + b for a in SYLLABLES for b in SYLLABLES)
MAX_PASSAGES = 200  # at most 4 names per country and 2 per person: 600 of the 784
SIDES = ("northern", "southern", "eastern", "western")
# per passage kind: the fact sentence(s), neutral filler sentences and 1-hop questions
# (question template, fact key)
TEXT = {
    "country": (
        "{name} is a small country on the {side} coast of the {sea} Sea. "
        "The capital of {name} is {capital}. "
        "The official language of {name} is {language}."
    ),
    "person": "{name} was born in {country} in {year}. The occupation of {name} is {occupation}.",
}
FILLER = {
    "country": (
        "Its markets are busiest in the early morning.",
        "Visitors often remark on the narrow streets and the quiet harbors.",
        "The surrounding region is known for its mild winters and long dry summers.",
    ),
    "person": (
        "Much of what is known about this life comes from letters kept in private collections.",
        "Several short biographies have been written, though none is considered complete.",
        "Local archives hold a small number of documents about this work.",
    ),
}
ONE_HOP = {
    "country": (
        ("What is the capital of {name}?", "capital"),
        ("What is the official language of {name}?", "language"),
    ),
    "person": (
        ("In which year was {name} born?", "year"),
        ("What is the occupation of {name}?", "occupation"),
    ),
}
TWO_HOP = (
    ("What is the capital of the country where {name} was born?", "capital"),
    ("What is the official language of the country where {name} was born?", "language"),
)
# each question restated as the start of its answer (``lead_in``)
STATEMENTS = {
    "What is the capital of {name}?": "The capital of {name} is",
    "What is the official language of {name}?": "The official language of {name} is",
    "In which year was {name} born?": "{name} was born in",
    "What is the occupation of {name}?": "The occupation of {name} is",
    "What is the capital of the country where {name} was born?": (
        "The capital of the country where {name} was born is"
    ),
    "What is the official language of the country where {name} was born?": (
        "The official language of the country where {name} was born is"
    ),
}


@dataclass(frozen=True, kw_only=True)
class PassagesConfig:
    """How to generate synthetic multi-document QA samples.

    Attributes:
        num_passages: passages per sample (golden + distractors), half of them countries
            (rounded up); at most ``MAX_PASSAGES``.
        hops: 1 (one golden passage) or 2 (person passage + their birth country's passage).
        filler_sentences: neutral sentences appended to each passage to lengthen it.
        dataset: the ``dataset`` field of the records.
    """

    num_passages: int = 10
    hops: int = 1
    filler_sentences: int = 2
    dataset: str = "synthetic_mdqa"

    def __post_init__(self):
        if not 2 <= self.num_passages <= MAX_PASSAGES:
            raise ValueError(
                f"num_passages must be in 2..{MAX_PASSAGES} (at least a person and a country; "
                f"at most what the made-up names allow), got {self.num_passages}"
            )
        if self.hops not in (1, 2):
            raise ValueError(f"hops must be 1 or 2, got {self.hops}")
        most = min(len(f) for f in FILLER.values())
        if not 0 <= self.filler_sentences <= most:
            raise ValueError(f"filler_sentences must be in 0..{most}, got {self.filler_sentences}")


def _names(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    """``n`` made-up words of ``NAMES``, unique within ``taken``."""
    out = []
    while len(out) < n:
        word = rng.choice(NAMES)
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def _passage(rng: random.Random, cfg: PassagesConfig, kind: str, facts: dict) -> tuple[str, str]:
    """(title, text) of one passage: its facts then ``cfg.filler_sentences`` filler sentences."""
    filler = rng.sample(FILLER[kind], cfg.filler_sentences)
    return facts["name"], " ".join([TEXT[kind].format(**facts), *filler])


def make_sample(cfg: PassagesConfig, rng: random.Random, sample_id: str) -> Sample:
    """One seeded sample with a question about one (1 hop) or two (2 hops) golden passages."""
    n_countries = (cfg.num_passages + 1) // 2
    n_people = cfg.num_passages - n_countries
    taken: set[str] = set()
    names, capitals = _names(rng, n_countries, taken), _names(rng, n_countries, taken)
    languages, seas = _names(rng, n_countries, taken), _names(rng, n_countries, taken)
    countries = [
        {"name": names[i], "capital": capitals[i], "language": languages[i] + "ese",
         "side": rng.choice(SIDES), "sea": seas[i]}
        for i in range(n_countries)
    ]  # fmt: skip
    firsts, lasts = _names(rng, n_people, taken), _names(rng, n_people, taken)
    people = [
        {"name": f"{firsts[i]} {lasts[i]}", "occupation": rng.choice(OCCUPATIONS),
         "country": rng.choice(countries)["name"], "year": rng.randint(1700, 1990)}
        for i in range(n_people)
    ]  # fmt: skip
    blocks = [("country", c) for c in countries] + [("person", p) for p in people]
    rng.shuffle(blocks)

    if cfg.hops == 2:
        person = rng.choice(people)
        country = next(c for c in countries if c["name"] == person["country"])
        template, key = rng.choice(TWO_HOP)
        question, answer = template.format(name=person["name"]), country[key]
        golden = [i for i, (_, facts) in enumerate(blocks) if facts in (person, country)]
    else:
        g = rng.randrange(len(blocks))
        kind, facts = blocks[g]
        template, key = rng.choice(ONE_HOP[kind])
        question = template.format(name=facts["name"])
        answer, golden = str(facts[key]), [g]

    context = longbench.format_context([_passage(rng, cfg, kind, facts) for kind, facts in blocks])
    record = {
        "input": question,
        "context": context,
        "answers": [answer],
        "length": len(context.split()) + len(question.split()),
        "dataset": cfg.dataset,
        "language": "en",
        "all_classes": None,
        "_id": sample_id,
    }
    return longbench.sample_from_record(record, golden)


def lead_in(sample: Sample) -> str:
    """The sample's question restated as the start of its answer (``" The capital of Velmor
    is"`` for ``What is the capital of Velmor?``): forced after the prompt
    (``chat.force_prefix``), the answer completes it, as LongEval's answer prefix does for a
    line's value. ``""`` for a question of no template here."""
    for question, statement in STATEMENTS.items():
        pattern = re.escape(question).replace(re.escape("{name}"), "(?P<name>.+)")
        match = re.fullmatch(pattern, sample.meta.get("input", ""))
        if match:
            return " " + statement.format(name=match["name"])
    return ""


def generate(cfg: PassagesConfig, n_samples: int, seed: int = 0) -> list[Sample]:
    """``n_samples`` samples, reproducible from ``seed``; ids ``{dataset}-{seed}-{i}``."""
    rng = random.Random(f"passages/{seed}/{cfg.num_passages}/{cfg.hops}")
    return [make_sample(cfg, rng, f"{cfg.dataset}-{seed}-{i}") for i in range(n_samples)]
