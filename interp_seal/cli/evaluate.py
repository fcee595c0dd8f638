"""``interp-seal evaluate``: retrieval accuracy of a model, and scores of generated text.

    interp-seal evaluate lines --model organism --lengths 10 20 40 --n 50 --seed 0 --out runs/acc
    interp-seal evaluate lines --lengths 40 --ablate 1.3 0.2 --out runs/acc_pruned
    interp-seal evaluate lines --model smollm2 --chat-template tokenizer --generate --out runs/smol
    interp-seal evaluate lines --lengths 40 --streaming-heads 0.1,1.0 --sink 4 --window 64
    interp-seal evaluate generate tasks.jsonl --model smollm2 --chat-template tokenizer
    interp-seal evaluate generated tasks.jsonl --predictions preds.jsonl

``lines`` measures greedy exact match on LongEval line retrieval by teacher forcing (one
forward per record) for each number of lines, optionally with heads ablated, prints the table
and writes ``OUT/accuracy.csv`` and ``OUT/accuracy.html`` (the figure; it loads
``OUT/plotly.min.js``, written once). The CSV's columns are the printed table's, then its
provenance (``interp_seal.provenance``): ``model``, ``seed`` and the 95 % Wilson interval of
each proportion over the ``n`` records (``exact_match_ci_low``, ``exact_match_ci_high``,
``first_token_ci_low``, ``first_token_ci_high``); ``generated.csv`` ends the same way.
With ``--streaming-heads`` the listed KV heads (``LAYER.KV_HEAD``, comma-separated, ``all``, or
a file holding them) attend to the first ``--sink`` and the last ``--window`` tokens only and
keep only those in the KV cache (DuoAttention / RazorAttention head-level KV compression,
``interp_seal.models.streaming_heads``); the table's heading gives the KV budget at the
longest record. ``generated`` scores model outputs: LongEval records (``expected_number``) by the last integer,
LongBench QA records (``answers``) by token F1; predictions are matched to records line by line
and read from the ``pred`` field (LongBench's prediction files) unless ``--field`` says otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp_seal.cli.common import (
    DistinctHeads,
    chat_template_argument,
    finite_float,
    head,
    head_label,
    index_style_argument,
    line_count,
    line_records,
    model_options,
    nonnegative_int,
    positive_int,
    sample_count,
)
from interp_seal.defaults import RECORDS_PER_LENGTH

ABLATION_CHOICES = ("zero", "scale", "uniform")


def register(subparsers) -> None:
    parser = subparsers.add_parser("evaluate", help="retrieval accuracy and output scoring")
    sub = parser.add_subparsers(dest="evaluate_command", required=True)

    lines = sub.add_parser(
        "lines", help="LongEval exact match vs number of lines (teacher forcing)"
    )
    lines.add_argument(
        "--model", default="organism", help="'organism', a checkpoint dir or hub name"
    )
    lines.add_argument(
        "--lengths", type=line_count, nargs="+", default=[10, 20, 40], help="lines per record"
    )
    lines.add_argument(
        "--n", type=sample_count, default=RECORDS_PER_LENGTH, help="records per length"
    )
    lines.add_argument("--seed", type=int, default=0, help="seed of the generated records")
    index_style_argument(lines)
    lines.add_argument("--batch-size", type=positive_int, default=8, help="records per forward")
    lines.add_argument(
        "--ablate",
        type=head,
        nargs="+",
        action=DistinctHeads,
        default=[],
        metavar="LAYER.HEAD",
        help="heads to ablate, e.g. 1.3",
    )
    lines.add_argument("--mode", choices=ABLATION_CHOICES, default="zero", help="ablation mode")
    _chat_arguments(lines)
    lines.add_argument(
        "--generate",
        action="store_true",
        help="also generate and score (LongChat's protocol) and report agreement",
    )
    lines.add_argument("--factor", type=finite_float, help="multiplier for --mode scale")
    lines.add_argument(
        "--streaming-heads",
        type=streaming_heads_argument,
        metavar="HEADS|FILE",
        help="KV heads on sink + window attention: LAYER.KV_HEAD,... (from 0), 'all', or a file",
    )
    lines.add_argument(
        "--sink", type=nonnegative_int, help="first tokens a streaming head sees (default 4)"
    )
    lines.add_argument(
        "--window",
        type=positive_int,
        help="most recent tokens a streaming head sees, itself included (default 256)",
    )
    lines.add_argument(
        "--threads", type=positive_int, help="torch threads (default: torch's choice)"
    )
    lines.add_argument("--out", type=Path, help="write accuracy.csv and accuracy.html here")
    lines.set_defaults(func=run_lines)

    gen = sub.add_parser(
        "generate", help="generate-then-score a task file beside teacher forcing (agreement)"
    )
    gen.add_argument("tasks", type=Path, help="task JSONL (any task, e.g. LongChat's files)")
    gen.add_argument("--model", default="organism", help="'organism', 'smollm2', a dir or hub name")
    _chat_arguments(gen)
    gen.add_argument(
        "--batch-size", type=positive_int, default=8, help="records per teacher-forced forward"
    )
    gen.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")
    gen.add_argument("--out", type=Path, help="write generated.csv and generated_records.csv here")
    gen.set_defaults(func=run_generate)

    generated = sub.add_parser("generated", help="score generated outputs against a task file")
    generated.add_argument("tasks", type=Path, help="task JSONL (LongChat or LongBench fields)")
    generated.add_argument(
        "--predictions", type=Path, required=True, help="JSONL, one per task line"
    )
    generated.add_argument("--field", default="pred", help="prediction field in each line")
    generated.set_defaults(func=run_generated)


def run_lines(args: argparse.Namespace) -> int:
    import torch

    from interp_seal.evaluation import accuracy_table, score_lengths
    from interp_seal.evaluation.lengths import ACCURACY_PROPORTIONS
    from interp_seal.interventions import ablate
    from interp_seal.models import load_model
    from interp_seal.outputs import write_html, write_table
    from interp_seal.provenance import with_provenance
    from interp_seal.viz import accuracy_figure

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    streaming = streaming_heads_option(args)  # checked against the config before any weight
    handle = load_model(args.model, **model_options(args), streaming_heads=streaming)
    intervention = None
    if args.ablate:
        intervention = ablate(handle.spec, args.ablate, args.mode, factor=args.factor)
    samples = line_records(args, handle.tokenizer)
    scores = score_lengths(handle, samples, intervention=intervention, batch_size=args.batch_size)
    table = accuracy_table(scores)
    ablated = f", heads {head_label(args.ablate)} ablated ({args.mode})" if args.ablate else ""
    if streaming is not None:
        from interp_seal.models import kv_budget_bytes

        tokens = max(len(s.encode(handle.tokenizer)) for g in samples.values() for s in g)
        kept = kv_budget_bytes(streaming, handle.spec, tokens, itemsize=handle.dtype.itemsize)
        full = kv_budget_bytes(None, handle.spec, tokens, itemsize=handle.dtype.itemsize)
        ablated += (
            f", {streaming.label}: KV cache {kept / 2**20:.2f} of {full / 2**20:.2f} MiB at "
            f"{tokens} tokens"
        )
    print(f"LongEval line retrieval, {handle.name_or_path}{ablated}, seed {args.seed}")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.out is not None:
        provenance = with_provenance(
            table, model=args.model, seed=args.seed, proportions=ACCURACY_PROPORTIONS
        )
        write_table(provenance, args.out / "accuracy.csv")
        title = f"LongEval line retrieval: {Path(handle.name_or_path).name}{ablated}"
        write_html(accuracy_figure(table, title=title), args.out / "accuracy.html")
        print(f"wrote {args.out / 'accuracy.csv'} and {args.out / 'accuracy.html'}")
    if args.generate:  # beside the teacher-forced scores above, not recomputing them
        flat = [s for group in samples.values() for s in group]
        forced = [s for group in scores.values() for s in group]
        _generate_and_report(args, handle, flat, intervention, forced)
    return 0


def streaming_heads_argument(text: str) -> str:
    """``--streaming-heads``: ``LAYER.KV_HEAD`` pairs (commas or whitespace), ``all``, or a file
    holding them (``#`` starts a comment); the format is checked here, the range against the
    model's config by ``streaming_heads_option``. Returns the heads' text."""
    path = Path(text)
    if path.is_file():
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise argparse.ArgumentTypeError(f"cannot read {text}: {err}") from None
        text = ",".join(line.partition("#")[0] for line in lines)
    items = [item for item in text.replace(",", " ").split() if item]
    if items == ["all"]:
        return "all"
    if not items:
        raise argparse.ArgumentTypeError(f"no heads in {text!r}; write LAYER.KV_HEAD,... or all")
    try:
        pairs = [head(item) for item in items]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r}; write LAYER.KV_HEAD pairs counted from 0 (e.g. 1.0,3.1), "
            "'all', or a file of them"
        ) from None
    if len(set(pairs)) != len(pairs):
        raise argparse.ArgumentTypeError(f"a KV head is listed twice in {text!r}")
    return ",".join(items)


def streaming_heads_option(args: argparse.Namespace):
    """The ``StreamingHeads`` of ``--streaming-heads / --sink / --window`` (None without them),
    its heads checked against the model's config: a bad head fails before any weight loads."""
    from interp_seal.models.load import load_config
    from interp_seal.models.spec import ModelSpec
    from interp_seal.models.streaming_heads import StreamingHeads

    if args.streaming_heads is None:
        if args.sink is not None or args.window is not None:
            raise ValueError("--sink and --window size the streaming heads: add --streaming-heads")
        return None
    sizes = {"sink": args.sink, "window": args.window}
    sizes = {key: value for key, value in sizes.items() if value is not None}
    if str(args.model).endswith(".gguf"):  # its geometry is read when it loads
        spec = None
    else:
        spec = ModelSpec.from_config(load_config(args.model)[1])
    if args.streaming_heads == "all":
        if spec is None:
            raise ValueError("--streaming-heads all needs a model directory or name, not a .gguf")
        return StreamingHeads.all_heads(spec, **sizes)
    config = StreamingHeads.parse(args.streaming_heads, **sizes)
    if spec is not None:
        config.check_model(spec, str(args.model))
    return config


def _chat_arguments(parser: argparse.ArgumentParser) -> None:
    chat_template_argument(parser)
    parser.add_argument(
        "--max-new-tokens", type=positive_int, default=100, help="generation budget (LongChat: 100)"
    )


def _generate_and_report(args, handle, samples, intervention, forced=None) -> None:
    """Generate-then-score ``samples``; print the summary, write ``generated*.csv`` to --out."""
    from interp_seal.evaluation import evaluate_generated
    from interp_seal.outputs import write_table
    from interp_seal.provenance import with_provenance

    result = evaluate_generated(
        handle,
        samples,
        max_new_tokens=args.max_new_tokens,
        intervention=intervention,
        batch_size=args.batch_size,
        forced=forced,
    )
    print(
        f"generate-then-score ({args.max_new_tokens} new tokens, chat template "
        f"{args.chat_template!r}) beside teacher forcing:"
    )
    print(result.summary.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.out is not None:
        summary = with_provenance(
            result.summary,
            model=args.model,
            seed=getattr(args, "seed", None),  # `generate` reads its records from a file
            proportions=("exact_match", "generated_accuracy"),
        )
        write_table(summary, args.out / "generated.csv")
        write_table(result.records, args.out / "generated_records.csv")
        print(f"wrote {args.out / 'generated.csv'} and {args.out / 'generated_records.csv'}")


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from interp_seal.models import load_model
    from interp_seal.tasks.chat import wrap_samples
    from interp_seal.tasks.jsonl import read_samples

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    samples = read_samples(args.tasks)
    if not samples:
        raise ValueError(f"task file {args.tasks} holds no records")
    handle = load_model(args.model, **model_options(args))
    samples = wrap_samples(samples, args.chat_template, handle.tokenizer)
    print(f"{args.tasks}: {len(samples)} {samples[0].task} records, {handle.name_or_path}")
    _generate_and_report(args, handle, samples, None)
    return 0


def read_nonempty(path: Path, what: str) -> list[dict]:
    """The records of JSONL file ``path``; ValueError if it holds none."""
    from interp_seal.tasks.jsonl import read_jsonl

    records = read_jsonl(path)
    if not records:
        raise ValueError(
            f"{what} file {path} holds no records (it is empty or has only blank lines); pass "
            "a JSONL file with one JSON object per line"
        )
    return records


def run_generated(args: argparse.Namespace) -> int:
    from interp_seal.evaluation import score_records

    records = read_nonempty(args.tasks, "task")
    predictions = []
    for i, row in enumerate(read_nonempty(args.predictions, "--predictions")):
        if args.field not in row:
            raise ValueError(
                f"{args.predictions} record {i + 1} has no {args.field!r} field (fields: "
                f"{sorted(row)}); pass --field"
            )
        if not isinstance(row[args.field], str):
            raise ValueError(
                f"{args.predictions} record {i + 1}: field {args.field!r} is "
                f"{row[args.field]!r:.40} ({type(row[args.field]).__name__}), not the text a "
                "model generated; write each prediction as a JSON string, or pass --field"
            )
        predictions.append(row[args.field])
    scores = score_records(records, predictions)
    table = scores.groupby("task", sort=True)["score"].agg(["count", "mean"]).reset_index()
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0
