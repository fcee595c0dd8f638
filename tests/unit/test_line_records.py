"""The LongEval format is parsed and corrupted in one place (``tasks.line_retrieval``)."""

from __future__ import annotations

import random

import pytest

from interp_seal.tasks.line_retrieval import (
    LineRetrievalConfig,
    corruptions,
    generate,
    parse_record,
    render,
)


def test_parse_record_reads_back_what_render_wrote():
    sample = render(["Well known-São Paulo", "tiny-cat"], [123, 45041], 1)
    lines = parse_record(sample.prompt)
    assert [(x.index, x.value) for x in lines] == [
        ("Well known-São Paulo", 123),
        ("tiny-cat", 45041),
    ]
    assert (
        sample.prompt[lines[1].start : lines[1].end] == "line tiny-cat: REGISTER_CONTENT is <45041>"
    )
    assert sample.meta["correct_line"] == "line tiny-cat: REGISTER_CONTENT is <45041>"
    assert sample.meta["random_idx"] == ["tiny-cat", 1] and sample.answer == " 45041."


@pytest.mark.parametrize("style", ["adjective-noun", "integers", "letters"])
def test_corruptions_change_exactly_one_detail(style):
    sample = generate(LineRetrievalConfig(num_lines=6, index_style=style), 1, seed=2)[0]
    assert (
        render(
            [int(x.index) if style == "integers" else x.index for x in parse_record(sample.prompt)],
            [x.value for x in parse_record(sample.prompt)],
            sample.meta["random_idx"][1],
            index_style=style,
        )
        == sample
    )  # rendering the parsed record reproduces the sample
    target = sample.meta["random_idx"][1]
    for other in corruptions(sample, "key", random.Random(0)):
        assert parse_record(other.prompt) == parse_record(sample.prompt)  # same record
        assert other.meta["random_idx"][1] != target
        assert other.meta["expected_number"] != sample.meta["expected_number"]
    values = [x.value for x in parse_record(sample.prompt)]
    changed = corruptions(sample, "value", random.Random(0))
    assert len(changed) == 8  # every other first digit
    for other in changed:
        new = [x.value for x in parse_record(other.prompt)]
        assert [i for i, (a, b) in enumerate(zip(values, new, strict=True)) if a != b] == [target]
        assert str(new[target])[1:] == str(values[target])[1:]
        assert (
            other.answer == f" {new[target]}."
            and other.meta["random_idx"] == sample.meta["random_idx"]
        )
    with pytest.raises(ValueError, match="unknown corruption 'both'"):
        corruptions(sample, "both", random.Random(0))
