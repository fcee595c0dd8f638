"""``interp-seal tune``: train a tuner, fold scales into weights, evaluate before/after.

    interp-seal tune seal-h --model organism --task line_retrieval --num-lines 40 --out runs/seal_h
    interp-seal tune seal-c --model organism --num-lines 40 --lr 2e-2 --out runs/seal_c
    interp-seal tune lora --model organism --num-lines 40 --out runs/seal_l
    interp-seal tune mudaf --model organism --task passages --sample-k 8 \\
        --scores runs/mudaf/head_scores.csv --out runs/mudaf_tuned
    interp-seal tune sft --model organism --task passages --out runs/sft
    interp-seal tune merge --model organism --scales runs/seal_c/scales.safetensors --out runs/merged

Several processes (two CPU processes over gloo here; GPUs elsewhere) run the same command::

    torchrun --nproc_per_node 2 -m interp_seal.cli.tune seal-h --cpu --out runs/seal_h ...
    accelerate launch --multi_gpu --num_processes 2 -m interp_seal.cli.tune seal-h --cpu ...

(``accelerate launch --cpu --num_processes 2`` starts only one process.) Training writes
``OUT/train_log.json`` (losses per step, processes, settings) and checkpoints under ``OUT``;
re-running the same command with ``--resume`` after an interruption continues from the newest
checkpoint.
SEAL writes ``OUT/scales.safetensors`` (with metadata); LoRA / DoRA (merged), MuDAF and SFT
write the tuned model as a plain HF checkpoint in ``OUT/model`` (MuDAF adds ``OUT/heads.json``);
``merge`` folds a scale file into a plain HF checkpoint.
``evaluate`` (``OUT/accuracy.csv``) and ``retrieval`` (``OUT/retrieval.csv``) end their tables
with their provenance (``interp_seal.provenance``): ``model`` (the base model), ``seed``, ``n``
and the 95 % Wilson interval of each proportion (exact match, first token; EM).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from interp_seal.cli.common import (
    DistinctHeads,
    add_resume_argument,
    chat_template_argument,
    fraction,
    head,
    index_style_argument,
    line_count,
    model_options,
    nonnegative_int,
    positive_float,
    positive_int,
    read_table,
    sample_count,
)
from interp_seal.defaults import RECORDS_PER_LENGTH, TASKS, TUNING_SAMPLES
from interp_seal.inputs import read_json
from interp_seal.outputs import write_table, write_text
from interp_seal.tuning.methods import by_command


def register(subparsers) -> None:
    parser = subparsers.add_parser("tune", help="SEAL-H/C, LoRA/DoRA, MuDAF tuning and merging")
    sub = parser.add_subparsers(dest="tune_command", required=True)
    for method, granularity in (("seal-h", "head"), ("seal-c", "channel")):
        p = sub.add_parser(method, help=by_command(method).summary)
        _training_args(p, method)
        p.set_defaults(func=run_seal, granularity=granularity, torchrun="accelerate")

    for method, dora in (("lora", False), ("dora", True)):
        p = sub.add_parser(method, help=by_command(method).summary)
        _training_args(p, method)
        p.add_argument("--rank", type=positive_int, default=4, help="adapter rank (SEAL: 4)")
        p.add_argument("--alpha", type=positive_float, default=8.0, help="LoRA alpha")
        p.set_defaults(func=run_peft, dora=dora, torchrun="accelerate")

    for method in ("mudaf", "sft"):
        p = sub.add_parser(method, help=by_command(method).summary)
        _training_args(p, method)
        p.add_argument(
            "--trainable",
            choices=("all", "attention"),
            default="all",
            help="parameters trained: the whole model (the paper) or the attention of the heads' layers",
        )
        p.add_argument(
            "--layers", type=nonnegative_int, nargs="+", help="layers whose attention trains"
        )
        p.set_defaults(func=run_mudaf, method=method, torchrun="accelerate")
        if method == "mudaf":
            pick = p.add_mutually_exclusive_group(required=True)
            pick.add_argument(
                "--heads",
                type=head,
                nargs="+",
                action=DistinctHeads,
                metavar="LAYER.HEAD",
                help="target heads",
            )
            pick.add_argument(
                "--top-k", type=positive_int, help="the k heads with the best --scores"
            )
            pick.add_argument(
                "--sample-k", type=positive_int, help="k heads drawn from softmax(R/tau)"
            )
            p.add_argument(
                "--scores", type=Path, help="head_scores.csv (retrieval) or retrieval.csv (tune)"
            )
            p.add_argument(
                "--select-tau", type=positive_float, default=0.05, help="sampling temperature"
            )
            p.add_argument("--alpha", type=fraction, default=0.5, help="contrastive loss weight")
            p.add_argument("--tau", type=positive_float, default=0.05, help="cosine temperature")
            p.add_argument("--per-head", action="store_true", help="one loss per head")

    ev = sub.add_parser("evaluate", help="line-retrieval accuracy vs length, base vs tuned")
    ev.add_argument("--model", default="organism", help="the base model")
    ev.add_argument("--scales", nargs="+", default=[], metavar="NAME=FILE", help="scale files")
    ev.add_argument("--tuned", nargs="+", default=[], metavar="NAME=DIR", help="tuned checkpoints")
    ev.add_argument("--lengths", type=line_count, nargs="+", required=True, help="lines per record")
    ev.add_argument("--n", type=sample_count, default=RECORDS_PER_LENGTH, help="records per length")
    ev.add_argument("--seed", type=int, default=0, help="evaluation records' seed")
    ev.add_argument("--batch-size", type=positive_int, default=8, help="records per forward")
    ev.add_argument("--threads", type=positive_int, help="torch threads")
    ev.add_argument("--out", type=Path, help="write accuracy.csv here")
    chat_template_argument(ev)
    index_style_argument(ev)
    ev.set_defaults(func=run_evaluate)

    rt = sub.add_parser("retrieval", help="per-head retrieval scores, base vs tuned (MuDAF Fig. 5)")
    rt.add_argument("--model", default="organism", help="the base model")
    rt.add_argument("--tuned", nargs="*", default=[], metavar="NAME=DIR", help="tuned models")
    rt.add_argument("--targets", type=Path, help="heads.json of the MuDAF run (marks targets)")
    rt.add_argument(
        "--task",
        choices=("line_retrieval", "passages"),
        default="passages",
        help="questions whose passage attention is scored",
    )
    rt.add_argument("--num-lines", type=line_count, help="line retrieval: lines per record")
    rt.add_argument("--num-passages", type=positive_int, default=10, help="passages per sample")
    rt.add_argument("--n", type=sample_count, default=RECORDS_PER_LENGTH, help="samples")
    rt.add_argument("--seed", type=int, default=0, help="evaluation samples' seed")
    rt.add_argument("--threads", type=positive_int, help="torch threads")
    rt.add_argument("--out", type=Path, help="write retrieval.csv here")
    rt.set_defaults(func=run_retrieval)

    merge = sub.add_parser("merge", help="fold a scale file into the weights (HF checkpoint)")
    merge.add_argument("--model", default="organism", help="the model the scales were tuned on")
    merge.add_argument("--scales", type=Path, required=True, help="a scales.safetensors file")
    merge.add_argument(
        "--into",
        choices=("o_proj", "v_proj"),
        default="o_proj",
        help="weights the scales multiply (v_proj: exact only when the heads sharing a KV head "
        "share their scales)",
    )
    merge.add_argument(
        "--allow-negative",
        action="store_true",
        help="accept negative factors (they flip the sign of a head's output)",
    )
    merge.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    merge.set_defaults(func=run_merge)


def _training_args(p: argparse.ArgumentParser, method: str) -> None:
    p.add_argument("--model", default="organism", help="'organism', a checkpoint dir or hub name")
    p.add_argument("--task", choices=TASKS, default="line_retrieval", help="training format")
    p.add_argument(
        "--samples", type=sample_count, default=TUNING_SAMPLES, help="generated training samples"
    )
    p.add_argument("--num-lines", type=line_count, help="line retrieval: lines per record")
    p.add_argument(
        "--tokens", type=positive_int, help="prompt length in tokens (line retrieval, needle)"
    )
    p.add_argument(
        "--num-passages", type=positive_int, default=10, help="passages: passages per sample"
    )
    p.add_argument("--data-seed", type=int, default=1000, help="seed of the generated samples")
    index_style_argument(p)
    chat_template_argument(p)
    p.add_argument(
        "--lr", type=positive_float, default=by_command(method).lr, help="AdamW lr (constant)"
    )
    p.add_argument("--epochs", type=positive_int, default=1, help="passes over the tuning data")
    p.add_argument(
        "--batch-size", type=positive_int, default=1, help="samples per process per step"
    )
    p.add_argument("--seed", type=int, default=0, help="sample order / initialisation seed")
    p.add_argument(
        "--checkpoint-every", type=nonnegative_int, default=10, help="steps between checkpoints"
    )
    p.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute activations in the backward pass (less memory, more time)",
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="train on CPU (gloo between processes); default: where --device put the model",
    )
    p.add_argument("--threads", type=positive_int, help="torch threads per process")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    add_resume_argument(p)


def _prepare(args):
    """The model handle, the encoded samples and the training config of a tuning command."""
    from interp_seal.models import load_model
    from interp_seal.tasks.chat import wrap_samples
    from interp_seal.tuning.data import format_samples
    from interp_seal.tuning.loop import TrainConfig

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    handle = load_model(args.model, **model_options(args))
    samples = format_samples(
        args.task,
        handle.tokenizer,
        args.samples,
        num_lines=args.num_lines,
        tokens=args.tokens,
        num_passages=args.num_passages,
        seed=args.data_seed,
        index_style=args.index_style,
    )
    samples = wrap_samples(samples, args.chat_template, handle.tokenizer)
    cfg = TrainConfig(
        lr=args.lr,
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        gradient_checkpointing=args.gradient_checkpointing,
        checkpoint_every=args.checkpoint_every,
        cpu=True if args.cpu else None,  # else where the model was loaded (--device)
    )
    return handle, samples, cfg


def _loss_summary(losses: list[float]) -> str:
    """Mean loss of the first and the last tenth of the steps: one step's loss is one sample's
    and swings with it, so the last alone reads as divergence or success by chance."""
    k = max(1, len(losses) // 10)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    return f"mean loss {first:.4f} over the first {k} step(s), {last:.4f} over the last {k}"


def _hyperparameters(args, cfg) -> dict:
    return {
        "lr": cfg.lr,
        "epochs": cfg.epochs,
        "batch_size": cfg.batch_size,
        "seed": cfg.seed,
        "samples": args.samples,
        "num_lines": args.num_lines,
        "tokens": args.tokens,
        "data_seed": args.data_seed,
        "index_style": args.index_style,
    }


def _train(args, tuner, handle, samples, cfg):
    """Run the loop and write ``train_log.json`` (main process); returns the ``TrainResult``."""
    from interp_seal.engine import pad_id_of
    from interp_seal.tuning.counts import parameter_count
    from interp_seal.tuning.data import encode_examples
    from interp_seal.tuning.loop import train

    count = parameter_count(tuner)
    print(
        f"{tuner.method}: {count.trainable:,} trainable parameters of {count.base:,} "
        f"(SEAL Table 1's column: {count.table_cell})"
    )
    examples = encode_examples(samples, handle.tokenizer)
    result = train(tuner, examples, cfg, pad_id=pad_id_of(handle.tokenizer), out_dir=args.out)
    if result.is_main_process:
        log = {
            "method": tuner.method,
            "model": handle.identity,
            "task": args.task,
            "trainable_parameters": count.trainable,
            "base_parameters": count.base,
            "steps": result.steps,
            "processes": result.processes,
            "resumed_from": result.resumed_from,
            "seconds": result.seconds,
            "hyperparameters": _hyperparameters(args, cfg),
            "losses": result.losses,
            "parts": result.parts,
        }
        write_text(args.out / "train_log.json", json.dumps(log, indent=1))
    return result


def run_seal(args) -> None:
    from interp_seal.models.load import ORGANISM_DIR
    from interp_seal.tuning.scales import ScaleFile, save_scales
    from interp_seal.tuning.seal import SealTuner

    handle, samples, cfg = _prepare(args)
    if handle.name_or_path == str(ORGANISM_DIR):
        print(
            "note: on the bundled organism SEAL-H raises the answer log-probability but not "
            "exact match (its card: 0.52 -> 0.48 at 200 lines); the model where SEAL-H repairs "
            "retrieval is SmolLM2 (--model smollm2, README 'On a real model': 0.20 -> 0.625 at "
            "7 lines)."
        )
    tuner = SealTuner(handle, args.granularity)
    result = _train(args, tuner, handle, samples, cfg)
    if result.is_main_process:
        path = save_scales(
            args.out / "scales.safetensors",
            ScaleFile(
                scales=tuner.scales.detach().cpu(),
                spec=handle.spec,
                model=handle.identity,
                granularity=args.granularity,
                task=args.task,
                hyperparameters=_hyperparameters(args, cfg),
            ),
        )
        print(f"{tuner.method}: {result.steps} steps, {_loss_summary(result.losses)} -> {path}")


def run_peft(args) -> None:
    from interp_seal.tuning.merge import save_checkpoint
    from interp_seal.tuning.peft_baselines import PeftBaselineConfig, PeftTuner

    handle, samples, cfg = _prepare(args)
    peft_cfg = PeftBaselineConfig(dora=args.dora, rank=args.rank, alpha=args.alpha, seed=args.seed)
    tuner = PeftTuner(handle, peft_cfg)
    result = _train(args, tuner, handle, samples, cfg)
    if result.is_main_process:
        out = save_checkpoint(tuner.merge_and_unload(), handle.tokenizer, args.out / "model")
        print(f"{tuner.method}: {result.steps} steps, {_loss_summary(result.losses)} -> {out}")


def _target_heads(args, spec, table) -> tuple[tuple[int, int], ...]:
    from interp_seal.tuning.mudaf import sample_heads, score_matrix, top_k_heads

    if args.heads:
        return tuple(args.heads)
    if "method" in table:  # a `tune retrieval` table: score heads on the base model
        table = table[table["method"] == "base"]
    scores = score_matrix(table, spec)
    if args.top_k:
        return top_k_heads(scores, args.top_k)
    return sample_heads(scores, args.sample_k, tau=args.select_tau, seed=args.seed)


def run_mudaf(args) -> None:
    from interp_seal.tuning.data import with_line_passages
    from interp_seal.tuning.merge import save_checkpoint
    from interp_seal.tuning.mudaf import MudafConfig, MudafTuner

    table = None
    if args.method == "mudaf" and not args.heads:
        if args.scores is None:
            raise ValueError("--top-k and --sample-k need --scores (a head_scores.csv)")
        table = read_table(args.scores, "--scores", ("layer", "head", "f1"))
    handle, samples, cfg = _prepare(args)
    if args.task == "line_retrieval":  # each line is a passage, the queried line the golden one
        samples = [with_line_passages(s) for s in samples]
    mudaf = args.method == "mudaf"
    mcfg = MudafConfig(
        heads=_target_heads(args, handle.spec, table) if mudaf else (),
        alpha=args.alpha if mudaf else 0.0,
        tau=args.tau if mudaf else 0.05,
        concat=not args.per_head if mudaf else True,
        trainable=args.trainable,
        layers=tuple(args.layers) if args.layers else None,
    )
    tuner = MudafTuner(handle, mcfg)
    result = _train(args, tuner, handle, samples, cfg)
    if result.is_main_process:
        out = save_checkpoint(tuner.model, handle.tokenizer, args.out / "model")
        write_text(args.out / "heads.json", json.dumps([list(h) for h in tuner.heads]))
        print(f"{tuner.method}: {result.steps} steps, heads {list(tuner.heads)} -> {out}")


def run_merge(args) -> None:
    from interp_seal.models import load_model
    from interp_seal.tuning.merge import save_merged
    from interp_seal.tuning.scales import load_scales

    handle = load_model(args.model, **model_options(args))
    scale_file = load_scales(args.scales, handle.spec)
    out = save_merged(
        handle, scale_file.scales, args.out, into=args.into, allow_negative=args.allow_negative
    )
    print(f"merged {scale_file.granularity} scales into {args.into}: {out}")


def _named(pairs: list[str], flag: str, taken: tuple[str, ...] = ()) -> dict[str, str]:
    """``NAME=PATH`` pairs of option ``flag`` as a dict; each name once, none of ``taken``
    (``base`` and the names of another option: one would silently replace the other's row)."""
    named: dict[str, str] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"{flag}: expected NAME=PATH, got {pair!r}")
        if name in named or name in ("base", *taken):
            what = "the base model's row" if name == "base" else "given twice"
            raise ValueError(
                f"{flag}: the name {name!r} is {what} ({pair!r}); give each file its own name, "
                "since each names one row of the table"
            )
        named[name] = path
    return named


