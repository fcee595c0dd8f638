"""The served dashboard in a real browser (Playwright driving chromium), as its user meets it.

Used by the browser tests (``tests/acceptance/test_dashboard_browser.py``) and the dashboard benchmark
(``benchmarks/bench_dashboard.py``): start ``interp-seal dashboard`` in its own process group,
open the page, read the plotly figures the page actually draws (their ``data`` in the DOM), click
a head where the grid draws it, and time what the user sees:

- **first feedback**: from the mouse click to the grid cell's new colour in the page;
- **final**: from the mouse click to the page's status saying the update is done, with the
  accuracy curve complete. The kernel reports how long it computed (``data-compute-s`` on the
  status), so ``final - compute`` is the time the widgets and the browser add.

Playwright's own browser download is not needed: Debian's chromium (``/usr/bin/chromium``) is
driven through ``executable_path``. Nothing here is imported by the library.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

FIND_FIGURE = """(title) => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => g.layout && String(g.layout.title && (g.layout.title.text || g.layout.title))
      .includes(title));
  return gd ? gd : null;
}"""
FIGURE_DATA = """(title) => {
  const gd = (FIND)(title);
  return gd && gd.data.map(d => ({
    name: d.name === undefined ? null : d.name,
    y: d.y ? Array.from(d.y) : null, z: d.z ? Array.from(d.z, r => Array.from(r)) : null,
  }));
}""".replace("FIND", FIND_FIGURE)
CELL_POSITION = """([layer, head]) => {
  const gd = (FIND)('Head edits');
  const box = gd.getBoundingClientRect();
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  return [box.left + xa._offset + xa.l2p(head), box.top + ya._offset + ya.l2p(layer)];
}""".replace("FIND", FIND_FIGURE)
CELL_VALUE = """([layer, head]) => (FIND)('Head edits').data[0].z[layer][head]""".replace(
    "FIND", FIND_FIGURE
)
HOVERED = """([layer, head]) => {
  const hover = (FIND)('Head edits')._hoverdata;
  return Boolean(hover && hover.length && hover[0].x === head && hover[0].y === layer);
}""".replace("FIND", FIND_FIGURE)
STATUS = """() => {
  const el = document.querySelector('[data-update]');
  return el && {update: Number(el.dataset.update), compute: Number(el.dataset.computeS),
                text: el.textContent};
}"""
SHOWN = "(title) => (FIND)(title) !== null".replace("FIND", FIND_FIGURE)


def launch_chromium():
    """``(playwright, browser)``: Playwright's sync API driving ``CHROMIUM``. Stop both with
    ``browser.close(); playwright.stop()``."""
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    except Exception:
        playwright.stop()
        raise
    return playwright, browser


def start(command: list[str], ready: str, *, cwd: Path, timeout: float = 120) -> subprocess.Popen:
    """Run ``command`` in ``cwd`` (its own process group, one torch thread) until a line
    containing ``ready`` shows; ``AssertionError`` with its output if it does not.

    ``proc.output`` is the list of lines it has printed (stdout and stderr), kept up to date by a
    thread that reads the pipe to its end: the tests read the server's log, and a pipe nobody
    reads would block a chatty server once full."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        cwd=cwd,
    )
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if ready in line:
            proc.output = seen
            threading.Thread(target=_read_to_end, args=(proc, seen), daemon=True).start()
            return proc
        if not line and proc.poll() is not None:
            break
    stop(proc)
    raise AssertionError(f"{command[:4]} did not start:\n{''.join(seen)[-3000:]}")


def _read_to_end(proc: subprocess.Popen, lines: list[str]) -> None:
    for line in proc.stdout:
        lines.append(line)


def stop(proc: subprocess.Popen) -> None:
    """End a process started by ``start`` and everything it started (its process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def kernel_processes(proc: subprocess.Popen) -> list:
    """The live kernel processes (``psutil.Process``) of a server started by ``start``; a kernel
    shut down just now may linger as a zombie and is left out."""
    import psutil

    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "ipykernel_launcher" in " ".join(
                child.cmdline()
            ):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def serve_dashboard(
    *, port: int, token: str, lengths, n: int, cwd: Path, model: str = "organism"
) -> subprocess.Popen:
    """``interp-seal dashboard`` on ``127.0.0.1:port``, returned once Voila listens."""
    command = [sys.executable, "-m", "interp_seal.cli", "dashboard", "--model", model]
    command += ["--lengths", *map(str, lengths), "--n", str(n), "--port", str(port)]
    command += ["--token", token]
    return start(command, "is running at", cwd=cwd)


def open_dashboard(browser, url: str, *, width: int = 1400, height: int = 1600):
    """A page on the dashboard at ``url``, returned once its accuracy figure is drawn. The page
    counts the bytes its websockets receive (``received_bytes(page)``)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    received = page.received_bytes = [0]

    def watch(ws) -> None:
        ws.on("framereceived", lambda payload: received.__setitem__(0, received[0] + len(payload)))

    page.on("websocket", watch)
    page.goto(url, timeout=60_000)
    page.wait_for_function(SHOWN, arg="vs context length", timeout=300_000)
    page.wait_for_function(STATUS, timeout=60_000)
    return page


