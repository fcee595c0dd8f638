"""LongChat's LongEval test files: every index style generated and read as LongChat does.

``longchat_file`` below is a direct reimplementation of LongChat's record layout
(``generate_testcases.py`` with ``generate_line_index``), written from the facts in docs/design.md
Sec. 5 and independent of ``interp_seal.tasks``. Its random draws (uuid4, wonderwords) are
taken from a ``random.Random`` instead, so that with the same draws the two files must be
byte-identical, and with different draws identical once the draws are masked.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import uuid

import pytest

from interp_seal.tasks import jsonl, line_retrieval
from interp_seal.tasks.line_retrieval import LineRetrievalConfig

LONGCHAT_HEADER = (
    "Below is a record of lines I want you to remember. Each line begins with 'line <line "
    "index>' and contains a '<REGISTER_CONTENT>' at the end of the line as a numerical value. "
    "For each line index, memorize its corresponding <REGISTER_CONTENT>. At the end of the "
    "record, I will ask you to retrieve the corresponding <REGISTER_CONTENT> of a certain line "
    "index. Now the record start:\n\n"
)
# LongChat's option names for our index styles
LONGCHAT_OPTION = {
    "integers": "LRT",
    "letters": "LRT-ABCindex",
    "uuid": "LRT-UUID",
    "adjective-noun": "LRT-NL",
}


def longchat_file(option: str, n: int, count: int, rng: random.Random, words=None) -> str:
    """LongChat's ``{n}_lines.jsonl`` text, its random draws taken from ``rng``."""
    out = []
    for _ in range(count):
        if option == "LRT":
            indices = list(range(1, n + 1))
        elif option == "LRT-ABCindex":
            width = 6
            combos = list(itertools.product(["A", "B", "C", "D", "E", "F"], repeat=width))
            while len(combos) < n:
                width += 1
                combos = list(itertools.product(["A", "B", "C", "D", "E", "F"], repeat=width))
            indices = ["".join(c) for c in combos][:n]
        elif option == "LRT-UUID":
            indices = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]
        else:  # LRT-NL: n adjectives and n nouns, each list without repeats
            adjectives, nouns = words
            indices = [
                f"{a}-{b}"
                for a, b in zip(rng.sample(adjectives, n), rng.sample(nouns, n), strict=True)
            ]
        lines = [f"line {i}: REGISTER_CONTENT is <{rng.randint(1, 50000)}>\n" for i in indices]
        if option == "LRT":
            random_idx = rng.randint(1, n)
            random_num = random_idx - 1
        else:
            random_num = rng.randint(0, len(indices) - 1)
            random_idx = indices[random_num]
        correct_line = lines[random_num]
        expected_number = int(re.search(r"<\d+>", correct_line).group()[1:-1])
        prompt = LONGCHAT_HEADER + "".join(lines)
        prompt += (
            "\nNow the record is over. Tell me what is the <REGISTER_CONTENT> in line "
            f"{random_idx}? I need the number."
        )
        output = {
            "random_idx": (random_idx, random_num),
            "expected_number": expected_number,
            "num_lines": n,
            "correct_line": correct_line,
            "prompt": prompt,
        }
        out.append(json.dumps(output) + "\n")
    return "".join(out)


def ours(tmp_path, style: str, n: int, count: int, seed: int) -> str:
    samples = line_retrieval.generate(
        LineRetrievalConfig.longchat(n, index_style=style), count, seed
    )
    path = tmp_path / f"{style}_{n}_lines.jsonl"
    jsonl.write_longchat(path, samples)
    return path.read_text(encoding="utf-8")


def our_rng(style: str, n: int, seed: int) -> random.Random:
    return random.Random(f"line_retrieval/{seed}/{n}/{style}")  # generate()'s seeding


@pytest.mark.parametrize("style", list(LONGCHAT_OPTION))
@pytest.mark.parametrize("n", [1, 7, 60])
def test_same_draws_give_longchats_file_byte_for_byte(tmp_path, style, n):
    rng = our_rng(style, n, seed=3)
    theirs = longchat_file(LONGCHAT_OPTION[style], n, 4, rng, line_retrieval.longchat_words())
    assert ours(tmp_path, style, n, 4, seed=3) == theirs


