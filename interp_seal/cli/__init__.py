"""``interp-seal``: the command line.

Each command group lives in its own module under ``interp_seal.cli`` and exposes
``register(subparsers)``, which adds its sub-commands; every sub-command sets ``func``, the
function that runs it with the parsed arguments. ``main`` wires the groups listed in
``GROUPS`` together, checks ``--out`` before the command runs (``common.check_outputs``), holds
an output directory for the command's duration (``outputs.claim_output_dir``: one run per
directory; ``--force`` to write into a directory that holds none of our runs), and turns bad
input (ValueError, FileNotFoundError) and file-system errors (OSError) into one ``error:`` line
and exit status 2.

Under ``torchrun --nproc_per_node N -m interp_seal.cli ...`` a command that splits its work
over processes (``torchrun="shards"``: sweeps, retrieval scores, masking) joins the process
group before it starts (``interp_seal.shards``); tuning commands (``torchrun="accelerate"``)
let accelerate do it; any other command refuses to run N times over.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from contextlib import nullcontext

from interp_seal import __version__
from interp_seal.cli.common import (
    ArgumentParser,
    add_model_options,
    add_output_options,
    check_outputs,
    os_error_line,
)
from interp_seal.outputs import claim_output_dir, command_line

GROUPS = (
    "tasks",
    "evaluate",
    "organism",
    "retrieval",
    "tune",
    "analysis",
    "attribution",
    "dashboard",
    "figures",
    "plan",
)


def version_line() -> str:
    """``interp-seal 0.1.0 (torch ..., transformers ...)``: what a bug report needs."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("torch", "transformers"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} not installed")
    return f"interp-seal {__version__} ({', '.join(found)})"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="interp-seal",
        description="Find and fix the attention heads behind long-context retrieval (SEAL, MuDAF).",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        importlib.import_module(f"interp_seal.cli.{group}").register(sub)
    add_output_options(parser)
    add_model_options(parser)
    return parser


def join_ranks(args: argparse.Namespace) -> None:
    """Under torchrun: join the process group of a sharded command, refuse an unsharded one."""
    from interp_seal.shards import launched_by_torchrun, start_process_group

    if not launched_by_torchrun():
        return
    launcher = getattr(args, "torchrun", None)
    if launcher is None:
        raise ValueError(
            f"`interp-seal {args.command}` runs in one process; under torchrun only the sweeps, "
            "retrieval scores, masking and tuning split their work: run it without torchrun"
        )
    if launcher == "shards":
        from interp_seal.models.load import resolve_device

        start_process_group(resolve_device(args.device))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        join_ranks(args)
        check_outputs(args)  # before any work: an unwritable --out must not cost a long run
        out_dir = getattr(args, "out", None)
        # under torchrun every rank runs this command on one --out: rank 0 holds it for all
        first_rank = os.environ.get("RANK", "0") == "0"
        claim = (
            claim_output_dir(
                out_dir,
                force=args.force,
                command=command_line(),
                resume=getattr(args, "resume", None),
            )
            if out_dir is not None and not getattr(args, "out_is_file", False) and first_rank
            else nullcontext()
        )
        with claim:
            return args.func(args) or 0
    except (ValueError, FileNotFoundError) as err:
        print(f"interp-seal {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"interp-seal {args.command}: error: {os_error_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interp-seal {args.command}: {interrupted_line(args)}", file=sys.stderr)
        return 130


def interrupted_line(args) -> str:
    """What Ctrl-C kept, in one line: resumable commands write each finished part as they go
    (and a refused or interrupted run's marker is released), so the line says how to go on."""
    out = getattr(args, "out", None)
    if out is None:
        return "interrupted; nothing was written"
    if hasattr(args, "resume"):
        return f"interrupted; finished parts are kept in {out}: rerun with --resume to continue"
    return f"interrupted; {out} holds only what was finished (rerun the command to redo it)"


if __name__ == "__main__":
    sys.exit(main())
