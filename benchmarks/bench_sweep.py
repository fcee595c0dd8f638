"""Benchmark: a per-head zero-ablation sweep, naive loop vs the batched cached sweep.

Command (from the repository root; about a minute on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_sweep.py
    python benchmarks/bench_sweep.py --device cuda [--dtype bfloat16]  # on a GPU
    OMP_NUM_THREADS=1 python benchmarks/bench_sweep.py --family gemma2  # a random Gemma 2

Uses the bundled model organism when ``interp_seal/organism/checkpoint/config.json`` exists,
else a random Llama of the organism's geometry (4 layers, 8 heads, 2 KV heads; see
``benchmarks/common.py``) in a temporary directory. On the same LongEval records (``--n`` per
length, ``--lengths`` lines) it runs the sweep twice:

- naive: for every length, one ``hf_logits`` forward over the right-padded records for the
  baseline and one per head with that head zeroed (full model, full ``T x vocab``
  unembedding), scored at the answer positions;
- batched: ``interp_seal.analysis.sweeps.head_sweep`` (one clean forward per chunk of records,
  each head's forward started from the cached residual stream at its layer, the heads of a
  layer in one forward, the last layer and the unembedding only at answer positions).

It asserts that both give the same exact-match verdict for every (head or baseline, length,
record) and answer log-probabilities within 1e-4 (in float32; in bfloat16 / float16 the two
round differently, so it counts the verdicts that differ and the log-probabilities more than 0.1
nats apart, ``mismatches=``, and ``identical_accuracy`` says whether there were none), and
prints one final line::

    RESULT sweep sweep_speedup=<naive s / batched s> naive_s=... batched_s=... ...
        device=<device> dtype=<dtype> clock=<cpu_s or wall_s>

Why about 4.5x on the organism, and not more: the cached sweep already does only the work an
exact answer needs. After an edit of layer ``l`` that is layer ``l``'s MLP, every layer between
``l`` and the last at every position (their keys and values feed the last layer), and the last
layer's keys and values; over the 4 layers' heads, 0.75 full layers and 0.75 MLPs per head, plus
the clean run shared by 32 heads, against 4 layers and the ``T x vocab`` unembedding per head
for the naive loop. Attention over every position is ~60% of a layer's time at these lengths and
the sweep spends ~80% of its time in matmuls and attention kernels, so batching cannot buy more
on a CPU (``--batch-rows`` 2 to 16 with ``--batch-samples`` 2 to 8 measured within 10% of each
other; 32 rows is ~25% slower: the tensors leave the cache).

Other families (``--family``: random checkpoints of the organism's geometry with their rows'
particulars), each run once on the 2-core development machine while two other jobs ran (load 3
to 5; CPU seconds on one thread, so the ratios hold but are not careful timings), every verdict
identical and every log-probability within 1e-4: ``sweep_speedup`` 3.43 on a random Llama, 3.15
Qwen3, 3.74 Gemma 2 (``-gqa-``), 3.00 GPT-2 and 2.86 GPT-NeoX (multi-head, ``-mha-``).

Times are CPU seconds of this process on the CPU (robust on a shared machine with one torch
thread), wall seconds after ``torch.cuda.synchronize`` on a GPU (``common.Clock``), the best of
``--repeat`` runs of each after an untimed warm-up call of each.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from common import (
    Clock,
    add_device_arguments,
    add_family_argument,
    benchmark_model,
    check_agreement,
    result_tags,
    timed,
)

from interp_seal.analysis.sweeps import SweepOptions, all_heads, head_sweep
from interp_seal.engine import AnswerBatch, pad_id_of
from interp_seal.interventions import ablate, hf_logits
from interp_seal.tasks import line_retrieval as lr


def naive_sweep(handle, samples: dict) -> dict:
    """``{(layer, head, length): (exact, logprob)}`` (head ``None``: the baseline) with one full
    forward per head and length."""
    out = {}
    for length, batch in samples.items():
        answers = AnswerBatch.from_encoded(
            [s.encode(handle.tokenizer) for s in batch], pad_id=pad_id_of(handle.tokenizer)
        )
        ids = answers.ids.to(handle.device)
        rows = torch.arange(len(answers), device=handle.device)[:, None]
        query = answers.query.to(handle.device)
        for layer, head in [(None, None), *all_heads(handle)]:
            iv = None if head is None else ablate(handle.spec, [(layer, head)], "zero")
            logits = hf_logits(handle, ids, iv)
            scored = answers.score(logits[rows, query])
            out[(layer, head, length)] = (scored.exact, scored.logprob)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 40], help="lines per record")
    parser.add_argument("--n", type=int, default=8, help="records per length")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2, help="timed runs of each (best kept)")
    parser.add_argument("--batch-rows", type=int, default=SweepOptions.batch_rows)
    parser.add_argument("--batch-samples", type=int, default=SweepOptions.batch_samples)
    add_device_arguments(parser)
    add_family_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        handle, model_name = benchmark_model(
            tmp, device=args.device, dtype=args.dtype, family=args.family
        )
        clock = Clock(handle.device)
        samples = {
            n: lr.generate(lr.LineRetrievalConfig(num_lines=n), args.n, seed=0)
            for n in args.lengths
        }
        tokens = {n: max(len(s.encode(handle.tokenizer)) for s in b) for n, b in samples.items()}
        runs = iter(range(args.repeat + 1))

        def batched():
            options = SweepOptions(
                out=Path(tmp) / f"sweep{next(runs)}",  # a fresh output: nothing to resume
                progress=False,
                batch_rows=args.batch_rows,
                batch_samples=args.batch_samples,
            )
            return head_sweep(handle, samples, options=options)

        warm = {args.lengths[0]: samples[args.lengths[0]][:1]}  # first-call costs, untimed
        naive_sweep(handle, warm)
        head_sweep(handle, warm, options=SweepOptions(progress=False))
        naive, naive_s = timed(naive_sweep, handle, samples, clock=clock, repeat=args.repeat)
        table, batched_s = timed(batched, clock=clock, repeat=args.repeat)

        # per-record agreement, read back from the sweep's own records
        naive = {key: (exact.cpu(), logprob.cpu()) for key, (exact, logprob) in naive.items()}
        tolerance = 1e-4 if args.dtype == "float32" else 0.1  # nats
        units = all_heads(handle)
        n_checked, verdicts, logprobs = 0, [], []  # records where the two paths differ
        for line in (Path(tmp) / "sweep0" / "records.jsonl").read_text().splitlines():
            rec = json.loads(line)
            layer, head = units[rec["unit"]] if rec["unit"] >= 0 else (None, None)
            exact, logprob = naive[(layer, head, rec["length"])]
            if rec["exact_match"] != bool(exact[rec["sample"]]):
                verdicts.append(f"exact match of {rec}")
            elif abs(rec["answer_logprob"] - float(logprob[rec["sample"]])) >= tolerance:
                logprobs.append(f"log-probability of {rec}: naive {float(logprob[rec['sample']])}")
            n_checked += 1
        assert n_checked == (len(units) + 1) * args.n * len(args.lengths)
        n_mismatches = check_agreement(
            verdicts + logprobs, dtype=args.dtype, what="naive and batched sweep"
        )

    exact = table[table.metric == "exact_match"]
    print(exact.groupby("length")[["baseline"]].first().rename(columns={"baseline": "accuracy"}))
    print(f"naive: {naive_s:.2f} {clock.unit}, batched cached sweep: {batched_s:.2f} {clock.unit}")
    print(
        f"RESULT sweep sweep_speedup={naive_s / batched_s:.2f} naive_s={naive_s:.2f} "
        f"batched_s={batched_s:.2f} heads={len(units)} lengths={'/'.join(map(str, args.lengths))} "
        f"n={args.n} max_tokens={max(tokens.values())} model={model_name} "
        f"identical_accuracy={not verdicts} threads={args.threads} "
        f"batch_rows={args.batch_rows} batch_samples={args.batch_samples} "
        f"mismatches={n_mismatches} {result_tags(args, clock)}"
    )


if __name__ == "__main__":
    main()
