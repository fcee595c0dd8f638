"""``interp-seal plan``: will an analysis fit on a device, with which batch, in how many forwards?

    interp-seal plan --model organism --length 4000
    interp-seal plan --model lmsys/longchat-7b-v1.5-32k --length 31744 --dtype bfloat16 \\
        --budget 80GiB --analysis head-sweep --batch 2
    interp-seal plan --model path/to/config.json --length 8192 --analysis dla --json

Reads only the model's config (``--model``: a name, a checkpoint directory, a directory or file
with a ``config.json``; no weight is loaded) and prints, per analysis, the predicted weights,
KV cache, activations, analysis buffers and peak in GiB, whether the peak fits ``--budget``,
the largest batch that does, and the forwards the analysis runs
(``interp_seal.analysis.plan`` says what is counted). Writes nothing; ``--dtype`` sets the
bytes per parameter and activation.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from interp_seal.cli.common import DTYPES, positive_int


def memory_size(text: str) -> int:
    """``--budget``: ``80GiB``, ``24GB``, ``512MiB`` -> bytes."""
    from interp_seal.analysis.plan import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def register(subparsers) -> None:
    from interp_seal.defaults import PLANNED_ANALYSES as ANALYSES

    parser = subparsers.add_parser(
        "plan", help="predicted peak memory, largest batch and forwards of an analysis"
    )
    parser.add_argument(
        "--model",
        default="organism",
        help="'organism', 'smollm2', a checkpoint or config directory, a config.json, or a hub "
        "name (only the config is read)",
    )
    parser.add_argument(
        "--analysis",
        choices=ANALYSES,
        nargs="+",
        default=list(ANALYSES),
        metavar="ANALYSIS",
        help=f"analyses to plan, of: {', '.join(ANALYSES)} (default: all)",
    )
    parser.add_argument(
        "--length", type=positive_int, required=True, help="tokens per record (prompt + answer)"
    )
    parser.add_argument(
        "--batch",
        type=positive_int,
        default=1,
        help="records per forward (patched runs for patching; passage-scores, needle-scores and "
        "dla always run one)",
    )
    parser.add_argument(
        "--budget", type=memory_size, default="80GiB", help="device memory, e.g. 80GiB or 24GB"
    )
    parser.add_argument(
        "--n-units",
        type=positive_int,
        help="heads swept (head-sweep; default all), heads opened (channel-sweep; default 1), "
        "heads confirmed (screen; default 20), head patches (patching; default all)",
    )
    parser.add_argument(
        "--records", type=positive_int, help="records per length, for the count of forwards"
    )
    parser.add_argument(
        "--batch-rows", type=positive_int, default=8, help="sweeps: most rows per edited forward"
    )
    parser.add_argument(
        "--answer-tokens",
        type=positive_int,
        default=8,
        help="answer tokens per record (needle-scores: tokens decoded)",
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="precision the model would run in"
    )
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    parser.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from interp_seal.analysis.plan import ONE_RECORD, plan, table

    plans = [
        plan(
            args.model,
            analysis,
            length=args.length,
            batch=1 if analysis in ONE_RECORD else args.batch,
            budget_bytes=args.budget,
            dtype=args.dtype,
            n_units=args.n_units,
            records=args.records,
            batch_rows=args.batch_rows,
            answer_tokens=args.answer_tokens,
        )
        for analysis in args.analysis
    ]
    print(json.dumps([asdict(p) for p in plans], indent=1) if args.json else table(plans))
    return 0
