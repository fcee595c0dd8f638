"""Benchmark: exact per-head activation patching vs attribution patching (time and agreement).

Command (from the repository root; about a minute on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_attribution_patching.py [--corrupt value]

Uses the bundled model organism when ``interp_seal/organism/checkpoint/config.json`` exists,
else a random GQA Llama with 4 layers and 8 heads (``benchmarks/common.py``) in a temporary
directory. For ``--n`` LongEval records of ``--lines`` lines it builds clean/corrupted pairs
(``--corrupt``, default ``key``: ask for another line; ``value``: change the queried number)
and times, in CPU seconds of this process:

- the naive loop (``naive_head_patching`` below, what ``transformer_lens.patching`` does): the
  clean run with its head outputs cached, the corrupted run, then one full forward of the
  corrupted prompt per head with that head's output replaced at every position;
- exact patching as the library runs it (``patch_heads``: the shared prefix once, then
  ``--batch-size`` patched runs per forward, over the positions after it and from the patched
  layer up);
- attribution patching (``attribution_patch_heads``: the shared prefix once, the clean and the
  corrupted run over the rest, one backward pass);
- exact zero-ablation of every head (``ablate_heads``, on the ablation sweeps' cached engine)
  and its attribution estimate (``attribution_ablate_heads``: one forward and one backward over
  the whole prompt);
- exact per-position head patching (batched ``patch_heads(by_position=True)``) over a window:
  the positions where the prompts differ and the last ``--last``, against
  ``attribution_patch_heads(by_position=True)`` (which prices every position in one pass).

``atp_speedup`` is naive loop / attribution patching: one forward per head plus the two
baselines against about one forward of the whole prompt for a key corruption (the prompts
differ only in the question) and about two for a value corruption (they differ mid-record).
``atp_speedup_exact`` is the library's exact patching / attribution patching: the shared prefix
and the layer starts make exact patching cheap too, so attribution patching gains little over
it for whole heads (its use is per-position patching, thousands of runs).

Each time includes the runs a method needs from scratch (the clean run's activations, the
baselines); every method is called once, untimed, before the timed pairs. Spearman correlations between exact and attribution values are computed per pair
over all heads and averaged over pairs. Every method's exact values are checked against the
naive loop (1e-4). Final line::

    RESULT attribution_patching atp_speedup=<naive loop s / atp s> atp_spearman=<mean rho>
        atp_spearman_se=<its standard error over pairs> atp_speedup_exact=<patch_heads s /
        atp s> ablate_speedup=... ablate_spearman=... by_position_speedup=... ...

Why 32 pairs: one pair's Spearman correlation over the organism's 32 heads, most of which
barely move the logit difference, ranges from 0.37 to 0.997 (key corruption, 20 lines), so the
mean of 4 pairs (the old default) is uncertain by about +-0.13. The first 4 pairs give 0.68,
all 32 give 0.837 +- 0.030 (measured 2026-11-25, one thread, alone on the machine:
``atp_speedup=20.73 atp_spearman=0.837 atp_spearman_se=0.030 atp_speedup_exact=1.78``). An integrated-gradients
variant (gradients averaged along the interpolation of the differing tokens' embeddings, 2 to
5 points, as in EAP-IG) ranked heads worse on the first 8 pairs (0.54-0.66 against plain
AtP's 0.82), so plain AtP stays the estimate.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
from common import Clock, add_device_arguments, benchmark_model, result_tags, timed
from scipy.stats import spearmanr

from interp_seal.analysis.attribution_patching import (
    ablate_heads,
    attribution_ablate_heads,
    attribution_patch_heads,
)
from interp_seal.analysis.patching import (
    PatchingPair,
    line_retrieval_pair,
    patch_heads,
    replace_inputs,
)
from interp_seal.engine import last_logits
from interp_seal.interventions import capture_head_outputs
from interp_seal.models import ModelHandle
from interp_seal.tasks import line_retrieval as lr


def naive_head_patching(handle: ModelHandle, pair: PatchingPair) -> np.ndarray:
    """The clean and corrupted logit differences (what the normalisation needs), then the one
    with each head (layer-major) patched clean -> corrupted at every position, one full forward
    per head."""
    spec = handle.spec
    with torch.no_grad():
        clean_z = capture_head_outputs(handle, pair.clean_ids[None].to(handle.device))
        baselines = last_logits(handle, torch.stack([pair.clean_ids, pair.corrupted_ids]))
        out = pair.logit_diff(baselines).tolist()
        for layer in range(spec.n_layers):
            for head in range(spec.n_heads):

                def edit(z, layer=layer, head=head):
                    z = z.clone()
                    z[:, :, head] = clean_z[layer][:, :, head]
                    return z

                with replace_inputs(handle, "head", {layer: edit}):
                    logits = last_logits(handle, pair.corrupted_ids[None])
                out.append(float(pair.logit_diff(logits)[0]))
    return np.array(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=20, help="lines per record")
    parser.add_argument("--n", type=int, default=32, help="prompt pairs")
    parser.add_argument("--corrupt", choices=("key", "value"), default="key")
    parser.add_argument("--batch-size", type=int, default=16, help="patches per forward")
    parser.add_argument(
        "--last", type=int, default=8, help="by-position patching: the last N positions too"
    )
    parser.add_argument("--threads", type=int, default=1)
    add_device_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    totals = dict.fromkeys(
        ("naive", "exact", "atp", "ablate", "atp_ablate", "by_pos", "atp_pos"), 0.0
    )
    rho_patch, rho_ablate, rho_pos, tokens = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        handle, model_name = benchmark_model(tmp, d_head=16, device=args.device, dtype=args.dtype)
        clock = Clock(handle.device)
        samples = lr.generate(lr.LineRetrievalConfig(num_lines=args.lines), args.n, seed=0)
        quiet = {"progress": False}
        warm = line_retrieval_pair(samples[0], handle.tokenizer, corrupt=args.corrupt, seed=-1)
        for fn in (naive_head_patching, attribution_patch_heads, attribution_ablate_heads):
            fn(handle, warm)  # first-call costs, untimed
        for fn in (patch_heads, ablate_heads):
            fn(handle, warm, **quiet)
        for i, sample in enumerate(samples):
            pair = line_retrieval_pair(sample, handle.tokenizer, corrupt=args.corrupt, seed=i)
            tokens.append(pair.clean_ids.shape[0])
            naive, t_naive = timed(naive_head_patching, handle, pair, clock=clock)
            exact, t_exact = timed(
                patch_heads, handle, pair, clock=clock, batch_size=args.batch_size, **quiet
            )
            atp, t_atp = timed(attribution_patch_heads, handle, pair, clock=clock)
            exact_ablate, t_ablate = timed(
                ablate_heads, handle, pair, clock=clock, batch_size=args.batch_size, **quiet
            )
            atp_ablate, t_atp_ablate = timed(attribution_ablate_heads, handle, pair, clock=clock)
            T = tokens[-1]
            differ = (pair.clean_ids != pair.corrupted_ids).nonzero().flatten().tolist()
            window = sorted({*differ, *range(T - args.last, T)})
            by_pos, t_by_pos = timed(
                patch_heads,
                handle,
                pair,
                clock=clock,
                by_position=True,
                positions=window,
                batch_size=args.batch_size,
                **quiet,
            )
            atp_pos, t_atp_pos = timed(
                attribution_patch_heads, handle, pair, clock=clock, by_position=True
            )
            atp_pos = atp_pos[atp_pos.position.isin(window)]
            ours = [exact.attrs["clean_logit_diff"], exact.attrs["corrupted_logit_diff"]]
            gap = np.abs(naive - np.concatenate([ours, exact.logit_diff.to_numpy()])).max()
            assert gap < 1e-4, f"patch_heads differs from the naive loop by {gap}"
            times = (t_naive, t_exact, t_atp, t_ablate, t_atp_ablate, t_by_pos, t_atp_pos)
            for key, t in zip(totals, times, strict=True):
                totals[key] += t
            rho_patch.append(spearmanr(exact.value, atp.value).statistic)
            rho_ablate.append(spearmanr(exact_ablate.delta, atp_ablate.delta).statistic)
            rho_pos.append(spearmanr(by_pos.value, atp_pos.value).statistic)
            print(
                f"pair {i}: {tokens[-1]} tokens, LD clean {exact.attrs['clean_logit_diff']:.3f} "
                f"corrupted {exact.attrs['corrupted_logit_diff']:.3f}; Spearman patch "
                f"{rho_patch[-1]:.3f}, ablate {rho_ablate[-1]:.3f}; CPU s naive {t_naive:.2f}, "
                f"patch_heads {t_exact:.2f}, atp {t_atp:.2f}, ablate {t_ablate:.2f}, "
                f"atp-ablate {t_atp_ablate:.2f}; by position ({len(window)} positions): Spearman "
                f"{rho_pos[-1]:.3f}, CPU s exact {t_by_pos:.2f}, atp {t_atp_pos:.2f}"
            )
    heads = handle.spec.n_layers * handle.spec.n_heads
    print(
        f"RESULT attribution_patching atp_speedup={totals['naive'] / totals['atp']:.2f} "
        f"atp_spearman={np.mean(rho_patch):.3f} "
        f"atp_spearman_se={np.std(rho_patch, ddof=1) / np.sqrt(len(rho_patch)):.3f} "
        f"atp_speedup_exact={totals['exact'] / totals['atp']:.2f} "
        f"ablate_speedup={totals['ablate'] / totals['atp_ablate']:.2f} "
        f"ablate_spearman={np.mean(rho_ablate):.3f} "
        f"by_position_speedup={totals['by_pos'] / totals['atp_pos']:.2f} "
        f"by_position_spearman={np.mean(rho_pos):.3f} naive_s={totals['naive']:.2f} "
        f"exact_s={totals['exact']:.2f} atp_s={totals['atp']:.2f} heads={heads} "
        f"pairs={args.n} corrupt={args.corrupt} tokens={min(tokens)}-{max(tokens)} "
        f"model={model_name} threads={args.threads} {result_tags(args, clock)}"
    )


if __name__ == "__main__":
    main()
