"""A word-level tokenizer whose decode reproduces the text exactly.

The model organism uses one token per word (with its leading space), one token per digit and
one per punctuation mark, so retrieval circuits are easy to read: a line index such as
``happy-tiger`` is a single token and every digit of a value is its own token. Pieces come
from a regex pre-tokenizer; the vocabulary is every piece seen in a corpus (plus all line
indices and digits); decoding concatenates pieces, so ``decode(encode(text)) == text`` for
in-vocabulary text. Unknown pieces map to ``[UNK]``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIALS = ("[PAD]", "[UNK]", "<s>", "</s>")
# a word (letters, '_', '-' and "'" inside) or a digit or one other character, each with an
# optional leading space; newlines and runs of other whitespace stand alone
PIECE = r" ?[A-Za-z_][A-Za-z_'\-]*| ?[0-9]| ?[^\sA-Za-z0-9_]|\n|\s"


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Split(Regex(PIECE), behavior="isolated")


def pieces(text: str) -> list[str]:
    """The pre-tokenizer's pieces of ``text``."""
    return [p for p, _ in _pre_tokenizer().pre_tokenize_str(text)]


def build_tokenizer(corpus: Iterable[str], extra: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """A word-level tokenizer covering every piece of ``corpus`` plus ``extra`` pieces.

    ``extra`` adds pieces verbatim (e.g. ``" happy-tiger"``); digits with and without a
    leading space are always included. The tokenizer prepends ``<s>``.
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
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.Fuse()
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
