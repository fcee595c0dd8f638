"""Benchmark: memory and time of row-wise attention capture vs TransformerLens's full patterns.

Command (from the repository root; about two minutes on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_attention_memory.py
    python benchmarks/bench_attention_memory.py --device cuda [--dtype bfloat16]  # on a GPU

On a random Llama with 4 layers, 8 query heads (2 KV heads), d_head 32 and a 16K-position
window, at 2K, 4K, 8K and 16K tokens, it measures

- **rows**: ``capture_attention_rows(handle, ids, (-1,))``, the last token's attention row of
  every head and layer from post-RoPE q/k on the HF sdpa path (what MuDAF's passage score
  needs);
- **tl**: ``TransformerBridge.run_with_cache(ids, names_filter=...hook_pattern)``, every
  layer's full ``H x T x T`` attention pattern (TransformerLens always computes eager
  attention).

Each measurement runs in a fresh subprocess that loads the model (and, for tl, boots the
bridge), then runs the capture once; its peak resident memory is the process's own
``getrusage(RUSAGE_SELF).ru_maxrss`` (tracemalloc cannot see torch's allocator). The same
subprocess without the capture gives the baseline, and the reported memory is the difference:
what the capture itself costs at that length (for rows, that is mostly the model's own sdpa
forward; the rows add a few MB). Subprocesses run with ``MALLOC_MMAP_THRESHOLD_=65536`` so that
glibc serves large blocks by ``mmap`` and returns them on free: peak RSS then tracks the peak
of live tensors instead of heap fragmentation (without it, the same forward measured 109 MB at
8K and 255 MB at 16K; with it, 93 MB and 175 MB). On CUDA the memory is instead the peak of
torch's CUDA allocator (``torch.cuda.max_memory_allocated``: what the capture holds on the GPU;
host memory is not counted), and on MPS the memory Metal's driver holds after the capture
(``torch.mps.driver_allocated_memory``; freed blocks stay cached, so it approximates the peak).
Time is the wall time of the capture call, read after ``torch.cuda.synchronize`` on a GPU
(``common.Clock``).

TransformerLens is only run where its patterns fit: a length is skipped (and said so) when the
estimated need ``L*H*T^2*4`` bytes of cached patterns plus ``2*H*T^2*4`` for one layer's
scores and softmax exceeds ``--tl-limit-gb`` GiB (default 8; at 8K tokens the estimate is
12 GiB, at 16K 48 GiB). ``mem_ratio_8k`` then divides TL's 8K memory *extrapolated* from its
measured lengths by a least-squares fit ``a*T^2 + b*T`` (the quadratic its patterns follow) by
ours measured at 8K, and the RESULT line says ``tl_8k=extrapolated``; with a larger
``--tl-limit-gb`` the 8K run is measured (``tl_8k=measured``).

Measured on the 2-core development machine, shared (``OMP_NUM_THREADS=1``, ~2.5 min):
rows 31 / 52 / 94 / 177 MB at 2K / 4K / 8K / 16K; TL 699 / 2704 MB at 2K / 4K (1.3x its
``L*H*T^2*4`` bytes of patterns), 10.6 GB extrapolated at 8K. The estimate counts float32
patterns, so it is an overestimate under ``--dtype bfloat16`` / ``float16``. Final line::

    RESULT attention_memory mem_ratio_8k=<TL / ours at 8K> growth_16k_over_8k=<ours 16K / 8K> ...
        device=<device> dtype=<dtype> clock=wall_s
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from common import Clock, add_device_arguments, load, result_tags, timed

from interp_seal.models.load import resolve_device

LENGTHS = (2048, 4096, 8192, 16384)
N_LAYERS, N_HEADS, N_KV_HEADS, D_HEAD = 4, 8, 2, 32
MB = 2**20


def build_checkpoint(path: Path) -> str:
    """A random 4-layer, 8-head GQA Llama with a 16K window and a small word-level tokenizer."""
    from interp_seal.organism.tokenizer import build_tokenizer
    from interp_seal.testing import save_random_checkpoint

    return save_random_checkpoint(
        path,
        "llama",
        tokenizer=build_tokenizer(["the quick brown fox jumps over the lazy dog"]),
        n_layers=N_LAYERS,
        n_heads=N_HEADS,
        n_kv_heads=N_KV_HEADS,
        d_head=D_HEAD,
        max_positions=max(LENGTHS),
    )


def peak_mb(device) -> float:
    """Peak memory of this process so far on ``device`` (MB; see the module docstring)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MB
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / MB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (MB if sys.platform == "darwin" else 1024)


