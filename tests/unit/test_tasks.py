"""Task formats: exact strings, seeded reproducibility, spans, JSONL round trips and errors."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from interp_seal.cli import main
from interp_seal.organism.tokenizer import build_tokenizer
from interp_seal.tasks import jsonl, line_retrieval, longbench, needle, passages
from interp_seal.tasks.sample import Sample

# ---------------------------------------------------------------------------------------------
# literal formats (docs/design.md section 5)


def test_line_retrieval_strings_match_longeval():
    assert line_retrieval.HEADER == (
        "Below is a record of lines I want you to remember. Each line begins with 'line <line "
        "index>' and contains a '<REGISTER_CONTENT>' at the end of the line as a numerical "
        "value. For each line index, memorize its corresponding <REGISTER_CONTENT>. At the end "
        "of the record, I will ask you to retrieve the corresponding <REGISTER_CONTENT> of a "
        "certain line index. Now the record start:\n\n"
    )
    assert line_retrieval.LINE.format(idx="happy-tiger", value=123) == (
        "line happy-tiger: REGISTER_CONTENT is <123>\n"
    )
    assert line_retrieval.FOOTER.format(idx="happy-tiger") == (
        "\nNow the record is over. Tell me what is the <REGISTER_CONTENT> in line happy-tiger? "
        "I need the number."
    )


def test_longbench_prompt_and_passage_blocks():
    assert longbench.PROMPT.replace("{context}", "C").replace("{input}", "Q?") == (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\nC\n\nAnswer the question "
        "based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nQuestion: Q?\nAnswer:"
    )
    context = longbench.format_context(
        [("Alpha", "Alpha is a town."), ("Beta", "Beta is a river.")]
    )
    assert context == "Passage 1:\nAlpha\nAlpha is a town.\nPassage 2:\nBeta\nBeta is a river."
    spans = longbench.passage_spans(context)
    assert [context[s:e] for s, e in spans] == [
        "Passage 1:\nAlpha\nAlpha is a town.",
        "Passage 2:\nBeta\nBeta is a river.",
    ]


# ---------------------------------------------------------------------------------------------
# needle in a haystack


def test_seal_needles_are_the_papers():
    assert len(needle.SEAL_NEEDLES) == 10
    assert len({n.id for n in needle.SEAL_NEEDLES}) == 10
    first, third = needle.SEAL_NEEDLES[0], needle.SEAL_NEEDLES[2]
    assert first.text == (
        "Immediately noticeable upon entering the room is the large oak table positioned "
        "beneath the chandelier."
    )
    assert first.question == "What is immediately noticeable upon entering the room?"
    assert third.text == (
        "Dominating the center of the room is a grand piano, its polished surface reflecting "
        "the light from the windows."
    )
    assert needle.SEAL_NEEDLES[6].question == "What stands out immediately in the room?"
    assert all(n.text.endswith(".") and n.question.endswith("?") for n in needle.SEAL_NEEDLES)


def test_linear_grid_is_gkamradts():
    assert needle.linear_grid(0, 100, 11) == (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100)
    assert needle.linear_grid(1000, 2000, 4) == (1000, 1333, 1667, 2000)
    assert needle.linear_grid(7, 9, 1) == (7,)
    with pytest.raises(ValueError, match="at least one point"):
        needle.linear_grid(0, 1, 0)


TINY_HAYSTACK = "Aa bb cc. Dd ee ff gg. Hh ii."
TINY_NEEDLE = needle.Needle(id="n", text="The key is here.", question="Where is the key?")


@pytest.fixture(scope="module")
def tiny_needle_tok():
    return build_tokenizer([TINY_HAYSTACK, TINY_NEEDLE.text, TINY_NEEDLE.question, needle.PROMPT])


def _tiny_context(tok, depth, context_length=17):
    # 12 haystack tokens, 5 needle tokens, no buffer: the whole haystack fits at length 17
    return needle.insert_needle(
        TINY_HAYSTACK, TINY_NEEDLE.text, tok, context_length=context_length, depth=depth, buffer=0
    )


@pytest.mark.parametrize(
    ("depth", "expected"),
    [
        # int(12 * 0.5) = 6 -> "Aa bb cc. Dd ee" walks back to just after "cc."
        (50, "Aa bb cc. The key is here. Dd ee ff gg. Hh ii."),
        # int(12 * 0.2) = 2 -> "Aa bb" has no sentence end before it: start of the document
        (20, "The key is here. Aa bb cc. Dd ee ff gg. Hh ii."),
        (0, "The key is here. Aa bb cc. Dd ee ff gg. Hh ii."),
        # int(12 * 0.75) = 9 -> "... gg." already ends a sentence
        (75, "Aa bb cc. Dd ee ff gg. The key is here. Hh ii."),
        (100, "Aa bb cc. Dd ee ff gg. Hh ii. The key is here."),
    ],
)
def test_needle_walks_back_to_a_sentence_end(tiny_needle_tok, depth, expected):
    context, (start, end) = _tiny_context(tiny_needle_tok, depth)
    assert context == expected
    assert context[start:end] == TINY_NEEDLE.text


def test_needle_haystack_is_cut_to_budget(tiny_needle_tok):
    # 13 - 0 - 5 = 8 haystack tokens: "Aa bb cc. Dd ee ff gg" (the cut is mid-sentence)
    context, _ = _tiny_context(tiny_needle_tok, 100, context_length=13)
    assert context == "Aa bb cc. Dd ee ff gg The key is here."
    with pytest.raises(ValueError, match="no room for the haystack"):
        _tiny_context(tiny_needle_tok, 50, context_length=5)


def test_a_haystack_shorter_than_the_context_is_refused_unless_repeated(tiny_needle_tok):
    # 20 - 0 - 5 = 15 haystack tokens from a 12-token haystack
    with pytest.raises(
        ValueError, match="the haystack has 12 tokens, but a 20-token context needs 15"
    ):
        _tiny_context(tiny_needle_tok, 100, context_length=20)
    context, _ = needle.insert_needle(
        TINY_HAYSTACK, TINY_NEEDLE.text, tiny_needle_tok, context_length=20, depth=100, buffer=0,
        repeat=True,
    )  # fmt: skip
    assert context == "Aa bb cc. Dd ee ff gg. Hh ii.\n\nAa The key is here."  # 12 + 2 + 1
    # the config carries it to every sample, and the refusal comes from generate
    cfg = needle.NeedleConfig(
        context_lengths=(17, 20), depths=(100,), needles=(TINY_NEEDLE,), haystack=TINY_HAYSTACK,
        buffer=0,
    )  # fmt: skip
    with pytest.raises(ValueError, match="repeat=True"):
        needle.generate(cfg, tiny_needle_tok)
    repeated = dataclasses.replace(cfg, repeat=True)
    assert needle.generate(repeated, tiny_needle_tok)[1].prompt.count("Aa") == 2


@pytest.fixture(scope="module")
def essay_tok():
    texts = [needle.read_haystack(), needle.PROMPT, needle.SAN_FRANCISCO.text]
    texts += [f" {n.text} {n.question}" for n in (*needle.SEAL_NEEDLES, needle.SAN_FRANCISCO)]
    return build_tokenizer(texts)


def test_needle_sample_spans_meta_and_token_budget(essay_tok):
    cfg = needle.NeedleConfig(context_lengths=(300, 1500), depths=(0, 40, 100), buffer=50)
    samples = needle.generate(cfg, essay_tok, n_per_cell=2, seed=3)
    assert [(s.meta["context_length"], s.meta["depth_percent"]) for s in samples] == [
        (length, depth) for length in (300, 1500) for depth in (0, 40, 100) for _ in range(2)
    ]
    by_id = {n.id: n for n in needle.SEAL_NEEDLES}
    for s in samples:
        n = by_id[s.meta["needle_id"]]
        start, end = s.needle
        assert s.prompt[start:end] == n.text
        assert s.answer == " " + n.text
        assert s.meta["question"] == n.question
        assert s.prompt.startswith("This is a very long story book: <book> ")
        assert s.prompt.endswith(
            f" </book>.\nBased on the content of the book, Question: {n.question}\nAnswer:"
        )
        # the haystack without the needle is exactly context_length - buffer - needle tokens
        context = s.prompt[
            len("This is a very long story book: <book> ") : s.prompt.index(" </book>")
        ]
        haystack = context.replace(f" {n.text}", "", 1).replace(f"{n.text} ", "", 1)
        n_needle = len(essay_tok(n.text, add_special_tokens=False)["input_ids"])
        n_hay = len(essay_tok(haystack, add_special_tokens=False)["input_ids"])
        assert n_hay == s.meta["context_length"] - 50 - n_needle
        if 0 < s.meta["depth_percent"] < 100:
            assert s.prompt[:start].endswith(". ")
        enc = s.encode(essay_tok)
        assert essay_tok.decode(enc.input_ids[slice(*enc.needle)]) == " " + n.text

    assert needle.generate(cfg, essay_tok, 2, seed=3) == samples
    assert [s.meta["needle_id"] for s in needle.generate(cfg, essay_tok, 2, seed=4)] != [
        s.meta["needle_id"] for s in samples
    ]


def test_needle_key_phrase_answers(essay_tok):
    # every key phrase is the end of its sentence, right after the phrase the question asks for
    for n in (*needle.SEAL_NEEDLES, needle.SAN_FRANCISCO):
        assert n.text.endswith(n.key + ".")
        opening = n.text[: -len(n.key) - 1].strip()
        assert opening.endswith(("is", "drawn to")), opening
    assert needle.SEAL_NEEDLES[8].key.startswith("the stained glass window")
    cfg = needle.NeedleConfig(context_lengths=(300,), depths=(50,), answer="key_phrase")
    (s,) = needle.generate(cfg, essay_tok, seed=3)
    n = {n.id: n for n in needle.SEAL_NEEDLES}[s.meta["needle_id"]]
    assert s.answer == " " + n.key and s.prompt[slice(*s.needle)] == n.text
    no_key = needle.Needle(id="x", text="A cat is here.", question="What is here?")
    with pytest.raises(ValueError, match="key phrase on every needle"):
        needle.NeedleConfig(context_lengths=(300,), needles=(no_key,), answer="key_phrase")
    with pytest.raises(ValueError, match="answer must be one of"):
        needle.NeedleConfig(context_lengths=(300,), answer="phrase")
    with pytest.raises(ValueError, match="must be a non-empty part of its text"):
        needle.Needle(id="x", text="A cat is here.", question="What is here?", key="a dog")


def test_needle_config_validation():
    with pytest.raises(ValueError, match=r"depths must be percentages in \[0, 100\]"):
        needle.NeedleConfig(context_lengths=(100,), depths=(101,))
    with pytest.raises(ValueError, match="needle ids must be unique"):
        needle.NeedleConfig(context_lengths=(100,), needles=(TINY_NEEDLE, TINY_NEEDLE))
    with pytest.raises(ValueError, match=r"\{question\} exactly once"):
        needle.NeedleConfig(context_lengths=(100,), template="{context}")


def test_read_haystack_from_file_and_directory(tmp_path):
    assert needle.read_haystack().startswith("On Learning a Language Late\n\n")
    assert needle.read_haystack("long") == needle.read_haystack()
    assert needle.read_haystack("essays").startswith("On Keeping a Notebook\n\nMost people")
    with pytest.raises(
        FileNotFoundError, match=r"built-in haystacks \['essays', 'long', 'organism'\]"
    ):
        needle.read_haystack("longer")
    (tmp_path / "b.txt").write_text("Second.")
    (tmp_path / "a.txt").write_text("First. ")
    assert needle.read_haystack(tmp_path) == "First. Second."
    assert needle.read_haystack(tmp_path / "b.txt") == "Second."
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty has no \*\.txt files"):
        needle.read_haystack(tmp_path / "empty")


def assert_no_repeat_no_needle(name: str, essays: int, sentences: int) -> str:
    """What ``tasks/data/README.md`` says of a project-written haystack: ``essays`` titled
    essays, more than ``sentences`` sentences of more than five words and none twice, plain
    ASCII without digits, no needle's phrase or distinctive word, no paragraph of another
    built-in haystack."""
    text = needle.read_haystack(name)
    paragraphs = text.strip().split("\n\n")
    titles = [p for p in paragraphs if not p.endswith(".")]
    assert len(titles) == essays and all(len(t) < 60 and "\n" not in t for t in titles)
    said = [s for s in re.split(r"(?<=\.)\s+", text) if len(s.split()) > 5]
    assert len(said) > sentences and len(set(said)) == len(said)
    assert text.isascii() and not re.search(r"[0-9]", text)
    lower = text.lower()
    for n in (*needle.SEAL_NEEDLES, needle.SAN_FRANCISCO):
        assert n.key.lower() not in lower and n.text.lower() not in lower
    for word in ("oak", "chandelier", "bookshelf", "piano", "tapestry", "grandfather clock",
                 "stained glass", "san francisco", "sandwich", "dolores park"):  # fmt: skip
        assert not re.search(rf"\b{word}\b", lower), word
    for other in needle.HAYSTACKS.keys() - {name}:
        assert not set(needle.read_haystack(other).split("\n\n")) & set(paragraphs), other
    return text


def test_the_long_haystack_never_repeats_and_holds_no_needle():
    assert_no_repeat_no_needle("long", essays=30, sentences=700)


def test_the_organism_haystack_is_in_its_vocabulary_and_long_enough_for_its_gallery():
    """The organism's own haystack: the long one's checks, every token known to its
    word-level tokenizer, and its gallery's longest needle context (Fig. 6's 4,000 tokens,
    ``figures/organism``) made without repeating it."""
    from interp_seal.figures.sizes import preset_sizes
    from interp_seal.models import load_model

    text = assert_no_repeat_no_needle("organism", essays=9, sentences=240)
    tok = load_model("organism").tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 4502 and tok.unk_token_id not in ids
    sizes = preset_sizes("organism")
    assert (sizes.haystack, sizes.haystack_repeat) == ("organism", False)
    cfg = needle.NeedleConfig(context_lengths=(4000,), depths=(0, 100), haystack=text)
    samples = needle.generate(cfg, tok)
    assert [x.meta["context_length"] for x in samples] == [4000, 4000]
    assert all(x.prompt.count("On Reading Slowly") == 1 for x in samples)  # read once
    with pytest.raises(ValueError, match="repeat=True"):
        needle.generate(dataclasses.replace(cfg, context_lengths=(5000,)), tok)


# ---------------------------------------------------------------------------------------------
# synthetic multi-document QA


@pytest.mark.parametrize("hops", [1, 2])
def test_synthetic_passages(hops):
    cfg = passages.PassagesConfig(num_passages=7, hops=hops)
    samples = passages.generate(cfg, 20, seed=1)
    assert samples == passages.generate(cfg, 20, seed=1)
    assert samples != passages.generate(cfg, 20, seed=2)
    for i, s in enumerate(samples):
        blocks = [s.prompt[a:b] for a, b in s.passages]
        assert [b.split("\n")[0] for b in blocks] == [f"Passage {k}:" for k in range(1, 8)]
        assert len(s.golden) == hops
        answer = s.meta["answers"][0]
        assert s.answer == " " + answer and s.meta["answers"] == [answer]
        assert s.meta["_id"] == f"synthetic_mdqa-1-{i}"
        assert s.prompt.endswith(f"\n\nQuestion: {s.meta['input']}\nAnswer:")
        start, end = s.meta["context_span"]
        assert s.prompt == longbench.PROMPT.replace("{context}", s.prompt[start:end]).replace(
            "{input}", s.meta["input"]
        )
        golden_text = [blocks[g] for g in s.golden]
        if hops == 1:
            assert answer in golden_text[0]
            assert golden_text[0].split("\n")[1] in s.meta["input"]  # the title
        else:
            # the person's passage names the country whose passage holds the answer
            person, country = sorted(golden_text, key=lambda b: "small country" in b)
            assert person.split("\n")[1] in s.meta["input"]
            assert country.split("\n")[1] in person
            assert answer in country and answer not in person
            distractors = [b for k, b in enumerate(blocks) if k not in s.golden]
            assert not any(f"is {answer}." in b for b in distractors)


def test_synthetic_two_hop_sample_is_exact():
    cfg = passages.PassagesConfig(num_passages=3, hops=2, filler_sentences=1)
    (s,) = passages.generate(cfg, 1, seed=0)
    start, _ = s.meta["context_span"]
    assert s.prompt[start:] == (
        "Passage 1:\nSormor\nSormor is a small country on the northern coast of the Ganthu Sea. "
        "The capital of Sormor is Casvel. The official language of Sormor is Olvisese. Its "
        "markets are busiest in the early morning.\n"
        "Passage 2:\nEkol Thuno\nEkol Thuno was born in Penma in 1889. The occupation of Ekol "
        "Thuno is potter. Several short biographies have been written, though none is considered "
        "complete.\n"
        "Passage 3:\nPenma\nPenma is a small country on the northern coast of the Penbel Sea. "
        "The capital of Penma is Thuzan. The official language of Penma is Lidorese. Visitors "
        "often remark on the narrow streets and the quiet harbors.\n\nAnswer the question based "
        "on the given passages. Only give me the answer and do not output any other words.\n\n"
        "Question: What is the official language of the country where Ekol Thuno was born?\n"
        "Answer:"
    )
    assert (s.golden, s.answer, s.meta["answers"]) == ((1, 2), " Lidorese", ["Lidorese"])
    # passage token spans decode to the passage blocks
    tok = build_tokenizer([s.prompt + s.answer])
    enc = s.encode(tok)
    assert [tok.decode(enc.input_ids[a:b]) for a, b in enc.passages] == [
        s.prompt[a:b] for a, b in s.passages
    ]


def test_passages_config_validation():
    with pytest.raises(ValueError, match="hops must be 1 or 2"):
        passages.PassagesConfig(hops=3)
    with pytest.raises(ValueError, match=r"num_passages must be in 2\.\.200"):
        passages.PassagesConfig(num_passages=1)


# ---------------------------------------------------------------------------------------------
# LongBench loader

LONGBENCH_RECORDS = [
    {
        "input": "Which river flows through Alpha?",
        "context": (
            "Passage 1:\nAlpha\nAlpha is a town.\nIt lies on the Gamma river.\n"
            "Passage 2:\nBeta\nBeta is a village.\nPassage 3:\nGamma\nGamma is a river."
        ),
        "answers": ["Gamma", "the Gamma river"],
        "length": 22,
        "dataset": "hotpotqa",
        "language": "en",
        "all_classes": None,
        "_id": "q1",
    },
    {
        "input": "Who founded Delta?",
        "context": "Passage 1:\nDelta\nDelta was founded by Ann.\n\nPassage 2:\nEpsilon\nEpsilon.",
        "answers": ["Ann"],
        "length": 10,
        "dataset": "2wikimqa",
        "language": "en",
        "all_classes": None,
        "_id": "q2",
    },
]


def _write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_load_longbench_with_golden_files(tmp_path, capsys):
    data = _write_lines(tmp_path / "hotpotqa.jsonl", LONGBENCH_RECORDS)
    golden_json = tmp_path / "golden.json"
    golden_json.write_text(json.dumps({"q1": [2, 0], "q2": [0]}))
    golden_jsonl = _write_lines(
        tmp_path / "golden.jsonl", [{"_id": "q1", "golden": [0, 2]}, {"_id": "q2", "golden": [0]}]
    )
    first, second = jsonl.load_longbench(data, golden_json)
    assert jsonl.load_longbench(data, golden_jsonl) == [first, second]
    assert [first.prompt[a:b] for a, b in first.passages] == [
        "Passage 1:\nAlpha\nAlpha is a town.\nIt lies on the Gamma river.",
        "Passage 2:\nBeta\nBeta is a village.",
        "Passage 3:\nGamma\nGamma is a river.",
    ]
    assert [second.prompt[a:b] for a, b in second.passages] == [
        "Passage 1:\nDelta\nDelta was founded by Ann.",
        "Passage 2:\nEpsilon\nEpsilon.",
    ]
    assert first.golden == (0, 2) and second.golden == (0,)
    assert first.answer == " Gamma"
    assert first.meta["answers"] == ["Gamma", "the Gamma river"]
    assert first.meta["dataset"] == "hotpotqa" and first.meta["_id"] == "q1"
    assert first.prompt == longbench.PROMPT.replace(
        "{context}", LONGBENCH_RECORDS[0]["context"]
    ).replace("{input}", "Which river flows through Alpha?")
    assert main(["tasks", "show", str(data), "--golden", str(golden_json)]) == 0
    assert "  golden passages per sample: 1 x 1, 2 x 1\n" in capsys.readouterr().out
    no_answer = _write_lines(tmp_path / "no_answer.jsonl", [dict(LONGBENCH_RECORDS[0], answers=[])])
    with pytest.raises(ValueError, match=r"no_answer\.jsonl:1: field 'answers': no gold answer"):
        jsonl.load_longbench(no_answer)
    # without golden ids the file still loads, and writes back field for field
    plain = jsonl.load_longbench(data)
    assert [s.golden for s in plain] == [(), ()]
    jsonl.write_samples(tmp_path / "out.jsonl", plain)
    assert [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()] == (
        LONGBENCH_RECORDS
    )


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ("Alpha is a town.", "field 'context': no 'Passage N:' blocks found"),
        ("Intro.\nPassage 1:\nA\nB", "field 'context': text before the first"),
        ("Passage 1:\nA\nB\nPassage 3:\nC\nD", r"field 'context': Passage 2 is missing"),
        (
            "Passage 1:\nA\nB\nPassage 2:\n\nPassage 3:\nC\nD",
            r"field 'context': Passage 2 is empty",
        ),
        ("Passage 1:\nA\nB\nPassage 2:", r"field 'context': Passage 2 is empty"),
    ],
)
def test_longbench_context_errors(tmp_path, context, message):
    bad = dict(LONGBENCH_RECORDS[1], context=context)
    path = _write_lines(tmp_path / "bad.jsonl", [LONGBENCH_RECORDS[0], bad])
    with pytest.raises(ValueError, match=rf"bad\.jsonl:2: {message}"):
        jsonl.load_longbench(path)


def test_longbench_golden_errors(tmp_path):
    data = _write_lines(tmp_path / "lb.jsonl", LONGBENCH_RECORDS)
    out_of_range = tmp_path / "g1.json"
    out_of_range.write_text(json.dumps({"q1": [0], "q2": [0, 2]}))
    with pytest.raises(
        ValueError,
        match=r"lb\.jsonl:2: record .q2.: golden passage ids \[2\] are out of range: the sample has 2 passages",
    ):
        jsonl.load_longbench(data, out_of_range)
    repeated = tmp_path / "g0.json"
    repeated.write_text(json.dumps({"q1": [1, 1], "q2": [0]}))
    with pytest.raises(
        ValueError, match=r"lb\.jsonl:1: record .q1.: golden passage ids \[1, 1\] repeat"
    ):
        jsonl.load_longbench(data, repeated)
    missing = tmp_path / "g2.json"
    missing.write_text(json.dumps({"q1": [0]}))
    with pytest.raises(
        ValueError, match=r"lb\.jsonl:2: field '_id': 'q2' is not in the golden-id file"
    ):
        jsonl.load_longbench(data, missing)
    wrong_type = tmp_path / "g3.json"
    wrong_type.write_text(json.dumps({"q1": [0], "q2": "0"}))
    with pytest.raises(ValueError, match=r"g3\.json: field 'q2' must be a list of integers"):
        jsonl.read_golden(wrong_type)
    duplicated = _write_lines(
        tmp_path / "g4.jsonl", [{"_id": "q1", "golden": [0]}, {"_id": "q1", "golden": [1]}]
    )
    with pytest.raises(ValueError, match=r"g4\.jsonl:2: field '_id': 'q1' appears twice"):
        jsonl.read_golden(duplicated)
    broken = tmp_path / "g5.json"
    broken.write_text('{"q1": [0],\n "q2": [0')
    with pytest.raises(ValueError, match=r"g5\.json: not valid JSON \(.*line 2, column 10\)"):
        jsonl.read_golden(broken)


# ---------------------------------------------------------------------------------------------
# JSONL round trips and errors


@pytest.mark.parametrize("force_prefix", [True, False])
def test_line_retrieval_jsonl_round_trip(tmp_path, force_prefix):
    cfg = line_retrieval.LineRetrievalConfig(num_lines=5, force_prefix=force_prefix)
    samples = line_retrieval.generate(cfg, 3, seed=7)
    path = tmp_path / "lines.jsonl"
    jsonl.write_samples(path, samples)
    assert jsonl.read_samples(path) == samples
    record = json.loads(path.read_text().splitlines()[0])
    idx, value = record["random_idx"][0], record["expected_number"]
    assert record["prompt"].endswith(f"in line {idx}? I need the number.")
    assert record["correct_line"] == f"line {idx}: REGISTER_CONTENT is <{value}>\n"
    if force_prefix:
        assert record["answer_prefix"] == f"\nThe <REGISTER_CONTENT> in line {idx} is"
        assert record["answer"] == f" {value}."
    else:
        assert record["answer_prefix"] == ""
        assert record["answer"] == f"The <REGISTER_CONTENT> in line {idx} is {value}."


def test_longchat_native_file_reads_with_seal_answer(tmp_path):
    # a LongChat test case as generate_testcases.py writes it (3 lines, extra fields kept)
    prompt = (
        line_retrieval.HEADER
        + "line torpid-kid: REGISTER_CONTENT is <2416>\n"
        + "line brave-lamb: REGISTER_CONTENT is <77>\n"
        + "line odd-owl: REGISTER_CONTENT is <5>\n"
        + "\nNow the record is over. Tell me what is the <REGISTER_CONTENT> in line brave-lamb? "
        + "I need the number."
    )
    native = {
        "random_idx": ["brave-lamb", 1],
        "expected_number": 77,
        "num_lines": 3,
        "token_size": 120,
        "correct_line": "line brave-lamb: REGISTER_CONTENT is <77>\n",
        "prompt": prompt,
        "prompt_length": -1,
    }
    path = _write_lines(tmp_path / "3_lines.jsonl", [native])
    (read,) = jsonl.read_samples(path)
    assert read.prompt == prompt + "\nThe <REGISTER_CONTENT> in line brave-lamb is"
    assert read.answer == " 77."
    assert read.meta == {
        "random_idx": ["brave-lamb", 1],
        "expected_number": 77,
        "num_lines": 3,
        "correct_line": "line brave-lamb: REGISTER_CONTENT is <77>",
        "force_prefix": True,
    }
    jsonl.write_samples(tmp_path / "ours.jsonl", [read])
    written = json.loads((tmp_path / "ours.jsonl").read_text())
    assert written == {
        **{k: v for k, v in native.items() if k not in ("token_size", "prompt_length")},
        "answer": " 77.",
        "answer_prefix": "\nThe <REGISTER_CONTENT> in line brave-lamb is",
    }


def test_needle_and_passages_jsonl_round_trip(tmp_path, tiny_needle_tok):
    cfg = needle.NeedleConfig(
        context_lengths=(17,),
        depths=(0, 50),
        needles=(TINY_NEEDLE,),
        haystack=TINY_HAYSTACK,
        buffer=0,
    )
    needles = needle.generate(cfg, tiny_needle_tok)
    jsonl.write_samples(tmp_path / "niah.jsonl", needles)
    assert jsonl.read_samples(tmp_path / "niah.jsonl") == needles
    record = json.loads((tmp_path / "niah.jsonl").read_text().splitlines()[1])
    assert record["needle"] == "The key is here." and record["needle_id"] == "n"
    assert record["prompt"][slice(*record["needle_span"])] == "The key is here."
    assert (record["depth_percent"], record["context_length"]) == (50, 17)

    mdqa = passages.generate(passages.PassagesConfig(num_passages=4, hops=2), 3, seed=0)
    jsonl.write_samples(tmp_path / "mdqa.jsonl", mdqa)
    assert jsonl.read_samples(tmp_path / "mdqa.jsonl") == mdqa
    assert json.loads((tmp_path / "mdqa.jsonl").read_text().splitlines()[0])["golden"] == list(
        mdqa[0].golden
    )
    with pytest.raises(ValueError, match=r"one task per file, got \['needle', 'passages'\]"):
        jsonl.write_samples(tmp_path / "mixed.jsonl", [*needles, *mdqa])


def _line_record():
    sample = line_retrieval.generate(line_retrieval.LineRetrievalConfig(num_lines=2), 1, seed=0)[0]
    return jsonl.FORMATS["line_retrieval"].to_record(sample)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("expected_number"), "missing field 'expected_number'"),
        (lambda r: r.update(expected_number="12"), "field 'expected_number' must be an integer"),
        (lambda r: r.update(num_lines=True), "field 'num_lines' must be an integer"),
        (
            lambda r: r.update(random_idx=["a"]),
            r"field 'random_idx' must be a \[line index, line number\] pair",
        ),
        (lambda r: r.update(answer=3), "field 'answer' must be a string"),
    ],
)
def test_malformed_line_retrieval_records(tmp_path, edit, message):
    bad = _line_record()
    edit(bad)
    path = _write_lines(tmp_path / "bad.jsonl", [_line_record(), _line_record(), bad])
    with pytest.raises(ValueError, match=rf"bad\.jsonl:3: {message}"):
        jsonl.read_samples(path)


def test_malformed_files(tmp_path, tiny_needle_tok):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(_line_record()) + "\n\n{not json\n")
    with pytest.raises(ValueError, match=r"broken\.jsonl:3: not valid JSON \(.*column 2\)"):
        jsonl.read_samples(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"broken\.jsonl:1: expected a JSON object, got list"):
        jsonl.read_samples(path)
    path.write_text('{"foo": 1}\n')
    with pytest.raises(
        ValueError, match=r"broken\.jsonl:1: cannot tell the task: no field 'expected_number'"
    ):
        jsonl.read_samples(path)
    with pytest.raises(ValueError, match="unknown task 'qa'"):
        jsonl.read_samples(path, task="qa")

    cfg = needle.NeedleConfig(
        context_lengths=(17,),
        depths=(50,),
        needles=(TINY_NEEDLE,),
        haystack=TINY_HAYSTACK,
        buffer=0,
    )
    record = jsonl.FORMATS["needle"].to_record(needle.generate(cfg, tiny_needle_tok)[0])
    record["needle_span"] = [record["needle_span"][0] + 1, record["needle_span"][1] + 1]
    _write_lines(path, [record])
    with pytest.raises(
        ValueError, match=r"broken\.jsonl:1: field 'needle_span': prompt\[\d+:\d+\] is"
    ):
        jsonl.read_samples(path)
    record["depth_percent"] = "50"
    _write_lines(path, [record])
    with pytest.raises(
        ValueError, match=r"broken\.jsonl:1: field 'depth_percent' must be a number"
    ):
        jsonl.read_samples(path)
    _write_lines(path, [_line_record()])
    with pytest.raises(
        ValueError, match=r"broken\.jsonl:1: golden passage ids given for a line_retrieval file"
    ):
        jsonl.read_samples(path, golden={})


def test_sample_round_trip_keeps_types(tmp_path):
    (s,) = passages.generate(passages.PassagesConfig(num_passages=3), 1, seed=5)
    jsonl.write_samples(tmp_path / "p.jsonl", [s])
    (read,) = jsonl.read_samples(tmp_path / "p.jsonl")
    assert isinstance(read, Sample)
    assert read.passages == s.passages and isinstance(read.passages[0], tuple)
    assert read.meta["context_span"] == s.meta["context_span"]


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_generate_and_show(tmp_path, capsys):
    lines = tmp_path / "lines.jsonl"
    assert (
        main(
            [
                "tasks",
                "generate",
                "--task",
                "line_retrieval",
                "--num-lines",
                "6",
                "--n",
                "3",
                "--seed",
                "2",
                "--out",
                str(lines),
            ]
        )
        == 0
    )
    cfg = line_retrieval.LineRetrievalConfig(num_lines=6)
    assert jsonl.read_samples(lines) == line_retrieval.generate(cfg, 3, seed=2)

    mdqa = tmp_path / "mdqa.jsonl"
    assert (
        main(
            [
                "tasks",
                "generate",
                "--task",
                "passages",
                "--num-passages",
                "5",
                "--hops",
                "2",
                "--n",
                "4",
                "--out",
                str(mdqa),
            ]
        )
        == 0
    )
    cfg = passages.PassagesConfig(num_passages=5, hops=2)
    assert jsonl.read_samples(mdqa) == passages.generate(cfg, 4, seed=0)

    sf = needle.SAN_FRANCISCO
    tok_dir = tmp_path / "tok"
    build_tokenizer([TINY_HAYSTACK, f" {sf.text}", sf.question, needle.PROMPT]).save_pretrained(
        tok_dir
    )
    haystack = tmp_path / "hay.txt"
    haystack.write_text(TINY_HAYSTACK)
    niah = tmp_path / "niah.jsonl"
    assert (
        main(
            [
                "tasks",
                "generate",
                "--task",
                "needle",
                "--tokenizer",
                str(tok_dir),
                "--needles",
                "san_francisco",
                "--haystack",
                str(haystack),
                "--lengths",
                "30",
                "34",
                "--depths",
                "0:100:3",
                "--buffer",
                "0",
                "--out",
                str(niah),
            ]
        )
        == 0
    )
    written = jsonl.read_samples(niah)
    assert [(s.meta["context_length"], s.meta["depth_percent"]) for s in written] == [
        (30, 0),
        (30, 50),
        (30, 100),
        (34, 0),
        (34, 50),
        (34, 100),
    ]
    # 30 - 22 needle tokens = 8 haystack tokens; depth 50 -> token 4, right after "cc."
    assert written[1].prompt == (
        f"This is a very long story book: <book> Aa bb cc. {sf.text} Dd ee ff gg </book>.\n"
        f"Based on the content of the book, Question: {sf.question}\nAnswer:"
    )
    capsys.readouterr()

    assert main(["tasks", "show", str(niah)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "  6 needle samples",
        f"  prompt characters: min {min(len(s.prompt) for s in written)}, mean "
        f"{sum(len(s.prompt) for s in written) / 6:.0f}, max {max(len(s.prompt) for s in written)}",
        "  context lengths: 30 x 3, 34 x 3",
        "  depths: 0 x 2, 50 x 2, 100 x 2",
        "  needles: san_francisco x 6",
        "  first answer: ' The best thing to do in San Francisco is eat a sandwich and sit in "
        "Dolores Park on a sunny day.'",
    ]
    assert main(["tasks", "show", str(mdqa)]) == 0
    out = capsys.readouterr().out
    assert "  4 passages samples\n" in out
    assert "  passages per sample: 5 x 4\n  golden passages per sample: 2 x 4\n" in out
    assert main(["tasks", "show", str(lines)]) == 0
    assert "  num_lines: 6 x 3\n" in capsys.readouterr().out


def test_cli_errors(tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    assert (
        main(["tasks", "generate", "--task", "needle", "--lengths", "100", "--out", str(out)]) == 2
    )
    assert "--task needle needs --tokenizer and --lengths" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"expected_number": 1}\n')
    assert main(["tasks", "show", str(bad)]) == 2
    assert "bad.jsonl:1: missing field 'random_idx'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tasks", "generate", "--task", "needle", "--lengths", "1:2", "--out", str(out)])
    assert "invalid grid value: '1:2'" in capsys.readouterr().err


def test_needle_task_measured_by_the_organisms_tokenizer(tmp_path, capsys):
    """``--tokenizer organism`` is the bundled model's tokenizer, as ``--model organism`` is."""
    from interp_seal.cli import main
    from interp_seal.models import load_model

    out = tmp_path / "niah.jsonl"
    argv = ["tasks", "generate", "--task", "needle", "--tokenizer", "organism", "--lengths", "300"]
    assert main([*argv, "--depths", "0", "100", "--out", str(out)]) == 0
    cfg = needle.NeedleConfig(context_lengths=(300,), depths=(0, 100))
    expected = needle.generate(cfg, load_model("organism").tokenizer, 1, 0)
    assert [s.prompt for s in jsonl.read_samples(out)] == [s.prompt for s in expected]
    # the short built-in haystack is refused past its length, unless repetition is asked for
    short = [*argv[:-1], "3000", "--haystack", "essays", "--out", str(tmp_path / "long.jsonl")]
    assert main(short) == 2
    assert "a 3000-token context needs" in capsys.readouterr().err
    assert main([*short, "--repeat-haystack"]) == 0
    (x,) = {s.prompt.count("On Keeping a Notebook") for s in jsonl.read_samples(short[-1])}
    assert x >= 3