def run_evaluate(args) -> None:
    from interp_seal.interventions.head_edit import HeadIntervention
    from interp_seal.models import load_model
    from interp_seal.tuning.evaluate import accuracy_by_method
    from interp_seal.tuning.scales import load_scales

    scale_paths = _named(args.scales, "--scales")
    tuned_paths = _named(args.tuned, "--tuned", taken=tuple(scale_paths))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    base = load_model(args.model, **model_options(args))
    variants = {
        name: HeadIntervention.from_scales(base.spec, load_scales(path, base.spec).scales)
        for name, path in scale_paths.items()
    }
    variants |= {
        name: load_model(path, **model_options(args)) for name, path in tuned_paths.items()
    }
    table = accuracy_by_method(
        base,
        variants,
        args.lengths,
        n=args.n,
        seed=args.seed,
        batch_size=args.batch_size,
        chat_template=args.chat_template,
        index_style=args.index_style,
    )
    print(table.pivot(index="method", columns="length", values="exact_match").to_string())
    if args.out:
        from interp_seal.evaluation.lengths import ACCURACY_PROPORTIONS
        from interp_seal.provenance import with_provenance

        provenance = with_provenance(
            table, model=args.model, seed=args.seed, proportions=ACCURACY_PROPORTIONS
        )
        write_table(provenance, args.out / "accuracy.csv")