def _mask(text: str) -> list[dict]:
    """Records with every random draw (line indices, values, the queried line) masked."""
    masked = []
    for line in text.splitlines():
        record = json.loads(line)
        idx, number = record["random_idx"]
        indices = re.findall(r"^line (.+): REGISTER_CONTENT is <\d+>$", record["prompt"], re.M)
        prompt = record["prompt"]
        for i, index in enumerate(indices):
            prompt = prompt.replace(f"line {index}: ", f"line <I{i}>: ", 1)
        prompt = re.sub(r"<\d+>\n", "<V>\n", prompt)
        prompt = prompt.replace(f"in line {idx}?", "in line <Q>?")
        masked.append(
            {
                "keys": list(record),
                "random_idx": [type(idx).__name__, type(number).__name__],
                "expected_number": type(record["expected_number"]).__name__,
                "num_lines": record["num_lines"],
                "correct_line": re.sub(
                    r"<\d+>", "<V>", record["correct_line"].replace(f"line {idx}: ", "line <Q>: ")
                ),
                "prompt": prompt,
            }
        )
    return masked


@pytest.mark.parametrize("style", list(LONGCHAT_OPTION))
def test_other_draws_differ_only_in_the_draws(tmp_path, style):
    theirs = longchat_file(
        LONGCHAT_OPTION[style], 30, 3, random.Random(99), line_retrieval.longchat_words()
    )
    mine = ours(tmp_path, style, 30, 3, seed=0)
    assert mine != theirs
    assert _mask(mine) == _mask(theirs)


def test_index_styles_as_longchat_draws_them():
    rng = random.Random(0)
    integers = line_retrieval._indices(
        LineRetrievalConfig(num_lines=5, index_style="integers"), rng
    )
    assert integers == [1, 2, 3, 4, 5]
    letters = line_retrieval._indices(LineRetrievalConfig(num_lines=8, index_style="letters"), rng)
    assert letters[:3] == ["AAAAAA", "AAAAAB", "AAAAAC"] and letters[6:] == ["AAAABA", "AAAABB"]
    # past 6**6 lines LongChat takes the product 7 at a time: line 46657 is 6**6 in base 6
    many = LineRetrievalConfig(num_lines=6**6 + 1, index_style="letters")
    assert line_retrieval._indices(many, rng)[-1] == "BAAAAAA"
    uuids = line_retrieval._indices(LineRetrievalConfig(num_lines=50, index_style="uuid"), rng)
    assert all(uuid.UUID(u).version == 4 and str(uuid.UUID(u)) == u for u in uuids)
    assert len(set(uuids)) == 50


def test_longchat_vocabulary_and_draws_without_reuse():
    adjectives, nouns = line_retrieval.longchat_words()
    assert len(adjectives) == len(set(adjectives)) == 892
    assert len(nouns) == len(set(nouns)) == 837
    assert len(adjectives) * len(nouns) > 50 * 50
    for words in (adjectives, nouns):
        assert any(" " in w for w in words)  # multi-word
        assert any(w[0].isupper() for w in words)  # capitalised
        assert any(not w.isascii() for w in words)  # non-ASCII
        assert not any("-" in w or w != w.strip() for w in words)  # "adj-noun" splits once
    cfg = LineRetrievalConfig.longchat(837)
    (sample,) = line_retrieval.generate(cfg, 1, seed=1)
    pairs = [
        idx.split("-")
        for idx in re.findall(r"^line (.+): REGISTER_CONTENT is", sample.prompt, re.M)
    ]
    assert len(pairs) == 837
    assert len({a for a, _ in pairs}) == 837 and {a for a, _ in pairs} <= set(adjectives)
    assert {b for _, b in pairs} == set(nouns)  # every noun once
    assert "ice cream" in {b for _, b in pairs} and "São Paulo" in {b for _, b in pairs}
    with pytest.raises(ValueError, match="num_lines=838 exceeds the 837 adjective-noun indices"):
        LineRetrievalConfig.longchat(838)
    # the organism's compact vocabulary keeps drawing distinct pairs, words repeating
    assert LineRetrievalConfig(num_lines=2500).distinct_words is False


@pytest.mark.parametrize("style", list(LONGCHAT_OPTION))
def test_reads_longchat_files_in_every_style(tmp_path, style):
    text = longchat_file(
        LONGCHAT_OPTION[style], 12, 3, random.Random(5), line_retrieval.longchat_words()
    )
    path = tmp_path / "12_lines.jsonl"
    path.write_text(text, encoding="utf-8")
    samples = jsonl.read_samples(path)
    for sample, line in zip(samples, text.splitlines(), strict=True):
        record = json.loads(line)
        idx, number = record["random_idx"]
        assert isinstance(idx, int) == (style == "integers")
        assert sample.meta["random_idx"] == [idx, number]
        assert sample.prompt == record["prompt"] + f"\nThe <REGISTER_CONTENT> in line {idx} is"
        assert sample.answer == f" {record['expected_number']}."
        assert line_retrieval.score_output(sample.answer, sample.meta["expected_number"])
    jsonl.write_longchat(tmp_path / "again.jsonl", samples)
    assert (tmp_path / "again.jsonl").read_text(encoding="utf-8") == text


