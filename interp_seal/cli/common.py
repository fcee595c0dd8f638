"""What every ``interp-seal`` command shares: argument types that reject bad values at parse time,
and the output check that runs before any command starts working.

Argument types (``type=`` of ``add_argument``) make argparse print ``argument --n: ...`` and
exit with status 2, so the message always names the flag the user typed:

- ``positive_int`` / ``nonnegative_int``: counts; ``sample_count`` (``--n``, ``--samples``)
  and ``line_count`` (``--num-lines``, line ``--lengths``) also refuse absurd sizes;
- ``finite_float`` / ``positive_float`` / ``fraction``: real numbers (learning rates,
  temperatures, thresholds, minutes), never NaN or infinity;
- ``head``: ``LAYER.HEAD`` (``1.3``) -> ``(1, 3)``;
- ``device``: ``--device``, a device this machine has (``models.load.resolve_device``).

``read_table`` reads a CSV table given by an option (score tables), checking its columns.

Options several commands share: ``index_style_argument`` (``--index-style``, LongEval's line
indices) and ``chat_template_argument`` (``--chat-template``, ``interp_seal.tasks.chat``).

``HelpFormatter`` shows each option's default in ``--help`` (every parser of the command line
uses it).

``check_outputs`` is called by ``interp_seal.cli.main`` for every command that has ``--out``:
a directory by default, a file for commands that set ``out_is_file=True``. It uses
``interp_seal.outputs``, which also writes every result file atomically.
"""

from __future__ import annotations

import argparse
import errno
import math
from collections.abc import Iterable
from pathlib import Path

from interp_seal.inputs import check_input_file
from interp_seal.outputs import check_output_dir, check_output_file


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with ``(default: X)`` after each option that has a default worth showing.

    Options without a value (flags, ``None``) and help texts that already describe their default
    are left as written.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with ``HelpFormatter``; sub-command parsers inherit it."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (a count of samples, lines, steps, ...)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


MAX_SAMPLES = 100_000
"""The most records (samples, questions) one command makes: more belongs in several runs."""
MAX_LINES = 100_000
"""The most lines a LongEval record may have: ~2.3M tokens, far past any model's window."""


def _at_most(text: str, limit: int, unit: str) -> int:
    value = positive_int(text)
    if value > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit:,} {unit}, got {value:,}")
    return value


def sample_count(text: str) -> int:
    """A number of records or samples: ``1..MAX_SAMPLES``."""
    why = "records per run (split larger jobs into several runs with different --seed)"
    return _at_most(text, MAX_SAMPLES, why)


def line_count(text: str) -> int:
    """A number of lines of a LongEval record: ``1..MAX_LINES``."""
    return _at_most(text, MAX_LINES, "lines (~2.3M tokens, past any model's window)")


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text}")
    return value


def finite_float(text: str) -> float:
    """A real number; NaN and infinity are refused (``float()`` accepts both)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a learning rate, a temperature, a time limit)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def fraction(text: str) -> float:
    """A finite number from 0 to 1 (a weight between two losses, a threshold on attention)."""
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text}")
    return value


def head(text: str) -> tuple[int, int]:
    """``"1.3"`` -> ``(1, 3)``: head 3 of layer 1 (both counted from 0)."""
    layer, dot, index = text.partition(".")
    if not (dot and layer.isdigit() and index.isdigit()):
        raise argparse.ArgumentTypeError(
            f"cannot read head {text!r}; write LAYER.HEAD with both numbers counted from 0, e.g. 1.3"
        )
    return int(layer), int(index)


class DistinctHeads(argparse.Action):
    """``nargs="+"`` heads (``type=head``), each named once: a repeated head is an error when
    the arguments are parsed, not half-way through a run."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen: set = set()
        for value in values:
            if value in seen:
                parser.error(
                    f"argument {option_string}: head {value[0]}.{value[1]} is listed twice; "
                    "name each head once"
                )
            seen.add(value)
        setattr(namespace, self.dest, values)


def head_label(heads: list[tuple[int, int]]) -> str:
    """``[(1, 3), (0, 2)]`` -> ``"1.3 0.2"`` (as typed on the command line)."""
    return " ".join(f"{layer}.{index}" for layer, index in heads)


def index_style_argument(parser) -> None:
    """``--index-style``: the line indices of LongEval records (``line_retrieval.INDEX_STYLES``)."""
    from interp_seal.defaults import INDEX_STYLES

    parser.add_argument(
        "--index-style",
        choices=INDEX_STYLES,
        default="adjective-noun",
        help="line retrieval: the line indices",
    )


def chat_template_argument(parser) -> None:
    """``--chat-template``: wrap prompts in a conversation template (``tasks.chat.TEMPLATES``)."""
    from interp_seal.defaults import CHAT_TEMPLATES as TEMPLATES

    parser.add_argument(
        "--chat-template",
        choices=TEMPLATES,
        default="none",
        help="wrap prompts in the model's own template ('tokenizer'), LongChat's 'vicuna', or not",
    )


def line_records(args: argparse.Namespace, tokenizer) -> dict:
    """The LongEval records a command's ``--lengths``, ``--n``, ``--seed``, ``--index-style``
    and ``--chat-template`` name (``evaluation.line_retrieval_samples``)."""
    from interp_seal.evaluation import line_retrieval_samples

    return line_retrieval_samples(
        tokenizer,
        args.lengths,
        n=args.n,
        seed=args.seed,
        index_style=args.index_style,
        chat_template=args.chat_template,
    )


