"""``interp-seal tasks``: write task files and summarise them.

Commands::

    interp-seal tasks generate --task line_retrieval --num-lines 200 --n 50 --seed 0 --out lines.jsonl
    interp-seal tasks generate --task line_retrieval --longchat --index-style integers \
        --num-lines 200 --out 200_lines.jsonl
    interp-seal tasks generate --task needle --tokenizer PATH_OR_NAME --lengths 1000:8000:8 \\
        --depths 0:100:11 --out niah.jsonl
    interp-seal tasks generate --task passages --num-passages 10 --hops 2 --n 100 --out mdqa.jsonl
    interp-seal tasks show FILE [--golden GOLDEN_IDS]

``--lengths`` and ``--depths`` take integers and ``LO:HI:N`` linear grids (gkamradt's
``round(linspace(LO, HI, N))``); for the needle task ``--n`` is the number of samples per
(length, depth) cell. ``--longchat`` writes line retrieval as LongChat's generator does: its
file layout (five fields, read back with the SEAL answer prefix) and, for adjective-noun
indices, LongChat-like words with none reused in a record (``LineRetrievalConfig.longchat``).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from interp_seal.cli.common import (
    index_style_argument,
    line_count,
    nonnegative_int,
    sample_count,
)
from interp_seal.defaults import NEEDLE_ANSWERS, TASKS

NEEDLE_SETS = ("san_francisco", "seal")  # tasks.needle: SAN_FRANCISCO, SEAL_NEEDLES
DEPTHS = "0:100:11"  # the default depth grid, as --depths takes it


def needle_set(name: str):
    from interp_seal.tasks import needle

    return {"seal": needle.SEAL_NEEDLES, "san_francisco": (needle.SAN_FRANCISCO,)}[name]


def grid(text: str) -> tuple[int, ...]:
    """``"500"`` -> (500,); ``"0:100:5"`` -> (0, 25, 50, 75, 100)."""
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 1:
        return tuple(parts)
    if len(parts) != 3:
        raise ValueError(f"expected an integer or LO:HI:N, got {text!r}")
    from interp_seal.tasks.needle import linear_grid

    return linear_grid(*parts)


def register(subparsers) -> None:
    group = subparsers.add_parser("tasks", help="generate and inspect task files")
    sub = group.add_subparsers(dest="tasks_command", required=True)

    gen = sub.add_parser("generate", help="write a task file (JSONL)")
    gen.add_argument(
        "--task", required=True, choices=sorted(TASKS), help="the task format to write"
    )
    gen.add_argument("--out", required=True, help="output .jsonl file")
    gen.add_argument(
        "--n",
        type=sample_count,
        help="samples (default 50); needle: per length x depth cell (default 1)",
    )
    gen.add_argument("--seed", type=int, default=0, help="seed of the samples")
    lines = gen.add_argument_group("line_retrieval")
    lines.add_argument("--num-lines", type=line_count, default=200, help="lines per record")
    index_style_argument(lines)
    lines.add_argument(
        "--longchat",
        action="store_true",
        help="LongChat's draws and file layout (see the module doc)",
    )
    niah = gen.add_argument_group("needle")
    niah.add_argument(
        "--tokenizer",
        help="the tokenizer measuring lengths: a directory holding one, 'organism', or a hub name",
    )
    niah.add_argument("--lengths", type=grid, nargs="+", help="context lengths in tokens")
    niah.add_argument(
        "--depths",
        type=grid,
        nargs="+",
        help=f"needle depths in percent of the haystack (default {DEPTHS}: 0, 10, ..., 100)",
    )
    niah.add_argument("--needles", default="seal", choices=NEEDLE_SETS, help="the set of needles")
    niah.add_argument(
        "--haystack",
        help="a built-in haystack (long, the default, about 15.7K SmolLM2 tokens; organism, 4.5K "
        "tokens in the model organism's own vocabulary; essays, about 1K), a text file, or a "
        "directory of .txt",
    )
    niah.add_argument(
        "--repeat-haystack",
        action="store_true",
        help="repeat a haystack shorter than a context (gkamradt's tester) instead of refusing it",
    )
    niah.add_argument(
        "--buffer", type=nonnegative_int, default=200, help="tokens kept for question + answer"
    )
    niah.add_argument(
        "--answer",
        default="sentence",
        choices=NEEDLE_ANSWERS,
        help="the expected answer: the needle sentence (SEAL) or its key phrase",
    )
    mdqa = gen.add_argument_group("passages")
    mdqa.add_argument("--num-passages", type=sample_count, default=10, help="passages per question")
    mdqa.add_argument(
        "--hops", type=int, default=1, choices=(1, 2), help="passages an answer chains through"
    )
    gen.set_defaults(func=generate, out_is_file=True)

    show = sub.add_parser("show", help="summarise a task file")
    show.add_argument("file", help="a task file (JSONL)")
    show.add_argument("--golden", help="golden passage ids of a LongBench file (.json or .jsonl)")
    show.set_defaults(func=show_file)


def _samples(args: argparse.Namespace) -> list:
    from interp_seal.tasks import line_retrieval, needle, passages

    n = args.n if args.n is not None else (1 if args.task == "needle" else 50)
    if args.longchat and args.task != "line_retrieval":
        raise ValueError(f"--longchat writes LongChat's line_retrieval files, not {args.task}")
    if args.task == "line_retrieval":
        config = line_retrieval.LineRetrievalConfig
        make = config.longchat if args.longchat else config
        cfg = make(num_lines=args.num_lines, index_style=args.index_style)
        return line_retrieval.generate(cfg, n, args.seed)
    if args.task == "passages":
        cfg = passages.PassagesConfig(num_passages=args.num_passages, hops=args.hops)
        return passages.generate(cfg, n, args.seed)
    if not args.tokenizer or not args.lengths:
        raise ValueError("--task needle needs --tokenizer and --lengths")
    from interp_seal.models.load import load_tokenizer, resolve

    # a directory holding a tokenizer (with or without a model), or a name --model takes
    local = Path(args.tokenizer).expanduser()
    target = str(local) if local.is_dir() else resolve(args.tokenizer)
    cfg = needle.NeedleConfig(
        context_lengths=tuple(x for g in args.lengths for x in g),
        depths=tuple(x for g in args.depths or [grid(DEPTHS)] for x in g),
        needles=needle_set(args.needles),
        haystack=needle.read_haystack(args.haystack),
        repeat=args.repeat_haystack,
        buffer=args.buffer,
        answer=args.answer,
    )
    return needle.generate(cfg, load_tokenizer(target), n, args.seed)


def generate(args: argparse.Namespace) -> int:
    from interp_seal.tasks import jsonl

    samples = _samples(args)
    (jsonl.write_longchat if args.longchat else jsonl.write_samples)(args.out, samples)
    print(f"wrote {len(samples)} {args.task} samples to {args.out}")
    return 0


def _counts(values) -> str:
    return ", ".join(f"{v} x {n}" for v, n in sorted(Counter(values).items()))


def describe(samples: list) -> list[str]:
    """Summary lines of one task's samples."""
    if not samples:
        return ["0 samples"]
    task, chars = samples[0].task, [len(s.prompt) for s in samples]
    out = [
        f"{len(samples)} {task} samples",
        f"prompt characters: min {min(chars)}, mean {sum(chars) / len(chars):.0f}, max {max(chars)}",
    ]
    if task == "line_retrieval":
        out.append(f"num_lines: {_counts(s.meta['num_lines'] for s in samples)}")
    elif task == "needle":
        out.append(f"context lengths: {_counts(s.meta['context_length'] for s in samples)}")
        out.append(f"depths: {_counts(s.meta['depth_percent'] for s in samples)}")
        out.append(f"needles: {_counts(s.meta['needle_id'] for s in samples)}")
    else:
        out.append(f"datasets: {_counts(s.meta['dataset'] for s in samples)}")
        out.append(f"passages per sample: {_counts(len(s.passages) for s in samples)}")
        out.append(f"golden passages per sample: {_counts(len(s.golden) for s in samples)}")
    out.append(f"first answer: {samples[0].answer!r}")
    return out


def show_file(args: argparse.Namespace) -> int:
    from interp_seal.tasks import jsonl

    golden = jsonl.read_golden(args.golden) if args.golden else None
    print(f"{args.file}:")
    for line in describe(jsonl.read_samples(args.file, golden=golden)):
        print(f"  {line}")
    return 0