def test_published_files_extra_space_and_extra_fields(tmp_path):
    (record,) = [json.loads(x) for x in longchat_file("LRT", 3, 1, random.Random(1)).splitlines()]
    record["prompt"] += " "  # LongChat's published 200-680-line files
    record |= {"token_size": 99, "prompt_length": -1}
    path = tmp_path / "3_lines.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (sample,) = jsonl.read_samples(path)
    idx = record["random_idx"][0]
    assert sample.prompt == record["prompt"] + f"\nThe <REGISTER_CONTENT> in line {idx} is"
    assert record["prompt"].endswith(f"in line {idx}? I need the number. ")
    assert sample.answer == f" {record['expected_number']}."


def _records(n=6):
    text = longchat_file("LRT-NL", n, 2, random.Random(2), line_retrieval.longchat_words())
    return [json.loads(x) for x in text.splitlines()]


def _swap_line(record):
    """random_idx[1] points at another line than the queried one."""
    record["random_idx"][1] = (record["random_idx"][1] + 1) % record["num_lines"]


def _other_value(record):
    record["expected_number"] = record["expected_number"] % 50000 + 1


def _drop_line(record):
    """The prompt loses a line other than the queried one."""
    lines = record["prompt"].split("\n")
    first = next(i for i, x in enumerate(lines) if x.startswith("line "))
    del lines[first + (record["random_idx"][1] + 1) % record["num_lines"]]
    record["prompt"] = "\n".join(lines)


def _other_question(record):
    record["prompt"] = record["prompt"].replace(
        f"in line {record['random_idx'][0]}?", "in line nobody-home?"
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(random_idx=[1.5, 0]), "field 'random_idx' must be a"),
        (lambda r: r["random_idx"].__setitem__(1, 6), r"field 'random_idx': line number 6 is "),
        (_other_value, "field 'correct_line': .* is not .*, the line that random_idx and exp"),
        (_swap_line, r"field 'random_idx': line number \d, but correct_line is line \d of the"),
        (lambda r: r.update(num_lines=7), "field 'num_lines': 7, but the prompt has 6 "),
        (_other_question, "field 'prompt': the question asks for line 'nobody-home'"),
        (_drop_line, "field 'num_lines': 6, but the prompt has 5 "),
    ],
)
def test_wrong_field_names_file_line_and_field(tmp_path, edit, message):
    good, bad = _records()
    edit(bad)
    path = tmp_path / "6_lines.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=rf"6_lines\.jsonl:3: {message}"):
        jsonl.read_samples(path)


def test_prompt_line_that_disagrees_with_correct_line(tmp_path):
    (record, _) = _records()
    line = record["correct_line"]
    record["prompt"] = record["prompt"].replace(line, line.replace("<", "<1", 1))
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(
        ValueError, match=r"x\.jsonl:1: field 'prompt': no line of the prompt is correct_line"
    ):
        jsonl.read_samples(path)


def test_write_longchat_refuses_other_tasks_before_writing(tmp_path):
    from interp_seal.tasks import passages

    mdqa = passages.generate(passages.PassagesConfig(num_passages=3, hops=1), 1, seed=0)
    with pytest.raises(ValueError, match=r"line_retrieval samples only, got \['passages'\]"):
        jsonl.write_longchat(tmp_path / "x.jsonl", mdqa)
    assert not (tmp_path / "x.jsonl").exists()


def test_cli_generates_longchat_files(tmp_path, capsys):
    from interp_seal.cli import main

    out = tmp_path / "7_lines.jsonl"
    argv = [
        "tasks",
        "generate",
        "--task",
        "line_retrieval",
        "--longchat",
        "--index-style",
        "letters",
        "--num-lines",
        "7",
        "--n",
        "3",
        "--seed",
        "4",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    rng = our_rng("letters", 7, seed=4)
    assert out.read_text(encoding="utf-8") == longchat_file("LRT-ABCindex", 7, 3, rng)
    passages = out.with_name("passages.jsonl")
    assert main([*argv[:2], "--task", "passages", "--longchat", "--out", str(passages)]) == 2
    assert "--longchat writes LongChat's line_retrieval files, not passages" in (
        capsys.readouterr().err
    )
