"""Generated needles and haystacks for *training* needle-in-a-haystack retrieval.

SEAL (appendix B.2) tunes on ten needles written in one style: a statement whose opening
phrase is exactly what the question asks about, and whose remainder is the answer
("Dominating the center of the room is a grand piano, ..." / "What dominates the center of
the room?"). A model trained on those ten, or on the toolkit's evaluation haystack, would be
evaluated on its training data. This module generates needles of the same style from word
lists (five sentence templates x places x things x descriptions: hundreds of thousands of
distinct needles, none of them SEAL's) and haystacks of filler sentences, so that the model
organism can be trained on NIAH and evaluated on SEAL's needles in the shipped haystack.

A generated haystack is a sequence of filler sentences (random words from a fixed word list,
capitalised, with a full stop) plus a few *distractor* statements: other needles whose opening
phrase differs from the real needle's. A model can then only answer by matching the
question's phrase, not by finding "the one sentence that reads like a needle".
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from interp_seal.tasks.needle import Needle, read_haystack

PLACES = (
    "hall", "kitchen", "attic", "library", "garden", "porch", "cellar", "study", "gallery",
    "workshop", "bedroom", "courtyard", "hallway", "office", "studio", "chapel", "greenhouse",
    "balcony", "parlor", "cabin", "museum", "theater", "station", "lobby", "classroom",
)  # fmt: skip
SPOTS = (
    "the door", "the window", "the fireplace", "the staircase", "the far wall", "the entrance",
    "the corner", "the ceiling", "the old desk", "the bookcase", "the back wall", "the arch",
)  # fmt: skip
POSES = (
    ("Resting", "resting"), ("Hanging", "hanging"), ("Standing", "standing"),
    ("Leaning", "leaning"), ("Hidden", "hidden"), ("Tucked", "tucked"), ("Placed", "placed"),
)  # fmt: skip
PREPOSITIONS = ("near", "beside", "under", "above", "behind", "against", "next to", "across from")
QUALITIES = ("curious", "lovely", "rare", "charming", "odd", "famous", "welcome", "quiet")
ADVERBS = ("Easily", "Plainly", "Barely", "Partly", "Always", "Instantly")
SENSES = ("seen", "heard", "noticed", "visible", "reachable")
VERBS = (
    ("Filling", "fills"), ("Guarding", "guards"), ("Lighting", "lights"), ("Crowning", "crowns"),
    ("Warming", "warms"), ("Framing", "frames"), ("Brightening", "brightens"),
)  # fmt: skip
ORDINALS = ("first", "last", "only", "oldest", "strangest", "finest")
ACTIONS = ("see", "notice", "find", "remember", "touch")
ADJECTIVES = (
    "small", "heavy", "bright", "dusty", "carved", "painted", "silver", "wooden", "faded",
    "narrow", "round", "square", "copper", "velvet", "marble", "brass", "green", "crimson",
)  # fmt: skip
THINGS = (
    "clock", "mirror", "vase", "chest", "sculpture", "map", "trunk", "bench", "globe", "lantern",
    "cabinet", "harp", "bowl", "quilt", "statue", "telescope", "basket", "candle", "typewriter",
    "violin", "compass", "kettle", "ladder", "banner", "shield", "fountain", "model ship",
)  # fmt: skip
TAILS = (
    "", ", its {part} {state}", " covered in {material}", " made of {material}",
    " with a {adjective} {part}", " that once belonged to a sailor", " wrapped in {material}",
)  # fmt: skip
PARTS = ("handle", "frame", "edge", "lid", "base", "surface", "ribbon")
STATES = ("worn smooth", "slightly cracked", "freshly polished", "chipped at one side")
MATERIALS = ("linen", "dust", "old paper", "dark glass", "ivy", "gold leaf", "wool")
# (opening phrase, question), formatted with the slots drawn in ``make_needle``
TEMPLATES = (
    ("{Pose} {prep} {spot} of the {place}", "What is {pose} {prep} {spot} of the {place}?"),
    ("The {ordinal} thing you {action} in the {place}", "What is the {ordinal} thing you {action} in the {place}?"),
    ("A {quality} feature of the {place}", "What is a {quality} feature of the {place}?"),
    ("{Adverb} {sense} from {spot} of the {place}", "What is {adverb} {sense} from {spot} of the {place}?"),
    ("{Verb} {spot} of the {place}", "What {verbs} {spot} of the {place}?"),
)  # fmt: skip
FILLER_WORDS = (
    "the", "a", "of", "and", "to", "in", "it", "was", "that", "for", "on", "with", "as", "his",
    "her", "they", "at", "by", "this", "from", "but", "not", "or", "have", "had", "one", "all",
    "were", "when", "there", "can", "an", "which", "their", "said", "if", "will", "each",
    "about", "how", "up", "out", "then", "many", "some", "so", "these", "would", "other", "into",
    "more", "time", "could", "people", "year", "river", "road", "town", "winter", "summer",
    "letter", "story", "work", "market", "morning", "evening", "field", "farm", "ship", "train",
    "city", "village", "teacher", "child", "friend", "family", "music", "book", "paper", "rain",
    "wind", "light", "water", "stone", "bread", "coffee", "plan", "idea", "question", "answer",
    "slowly", "quickly", "often", "never", "always", "later", "early", "together", "alone",
    "walked", "wrote", "read", "found", "kept", "gave", "made", "took", "thought", "knew",
    "began", "ended", "learned", "carried", "watched", "waited", "returned", "opened", "closed",
)  # fmt: skip


def _slots(rng: random.Random) -> dict[str, str]:
    pose, pose_lower = rng.choice(POSES)
    verb, verbs = rng.choice(VERBS)
    adverb = rng.choice(ADVERBS)
    return {
        "Pose": pose, "pose": pose_lower, "prep": rng.choice(PREPOSITIONS),
        "spot": rng.choice(SPOTS), "place": rng.choice(PLACES), "ordinal": rng.choice(ORDINALS),
        "action": rng.choice(ACTIONS), "quality": rng.choice(QUALITIES), "Adverb": adverb,
        "adverb": adverb.lower(), "sense": rng.choice(SENSES), "Verb": verb, "verbs": verbs,
    }  # fmt: skip


def _description(rng: random.Random) -> str:
    """`` a dusty copper lantern, its handle worn smooth`` and the like."""
    adjectives = rng.sample(ADJECTIVES, rng.randint(1, 2))
    thing = " ".join([*adjectives, rng.choice(THINGS)])
    article = rng.choice(("a", "the", "an" if thing[0] in "aeiou" else "a"))
    tail = rng.choice(TAILS).format(
        part=rng.choice(PARTS), state=rng.choice(STATES), material=rng.choice(MATERIALS),
        adjective=rng.choice(ADJECTIVES),
    )  # fmt: skip
    return f"{article} {thing}{tail}"


def make_needle(rng: random.Random, avoid: Needle | None = None) -> Needle:
    """A generated needle: ``{opening} is {description}.`` and ``What is {opening}?``.

    ``avoid``: a needle whose question must not be repeated (for distractors).
    """
    while True:
        opening, question = rng.choice(TEMPLATES)
        slots = _slots(rng)
        needle = Needle(
            id="generated",
            text=f"{opening.format(**slots)} is {_description(rng)}.",
            question=question.format(**slots),
        )
        if avoid is None or needle.question != avoid.question:
            return needle


def filler_sentence(rng: random.Random, words: tuple[str, ...]) -> str:
    """A filler sentence: 6-18 random words from ``words``, capitalised, with a full stop."""
    chosen = [rng.choice(words) for _ in range(rng.randint(6, 18))]
    return " ".join(chosen).capitalize() + "."


def filler_words() -> tuple[str, ...]:
    """The filler vocabulary: ``FILLER_WORDS`` plus every lowercase word of the built-in
    haystack (as single words in random order, never its sentences), so that the words of the
    evaluation haystack are familiar filler to a trained model."""
    haystack = {w.strip(".,;:!?'\"()").lower() for w in read_haystack().split()}
    return tuple(sorted(set(FILLER_WORDS) | {w for w in haystack if w.isalpha()}))


def make_haystack(
    rng: random.Random, *, n_words: int, avoid: Needle, distractors: tuple[int, int] = (0, 3)
) -> str:
    """About ``n_words`` words of filler sentences in paragraphs, hiding 0-3 distractor needles.

    Distractors are generated needles whose question differs from ``avoid``'s.
    """
    words = filler_words()
    sentences: list[str] = []
    count = 0
    while count < n_words:
        sentences.append(filler_sentence(rng, words))
        count += len(sentences[-1].split())
    for _ in range(rng.randint(*distractors)):
        sentences.insert(rng.randrange(len(sentences) + 1), make_needle(rng, avoid).text)
    paragraphs, i = [], 0
    while i < len(sentences):
        size = rng.randint(3, 7)
        paragraphs.append(" ".join(sentences[i : i + size]))
        i += size
    return "\n\n".join(paragraphs)


def vocabulary() -> Iterator[str]:
    """Every word the generators can write (for growing a word-level tokenizer)."""
    groups = (PLACES, SPOTS, PREPOSITIONS, QUALITIES, ADVERBS, SENSES, ORDINALS, ACTIONS,
              ADJECTIVES, THINGS, TAILS, PARTS, STATES, MATERIALS, filler_words())  # fmt: skip
    for group in groups:
        yield from group
    for pair in (*POSES, *VERBS, *TEMPLATES):
        yield from pair
