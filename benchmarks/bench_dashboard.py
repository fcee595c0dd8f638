"""Benchmark: one head edit in the dashboard vs re-running the full evaluation for it.

Command (from the repository root; a few minutes on one CPU thread, about 15 at the
dashboard's own sizes, most of it the layer-0 channel map)::

    OMP_NUM_THREADS=1 python benchmarks/bench_dashboard.py
    OMP_NUM_THREADS=1 python benchmarks/bench_dashboard.py --lengths 40 80 120 160  # the page's
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
        update alone> naive_s=<mean CPU s, naive> above_layer0_s=<CPU s of a click above a
        layer-0 edit> above_layer0_naive_s=<the same edit from the clean run> threads=<torch
        threads> ... device=<device> dtype=<dtype> clock=<cpu_s, or wall_s on a GPU>

A click above a layer-0 edit: with L0H0 pruned, a click on a layer-2 head, then on a layer-3
head; the second is timed (``above_layer0_s``: the dashboard starts it at layer 3 from its
cached run of the layer-0 edit, built by the first) against the same edit evaluated from the
clean run, which starts at layer 0 (``above_layer0_naive_s``).

``--threads 2`` uses both cores, as the served page does; then the wall time per click is the
number a user feels.

Then, unless ``--no-browser``, the same clicks in a real browser (``interp_seal.browser``:
Playwright driving chromium) on the page ``interp-seal dashboard`` serves for the same model and
records (one torch thread): from the mouse click to the cell's new colour
(``dashboard_first_feedback_s``, the mean over the clicks; ``first_feedback_max_s`` the worst)
and to the finished update, minus the kernel's own compute time for it
(``dashboard_browser_overhead_s``: what the widgets and the browser add; ``browser_final_s``
the whole wait; ``click_bytes``: what the page's websockets received per click). The layer-0
click alone, the costliest: ``browser_layer0_update_s`` (mouse press to the finished update)
and ``browser_layer0_compute_s`` (the kernel's part). Then the channel map of a head of layer
``--channel-layer`` (default 0, the costliest: every channel restarts at layer 0; -1 skips it),
locked with no edit: ``browser_channel_map_s`` from the press on its button to the complete
map on the page, ``channel_map_compute_s`` the kernel's part. ``--screenshots DIR`` saves the
page at 800 and 1600 px wide after the clicks, a prune of a layer-0 head and a switch of a
top-layer KV head to streaming attention (``dashboard_800.png``, ``dashboard_1600.png``).

An edit of layer ``l`` recomputes ``L - l`` layers, so edits near the top are cheapest; the mean
is over one head per layer.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

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
from interp_seal.models.load import ORGANISM_DIR
from interp_seal.widgets import Dashboard
from interp_seal.widgets.app import new_token


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
    parser.add_argument("--no-browser", action="store_true", help="skip the browser timings")
    parser.add_argument("--screenshots", type=Path, help="save the page's screenshots here")
    parser.add_argument(
        "--channel-layer",
        type=int,
        default=0,
        help="time the channel map of a head of this layer in the browser (-1: skip it)",
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
        above, above_naive = click_above_layer0(dash, clock)
        print(
            f"click above a layer-0 edit: {above:.2f} {clock.unit} "
            f"(from the clean run: {above_naive:.2f})"
        )
        browser = "" if args.no_browser else browser_timings(name_path(handle), heads, args)
    n_mismatches = check_agreement(
        mismatches, dtype=args.dtype, what="dashboard click and full evaluation"
    )
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(
        f"RESULT dashboard dashboard_update_s={mean(click_cpu):.3f} "
        f"dashboard_speedup={mean(naive_cpu) / mean(click_cpu):.2f} "
        f"dashboard_update_wall_s={mean(click_wall):.3f} "
        f"evaluate_s={mean(eval_cpu):.3f} naive_s={mean(naive_cpu):.3f} "
        f"above_layer0_s={above:.3f} above_layer0_naive_s={above_naive:.3f} threads={args.threads} "
        f"lengths={'/'.join(map(str, args.lengths))} n={args.n} model={name} "
        f"mismatches={n_mismatches} {browser}{result_tags(args, clock)}"
    )


def click_above_layer0(dash: Dashboard, clock: Clock) -> tuple[float, float]:
    """Prune L0H0, then a layer-2 head (the dashboard caches the run of the layer-0 edit), then
    a head of the last layer: that click's seconds, and the same edit from the clean run."""
    spec = dash.handle.spec
    top = (spec.n_layers - 1, 1)
    for head in [(0, 0), (min(2, spec.n_layers - 2), 1)]:
        dash.click(head)
    _, seconds = timed(dash.click, top, clock=clock)
    iv = scale_table(spec, dash.state.table())
    _, naive = timed(dash.evaluator.evaluate, iv, clock=clock)
    dash.reset()
    return seconds, naive


