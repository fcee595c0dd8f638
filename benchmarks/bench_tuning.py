"""Benchmark: inference cost of merged SEAL scales, and the cost of a SEAL tuning step.

Command (from the repository root; under a minute on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_tuning.py --threads 1
    python benchmarks/bench_tuning.py --device cuda [--dtype bfloat16]  # on a GPU

Uses the bundled model organism when ``interp_seal/organism/checkpoint/config.json`` exists,
else a random GQA Llama with 4 layers, 8 heads and d_head 32 (``benchmarks/common.py``) in a
temporary directory. On one LongEval record of ``--lines`` lines it measures, as the median wall
time over ``--reps`` interleaved repetitions (interleaving keeps load from other processes from
favouring one side; on a GPU each time is read after ``torch.cuda.synchronize``,
``common.Clock``):

- ``merged_overhead``: a forward of the model with random SEAL-C scales merged into ``o_proj``
  (``tuning.merge.merged_model``) over a forward of the base model. Merging changes weights,
  not the computation, so this should be 1 up to noise (SEAL's "no additional computational
  cost during inference").
- ``step_overhead``: one SEAL-C training step (scale hooks on every layer, forward, answer loss,
  backward to the scales, AdamW step) over a frozen forward + backward of the same loss (no
  hooks, gradient taken down to the embedding output, no optimizer): what the learnable scales
  add to the unavoidable backward pass. It can come out below 1: the scales' gradient stops at
  the lowest layer's head outputs, so layer 0's attention is never back-propagated.

Final line::

    RESULT tuning merged_overhead=<merged / base forward> step_overhead=<SEAL step / frozen fwd+bwd>
        device=<device> dtype=<dtype> clock=wall_s
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch
from common import Clock, add_device_arguments, benchmark_model, result_tags, timed

from interp_seal.engine import pad_id_of
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.data import answer_loss, collate, encode_examples
from interp_seal.tuning.merge import merged_model
from interp_seal.tuning.seal import SealTuner


def _median_pair(first, second, reps: int, clock: Clock) -> tuple[float, float]:
    """Median seconds of ``first()`` and ``second()``, run alternately ``reps`` times each."""
    times: tuple[list[float], list[float]] = ([], [])
    for fn in (first, second):  # warm-up
        fn()
    for _ in range(reps):
        for fn, bucket in ((first, times[0]), (second, times[1])):
            bucket.append(timed(fn, clock=clock)[1])
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=60, help="lines in the LongEval record")
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions per side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    add_device_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        handle, name = benchmark_model(tmp, device=args.device, dtype=args.dtype)
        clock = Clock(handle.device, wall=True)
        sample = generate(LineRetrievalConfig(num_lines=args.lines), 1, seed=0)
        examples = encode_examples(sample, handle.tokenizer)
        batch = collate(examples, pad_id_of(handle.tokenizer)).to(handle.device)
        ids = batch.input_ids
        print(
            f"model: {name} on {handle.device} in {args.dtype}; {ids.shape[1]} tokens; "
            f"{args.threads} thread(s); {args.reps} reps"
        )

        scales = 1 + 0.2 * torch.randn(handle.spec.shape)
        merged = merged_model(handle, scales)

        def forward(model):
            def run():
                with torch.no_grad():
                    model(ids)

            return run

        base_s, merged_s = _median_pair(
            forward(handle.model), forward(merged.model), args.reps, clock
        )
        print(f"forward: base {base_s * 1e3:.1f} ms, merged {merged_s * 1e3:.1f} ms")

        tuner = SealTuner(handle, "channel")
        optimizer = torch.optim.AdamW([tuner.scales], lr=2e-2, weight_decay=0.0)

        def seal_step():
            with tuner.step_context():
                tuner(batch)["loss"].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        def frozen_forward_backward():
            hook = handle.embed().register_forward_hook(
                lambda _m, _i, out: out.detach().requires_grad_()
            )
            try:
                answer_loss(handle.model, batch).backward()
            finally:
                hook.remove()

        step_s, frozen_s = _median_pair(seal_step, frozen_forward_backward, args.reps, clock)
        print(f"step: SEAL-C {step_s * 1e3:.1f} ms, frozen fwd+bwd {frozen_s * 1e3:.1f} ms")
    print(
        f"RESULT tuning merged_overhead={merged_s / base_s:.3f} step_overhead={step_s / frozen_s:.3f} "
        f"{result_tags(args, clock)}"
    )


if __name__ == "__main__":
    main()
