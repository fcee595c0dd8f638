"""``interp-seal analysis``: ablation sweeps on LongEval line retrieval (SEAL Sec. 3, Fig. 2).

    interp-seal analysis head-sweep --model organism --lengths 20 40 --n 50 --mode zero --out runs/heads
    interp-seal analysis head-sweep ... --out runs/heads --resume      # continue a killed sweep
    interp-seal analysis head-sweep --model smollm2 --screen 10 --lengths 10 20 --n 5 --out runs/s
    interp-seal analysis channel-sweep --heads 1.3 2.5 --lengths 20 40 --n 50 --out runs/channels

Lengths are lines per LongEval record. Each command writes to ``OUT``: ``manifest.json`` and
``records.jsonl`` (per-sample results, appended as the sweep runs, so ``--resume`` continues a
killed sweep), ``results.csv`` (or ``.parquet``) with columns layer, head, channel, length,
metric, value, baseline, delta, and HTML figures: ``head_deltas.html`` (layer x
head heatmap per length) and, with two or more lengths, ``quadrants.html`` (the first length
against the last, SEAL Fig. 2b, also ``quadrants.csv``); ``channel_map.html`` for channel sweeps.
The figures load ``OUT/plotly.min.js``, written once. Every table ends with its provenance
(``interp_seal.provenance``): ``model``, ``seed``, ``n`` (the records a row's value is a mean
over) and, in ``results.csv``, ``value_ci_low`` / ``value_ci_high``, the 95 % Wilson interval
of ``value`` on ``exact_match`` rows (empty on ``answer_logprob`` rows).
``--screen K`` (models with many heads) prices every head by attribution patching, sweeps
exactly the ``--candidates`` heads with the largest estimated magnitude (on ``--confirm-records``
records per length) and reports the K most helpful and K most harmful
(``interp_seal.analysis.screening``): the table gains a ``source`` column (``exact``,
``corrected``: the answer log-probability of a head confirmed on fewer records than ``--n``,
estimated for all of them by the difference estimator, or ``estimate``), figures and quadrants use the answer's log-probability (the only metric every
head has), the estimates go to ``screen_estimates.csv``, the per-record estimates to
``OUT/screen`` and the exact sweep's records to ``OUT/exact``. ``--qk-fix`` and ``--grad-drop``
add AtP*'s corrections to the screen (Kramar et al. 2024; ``interp_seal.analysis.atp_star``):
later heads' softmax recomputed exactly, and candidates chosen by GradDrop's score.
Mode ``mean`` ablates to the mean head output over the sweep's own samples.

Both sweeps split their forwards over processes under torchrun (same table as one process)::

    torchrun --nproc_per_node 4 -m interp_seal.cli analysis head-sweep --device cuda ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp_seal.cli.common import (
    DistinctHeads,
    add_resume_argument,
    chat_template_argument,
    finite_float,
    head,
    index_style_argument,
    line_count,
    line_records,
    model_options,
    nonnegative_int,
    positive_int,
    sample_count,
)
from interp_seal.defaults import RECORDS_PER_LENGTH
from interp_seal.outputs import write_html, write_table
from interp_seal.shards import Shard

MODES = ("zero", "scale", "mean", "uniform")


def register(subparsers) -> None:
    parser = subparsers.add_parser("analysis", help="ablation sweeps and head quadrants")
    sub = parser.add_subparsers(dest="analysis_command", required=True)

    heads = sub.add_parser("head-sweep", help="ablate one head at a time (SEAL Fig. 2b)")
    _sweep_arguments(heads)
    heads.add_argument(
        "--heads",
        type=head,
        nargs="+",
        action=DistinctHeads,
        default=None,
        metavar="LAYER.HEAD",
        help="heads (default: all)",
    )
    heads.add_argument(
        "--screen",
        type=positive_int,
        default=None,
        metavar="K",
        help="screened sweep: attribution patching prices every head, the likeliest movers are "
        "swept exactly, and the K most helpful and K most harmful are reported",
    )
    heads.add_argument(
        "--candidates",
        type=positive_int,
        default=None,
        metavar="C",
        help="with --screen: heads swept exactly, the largest |estimate| + 2 SE (default: 2 K)",
    )
    heads.add_argument(
        "--confirm-records",
        type=positive_int,
        default=None,
        metavar="R",
        help="with --screen: records per length the candidates are swept on (default: all)",
    )
    heads.add_argument(
        "--qk-fix",
        action="store_true",
        help="with --screen: AtP*'s QK fix (later heads' attention softmax recomputed exactly)",
    )
    heads.add_argument(
        "--grad-drop",
        action="store_true",
        help="with --screen: AtP*'s GradDrop (candidates by the mean |estimate| over L "
        "backward passes, each dropping one layer)",
    )
    heads.set_defaults(func=run_head_sweep, torchrun="shards")

    channels = sub.add_parser(
        "channel-sweep", help="ablate one channel of chosen heads at a time (SEAL Fig. 2c)"
    )
    _sweep_arguments(channels)
    channels.add_argument(
        "--heads",
        type=head,
        nargs="+",
        action=DistinctHeads,
        required=True,
        metavar="LAYER.HEAD",
        help="heads to open, e.g. 1.3",
    )
    channels.add_argument(
        "--channels", type=nonnegative_int, nargs="+", default=None, help="channels (default: all)"
    )
    channels.set_defaults(func=run_channel_sweep, torchrun="shards")


def _sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="organism", help="'organism', a checkpoint dir or hub name"
    )
    parser.add_argument(
        "--lengths", type=line_count, nargs="+", default=[20, 40], help="lines per record"
    )
    parser.add_argument(
        "--n",
        "--records",
        dest="n",
        type=sample_count,
        default=RECORDS_PER_LENGTH,
        help="records per length (spell it --records under torchrun, whose own parser rejects "
        "--n as an abbreviation of its options)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated records")
    index_style_argument(parser)
    chat_template_argument(parser)
    parser.add_argument("--mode", choices=MODES, default="zero", help="ablation mode")
    parser.add_argument("--factor", type=finite_float, help="multiplier for --mode scale")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    add_resume_argument(parser)
    parser.add_argument(
        "--format", choices=("csv", "parquet"), default="csv", help="file format of the tables"
    )
    parser.add_argument(
        "--batch-rows",
        type=positive_int,
        default=8,
        help="rows per edited forward (raise on a GPU)",
    )
    parser.add_argument(
        "--batch-samples", type=positive_int, default=4, help="records per clean forward"
    )
    parser.add_argument(
        "--threads", type=positive_int, help="torch threads (default: torch's choice)"
    )


def _setup(args: argparse.Namespace):
    """The model, samples by length, ``mean_z`` (mode mean) and sweep options of a command."""
    import torch

    from interp_seal.analysis.sweeps import SweepOptions, mean_head_outputs
    from interp_seal.models import load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    handle = load_model(args.model, **model_options(args))
    samples = line_records(args, handle.tokenizer)
    mean_z = None
    if args.mode == "mean":
        mean_z = mean_head_outputs(handle, [s for batch in samples.values() for s in batch])
    options = SweepOptions(
        out=args.out,
        resume=args.resume,
        batch_rows=args.batch_rows,
        batch_samples=args.batch_samples,
    )
    return handle, samples, mean_z, options


def run_head_sweep(args: argparse.Namespace) -> int:
    from interp_seal.analysis.quadrants import head_quadrants
    from interp_seal.analysis.screening import screened_head_sweep
    from interp_seal.analysis.sweeps import head_sweep
    from interp_seal.viz.sweeps import head_delta_heatmap, quadrant_scatter

    if args.screen is None and (
        args.candidates or args.confirm_records or args.qk_fix or args.grad_drop
    ):
        raise ValueError(
            "--candidates, --confirm-records, --qk-fix and --grad-drop tune --screen K: add "
            "--screen"
        )
    if args.screen is not None and (args.heads is not None or args.mode == "uniform"):
        raise ValueError(
            "--screen ranks every head by attribution patching, which needs an edit affine in "
            "the head output: drop --heads, and use --mode zero, scale or mean"
        )
    handle, samples, mean_z, options = _setup(args)
    sweep_args = {"mode": args.mode, "factor": args.factor, "mean_z": mean_z, "options": options}
    metric, written = "exact_match", []
    if args.screen is None:
        table = head_sweep(handle, samples, heads=args.heads, **sweep_args)
    else:
        screen = screened_head_sweep(
            handle,
            samples,
            top_k=args.screen,
            candidates=args.candidates,
            confirm_records=args.confirm_records,
            qk_fix=args.qk_fix,
            grad_drop=args.grad_drop,
            **sweep_args,
        )
        table, metric = screen.table, "answer_logprob"
        estimates = _provenance(screen.estimates, args)  # over every record of a length
        written.append(write_table(estimates, args.out / "screen_estimates.csv"))
        print(f"screen: most helpful {screen.helpful}, most harmful {screen.harmful}")
    if not Shard.current().main:
        return 0  # rank 0 writes the outputs
    written += [
        write_table(_provenance(table, args), args.out / f"results.{args.format}"),
        write_html(head_delta_heatmap(table, metric=metric), args.out / "head_deltas.html"),
    ]
    lengths = sorted(args.lengths)
    if len(lengths) >= 2:
        quadrants = head_quadrants(table, mid=lengths[0], long=lengths[-1], metric=metric)
        rows = table[(table.metric == metric) & (table.length == lengths[-1])]
        rows = rows[["layer", "head"]].assign(n=_records(rows, args))
        n = quadrants.heads.merge(rows, on=["layer", "head"], how="left")["n"]
        written += [
            write_table(_provenance(quadrants.heads, args, n), args.out / "quadrants.csv"),
            write_html(quadrant_scatter(quadrants), args.out / "quadrants.html"),
        ]
        print(
            f"quadrants (lengths {lengths[0]} vs {lengths[-1]}): {quadrants.counts()}, "
            f"Pearson r = {quadrants.pearson:.3f}"
        )
    _print_summary(table, written)
    return 0


def run_channel_sweep(args: argparse.Namespace) -> int:
    from interp_seal.analysis.sweeps import channel_sweep
    from interp_seal.viz.sweeps import channel_map

    handle, samples, mean_z, options = _setup(args)
    table = channel_sweep(
        handle,
        samples,
        heads=args.heads,
        channels=args.channels,
        mode=args.mode,
        factor=args.factor,
        mean_z=mean_z,
        options=options,
    )
    if not Shard.current().main:
        return 0  # rank 0 writes the outputs
    written = [
        write_table(_provenance(table, args), args.out / f"results.{args.format}"),
        write_html(channel_map(table), args.out / "channel_map.html"),
    ]
    _print_summary(table, written)
    return 0


def _records(table, args: argparse.Namespace):
    """How many records each row of a sweep table is a mean over: ``--n`` per length, or
    ``--confirm-records`` on a screened sweep's exact rows."""
    import pandas as pd

    n = pd.Series(args.n, index=table.index)
    if getattr(args, "confirm_records", None) and "source" in table:
        n[table["source"] == "exact"] = min(args.confirm_records, args.n)
    return n