def name_path(handle) -> str:
    return "organism" if Path(handle.name_or_path) == ORGANISM_DIR else handle.name_or_path


def browser_timings(model: str, heads, args) -> str:
    """Click each of ``heads`` (then undo it) on the served page; the RESULT keys."""
    from interp_seal.browser import (
        click_head,
        launch_chromium,
        open_dashboard,
        serve_dashboard,
        stop,
        stream_head,
    )
    from interp_seal.cli.dashboard import free_port

    port, token = free_port(), new_token()
    playwright, browser = launch_chromium()
    with tempfile.TemporaryDirectory() as tmp:
        server = serve_dashboard(
            port=port, token=token, lengths=args.lengths, n=args.n, cwd=Path(tmp), model=model
        )
        try:
            page = open_dashboard(browser, f"http://127.0.0.1:{port}/?token={token}")
            timings, channel_map = [], ""
            for head in heads:
                timing = click_head(page, head)  # prune
                print(
                    f"browser: prune L{head[0]}H{head[1]}: cell after "
                    f"{timing.first_feedback_s:.3f} s, done after {timing.final_s:.3f} s "
                    f"(kernel {timing.compute_s:.3f} s), {timing.received_bytes:,} bytes received"
                )
                timings.append(timing)
                click_head(page, head)  # prune -> scale
                click_head(page, head)  # scale -> keep
                if head[0] == args.channel_layer:  # locked, with no edit: its channel map
                    final, compute = time_channel_map(page, head)
                    print(
                        f"browser: channel map of L{head[0]}H{head[1]}: complete after "
                        f"{final:.1f} s (kernel {compute:.1f} s)"
                    )
                    channel_map = (
                        f"browser_channel_map_s={final:.2f} channel_map_compute_s={compute:.2f} "
                        f"channel_map_head=L{head[0]}H{head[1]} "
                    )
            layer0 = timings[0]  # heads[0] is on layer 0
            if args.screenshots:  # after a prune and a switch of a top-layer KV head
                click_head(page, heads[0])
                stream_head(page, (heads[-1][0], 0))
                page.mouse.move(0, 0)  # no hover label over the grid
                args.screenshots.mkdir(parents=True, exist_ok=True)
                for width in (800, 1600):
                    page.set_viewport_size({"width": width, "height": 2000})
                    page.wait_for_timeout(500)
                    page.screenshot(
                        path=args.screenshots / f"dashboard_{width}.png", full_page=True
                    )
        finally:
            stop(server)
            browser.close()
            playwright.stop()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return (
        f"dashboard_browser_overhead_s={mean([t.overhead_s for t in timings]):.3f} "
        f"dashboard_first_feedback_s={mean([t.first_feedback_s for t in timings]):.3f} "
        f"first_feedback_max_s={max(t.first_feedback_s for t in timings):.3f} "
        f"browser_final_s={mean([t.final_s for t in timings]):.3f} "
        f"overhead_max_s={max(t.overhead_s for t in timings):.3f} "
        f"click_bytes={mean([t.received_bytes for t in timings]):.0f} "
        f"browser_layer0_update_s={layer0.final_s:.3f} "
        f"browser_layer0_compute_s={layer0.compute_s:.3f} {channel_map}"
    )


WATCH_MAP = """(label) => {
  // in the page's clock: the press on the button, the first frame showing the finished map
  const marks = window.__mapMarks = {press: null, done: null};
  document.addEventListener('mousedown', () => { marks.press = performance.now(); },
                            {capture: true, once: true});
  const watch = () => {
    const s = document.querySelector(`[data-channels="${label}"][data-compute-s]`);
    if (marks.press !== null && s) { marks.done = performance.now(); return; }
    requestAnimationFrame(watch);
  };
  requestAnimationFrame(watch);
}"""


def time_channel_map(page, head, *, timeout_ms: int = 1_800_000) -> tuple[float, float]:
    """Press the channel-map button (``head`` locked) and wait for the complete map: seconds
    from the press to the first frame showing it, and the kernel's compute seconds."""
    label = f"L{head[0]}H{head[1]}"
    page.evaluate(WATCH_MAP, label)
    page.get_by_role("button", name="channel map of the outlined head").click()
    page.wait_for_function("() => window.__mapMarks.done !== null", timeout=timeout_ms)
    marks = page.evaluate("() => window.__mapMarks")
    compute = page.evaluate(
        '(label) => Number(document.querySelector(`[data-channels="${label}"]`).dataset.computeS)',
        label,
    )
    return (marks["done"] - marks["press"]) / 1000, float(compute)


if __name__ == "__main__":
    main()
