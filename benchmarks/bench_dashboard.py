"""Benchmark: one head edit in the dashboard vs re-running the full evaluation for it.

Command (from the repository root; a few minutes on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_dashboard.py
    python benchmarks/bench_dashboard.py --device cuda [--dtype bfloat16]  # on a GPU

Builds the head-pruning dashboard (``interp_seal.widgets.Dashboard``) on the model organism (or
a random model of its geometry, see ``common.py``) with ``--n`` LongEval records at each of
``--lengths`` lines, then, for one head per layer, times a click that prunes it: the updated
accuracy at every length (``EditEvaluator``: from the cached clean run, only the layers from the
edited one up, the last layer at answer positions), the answer's direct logit attribution and
the redraw. The naive way re-runs the full teacher-forced evaluation for the same edit
(``evaluate_lengths``: every layer at every position of every record). Both give the same exact
match per length (asserted in float32; in bfloat16 / float16 the lengths where they differ are
counted, ``mismatches=``). Times are CPU seconds of this process on the CPU (robust on a shared
machine with one torch thread), with wall seconds printed beside them; on a GPU both are wall
seconds after ``torch.cuda.synchronize`` (``common.Clock``). It ends with::

    RESULT dashboard dashboard_update_s=<mean CPU s per click> dashboard_speedup=<naive / click>
        dashboard_update_wall_s=<mean wall s per click> evaluate_s=<mean CPU s of the accuracy
        update alone> naive_s=<mean CPU s, naive> threads=<torch threads> ...
        device=<device> dtype=<dtype> clock=<cpu_s, or wall_s on a GPU>

``--threads 2`` uses both cores, as the served page does; then the wall time per click is the
number a user feels.

An edit of layer ``l`` recomputes ``L - l`` layers, so edits near the top are cheapest; the mean
is over one head per layer.
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

from interp_seal.evaluation import evaluate_lengths, line_retrieval_samples
from interp_seal.interventions import scale_table
from interp_seal.widgets import Dashboard


def timed_twice(fn, clock: Clock, wall: Clock):
    """``(fn(), seconds on clock, wall seconds)``: on the CPU the CPU seconds and the seconds a
    user waits differ (with ``--threads 2`` the wall time is the smaller)."""
    (out, seconds), wall_seconds = timed(lambda: timed(fn, clock=clock), clock=wall)
    return out, seconds, wall_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 40, 60, 80])
    parser.add_argument("--n", type=int, default=20, help="records per length")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (2: both cores, as the page uses)"
    )
    add_device_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        handle, name = benchmark_model(tmp, device=args.device, dtype=args.dtype)
        clock, wall = Clock(handle.device), Clock(handle.device, wall=True)
        records = line_retrieval_samples(handle.tokenizer, args.lengths, n=args.n, seed=0)
        dash, build_cpu, build_wall = timed_twice(
            lambda: Dashboard.from_model(handle, lengths=args.lengths, n=args.n), clock, wall
        )
        print(f"{name}: dashboard built in {build_cpu:.2f} {clock.unit} ({build_wall:.2f} s wall)")
        heads = [(layer, layer % handle.spec.n_heads) for layer in range(handle.spec.n_layers)]
        click_cpu, click_wall, eval_cpu, naive_cpu, mismatches = [], [], [], [], []
        for head in heads:
            _, cpu, wall_s = timed_twice(lambda head=head: dash.click(head), clock, wall)
            click_cpu.append(cpu)
            click_wall.append(wall_s)
            iv = scale_table(handle.spec, {head: 0.0})
            _, ecpu = timed(dash.evaluator.evaluate, iv, clock=clock)
            eval_cpu.append(ecpu)
            naive, ncpu, nwall = timed_twice(
                lambda iv=iv: evaluate_lengths(handle, records, intervention=iv, progress=False),
                clock,
                wall,
            )
            naive_cpu.append(ncpu)
            shown = dash.results[dash.results.metric == "exact_match"].value.tolist()
            if shown != naive.exact_match.tolist():
                mismatches.append(f"prune {head}: {shown} vs {naive.exact_match.tolist()}")
            print(
                f"prune L{head[0]}H{head[1]}: click {cpu:.2f} {clock.unit} ({wall_s:.2f} wall), "
                f"accuracy update {ecpu:.2f}, full evaluation {ncpu:.2f} ({nwall:.2f} wall); "
                f"exact match {[round(x, 3) for x in shown]}"
            )
            dash.remove(head)
    n_mismatches = check_agreement(
        mismatches, dtype=args.dtype, what="dashboard click and full evaluation"
    )
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(
        f"RESULT dashboard dashboard_update_s={mean(click_cpu):.3f} "
        f"dashboard_speedup={mean(naive_cpu) / mean(click_cpu):.2f} "
        f"dashboard_update_wall_s={mean(click_wall):.3f} "
        f"evaluate_s={mean(eval_cpu):.3f} naive_s={mean(naive_cpu):.3f} threads={args.threads} "
        f"lengths={'/'.join(map(str, args.lengths))} n={args.n} model={name} "
        f"mismatches={n_mismatches} {result_tags(args, clock)}"
    )


if __name__ == "__main__":
    main()
