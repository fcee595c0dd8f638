"""Benchmark: memory and time of row-wise attention capture vs TransformerLens's full patterns.

Command (from the repository root; about two minutes on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_attention_memory.py
    python benchmarks/bench_attention_memory.py --device cuda [--dtype bfloat16]  # on a GPU
    OMP_NUM_THREADS=1 python benchmarks/bench_attention_memory.py --family qwen3  # a random Qwen3
    OMP_NUM_THREADS=1 python benchmarks/bench_attention_memory.py --family gemma2  # Gemma 2

On a random Llama (or, with ``--family``, a random checkpoint of that family with its row's test
particulars: Qwen3's q / k norms, Gemma 2's soft-caps and windows) with 4 layers, 8 query heads
(2 KV heads; 8 for GPT-2 and GPT-NeoX, which have no GQA: ``model=`` says which), d_head 32 and a 16K-position window, at 2K, 4K, 8K and 16K tokens (``--lengths``),
it measures

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
patterns, so it is an overestimate under ``--dtype bfloat16`` / ``float16``.

Other families, the same machine shared, one session (the Llama run again beside them:
115.9 / 1.92): a random Qwen3 keeps the ratios, ``mem_ratio_8k=115.1 growth_16k_over_8k=1.90``
(rows 30 / 51 / 92 / 175 MB; its q / k norms add nothing quadratic). A random Gemma 2 keeps
them too since it loads with its own soft-capped attention (``models.capped_attention``:
transformers' sdpa has no attention-logit soft-cap, and the eager attention it loaded with before
built each layer's ``H x T x T`` scores under the capture, ``mem_ratio_8k=2.3
growth_8k_over_4k=3.92``, 4.7 GB at 8K, 16K out of reach). Measured in one session on the same
machine, shared with other jobs (the Llama run beside it: rows 29 / 50 / 92 / 175 MB,
``mem_ratio_8k=115.2 growth_16k_over_8k=1.90``): Gemma 2 rows 56 / 71 / 99 / 177 MB at 2K / 4K /
8K / 16K against TL's 714 / 2764 MB and 10.9 GB extrapolated, ``mem_ratio_8k=109.4
growth_16k_over_8k=1.78``, 7.1 s at 8K (Llama 2.1 s). The ratio stays a little under Llama's,
and the growth too, for one reason: capped attention holds one block of float32 scores (up to
``SCORES_PER_BLOCK`` = 4M numbers, 16 MiB) and its softmax whatever the length, about 27 MB
more than sdpa's small fused tiles; a constant, so it shows at short lengths (56 against 29 MB at
2K) and fades at 16K (177 against 175). The time is that of unfused tensor algebra, block by
block, against sdpa's fused kernel.

Run again once each, the same machine shared with two other jobs (load 3 to 5), with the
multi-head families beside them: Llama ``mem_ratio_8k=115.1 growth_16k_over_8k=1.90``, Qwen3
115.2 / 1.90, Gemma 2 108.7 / 1.76 (times not comparable: 20 s at 8K under that load), GPT-NeoX
97.9 / 1.89 (rows 109 / 207 MB at 8K / 16K) and GPT-2 62.3 / 2.03 (rows 171 / 347 MB). Both keep
the linear growth. GPT-2's rows cost twice Llama's for its MLP, 4 d wide (``n_inner`` unset;
the other random checkpoints' MLPs are 2 d), with ``gelu_new``'s temporaries of that width;
GPT-NeoX's 17 MB more at 8K, about what its fused ``query_key_value`` output for 8 KV heads
(Llama's: 2) adds.
Final line (``8k`` / ``16k_over_8k``: the lengths the
keys are taken at)::

    RESULT attention_memory mem_ratio_8k=<TL / ours at 8K> growth_16k_over_8k=<ours 16K / 8K> ...
        model=<family and geometry> device=<device> dtype=<dtype> clock=wall_s
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

from common import (
    Clock,
    add_device_arguments,
    add_family_argument,
    load,
    model_tag,
    result_tags,
    timed,
)

from interp_seal.models import ModelSpec
from interp_seal.models.load import load_config, resolve_device

LENGTHS = (2048, 4096, 8192, 16384)
N_LAYERS, N_HEADS, N_KV_HEADS, D_HEAD = 4, 8, 2, 32
MB = 2**20


def build_checkpoint(path: Path, family: str = "llama", positions: int = max(LENGTHS)) -> str:
    """A random 4-layer, 8-head GQA checkpoint of ``family`` (with its row's test particulars)
    with a ``positions`` window and a small word-level tokenizer."""
    from interp_seal.organism.tokenizer import build_tokenizer
    from interp_seal.testing import save_random_checkpoint

    return save_random_checkpoint(
        path,
        family,
        tokenizer=build_tokenizer(["the quick brown fox jumps over the lazy dog"]),
        n_layers=N_LAYERS,
        n_heads=N_HEADS,
        n_kv_heads=N_KV_HEADS,
        d_head=D_HEAD,
        max_positions=positions,
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
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=list(LENGTHS),
        help="prompt lengths in tokens, at least two (default: 2048 4096 8192 16384)",
    )
    add_device_arguments(parser)
    add_family_argument(parser)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    lengths = sorted(set(args.lengths))
    if len(lengths) < 2:
        parser.error("--lengths needs at least two lengths (the growth is taken between them)")
    # the device checked once, before any worker; every worker then loads on the same one
    args.device = str(resolve_device(args.device))
    family = args.family or "llama"

    with tempfile.TemporaryDirectory() as tmp:
        model = build_checkpoint(Path(tmp) / family, family, positions=max(lengths))
        tag = model_tag(family, ModelSpec.from_config(load_config(model)[1]))
        rows, tl = {}, {}
        print(f"{'tokens':>7} {'method':>6} {'memory (MB)':>12} {'time (s)':>9}")
        for length in lengths:
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

    # the ratio at 8K where it was run (else the largest length), the growth over the two largest
    at = 8192 if 8192 in rows else lengths[-1]
    top, below = lengths[-1], lengths[-2]
    k = {t: f"{t // 1024}k" if t % 1024 == 0 else str(t) for t in lengths}
    if at in tl:
        tl_at, how = tl[at]["mb"], "measured"
    elif len(tl) >= 2:
        tl_at, how = quadratic_fit({t: m["mb"] for t, m in tl.items()}, at), "extrapolated"
    else:
        raise SystemExit("TL ran at fewer than two lengths; raise --tl-limit-gb")
    growth = rows[top]["mb"] / rows[below]["mb"]
    print(
        f"TL patterns at {k[at]}: {tl_at:.0f} MB ({how}); row-wise capture: {rows[at]['mb']:.1f} MB"
    )
    print(
        f"RESULT attention_memory mem_ratio_{k[at]}={tl_at / rows[at]['mb']:.1f} "
        f"growth_{k[top]}_over_{k[below]}={growth:.2f} rows_mb_{k[at]}={rows[at]['mb']:.1f} "
        + (f"rows_mb_{k[top]}={rows[top]['mb']:.1f} " if top != at else "")
        + f"tl_mb_{k[at]}={tl_at:.0f} tl_{k[at]}={how} "
        f"rows_s_{k[at]}={rows[at]['seconds']:.2f}"
        + (f" tl_s_4k={tl[4096]['seconds']:.2f}" if 4096 in tl else "")
        + f" model={tag}"
        + f" {result_tags(args, Clock(rows[at]['device'], wall=True))}"
    )


if __name__ == "__main__":
    main()
