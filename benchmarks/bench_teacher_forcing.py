"""Benchmark: greedy exact match by teacher forcing vs the naive ``generate()`` loop.

Command (from the repository root; about a minute on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_teacher_forcing.py
    python benchmarks/bench_teacher_forcing.py --device cuda [--dtype bfloat16]  # on a GPU

Uses the bundled model organism when ``interp_seal/organism/checkpoint/config.json`` exists,
else a random Llama of the organism's geometry (4 layers, 8 heads) built in a temporary
directory. On the same
LongEval line-retrieval records it measures greedy exact match twice: the naive way (one
``model.generate(do_sample=False, max_new_tokens=len(answer))`` per record) and by teacher
forcing (``interp_seal.evaluation.teacher_force``: one right-padded forward per batch of
records, logits only at answer positions). Times are CPU seconds of this process on the CPU
(robust on a shared machine with one torch thread), wall seconds after ``torch.cuda.synchronize``
on a GPU (``common.Clock``; the ``*_cpu_s`` keys keep their names, ``clock=`` says which).

What to expect: both paths pay one forward over the prompt (``generate``'s prefill), which
dominates on a CPU at these lengths; teacher forcing saves the ``len(answer) - 1`` decode steps
and ``generate``'s per-step overhead, so the CPU ratio is modest (1.4-1.5x on the random model
with the defaults). Batching several records per forward pays off where forwards are
latency-bound rather than compute-bound (GPUs). It asserts that both give the same verdict for
every record and the same greedy tokens up to the first error (in float32; in bfloat16 / float16
it counts the records where they differ, ``mismatches=``), and prints one final line::

    RESULT teacher_forcing tf_speedup=<generate time / teacher-forcing time> n_samples=<n> ...
        device=<device> dtype=<dtype> clock=<cpu_s or wall_s>
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from common import (
    Clock,
    add_device_arguments,
    benchmark_model,
    check_agreement,
    result_tags,
    timed,
)

from interp_seal.evaluation import teacher_force
from interp_seal.models import ModelHandle
from interp_seal.tasks import line_retrieval


def greedy_exact_match(handle: ModelHandle, samples) -> tuple[list[bool], list[list[int]]]:
    """The naive reference: ``generate()`` each record, compare its tokens with the answer."""
    verdicts, outputs = [], []
    with torch.no_grad():
        for sample in samples:
            enc = sample.encode(handle.tokenizer)
            out = handle.model.generate(
                enc.prompt_ids[None].to(handle.device),
                do_sample=False,
                max_new_tokens=len(enc.answer_ids),
                pad_token_id=handle.tokenizer.pad_token_id,
            )
            generated = out[0, enc.answer_start :].cpu().tolist()
            verdicts.append(generated == enc.answer_ids.tolist())
            outputs.append(generated)
    return verdicts, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lines", type=int, nargs="+", default=[10, 20, 40], help="lines per record"
    )
    parser.add_argument("--n", type=int, default=32, help="records per line count")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    add_device_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        handle, name = benchmark_model(tmp, device=args.device, dtype=args.dtype)
        clock = Clock(handle.device)
        samples = [
            sample
            for num_lines in args.lines
            for sample in line_retrieval.generate(
                line_retrieval.LineRetrievalConfig(num_lines=num_lines), args.n, args.seed
            )
        ]
        # warm-up both paths (first-call allocations), then time them on the same records
        greedy_exact_match(handle, samples[:2])
        teacher_force(handle, samples[:2])

        (verdicts, outputs), generate_s = timed(greedy_exact_match, handle, samples, clock=clock)
        scores, tf_s = timed(
            teacher_force, handle, samples, batch_size=args.batch_size, clock=clock
        )

    mismatches = []
    for i, (verdict, generated, score) in enumerate(zip(verdicts, outputs, scores, strict=True)):
        first_error = next(
            (j for j, ok in enumerate(score.token_correct) if not ok), len(score.token_correct) - 1
        )
        if verdict != score.exact_match:
            mismatches.append(f"record {i}: generate says {verdict}, teacher forcing disagrees")
        elif list(score.predicted[: first_error + 1]) != generated[: first_error + 1]:
            mismatches.append(f"record {i}: greedy tokens differ before the first error")
    n_mismatches = check_agreement(
        mismatches, dtype=args.dtype, what="generate() and teacher forcing"
    )
    exact_match = sum(verdicts) / len(verdicts)
    first_token = sum(s.first_token for s in scores) / len(scores)
    mean_tokens = sum(s.n_tokens for s in scores) / len(scores)
    print(f"model {name}: {len(samples)} records of {args.lines} lines, {mean_tokens:.0f} tokens")
    print(
        f"generate(): {generate_s:.2f} {clock.unit}, teacher forcing: {tf_s:.3f} {clock.unit}, "
        f"{len(samples) - n_mismatches} of {len(samples)} records agree"
    )
    print(
        f"RESULT teacher_forcing tf_speedup={generate_s / tf_s:.1f} n_samples={len(samples)} "
        f"generate_cpu_s={generate_s:.2f} tf_cpu_s={tf_s:.3f} exact_match={exact_match:.3f} "
        f"first_token={first_token:.3f} mean_tokens={mean_tokens:.0f} model={name} "
        f"threads={args.threads} mismatches={n_mismatches} {result_tags(args, clock)}"
    )


if __name__ == "__main__":
    main()