def _read_targets(path: Path) -> list[tuple[int, int]]:
    """The ``[[layer, head], ...]`` of a MuDAF run's ``heads.json`` (``--targets``)."""
    fix = "pass the heads.json that `interp-seal tune mudaf` writes"
    heads = read_json(path, "--targets file", fix=fix)
    pairs = isinstance(heads, list) and all(
        isinstance(h, list) and len(h) == 2 and all(type(x) is int for x in h) for h in heads
    )
    if not pairs:
        raise ValueError(f"--targets {path} is not a JSON list of [layer, head] pairs; {fix}")
    return [tuple(h) for h in heads]


def run_retrieval(args) -> None:
    from interp_seal.models import load_model
    from interp_seal.tuning.data import format_samples, with_line_passages
    from interp_seal.tuning.evaluate import retrieval_by_method

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    tuned = _named(args.tuned, "--tuned")
    targets = _read_targets(args.targets) if args.targets else []
    handles = {"base": load_model(args.model, **model_options(args))}
    handles |= {name: load_model(path, **model_options(args)) for name, path in tuned.items()}
    tokenizer = handles["base"].tokenizer
    samples = format_samples(
        args.task,
        tokenizer,
        args.n,
        num_lines=args.num_lines,
        num_passages=args.num_passages,
        seed=args.seed,
    )
    if args.task == "line_retrieval":
        samples = [with_line_passages(s) for s in samples]
    table = retrieval_by_method(handles, samples, targets=targets)
    shown = table[table["target"]] if targets else table[table["rank"] <= 8]
    print(shown.pivot(index=["layer", "head"], columns="method", values="f1").to_string())
    if args.out:
        from interp_seal.provenance import with_provenance

        provenance = with_provenance(
            table, model=args.model, seed=args.seed, n=len(samples), proportions=("em",)
        )
        write_table(provenance, args.out / "retrieval.csv")


if __name__ == "__main__":  # `python -m interp_seal.cli.tune ...` == `interp-seal tune ...`
    from interp_seal.cli import main

    sys.exit(main(["tune", *sys.argv[1:]]))
