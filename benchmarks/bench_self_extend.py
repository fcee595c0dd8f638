"""Benchmark: what Self-Extend attention keeps for backward, blocked with recompute vs T x T.

Command (from the repository root; about a minute on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_self_extend.py
    python benchmarks/bench_self_extend.py --device cuda --lengths 4096 8192 16384  # on a GPU

SEAL Table 2 tunes its scales through Self-Extend past the trained window, so gradients flow
through the attention function of ``interp_seal.models.rope_extension``. One attention layer
of SmolLM2's geometry (9 query heads over 3 KV heads, d_head 64; group 2, window 1,024) runs
forward and backward at each length, two ways, on the same post-RoPE queries and keys:

- **naive**: the definition at once, as the method is usually written: ``T x T`` scores at true
  and at grouped positions, one ``where``, the causal mask, one softmax;
- **ours**: ``self_extend_attention`` with 256-query blocks, each block's keys split into
  parts (true-position band, grouped keys before it, grouped triangle) that run PyTorch's fused
  flash kernel and merge by log-sum-exp; backward runs the kernel's backward per part with the
  merged output and log-sum-exp, so nothing ``b x T`` is kept.

Memory is the bytes autograd keeps for backward (every tensor ``saved_tensors_hooks`` sees,
each storage once): it is exact and does not depend on the allocator or on what else runs.
Time is forward + backward, then a forward alone without autograd (as evaluations run), on the
``Clock`` (CPU seconds of this process on the CPU). The two ways' outputs and gradients must
agree (float32: within 1e-4, they sum in different orders).

Measured on the 2-core development machine, one thread, alone (the gallery's runs paused;
CPU seconds), at 1K / 2K / 4K / 8K tokens: saved for backward naive 50 / 177 / 657 / 2,530
MiB, ours 15 / 29 / 58 / 116 MiB (3.5x / 6.1x / 11.3x / 21.8x: ours grows linearly, naive
quadratically); forward + backward naive 0.36 / 1.41 / 5.33 / 38.6 s, ours 0.07 / 0.24 / 0.76
/ 2.99 s (5.2x / 5.9x / 7.0x / 12.9x); forward alone naive 0.14 / 0.55 / 2.06 / 14.0 s, ours
0.02 / 0.08 / 0.23 / 0.87 s (6.6x / 6.8x / 8.9x / 16.1x). The previous version of ours (per-block
scores in float32 with ``torch.utils.checkpoint`` recompute), measured the same way in the same
session: 49 / 98 MiB, 2.32 / 8.67 s forward + backward, 0.53 / 2.04 s forward at 4K / 8K: the
fused parts are 3.1x / 2.9x faster in training for 19 % more kept memory (the grouped queries).
Final line::

    RESULT self_extend saved_ratio=<naive / ours at the longest length> time_ratio=<naive /
        ours there> forward_ratio=<naive / ours, forward alone> device=<device> dtype=<dtype>
        clock=<cpu_s or wall_s>
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch
from common import Clock, add_device_arguments, result_tags

from interp_seal.models import ContextExtension
from interp_seal.models import rope_extension as rx
from interp_seal.models.load import resolve_device

HEADS, KV_HEADS, D_HEAD, BASE = 9, 3, 64, 100_000.0


def naive(module, q, k, v):
    """Self-Extend by its definition over the whole ``T x T`` score matrix."""
    cfg, inv_freq = getattr(module, rx._CONFIG_ATTR)
    T = q.shape[-2]
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    pos = torch.arange(T, device=q.device)
    gq, gk = rx.grouped_positions(pos, pos, cfg.group_size, cfg.window)
    freq = inv_freq.to(q.device, torch.float64)
    q_g = rx.rotate(q, ((gq - pos)[:, None] * freq).float())
    k_g = rx.rotate(k, ((gk - pos)[:, None] * freq).float())
    dist = pos[:, None] - pos[None, :]
    scores = torch.where(dist < cfg.window, q @ k.transpose(-1, -2), q_g @ k_g.transpose(-1, -2))
    scores = (scores * D_HEAD**-0.5).masked_fill(dist < 0, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)


def ours(module, q, k, v):
    return rx.self_extend_attention(module, q, k, v, None)[0]


def run(fn, module, inputs, weights, clock: Clock):
    """``(output, gradients, bytes saved for backward, seconds, forward-only seconds)`` of one
    forward + backward, then one forward without autograd (how an evaluation runs)."""
    q, k, v = (x.detach().requires_grad_(True) for x in inputs)
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    start = clock()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(module, q, k, v)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    seconds = clock() - start
    start = clock()
    with torch.no_grad():
        fn(module, *inputs)
    return out.detach(), grads, sum(storages.values()), seconds, clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    add_device_arguments(parser)
    args = parser.parse_args()
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    clock = Clock(device)
    cfg = ContextExtension(group_size=2, window=1024)
    inv_freq = rx.ntk_inv_freq(BASE, D_HEAD, 1.0).float().to(device)
    module = SimpleNamespace(**{rx._CONFIG_ATTR: (cfg, inv_freq)})
    print(
        f"one attention layer, {HEADS} heads over {KV_HEADS} KV heads, d_head {D_HEAD}, "
        f"{cfg.label}, blocks of {cfg.block_size}; forward + backward ({clock.unit})"
    )
    last = None
    for T in args.lengths:
        gen = torch.Generator().manual_seed(T)
        pos = torch.arange(T).double()[:, None] * inv_freq.cpu().double()
        q = rx.rotate(torch.randn(1, HEADS, T, D_HEAD, generator=gen), pos.float())
        k = rx.rotate(torch.randn(1, KV_HEADS, T, D_HEAD, generator=gen), pos.float())
        v = torch.randn(1, KV_HEADS, T, D_HEAD, generator=gen)
        weights = torch.randn(1, T, HEADS, D_HEAD, generator=gen).to(device, dtype)
        inputs = [x.to(device, dtype) for x in (q, k, v)]
        n_out, n_grads, n_bytes, n_s, n_f = run(naive, module, inputs, weights, clock)
        o_out, o_grads, o_bytes, o_s, o_f = run(ours, module, inputs, weights, clock)
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        for a, b in zip((n_out, *n_grads), (o_out, *o_grads), strict=True):
            torch.testing.assert_close(b.float(), a.float(), atol=tol, rtol=tol)
        print(
            f"T={T:6d}  saved for backward: naive {n_bytes / 2**20:8.1f} MiB, ours "
            f"{o_bytes / 2**20:6.1f} MiB ({n_bytes / o_bytes:5.1f}x)  time: naive {n_s:6.2f} s,"
            f" ours {o_s:6.2f} s ({n_s / o_s:4.2f}x)  forward alone: naive {n_f:6.2f} s, ours "
            f"{o_f:6.2f} s ({n_f / o_f:4.2f}x)"
        )
        last = (n_bytes / o_bytes, n_s / o_s, n_f / o_f)
    print(
        f"RESULT self_extend saved_ratio={last[0]:.1f} time_ratio={last[1]:.2f} "
        f"forward_ratio={last[2]:.2f} {result_tags(args, clock)}"
    )


if __name__ == "__main__":
    main()
