"""Generated needles and haystacks for *training* needle-in-a-haystack retrieval.

SEAL (appendix B.2) tunes on ten needles written in one style: a statement whose opening
phrase is exactly what the question asks about, and whose remainder is the answer
("Dominating the center of the room is a grand piano, ..." / "What dominates the center of
the room?"). A model trained on those ten, or on the toolkit's evaluation haystack, would be
evaluated on its training data. This module generates needles of the same style from word
lists (fifteen sentence templates x places x things x descriptions: hundreds of thousands of
distinct needles, none of them SEAL's) and haystacks of filler sentences, so that the model
organism can be trained on NIAH and evaluated on SEAL's needles in the shipped essays haystack.

A generated haystack is a sequence of filler sentences (random words from a fixed word list,
capitalised, with a full stop) plus a few *distractor* statements: other needles whose opening
phrase differs from the real needle's. A model can then only answer by matching the
question's phrase, not by finding "the one sentence that reads like a needle".
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from interp_seal.tasks.needle import SAN_FRANCISCO, SEAL_NEEDLES, Needle, read_haystack

PLACES = (
    "hall", "kitchen", "attic", "library", "garden", "porch", "cellar", "study", "gallery",
    "workshop", "bedroom", "courtyard", "hallway", "office", "studio", "chapel", "greenhouse",
    "balcony", "parlor", "cabin", "museum", "theater", "station", "lobby", "classroom",
    "room", "lounge", "foyer", "den",
)  # fmt: skip
SPOTS = (
    "the door", "the window", "the fireplace", "the staircase", "the far wall", "the entrance",
    "the corner", "the ceiling", "the old desk", "the bookcase", "the back wall", "the arch",
    "the mantel", "the left wall", "the main wall", "the floor", "the center", "the armchair",
)  # fmt: skip
POSES = (
    ("Resting", "resting"), ("Hanging", "hanging"), ("Standing", "standing"),
    ("Leaning", "leaning"), ("Hidden", "hidden"), ("Tucked", "tucked"), ("Placed", "placed"),
)  # fmt: skip
PREPOSITIONS = ("near", "beside", "under", "above", "behind", "against", "next to", "across from")
QUALITIES = (
    "curious", "lovely", "rare", "charming", "odd", "famous", "welcome", "quiet", "striking",
)  # fmt: skip
ADVERBS = ("Easily", "Plainly", "Barely", "Partly", "Always", "Instantly", "Immediately", "Clearly")
SENSES = ("seen", "heard", "noticed", "visible", "reachable", "noticeable")
VERBS = (
    ("Filling", "fills"), ("Guarding", "guards"), ("Lighting", "lights"), ("Crowning", "crowns"),
    ("Warming", "warms"), ("Framing", "frames"), ("Brightening", "brightens"),
    ("Dominating", "dominates"),
)  # fmt: skip
ORDINALS = ("first", "last", "only", "oldest", "strangest", "finest")
ACTIONS = ("see", "notice", "find", "remember", "touch")
ADJECTIVES = (
    "small", "heavy", "bright", "dusty", "carved", "painted", "silver", "wooden", "faded",
    "narrow", "round", "square", "copper", "velvet", "marble", "brass", "green", "crimson",
    "large", "tall", "grand", "antique", "oak", "circular", "framed", "intricate", "polished",
)  # fmt: skip
THINGS = (
    "clock", "mirror", "vase", "chest", "sculpture", "map", "trunk", "bench", "globe", "lantern",
    "cabinet", "harp", "bowl", "quilt", "statue", "telescope", "basket", "candle", "typewriter",
    "violin", "compass", "kettle", "ladder", "banner", "shield", "fountain", "model ship",
    "table", "bookshelf", "piano", "tapestry", "photograph", "rug", "lamp", "window", "painting",
    "armchair", "chandelier", "portrait",
)  # fmt: skip
TAILS = (
    "", ", its {part} {state}", " covered in {material}", " made of {material}",
    " with a {adjective} {part}", " that once belonged to a sailor", " wrapped in {material}",
    " positioned {prep} {spot}", " resting {prep} {spot}", ", its {part} catching the light",
    " that covers most of {spot}", " hanging on {spot}", " mounted on {spot}",
    " that spans {spot}", ", ticking in {spot}",
)  # fmt: skip
PARTS = ("handle", "frame", "edge", "lid", "base", "surface", "ribbon")
STATES = ("worn smooth", "slightly cracked", "freshly polished", "chipped at one side")
MATERIALS = ("linen", "dust", "old paper", "dark glass", "ivy", "gold leaf", "wool")
ENTERINGS = (
    "walking into", "visiting", "reaching", "opening", "leaving", "crossing", "entering",
    "stepping into",
)  # fmt: skip
MOVES = (
    "walk in", "come through the door", "climb the stairs", "look around", "turn the corner",
    "open the gate", "sit down", "look up", "step inside", "enter", "enter the room",
)  # fmt: skip
ORGANS = ("eye", "gaze", "ear", "interest", "curiosity")
CATCHES = (
    ("Catching", "catches"),
    ("Drawing", "draws"),
    ("Holding", "holds"),
    ("Meeting", "meets"),
    ("Greeting", "greets"),
    ("Grabbing", "grabs"),
)
PULLS = ("pulled", "led", "turned", "guided", "drawn")
ITEMS = ("object", "piece", "sight", "detail", "thing", "item", "feature")
SUPERLATIVES = (
    "striking", "curious", "memorable", "unusual", "beautiful", "surprising", "noticeable",
)  # fmt: skip
STANDS = ("shines", "waits", "sits", "hangs", "glows", "stands out")
# (opening phrase, question, joiner): the needle is ``opening + joiner + key + "."``. Paraphrase
# families of SEAL's shapes (a fronted phrase, ``the ... thing that``, ``as you ...``, ``your
# eye is drawn to``, ``What ... is``); ``make_needle`` redraws any that repeats SEAL's own
# opening phrases or questions.
TEMPLATES = (
    ("{Pose} {prep} {spot} of the {place}", "What is {pose} {prep} {spot} of the {place}?", " is "),
    ("The {ordinal} thing you {action} in the {place}", "What is the {ordinal} thing you {action} in the {place}?", " is "),
    ("A {quality} feature of the {place}", "What is a {quality} feature of the {place}?", " is "),
    ("{Adverb} {sense} from {spot} of the {place}", "What is {adverb} {sense} from {spot} of the {place}?", " is "),
    ("{Verb} {spot} of the {place}", "What {verbs} {spot} of the {place}?", " is "),
    ("{Adverb} {sense} upon {entering} the {place}", "What is {adverb} {sense} upon {entering} the {place}?", " is "),
    ("{Catching} your {organ} as you {move}", "What {catches} your {organ} as you {move}?", " is "),
    ("The {ordinal} thing that {catches} your {organ}", "What is the {ordinal} thing that {catches} your {organ}?", " is "),
    ("{Adverb} {sense} as you {move}", "What is {adverb} {sense} as you {move}?", " is "),
    ("Your {organ} is {adverb} {pulled} to", "What is your {organ} {adverb} {pulled} to?", " "),
    ("What {stands} {adverb}", "What {stands} {adverb} in the {place}?", " is "),
    ("The most {superlative} {item} in the {place}", "What is the most {superlative} {item} in the {place}?", " is "),
    ("{Sense} as soon as you {move}", "What is {sense} as soon as you {move}?", " is "),
    ("The best thing to {action} in the {place}", "What is the best thing to {action} in the {place}?", " is "),
    ("A {quality} {item} of the {place}", "What is a {quality} {item} of the {place}?", " is "),
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


EVALUATION_QUESTIONS = frozenset(n.question for n in (*SEAL_NEEDLES, SAN_FRANCISCO))


def opening_of(needle: Needle) -> str:
    """What a needle says before its key phrase, lowercased (``"a striking feature of the room
    is"``)."""
    return needle.text[: needle.text.index(needle.key)].strip().lower()


EVALUATION_OPENINGS = frozenset(opening_of(n) for n in (*SEAL_NEEDLES, SAN_FRANCISCO))


def _slots(rng: random.Random) -> dict[str, str]:
    pose, pose_lower = rng.choice(POSES)
    verb, verbs = rng.choice(VERBS)
    catching, catches = rng.choice(CATCHES)
    adverb = rng.choice(ADVERBS)
    sense = rng.choice(SENSES)
    return {
        "Pose": pose, "pose": pose_lower, "prep": rng.choice(PREPOSITIONS),
        "spot": rng.choice(SPOTS), "place": rng.choice(PLACES), "ordinal": rng.choice(ORDINALS),
        "action": rng.choice(ACTIONS), "quality": rng.choice(QUALITIES), "Adverb": adverb,
        "adverb": adverb.lower(), "sense": sense, "Sense": sense.capitalize(), "Verb": verb,
        "verbs": verbs, "entering": rng.choice(ENTERINGS), "move": rng.choice(MOVES),
        "organ": rng.choice(ORGANS), "Catching": catching, "catches": catches,
        "pulled": rng.choice(PULLS), "item": rng.choice(ITEMS), "stands": rng.choice(STANDS),
        "superlative": rng.choice(SUPERLATIVES),
    }  # fmt: skip


def _description(rng: random.Random) -> str:
    """`` a dusty copper lantern, its handle worn smooth`` and the like."""
    adjectives = rng.sample(ADJECTIVES, rng.randint(1, 2))
    thing = " ".join([*adjectives, rng.choice(THINGS)])
    article = rng.choice(("a", "the", "an" if thing[0] in "aeiou" else "a"))
    tail = rng.choice(TAILS).format(
        part=rng.choice(PARTS), state=rng.choice(STATES), material=rng.choice(MATERIALS),
        adjective=rng.choice(ADJECTIVES), prep=rng.choice(PREPOSITIONS), spot=rng.choice(SPOTS),
    )  # fmt: skip
    return f"{article} {thing}{tail}"


def make_needle(rng: random.Random, avoid: Needle | None = None) -> Needle:
    """A generated needle: ``{opening} is {description}.``, ``What is {opening}?`` and the
    description as its key phrase.

    ``avoid``: a needle whose question must not be repeated (for distractors). A draw that
    repeats one of SEAL's questions or opening phrases (the evaluation needles) is redrawn. The
    word lists share everyday words with SEAL's needles (``room``, ``entering``, ``large``,
    ``piano``): a model that never saw those words as keys cannot match them at evaluation.
    """
    while True:
        opening, question, joiner = rng.choice(TEMPLATES)
        slots = _slots(rng)
        key = _description(rng)
        needle = Needle(
            id="generated",
            text=f"{opening.format(**slots)}{joiner}{key}.",
            question=question.format(**slots),
            key=key,
        )
        if (
            needle.question not in EVALUATION_QUESTIONS
            and opening_of(needle) not in EVALUATION_OPENINGS
            and (avoid is None or needle.question != avoid.question)
        ):
            return needle


def filler_sentence(rng: random.Random, words: tuple[str, ...]) -> str:
    """A filler sentence: 6-18 random words from ``words``, capitalised, with a full stop."""
    chosen = [rng.choice(words) for _ in range(rng.randint(6, 18))]
    return " ".join(chosen).capitalize() + "."


def filler_words() -> tuple[str, ...]:
    """The filler vocabulary: ``FILLER_WORDS`` plus every lowercase word of the built-in
    ``"essays"`` haystack (as single words in random order, never its sentences), so that the
    words of the organism's evaluation haystack are familiar filler to it."""
    haystack = {w.strip(".,;:!?'\"()").lower() for w in read_haystack("essays").split()}
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
              ADJECTIVES, THINGS, TAILS, PARTS, STATES, MATERIALS, ENTERINGS, MOVES, ORGANS,
              PULLS, ITEMS, SUPERLATIVES, STANDS, filler_words())  # fmt: skip
    for group in groups:
        yield from group
    for row in (*POSES, *VERBS, *CATCHES, *TEMPLATES):
        yield from row