def worker(args: argparse.Namespace) -> None:
    """One measurement in this process: print peak memory, the capture's wall time and the
    device it ran on as JSON."""
    import torch

    from interp_seal.analysis.attention_rows import capture_attention_rows

    torch.set_num_threads(args.threads)
    handle = load(args.model, device=args.device, dtype=args.dtype)
    clock = Clock(handle.device, wall=True)
    ids = torch.randint(
        4, handle.spec.vocab_size, (1, args.length), generator=torch.Generator().manual_seed(0)
    ).to(handle.device)
    bridge = handle.bridge() if args.method == "tl" else None

    def capture() -> None:
        with torch.no_grad():
            if bridge is None:
                rows = capture_attention_rows(handle, ids, (-1,))
                assert rows.shape == (N_LAYERS, 1, N_HEADS, 1, args.length)
            else:
                _, cache = bridge.run_with_cache(
                    ids, names_filter=lambda n: n.endswith("hook_pattern")
                )
                assert len(cache) == N_LAYERS

    seconds = timed(capture, clock=clock)[1] if args.run else 0.0
    print(
        json.dumps(
            {"peak_mb": peak_mb(handle.device), "seconds": seconds, "device": str(handle.device)}
        )
    )


def measure(model: str, method: str, length: int, args: argparse.Namespace) -> dict:
    """Peak memory above the setup baseline (MB), capture time and device of one (method,
    length)."""
    runs = {}
    threads = args.threads
    for run in (0, 1):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--model",
            model,
            "--method",
            method,
            "--length",
            str(length),
            "--run",
            str(run),
            "--threads",
            str(threads),
            "--device",
            args.device,
            "--dtype",
            args.dtype,
        ]
        env = os.environ | {
            "OMP_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "MALLOC_MMAP_THRESHOLD_": "65536",  # large blocks mmapped: RSS follows live memory
        }
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{method} at {length} tokens failed:\n{done.stderr[-3000:]}")
        runs[run] = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "mb": runs[1]["peak_mb"] - runs[0]["peak_mb"],
        "seconds": runs[1]["seconds"],
        "device": runs[1]["device"],
    }


def tl_estimate_gb(length: int) -> float:
    """Patterns cached for every layer, plus one layer's scores and softmax in flight."""
    return (N_LAYERS + 2) * N_HEADS * length**2 * 4 / 2**30


def quadratic_fit(points: dict[int, float], length: int) -> float:
    """Least-squares ``a*T^2 + b*T`` through the measured points, evaluated at ``length``."""
    import numpy as np

    t = np.array(sorted(points), dtype=float)
    coef, *_ = np.linalg.lstsq(
        np.stack([t**2, t], 1), np.array([points[x] for x in sorted(points)])
    )
    return float(coef[0] * length**2 + coef[1] * length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--method", choices=("rows", "tl"), help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    parser.add_argument(
        "--tl-limit-gb", type=float, default=8.0, help="skip TL above this estimate"
    )
    add_device_arguments(parser)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    # the device checked once, before any worker; every worker then loads on the same one
    args.device = str(resolve_device(args.device))

    with tempfile.TemporaryDirectory() as tmp:
        model = build_checkpoint(Path(tmp) / "llama16k")
        rows, tl = {}, {}
        print(f"{'tokens':>7} {'method':>6} {'memory (MB)':>12} {'time (s)':>9}")
        for length in LENGTHS:
            rows[length] = measure(model, "rows", length, args)
            print(
                f"{length:>7} {'rows':>6} {rows[length]['mb']:>12.1f} {rows[length]['seconds']:>9.3f}"
            )
            if tl_estimate_gb(length) > args.tl_limit_gb:
                print(
                    f"{length:>7} {'tl':>6}   skipped: needs ~{tl_estimate_gb(length):.1f} GiB "
                    f"> --tl-limit-gb {args.tl_limit_gb:g}"
                )
                continue
            tl[length] = measure(model, "tl", length, args)
            print(f"{length:>7} {'tl':>6} {tl[length]['mb']:>12.1f} {tl[length]['seconds']:>9.3f}")

    if 8192 in tl:
        tl_8k, how = tl[8192]["mb"], "measured"
    elif len(tl) >= 2:
        tl_8k, how = quadratic_fit({t: m["mb"] for t, m in tl.items()}, 8192), "extrapolated"
    else:
        raise SystemExit("TL ran at fewer than two lengths; raise --tl-limit-gb")
    growth = rows[16384]["mb"] / rows[8192]["mb"]
    print(f"TL patterns at 8K: {tl_8k:.0f} MB ({how}); row-wise capture: {rows[8192]['mb']:.1f} MB")
    print(
        f"RESULT attention_memory mem_ratio_8k={tl_8k / rows[8192]['mb']:.1f} "
        f"growth_16k_over_8k={growth:.2f} rows_mb_8k={rows[8192]['mb']:.1f} "
        f"rows_mb_16k={rows[16384]['mb']:.1f} tl_mb_8k={tl_8k:.0f} tl_8k={how} "
        f"rows_s_8k={rows[8192]['seconds']:.2f}"
        + (f" tl_s_4k={tl[4096]['seconds']:.2f}" if 4096 in tl else "")
        + f" {result_tags(args, Clock(rows[8192]['device'], wall=True))}"
    )


if __name__ == "__main__":
    main()