def _provenance(table, args: argparse.Namespace, n=None):
    """``table`` with ``model``, ``seed``, ``n`` (default: ``_records``) and, on the
    ``exact_match`` rows of a sweep table, the Wilson interval of ``value`` appended."""
    from interp_seal.provenance import with_provenance

    sweep = "metric" in table
    return with_provenance(
        table,
        model=args.model,
        seed=args.seed,
        n=_records(table, args) if n is None else n,
        proportions=("value",) if sweep else (),
        where=table["metric"].eq("exact_match") if sweep else None,
    )


def _print_summary(table, written: list[Path]) -> None:
    """The baseline per length and the largest changes in exact match."""
    exact = table[table.metric == "exact_match"]
    for length, rows in exact.groupby("length"):
        best, worst = rows.loc[rows.delta.idxmax()], rows.loc[rows.delta.idxmin()]
        print(
            f"length {length}: baseline exact match {rows.baseline.iloc[0]:.3f}; largest gain "
            f"{best.delta:+.3f} ({_unit(best)}), largest drop {worst.delta:+.3f} ({_unit(worst)})"
        )
    print("wrote " + ", ".join(str(p) for p in written))


def _unit(row) -> str:
    import pandas as pd

    channel = "" if pd.isna(row["channel"]) else f"C{row['channel']}"
    return f"L{row['layer']}H{row['head']}{channel}"
