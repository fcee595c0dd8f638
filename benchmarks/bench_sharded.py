"""Benchmark: a head sweep split over 2 torchrun processes against the same sweep in one.

Command (from the repository root; a few minutes on a 2-core machine, alone on it)::

    python benchmarks/bench_sharded.py [--procs 2] [--device cuda]

Runs ``interp-seal analysis head-sweep`` on the bundled organism (``--lengths`` lines,
``--records`` records per length) twice, each in fresh processes with one torch thread per
process: once as one process, once under ``torchrun --nproc_per_node PROCS`` (gloo on CPU,
nccl on GPUs; each rank takes every PROCS-th edited forward of the one-process plan and
writes its own record file, rank 0 merges). It checks that the two ``results.csv`` files are
byte-identical and prints::

    RESULT sharded shard_speedup=<one-process wall s / sharded wall s> identical=True ...

Wall seconds of the whole command (start-up and model loading included, as a user waits for
them): on a CPU the processes must have a core each, so run it on an otherwise idle machine.
On GPUs pass ``--device cuda`` and as many processes as GPUs.

Measured (2-core CPU machine, nothing else running, defaults: 40 and 80 lines, 16 records
each, 32 heads; 2026-11-25)::

    RESULT sharded shard_speedup=1.47 identical=True one_s=27.6 sharded_s=18.8 procs=2

Each process starts Python, imports torch and transformers and loads the model (about 5 s) and
runs the clean forward of every chunk it has work in, so on a model this small the two
processes do not halve the time; the edited forwards, the bulk of a large sweep, divide evenly.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sweep(out: Path, procs: int, args: argparse.Namespace) -> float:
    """Wall seconds of the head sweep into ``out`` with ``procs`` processes."""
    command = ["analysis", "head-sweep", "--lengths", *map(str, args.lengths)]
    command += ["--records", str(args.records), "--threads", "1", "--device", args.device]
    command += ["--out", str(out)]
    launcher = [sys.executable, "-m", "interp_seal.cli"]
    if procs > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        launcher += [f"--nproc_per_node={procs}", "-m", "interp_seal.cli"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run([*launcher, *command], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the {procs}-process sweep failed:\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2, help="processes of the sharded run")
    parser.add_argument("--lengths", type=int, nargs="+", default=[40, 80], help="lines")
    parser.add_argument("--records", type=int, default=16, help="records per length")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per process)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one_s = sweep(Path(tmp) / "one", 1, args)
        sharded_s = sweep(Path(tmp) / "sharded", args.procs, args)
        one = (Path(tmp) / "one" / "results.csv").read_bytes()
        identical = one == (Path(tmp) / "sharded" / "results.csv").read_bytes()
    print(f"one process: {one_s:.1f} s wall; {args.procs} processes: {sharded_s:.1f} s wall")
    print(
        f"RESULT sharded shard_speedup={one_s / sharded_s:.2f} identical={identical} "
        f"one_s={one_s:.1f} sharded_s={sharded_s:.1f} procs={args.procs} "
        f"lengths={'/'.join(map(str, args.lengths))} records={args.records} model=organism "
        f"device={args.device} clock=wall_s"
    )
    if not identical:
        raise SystemExit("the sharded sweep's results.csv differs from the one-process sweep's")


if __name__ == "__main__":
    main()
