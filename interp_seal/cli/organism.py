"""``interp-seal organism``: train the bundled model organism and measure its card's numbers.

interp-seal organism train --out runs/organism --seed 0          # the shipped recipe
interp-seal organism train --out /tmp/smoke --smoke               # CI-sized, seconds
interp-seal organism train --v2 --out runs/organism-v2 --seed 0  # v2: continue v1 on 3 tasks
interp-seal organism evaluate --parts lines prune                  # some parts only
interp-seal organism evaluate --write-card                        # every task, into README.md
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys

from interp_seal.cli.common import (
    add_resume_argument,
    model_options,
    positive_float,
    positive_int,
    sample_count,
)

DEFAULT_LENGTHS = (5, 10, 20, 30, 40, 50, 60, 70, 80)  # the shipped (v1) card's
DEFAULT_PRUNE_LINES = 80


def register(subparsers) -> None:
    parser = subparsers.add_parser("organism", help="train or evaluate the bundled model organism")
    sub = parser.add_subparsers(dest="organism_command", required=True)

    train = sub.add_parser("train", help="train the organism from scratch (resumable)")
    train.add_argument("--out", required=True, help="output directory (checkpoints in OUT/state)")
    train.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    train.add_argument("--steps", type=positive_int, help="total steps (default: the recipe's)")
    train.add_argument(
        "--max-minutes", type=positive_float, help="stop (resumably) after this long"
    )
    add_resume_argument(train)
    train.add_argument("--smoke", action="store_true", help="tiny model, 6 steps (CI)")
    train.add_argument(
        "--threads", type=positive_int, help="torch threads (default: the recipe's, 1)"
    )
    train.add_argument(
        "--v2", action="store_true", help="continue v1 on lines + needles + passages (v2 recipe)"
    )
    train.add_argument("--base", help="with --v2: the checkpoint dir to continue (default: v1)")
    train.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="FIELD=VALUE",
        help="recipe fields to override, e.g. p_needle=0.25 passages=2,30 (see MixtureConfig / "
        "OrganismConfig); recorded with the resumable state",
    )
    train.set_defaults(func=run_train)

    evaluate = sub.add_parser("evaluate", help="accuracy vs length and per-head pruning")
    evaluate.add_argument("--model", default="organism", help="'organism' or a checkpoint dir")
    evaluate.add_argument(
        "--lines",
        type=positive_int,
        nargs="+",
        default=list(DEFAULT_LENGTHS),
        help="record lengths (lines) of the accuracy table",
    )
    evaluate.add_argument(
        "--prune-lines",
        type=positive_int,
        default=DEFAULT_PRUNE_LINES,
        help="record length (lines) of the per-head pruning sweep",
    )
    evaluate.add_argument("--samples", type=sample_count, default=200, help="samples per length")
    evaluate.add_argument(
        "--prune-samples", type=positive_int, default=100, help="samples of the pruning sweep"
    )
    evaluate.add_argument(
        "--parts",
        nargs="+",
        help="card parts to measure (default all): lines prune needle passages retrieval seal",
    )
    evaluate.add_argument(
        "--results", help="JSONL file caching finished parts (resume; parallel --parts runs)"
    )
    evaluate.add_argument(
        "--niah-lengths", type=positive_int, nargs="+", help="needle context lengths"
    )
    evaluate.add_argument("--niah-per-cell", type=positive_int, help="needles per grid cell")
    evaluate.add_argument(
        "--passages", type=positive_int, nargs="+", help="passage counts for QA F1"
    )
    evaluate.add_argument(
        "--qa-samples", type=positive_int, help="questions per passage count and hop"
    )
    evaluate.add_argument(
        "--seal-lines", type=positive_int, help="SEAL-H tuning/evaluation line count"
    )
    evaluate.add_argument("--seal-samples", type=positive_int, help="SEAL-H evaluation records")
    evaluate.add_argument(
        "--training-json", help="a JSON file with the training run's record, kept on the card"
    )
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the evaluation records")
    evaluate.add_argument("--threads", type=positive_int, default=2, help="torch threads")
    evaluate.add_argument(
        "--write-card", action="store_true", help="write the numbers into the model's README.md"
    )
    evaluate.set_defaults(func=run_evaluate)


OWN_OPTIONS = ("seed", "steps", "threads", "base")  # recipe fields with a flag of their own


def recipe_overrides(config, items: list[str]) -> dict:
    """``["p_needle=0.25", "passages=2,30"]`` -> typed overrides of ``config``'s fields (a field's
    default value gives its type: numbers, booleans, tuples as comma lists)."""
    fields = {f.name: f.default for f in dataclasses.fields(config) if f.name not in OWN_OPTIONS}
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in fields:
            raise SystemExit(
                f"--set {item!r}: expected FIELD=VALUE with FIELD one of {sorted(fields)} "
                f"({', '.join(OWN_OPTIONS)} have their own options)"
            )
        default = fields[name]
        try:
            if isinstance(default, tuple):
                out[name] = tuple(type(default[0])(x) for x in text.split(","))
            elif isinstance(default, bool):
                out[name] = {"true": True, "false": False}[text.lower()]
            else:
                out[name] = type(default)(text)
        except (ValueError, KeyError):
            raise SystemExit(
                f"--set {item!r}: {text!r} is not a {type(default).__name__} like {default!r}"
            ) from None
    return out


def run_train(args: argparse.Namespace) -> int:
    from interp_seal.organism.mixture import MixtureConfig, train_v2
    from interp_seal.organism.train import OrganismConfig, train

    overrides = {"seed": args.seed}
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.threads is not None:
        overrides["threads"] = args.threads
    if args.base is not None and not args.v2:
        raise SystemExit("--base only applies to --v2 (v1 trains from scratch); add --v2")
    if args.v2:
        overrides["base"] = args.base
        config, run = MixtureConfig, train_v2
    else:
        config, run = OrganismConfig, train
    overrides.update(recipe_overrides(config, args.set))
    cfg = config.smoke(**overrides) if args.smoke else config(**overrides)
    out = run(cfg, args.out, resume=args.resume, max_minutes=args.max_minutes)
    print(f"wrote {out}")
    return 0


def settings(args: argparse.Namespace):
    """``LineSettings`` and ``TaskSettings`` with the command line's overrides (validated)."""
    from interp_seal.organism.card import LineSettings
    from interp_seal.organism.card_tasks import TaskSettings

    lines = LineSettings(
        lengths=tuple(args.lines),
        prune_lines=args.prune_lines,
        n_samples=args.samples,
        prune_samples=args.prune_samples,
        seed=args.seed,
    )
    chosen = {
        "niah_lengths": tuple(args.niah_lengths) if args.niah_lengths else None,
        "niah_per_cell": args.niah_per_cell,
        "passage_counts": tuple(args.passages) if args.passages else None,
        "passage_samples": args.qa_samples,
        "seal_lines": args.seal_lines,
        "seal_eval_samples": args.seal_samples,
        "seed": args.seed,
    }
    return lines, TaskSettings(**{k: v for k, v in chosen.items() if v is not None})


def run_evaluate(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from interp_seal.inputs import read_json
    from interp_seal.models import load_model
    from interp_seal.organism.card import PARTS, measure_parts, reports, write_card

    lines, tasks = settings(args)
    parts = args.parts or PARTS
    training = None
    if args.training_json:
        training = read_json(args.training_json, "--training-json file")
    torch.set_num_threads(args.threads)
    handle = load_model(args.model, **model_options(args))
    values = measure_parts(handle, lines, tasks, parts=parts, results=args.results)
    if not set(PARTS) <= set(values):
        print(f"measured {sorted(values)}; the card needs all of {list(PARTS)}")
        return 0
    report, task_report = reports(values, lines, tasks)
    print(report.text())
    print(task_report.text())
    if args.write_card:
        command = (
            "interp-seal " + shlex.join(sys.argv[1:])
            if sys.argv[1:]
            else "interp-seal organism evaluate"
        )
        card = write_card(Path(handle.name_or_path), report, command, task_report, training)
        print(f"wrote {card}")
    return 0
