"""``interp-seal tune``: train a tuner, fold scales into weights, evaluate before/after.

    interp-seal tune seal-h --model organism --task line_retrieval --num-lines 40 --out runs/seal_h
    interp-seal tune seal-c --model organism --num-lines 40 --lr 2e-2 --out runs/seal_c
    interp-seal tune lora --model organism --num-lines 40 --out runs/seal_l
    interp-seal tune merge --model organism --scales runs/seal_c/scales.safetensors --out runs/merged

Several processes (two CPU processes over gloo here; GPUs elsewhere) run the same command::

    torchrun --nproc_per_node 2 -m interp_seal.cli.tune seal-h --cpu --out runs/seal_h ...
    accelerate launch --multi_gpu --num_processes 2 -m interp_seal.cli.tune seal-h --cpu ...

(``accelerate launch --cpu --num_processes 2`` starts only one process.) Training writes
``OUT/train_log.json`` (losses per step, processes, settings) and checkpoints under ``OUT``;
re-running the same command after an interruption resumes from the newest checkpoint.
SEAL writes ``OUT/scales.safetensors`` (with metadata), LoRA / DoRA the merged model as a plain
HF checkpoint in ``OUT/model``; ``merge`` folds a scale file into a plain HF checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from interp_seal.tuning.data import TASKS

DEFAULT_LR = {"seal-h": 1e-2, "seal-c": 2e-2, "lora": 2e-4, "dora": 2e-4}


def register(subparsers) -> None:
    parser = subparsers.add_parser("tune", help="SEAL-H/C, LoRA/DoRA, MuDAF tuning and merging")
    sub = parser.add_subparsers(dest="tune_command", required=True)
    for method, granularity in (("seal-h", "head"), ("seal-c", "channel")):
        p = sub.add_parser(method, help=f"SEAL with one learnable scale per {granularity}")
        _training_args(p, method)
        p.set_defaults(func=run_seal, granularity=granularity)

    for method, dora in (("lora", False), ("dora", True)):
        p = sub.add_parser(method, help=f"SEAL-{'D' if dora else 'L'}: {method.upper()} on q/k/v/o")
        _training_args(p, method)
        p.add_argument("--rank", type=int, default=4, help="adapter rank (SEAL: 4)")
        p.add_argument("--alpha", type=float, default=8.0, help="LoRA alpha")
        p.set_defaults(func=run_peft, dora=dora)

    merge = sub.add_parser("merge", help="fold a scale file into the weights (HF checkpoint)")
    merge.add_argument("--model", default="organism", help="the model the scales were tuned on")
    merge.add_argument("--scales", type=Path, required=True, help="a scales.safetensors file")
    merge.add_argument("--into", choices=("o_proj", "v_proj"), default="o_proj")
    merge.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    merge.set_defaults(func=run_merge)


def _training_args(p: argparse.ArgumentParser, method: str) -> None:
    p.add_argument("--model", default="organism", help="'organism', a checkpoint dir or hub name")
    p.add_argument("--task", choices=TASKS, default="line_retrieval", help="training format")
    p.add_argument("--samples", type=int, default=50, help="generated training samples")
    p.add_argument("--num-lines", type=int, help="line retrieval: lines per record")
    p.add_argument("--tokens", type=int, help="prompt length in tokens (line retrieval, needle)")
    p.add_argument("--num-passages", type=int, default=10, help="passages: passages per sample")
    p.add_argument("--data-seed", type=int, default=1000, help="seed of the generated samples")
    p.add_argument("--lr", type=float, default=DEFAULT_LR.get(method), help="AdamW lr (constant)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=1, help="samples per process per step")
    p.add_argument("--seed", type=int, default=0, help="sample order / initialisation seed")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--cpu", action="store_true", help="train on CPU (gloo between processes)")
    p.add_argument("--threads", type=int, help="torch threads per process")
    p.add_argument("--out", type=Path, required=True, help="output directory")


def _prepare(args):
    """The model handle, the encoded samples and the training config of a tuning command."""
    from interp_seal.models import load_model
    from interp_seal.tuning.data import format_samples
    from interp_seal.tuning.loop import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    handle = load_model(args.model)
    samples = format_samples(
        args.task,
        handle.tokenizer,
        args.samples,
        num_lines=args.num_lines,
        tokens=args.tokens,
        num_passages=args.num_passages,
        seed=args.data_seed,
    )
    cfg = TrainConfig(
        lr=args.lr,
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        gradient_checkpointing=args.gradient_checkpointing,
        checkpoint_every=args.checkpoint_every,
        cpu=args.cpu,
    )
    return handle, samples, cfg


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
    }


def _train(args, tuner, handle, samples, cfg):
    """Run the loop and write ``train_log.json`` (main process); returns the ``TrainResult``."""
    from interp_seal.tuning.data import encode_samples, pad_id_of
    from interp_seal.tuning.loop import train

    examples = encode_samples(samples, handle.tokenizer)
    result = train(tuner, examples, cfg, pad_id=pad_id_of(handle.tokenizer), out_dir=args.out)
    if result.is_main_process:
        log = {
            "method": tuner.method,
            "model": handle.name_or_path,
            "task": args.task,
            "steps": result.steps,
            "processes": result.processes,
            "resumed_from": result.resumed_from,
            "seconds": result.seconds,
            "hyperparameters": _hyperparameters(args, cfg),
            "losses": result.losses,
            "parts": result.parts,
        }
        (args.out / "train_log.json").write_text(json.dumps(log, indent=1))
    return result


def run_seal(args) -> None:
    from interp_seal.tuning.scales import ScaleFile, save_scales
    from interp_seal.tuning.seal import SealTuner

    handle, samples, cfg = _prepare(args)
    tuner = SealTuner(handle, args.granularity)
    result = _train(args, tuner, handle, samples, cfg)
    if result.is_main_process:
        path = save_scales(
            args.out / "scales.safetensors",
            ScaleFile(
                scales=tuner.scales.detach().cpu(),
                spec=handle.spec,
                model=handle.name_or_path,
                granularity=args.granularity,
                task=args.task,
                hyperparameters=_hyperparameters(args, cfg),
            ),
        )
        print(f"{tuner.method}: {result.steps} steps, final loss {result.losses[-1]:.4f} -> {path}")


def run_peft(args) -> None:
    from interp_seal.tuning.merge import save_checkpoint
    from interp_seal.tuning.peft_baselines import PeftBaselineConfig, PeftTuner

    handle, samples, cfg = _prepare(args)
    peft_cfg = PeftBaselineConfig(dora=args.dora, rank=args.rank, alpha=args.alpha, seed=args.seed)
    tuner = PeftTuner(handle, peft_cfg)
    result = _train(args, tuner, handle, samples, cfg)
    if result.is_main_process:
        out = save_checkpoint(tuner.merge_and_unload(), handle.tokenizer, args.out / "model")
        print(f"{tuner.method}: {result.steps} steps, final loss {result.losses[-1]:.4f} -> {out}")


def run_merge(args) -> None:
    from interp_seal.models import load_model
    from interp_seal.tuning.merge import save_merged
    from interp_seal.tuning.scales import load_scales

    handle = load_model(args.model)
    scale_file = load_scales(args.scales, handle.spec)
    out = save_merged(handle, scale_file.scales, args.out, into=args.into)
    print(f"merged {scale_file.granularity} scales into {args.into}: {out}")


if __name__ == "__main__":  # `python -m interp_seal.cli.tune ...` == `interp-seal tune ...`
    from interp_seal.cli import main

    sys.exit(main(["tune", *sys.argv[1:]]))