def figure(page, title: str) -> list[dict]:
    """The traces (``name``, ``y``, ``z``) of the page's plotly figure whose title has
    ``title``."""
    return page.evaluate(FIGURE_DATA, title)


def curves(page) -> dict[str, list]:
    """The accuracy figure's curves as drawn: ``{"edited": [...], "unedited": [...]}``."""
    return {trace["name"]: trace["y"] for trace in figure(page, "vs context length")}


@dataclass(frozen=True)
class ClickTiming:
    """Seconds from a mouse click on a grid cell to what the page shows."""

    first_feedback_s: float  # the cell's new colour
    final_s: float  # the status says the update is done
    compute_s: float  # the kernel's own time for the update (its status says)
    received_bytes: int  # what the page's websockets received meanwhile

    @property
    def overhead_s(self) -> float:
        """What the widgets and the browser add to the computation."""
        return self.final_s - self.compute_s


WATCH_CLICK = """([head, cell, update]) => {
  // in the page's own clock: the mouse press, the cell's new value, the finished update
  const marks = window.__clickMarks = {press: null, cell: null, done: null};
  document.addEventListener('mousedown', () => { marks.press = performance.now(); },
                            {capture: true, once: true});
  const status = STATUS;
  const cellValue = CELL_VALUE;
  const watch = () => {
    const now = performance.now();
    if (marks.press !== null && marks.cell === null && cellValue(head) !== cell) marks.cell = now;
    const s = status();
    if (marks.press !== null && s && s.update > update) { marks.done = now; return; }
    requestAnimationFrame(watch);
  };
  requestAnimationFrame(watch);
}""".replace("STATUS", STATUS).replace("CELL_VALUE", CELL_VALUE)


def click_head(page, head: tuple[int, int], *, timeout_ms: int = 120_000) -> ClickTiming:
    """Click ``head``'s cell with the mouse and wait until the page shows the finished update.

    Times are read in the page (``performance.now`` at the mouse press, and on the first
    animation frame that shows the new cell value and the finished status), so that the
    driver's own round trips are not counted."""
    before_cell = page.evaluate(CELL_VALUE, list(head))
    before = page.evaluate(STATUS)["update"]
    x, y = page.evaluate(CELL_POSITION, list(head))
    start_bytes = page.received_bytes[0]
    # plotly reports a click on the point last hovered: hover the cell first, as a hand does
    page.mouse.move(x, y)
    page.wait_for_function(HOVERED, arg=list(head), polling="raf", timeout=timeout_ms)
    page.evaluate(WATCH_CLICK, [list(head), before_cell, before])
    page.mouse.down()
    page.mouse.up()
    page.wait_for_function(
        "() => window.__clickMarks.done !== null", polling="raf", timeout=timeout_ms
    )
    marks = page.evaluate("() => window.__clickMarks")
    if marks["cell"] is None:
        raise AssertionError(
            f"the cell of head {head} never changed on the page: marks {marks}, before "
            f"{before_cell!r} / update {before}, now {page.evaluate(CELL_VALUE, list(head))!r}, "
            f"status {page.evaluate(STATUS)}, grid {figure(page, 'Head edits')[0]['z']}"
        )
    compute = float(page.evaluate(STATUS)["compute"])
    return ClickTiming(
        (marks["cell"] - marks["press"]) / 1000,
        (marks["done"] - marks["press"]) / 1000,
        compute,
        page.received_bytes[0] - start_bytes,
    )


def stream_head(page, head: tuple[int, int], *, timeout_ms: int = 300_000) -> None:
    """Switch the KV head that query head ``head`` reads with a click in *stream KV* mode (the
    toggle is left there), and wait until the page shows the finished update."""
    page.get_by_role("button", name="stream KV", exact=True).click()
    before = page.evaluate(STATUS)["update"]
    x, y = page.evaluate(CELL_POSITION, list(head))
    page.mouse.move(x, y)
    page.wait_for_function(HOVERED, arg=list(head), polling="raf", timeout=timeout_ms)
    page.mouse.down()
    page.mouse.up()
    page.wait_for_function(
        f"() => {{ const s = ({STATUS})(); return s && s.update > {before}; }}",
        polling="raf",
        timeout=timeout_ms,
    )


def grid_cells_inside(page) -> bool:
    """Whether every cell of the head grid and its colour bar lie inside the viewport."""
    return page.evaluate(
        """() => {
          const gd = (FIND)('Head edits');
          const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
          const box = gd.getBoundingClientRect();
          const width = window.innerWidth;
          const heads = gd.data[0].x.length, layers = gd.data[0].y.length;
          const right = box.left + xa._offset + xa.l2p(heads - 1) + 0.5 * (xa.l2p(1) - xa.l2p(0));
          const bar = gd.querySelector('.colorbar');
          const barRight = bar ? bar.getBoundingClientRect().right : 0;
          return box.left >= 0 && right <= width && barRight <= width && layers > 0;
        }""".replace("FIND", FIND_FIGURE)
    )
