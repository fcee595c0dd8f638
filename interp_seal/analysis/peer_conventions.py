"""The peers' code conventions for the two retrieval scores, beside the papers' definitions.

Run side by side with MuDAF's and Retrieval_Head's own code on the same token ids, the scoring
rules of ``interp_seal.analysis.retrieval_scores`` agree, but the numbers do not, for reasons of
definition. Each peer's convention is a named option (``convention=``) of the score's config;
the paper's definition stays the default.

**MuDAF's code (``convention="mudaf_code"`` of ``PassageScoreConfig``).** The paper (App. A.2)
sums the last token's attention over each passage. MuDAF's visualisation code cuts the prompt
at the ``Passage i:`` markers instead: passage ``i`` runs from its marker to the next marker,
so the separator newlines after a passage (where some heads park their attention) count for
it, and the last passage runs to the question (up to the text after the context:
``"Answer the question based on the given passages."``). Token boundaries are where the
characters start (the code counts ``len(tokenizer.encode(prompt[:marker]))``; the two agree
whenever tokenising a prefix does not merge across the cut). Its EM ranks only the passages
above the threshold (``em_attended_only``), so EM also needs every golden passage attended.

**Retrieval_Head's code (``convention="retrieval_head_code"`` of ``CopyPasteConfig``).** Wu et
al. define the needle by its position. The code (``retrieval_head_detection.py``) instead

- locates the needle as the first window of ``len(needle ids)`` prompt tokens whose distinct
  ids cover more than 90% of the needle's distinct ids (the needle tokenised on its own): an
  earlier stretch of text that shares enough of the needle's tokens is taken for it, and a
  needle whose tokens change next to the text around it may not be found at all;
- decodes up to 50 tokens and stops after a newline token (not at the answer's length; it
  does not check EOS, this library's decoding loop also stops there);
- averages a head's score only over samples whose answer recalls the needle: ROUGE-1 recall of
  the needle by the decoded text above 50%. Heads of a model that never answers score NaN.

ROUGE-1 recall here is rouge-score's: lowercase, runs of ``[a-z0-9]`` as tokens, clipped
unigram overlap over the needle's token count. The Retrieval_Head code turns on rouge-score's
Porter stemmer, which this module does not reproduce: a word matches only in the same form
(a needle copied verbatim, as the copy-paste score rewards, is unaffected).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

from jaxtyping import Int
from torch import Tensor

from interp_seal.tasks.sample import Encoded, Sample, Span

PASSAGE_CONVENTIONS = ("paper", "mudaf_code")
NEEDLE_CONVENTIONS = ("paper", "retrieval_head_code")
NEEDLE_COVERAGE = 0.9  # Retrieval_Head: a window must cover > 90% of the needle's distinct ids
DECODE_TOKENS = 50  # Retrieval_Head: tokens decoded per sample
ROUGE_RECALL = 0.5  # Retrieval_Head: samples kept when ROUGE-1 recall of the needle > 50%


def check_convention(convention: str, choices: Sequence[str]) -> None:
    """Refuse a convention name that is not in ``choices``."""
    if convention not in choices:
        raise ValueError(
            f"unknown convention {convention!r}; choose one of {tuple(choices)} ('paper' is the "
            "paper's definition, the others reproduce a peer's code)"
        )


def mudaf_code_spans(sample: Sample, tokenizer) -> tuple[Span, ...]:
    """Passage token spans as MuDAF's code cuts them: marker to next marker, last to question.

    The last passage ends where the text after it starts (the whitespace that follows it is
    its). A boundary at character ``c`` is the first token starting at or after ``c``.
    """
    if not sample.passages:
        raise ValueError(
            "the sample has no passages; passage retrieval scores need Sample.passages (the "
            "character spans of the passages in the prompt)"
        )
    prompt = sample.prompt
    end = sample.passages[-1][1]
    while end < len(prompt) and prompt[end].isspace():
        end += 1
    cuts = [start for start, _ in sample.passages] + [end]
    offsets = tokenizer(prompt, return_offsets_mapping=True)["offset_mapping"]

    def token_at(c: int) -> int:  # special tokens have empty offsets
        return next((i for i, (a, b) in enumerate(offsets) if b > a and a >= c), len(offsets))

    bounds = [token_at(c) for c in cuts]
    return tuple(zip(bounds[:-1], bounds[1:], strict=True))


def locate_needle(tokenizer, sample: Sample | Encoded, prompt_ids: Int[Tensor, " pos"]) -> Span:
    """Retrieval_Head's needle: the first window covering > 90% of the needle's distinct ids.

    The needle is ``sample``'s needle text tokenised on its own; the window is as long.
    """
    if not isinstance(sample, Sample) or sample.needle is None:
        raise ValueError(
            "the retrieval_head_code convention needs a Sample with a needle span (the needle "
            "text is tokenised on its own)"
        )
    needle_ids = tokenizer(sample.prompt[slice(*sample.needle)], add_special_tokens=False)
    needle_ids = [int(t) for t in needle_ids["input_ids"]]
    needle, width = set(needle_ids), len(needle_ids)
    if not needle:
        raise ValueError(
            f"the needle {sample.prompt[slice(*sample.needle)]!r} tokenises to nothing"
        )
    ids = [int(t) for t in prompt_ids]
    for start in range(len(ids)):
        if len(needle & set(ids[start : start + width])) / len(needle) > NEEDLE_COVERAGE:
            return start, start + width
    raise ValueError(
        "no window of the prompt covers more than 90% of the needle's distinct token ids "
        "(Retrieval_Head's rule); is the needle in the prompt?"
    )


def rouge_tokens(text: str) -> list[str]:
    """rouge-score's default tokens: lowercase runs of letters and digits."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def rouge1_recall(reference: str, candidate: str) -> float:
    """Unigram overlap (clipped counts) over the reference's token count (0 when empty)."""
    ref, cand = Counter(rouge_tokens(reference)), Counter(rouge_tokens(candidate))
    overlap = sum(min(count, cand[token]) for token, count in ref.items())
    return overlap / max(sum(ref.values()), 1)


def newline_stop(tokenizer) -> Callable[[int], bool]:
    """True for tokens whose text holds a newline (Retrieval_Head stops decoding after one)."""
    return lambda token: "\n" in tokenizer.decode([token])
