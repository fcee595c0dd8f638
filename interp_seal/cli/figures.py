"""``interp-seal figures``: regenerate every SEAL / MuDAF figure and table for one model.

    interp-seal figures --model organism --out figures/organism          # the committed gallery
    interp-seal figures --model organism --out /tmp/g --quick            # CI-sized
    interp-seal figures --model organism --out figures/organism --only seal_table1_methods
    interp-seal figures --model smollm2 --out figures/smollm2 --threads 1    # the real model

The model picks the sizes (``interp_seal.figures.sizes.preset_sizes``): ``smollm2`` gets the
SmolLM2 preset (its task format and sizes, measured; ``--quick`` a small form of it), any other
model the organism's; ``run.json`` records them.

Resumable: rerun the same command with ``--resume`` after an interruption, or to add figures
(``--only``) to a gallery; with all data present it only redraws.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from interp_seal.cli.common import add_resume_argument, model_options, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("figures", help="regenerate the SEAL / MuDAF figures and gallery")
    p.add_argument("--model", default="organism", help="'organism', a checkpoint dir or hub name")
    p.add_argument("--out", type=Path, help="gallery directory (required unless --list)")
    add_resume_argument(p)
    p.add_argument("--only", nargs="+", metavar="NAME", help="figures to (re)generate")
    p.add_argument(
        "--quick", action="store_true", help="CI-sized experiments (the model's small preset)"
    )
    p.add_argument(
        "--keep-models",
        action="store_true",
        help="with --quick: keep the tuned model checkpoints under OUT/work (removed by default)",
    )
    p.add_argument("--no-png", action="store_true", help="write data and HTML only")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    p.add_argument("--list", action="store_true", help="list the figures and exit")
    p.set_defaults(func=run)


def run(args) -> None:
    import torch

    from interp_seal.figures import FIGURES, regenerate

    if args.list:
        for spec in FIGURES:
            print(f"{spec.name:28s} {spec.paper}")
        return
    if args.out is None:
        raise ValueError(
            "--out is required: the gallery directory to write (or --list the figures)"
        )
    torch.set_num_threads(args.threads)
    command = "interp-seal " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["figures"] else None
    result = regenerate(
        args.model,
        args.out,
        only=args.only,
        quick=args.quick,
        png=not args.no_png,
        command=command,
        load_options=model_options(args),
    )
    freed = "" if not args.quick or args.keep_models else _drop_models(result.out / "work")
    for name, stores in result.stale.items():
        print(
            f"figures: {name} recomputed: the stores its data came from changed since it was "
            f"written ({', '.join('work/' + s for s in stores)})"
        )
    if result.unchecked:
        print(
            f"figures: reused without a check of their stores ({', '.join(result.unchecked)}): "
            "their data was written before figures recorded what they read; delete "
            "data/<name>.json to recompute one from its stores"
        )
    print(
        f"figures: computed {len(result.computed)}, reused {len(result.reused)} -> "
        f"{result.out / 'README.md'}{freed}"
    )


def _drop_models(work: Path) -> str:
    """Remove the tuned models' checkpoints (``work/<tag>/model``: full copies of the model,
    ~50 MB each on the organism, hundreds for a real model) that a ``--quick`` run leaves; the
    data, the small stores and the scale files stay, so the gallery redraws and resumes (a
    figure computed later retunes what it needs). Says how much it freed."""
    import shutil

    folders = [p for p in work.glob("*/model") if (p / "config.json").is_file()]
    size = sum(f.stat().st_size for p in folders for f in p.rglob("*") if f.is_file())
    for p in folders:
        shutil.rmtree(p)
    return (
        f" ({len(folders)} tuned models removed, {size / 2**20:.0f} MB; --keep-models keeps them)"
        if folders
        else ""
    )
