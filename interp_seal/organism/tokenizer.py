"""A word-level tokenizer whose decode reproduces the text exactly.

The model organism uses one token per word (with its leading space), one token per digit and
one per punctuation mark, so retrieval circuits are easy to read: a line index such as
``happy-tiger`` is a single token and every digit of a value is its own token. Pieces come
from a regex pre-tokenizer; the vocabulary is every piece seen in a corpus (plus all line
indices and digits); decoding concatenates pieces, so ``decode(encode(text)) == text`` for
in-vocabulary text. Unknown pieces map to ``[UNK]``.

Words that are not in the vocabulary can instead be split into *subwords* (``subwords=...``):
the model becomes a WordPiece model whose continuation pieces carry a ``##`` prefix (``" Kalo"``
+ ``"##mi"``), greedily longest-first, with single letters as the fallback, and the decoder
removes the prefix before concatenating. The organism v2 uses this for the made-up names of
``interp_seal.tasks.passages`` (tens of thousands of syllable combinations, too many for one
row each); every real word stays one token.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIALS = ("[PAD]", "[UNK]", "<s>", "</s>")
CONTINUE = "##"  # prefix of WordPiece continuation pieces
# a word (letters, '_', '-' and "'" inside) or a digit or one other character, each with an
# optional leading space; newlines and runs of other whitespace stand alone
PIECE = r" ?[A-Za-z_][A-Za-z_'\-]*| ?[0-9]| ?[^\sA-Za-z0-9_]|\n|\s"


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Split(Regex(PIECE), behavior="isolated")


def pieces(text: str) -> list[str]:
    """The pre-tokenizer's pieces of ``text``."""
    return [p for p, _ in _pre_tokenizer().pre_tokenize_str(text)]


def build_tokenizer(
    corpus: Iterable[str], extra: Iterable[str] = (), subwords: Iterable[str] = ()
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer covering every piece of ``corpus`` plus ``extra`` pieces.

    ``extra`` adds pieces verbatim (e.g. ``" happy-tiger"``); digits with and without a
    leading space are always included. The tokenizer prepends ``<s>``. Non-empty ``subwords``
    (continuation pieces such as ``"lo"``) make it a WordPiece model: a word missing from the
    vocabulary is split greedily into a first piece and ``"##"``-prefixed continuations, with
    every ASCII letter (alone, with a leading space, and as a continuation) as the fallback.
    Ids are given in order (specials, digits, ``extra``, corpus pieces, then subwords), so a
    grown corpus keeps the ids of an earlier one.
    """
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIALS)}

    def add(piece: str) -> None:
        vocab.setdefault(piece, len(vocab))

    for d in "0123456789":
        add(d)
        add(" " + d)
    for piece in extra:
        add(piece)
    for text in corpus:
        for piece in pieces(text):
            add(piece)
    subwords = tuple(subwords)
    if subwords:
        letters = string.ascii_letters
        for piece in [*letters, *(" " + c for c in letters)]:
            add(piece)
        for piece in [*subwords, *letters]:
            add(CONTINUE + piece)
        model = models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)
        decoder = decoders.Sequence([decoders.Replace(CONTINUE, ""), decoders.Fuse()])
    else:
        model, decoder = models.WordLevel(vocab=vocab, unk_token="[UNK]"), decoders.Fuse()
    tok = Tokenizer(model)
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoder
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="[UNK]",
        pad_token="[PAD]",
    )
