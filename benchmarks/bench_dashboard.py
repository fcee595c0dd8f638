"""Benchmark: one head edit in the dashboard vs re-running the full evaluation for it.

Command (from the repository root; a few minutes on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_dashboard.py

Builds the head-pruning dashboard (``interp_seal.widgets.Dashboard``) on the model organism (or
a random model of its geometry, see ``common.py``) with ``--n`` LongEval records at each of
``--lengths`` lines, then, for one head per layer, times a click that prunes it: the updated
accuracy at every length (``EditEvaluator``: from the cached clean run, only the layers from the
edited one up, the last layer at answer positions), the answer's direct logit attribution and
the redraw. The naive way re-runs the full teacher-forced evaluation for the same edit
(``evaluate_lengths``: every layer at every position of every record). Both give the same exact
match per length (asserted). Times are CPU seconds of this process (robust on a shared machine
with one torch thread); wall seconds are printed beside them. It ends with::

    RESULT dashboard dashboard_update_s=<mean CPU s per click> dashboard_speedup=<naive / click>
        dashboard_update_wall_s=<mean wall s per click> evaluate_s=<mean CPU s of the accuracy
        update alone> naive_s=<mean CPU s, naive> threads=<torch threads> ...

``--threads 2`` uses both cores, as the served page does; then the wall time per click is the
number a user feels.

An edit of layer ``l`` recomputes ``L - l`` layers, so edits near the top are cheapest; the mean
is over one head per layer.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from common import benchmark_model

from interp_seal.evaluation import evaluate_lengths
from interp_seal.interventions import scale_table
from interp_seal.widgets import Dashboard, line_records


def timed(fn):
    """``(result, cpu seconds, wall seconds)`` of ``fn()``."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 40, 60, 80])
    parser.add_argument("--n", type=int, default=20, help="records per length")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (2: both cores, as the page uses)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        handle, name = benchmark_model(tmp)
        records = line_records(args.lengths, args.n, seed=0)
        dash, build_cpu, build_wall = timed(
            lambda: Dashboard.from_model(handle, lengths=args.lengths, n=args.n)
        )
        print(f"{name}: dashboard built in {build_cpu:.2f} CPU s ({build_wall:.2f} s wall)")
        heads = [(layer, layer % handle.spec.n_heads) for layer in range(handle.spec.n_layers)]
        click_cpu, click_wall, eval_cpu, naive_cpu = [], [], [], []
        for head in heads:
            _, cpu, wall = timed(lambda head=head: dash.click(head))
            click_cpu.append(cpu)
            click_wall.append(wall)
            iv = scale_table(handle.spec, {head: 0.0})
            _, ecpu, _ = timed(lambda iv=iv: dash.evaluator.evaluate(iv))
            eval_cpu.append(ecpu)
            naive, ncpu, nwall = timed(
                lambda iv=iv: evaluate_lengths(handle, records, intervention=iv, progress=False)
            )
            naive_cpu.append(ncpu)
            shown = dash.results[dash.results.metric == "exact_match"].value.tolist()
            assert shown == naive.exact_match.tolist(), (head, shown, naive.exact_match.tolist())
            print(
                f"prune L{head[0]}H{head[1]}: click {cpu:.2f} CPU s ({wall:.2f} wall), accuracy "
                f"update {ecpu:.2f}, full evaluation {ncpu:.2f} ({nwall:.2f} wall); exact match "
                f"{[round(x, 3) for x in shown]}"
            )
            dash.remove(head)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(
        f"RESULT dashboard dashboard_update_s={mean(click_cpu):.3f} "
        f"dashboard_speedup={mean(naive_cpu) / mean(click_cpu):.2f} "
        f"dashboard_update_wall_s={mean(click_wall):.3f} "
        f"evaluate_s={mean(eval_cpu):.3f} naive_s={mean(naive_cpu):.3f} threads={args.threads} "
        f"lengths={'/'.join(map(str, args.lengths))} n={args.n} model={name}"
    )


if __name__ == "__main__":
    main()