def read_table(path: Path, flag: str, columns: Iterable[str]):
    """The CSV table that option ``flag`` names, with at least ``columns``.

    Raises FileNotFoundError or ValueError naming the flag and the file when it is missing, not
    a regular file (``inputs.check_input_file``), not a CSV table, or lacks a column, so a wrong
    file fails before any model is loaded.
    """
    import pandas as pd

    check_input_file(path, f"{flag} file")
    try:
        table = pd.read_csv(path)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"{flag} {path} is not a CSV table ({err})") from None
    missing = sorted(set(columns) - set(table.columns))
    if missing:
        raise ValueError(
            f"{flag} {path} lacks the columns {missing} (it has {sorted(table.columns)}); pass "
            "the head_scores.csv that `interp-seal retrieval passage-scores` writes"
        )
    return table


def output_path(text: str) -> Path:
    """``--out``: a path, never the empty string (which would mean the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; name the directory (or file) for the results")
    return Path(text)


def sub_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(command words, parser)`` of ``parser`` and of every sub-command below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from sub_parsers(sub, (*path, name))


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's actions by option string (``--out`` -> its action)."""
    return {name: action for action in parser._actions for name in action.option_strings}


def add_output_options(root: argparse.ArgumentParser) -> None:
    """On every command with ``--out``: reject an empty ``--out`` and add ``--force`` (write into
    a directory holding something else or an earlier run's results; replace an existing file)."""
    for _, parser in list(sub_parsers(root)):
        out = options(parser).get("--out")
        if out is None:
            continue
        out.type = output_path
        parser.add_argument(
            "--force",
            action="store_true",
            help="replace an existing --out file"
            if parser.get_default("out_is_file")
            else "write into --out even if it holds files of something other than an "
            "interp-seal run, or an earlier run's results (files with the same names are "
            "overwritten)",
        )


DTYPES = ("float32", "bfloat16", "float16")


def device(text: str) -> str:
    """``--device``: a device this machine has (``resolve_device``), kept as typed."""
    from interp_seal.models.load import resolve_device

    try:
        resolve_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def add_model_options(root: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype`` and ``--device-map`` on every command with ``--model`` that
    runs the model where it is loaded (training commands place it through accelerate and
    take ``--cpu`` instead; ``plan`` loads no model and takes its own ``--dtype``)."""
    for _, parser in list(sub_parsers(root)):
        found = options(parser)
        if "--model" in found and "--cpu" not in found and "--dtype" not in found:
            add_device_arguments(parser)


def add_device_arguments(parser: argparse.ArgumentParser, *, device_map: bool = True) -> None:
    """``--device``, ``--dtype`` and (with ``device_map``) ``--device-map``: where and in which
    precision a model runs (the benchmarks take the same first two)."""
    parser.add_argument(
        "--device",
        type=device,
        default="cpu",
        help="where the model runs: cpu, cuda, cuda:N, mps, or auto (a GPU if there is one)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="parameter precision; float32 keeps the analyses exact (bf16 / fp16 tolerances: "
        "docs/design.md)",
    )
    if not device_map:
        return
    parser.add_argument(
        "--device-map",
        choices=("auto",),
        help="auto: spread a model larger than one device over all of them (accelerate)",
    )


def model_options(args: argparse.Namespace) -> dict:
    """The ``load_model`` keyword arguments of the model options (none on commands without)."""
    import torch

    if not hasattr(args, "dtype"):
        return {}
    return {
        "device": args.device,
        "dtype": getattr(torch, args.dtype),
        "device_map": args.device_map,
    }


_OS_ADVICE = {
    errno.ENOSPC: "the disk is full: free some space, or choose an --out on another disk",
    errno.EDQUOT: "the disk quota is exceeded: free some space, or choose another --out",
    errno.ENAMETOOLONG: "a file name is too long: choose a shorter --out",
    errno.EACCES: "permission denied: choose a directory you can write to, or fix its permissions",
    errno.EPERM: "operation not permitted: choose a directory you can write to",
    errno.EROFS: "the file system is read-only: choose a writable directory",
    errno.ELOOP: "too many levels of symbolic links: remove the loop",
    errno.ENOTDIR: "a part of the path is a file, not a directory: fix the path",
    errno.EISDIR: "a directory is where a file is needed: fix the path",
    errno.ENOENT: "no such file or directory: check the path",
}


def os_error_line(err: OSError) -> str:
    """One line for a file-system error: the path, what went wrong and what to do."""
    where = err.filename if err.filename is not None else ""
    if err.filename2 is not None:
        where = f"{where} -> {err.filename2}"
    advice = _OS_ADVICE.get(err.errno, err.strerror or str(err))
    return f"{where + ': ' if where else ''}{advice} ({err.strerror or err})"


def check_outputs(args: argparse.Namespace) -> None:
    """Raise ``OutputPathError`` if the command's ``--out`` cannot be written (nothing created)."""
    out = getattr(args, "out", None)
    if out is None:
        return
    if getattr(args, "out_is_file", False):
        check_output_file(out, force=args.force)
    else:
        check_output_dir(out)


def add_resume_argument(parser: argparse.ArgumentParser) -> None:
    """``--resume``, the one resume policy of long runs (``outputs.claim_output_dir``): an
    ``--out`` holding an earlier run's results is continued only when asked."""
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out: finished parts are kept, the rest is computed "
        "(without it, an --out holding an earlier run's results is refused)",
    )
