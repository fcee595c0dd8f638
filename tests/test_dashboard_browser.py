"""Real-browser tests: Debian's chromium driven by Playwright's Python package.

1. ``interp-seal dashboard`` serves the page; the test clicks a head in the grid, waits for the
   accuracy figure to change and checks the numbers shown against the library's
   (``EditEvaluator`` on the same records, itself checked against one full forward per record in
   ``test_widgets_dashboard.py``).
2. JupyterLab renders ``notebooks/dashboard.ipynb``'s widgets after running it.

When no browser can be started the tests skip, except under CI (``$CI`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.cli.dashboard import free_port
from interp_seal.evaluation import line_retrieval_samples
from interp_seal.interventions import scale_table
from interp_seal.models import load_model
from interp_seal.tuning import load_scales

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
LENGTHS, N = (10, 60), 4
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def _no_network():
    """These tests talk to local servers over loopback (conftest blocks sockets elsewhere)."""


@pytest.fixture(scope="module")
def chromium():
    try:
        from playwright.sync_api import sync_playwright

        playwright = sync_playwright().start()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    except Exception as err:  # no playwright, no chromium, or it does not start
        message = f"cannot start chromium at {CHROMIUM} through Playwright: {err}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI: browser tests must run; see scripts/install_test_deps.sh)")
        pytest.skip(message)
    yield browser
    browser.close()
    playwright.stop()


def start(
    command: list[str], ready: str, *, timeout: float = 120, cwd: Path = ROOT
) -> subprocess.Popen:
    """Run ``command`` (in ``cwd``, its own process group) until a line containing ``ready``
    shows."""
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
            return proc
        if not line and proc.poll() is not None:
            break
    stop(proc)
    raise AssertionError(f"{command[:4]} did not start:\n{''.join(seen)[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """End the server and the kernels it started (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


FIND_FIGURE = """(title) => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => g.layout && String(g.layout.title && (g.layout.title.text || g.layout.title))
      .includes(title));
  return gd ? gd : null;
}"""


FIGURE_DATA = """(title) => {
  const gd = (FIND)(title);
  return gd && gd.data.map(d => ({
    y: d.y ? Array.from(d.y) : null, z: d.z ? Array.from(d.z, r => Array.from(r)) : null,
  }));
}""".replace("FIND", FIND_FIGURE)
CELL_POSITION = """([layer, head]) => {
  const gd = (FIND)('Head edits');
  const box = gd.getBoundingClientRect();
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  return [box.left + xa._offset + xa.l2p(head), box.top + ya._offset + ya.l2p(layer)];
}""".replace("FIND", FIND_FIGURE)
CHANGED = """([title, before]) => {
  const gd = (FIND)(title);
  return JSON.stringify(Array.from(gd.data[1].y)) !== before;
}""".replace("FIND", FIND_FIGURE)
SHOWN = "(title) => (FIND)(title) !== null".replace("FIND", FIND_FIGURE)


def figure(page, title: str) -> list[dict]:
    """The traces (``y``, ``z``) of the plotly figure whose title contains ``title``."""
    return page.evaluate(FIGURE_DATA, title)


def test_served_dashboard_click_updates_accuracy(chromium, tmp_path):
    port, token = free_port(), "test-token-0123456789abcdef"
    command = [sys.executable, "-m", "interp_seal.cli", "dashboard", "--model", "organism"]
    command += ["--lengths", *map(str, LENGTHS), "--n", str(N), "--port", str(port)]
    command += ["--token", token]
    # started in tmp_path: saves land in the launch directory (not Voila's temporary one)
    server = start(command, "is running at", cwd=tmp_path)  # Voila prints its URL when it listens
    try:
        # meanwhile: the library's numbers for the same records; a head whose pruning changes
        # exact match, found through the library (no organism number is hard-coded)
        handle = load_model("organism")
        records = line_retrieval_samples(handle.tokenizer, LENGTHS, n=N, seed=0)
        evaluator = EditEvaluator(handle, records, progress=False)
        base = evaluator.evaluate(None)
        base = base[base.metric == "exact_match"].value.tolist()
        heads = [(handle.spec.n_layers - 1, h) for h in range(handle.spec.n_heads)]
        heads += [(0, h) for h in range(handle.spec.n_heads)]
        for head in heads:
            table = evaluator.evaluate(scale_table(handle.spec, {head: 0.0}))
            edited = table[table.metric == "exact_match"].value.tolist()
            if edited != base:
                break
        assert edited != base, "no head of the first and last layer changes exact match"

        page = chromium.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(f"http://127.0.0.1:{port}/?token={token}", timeout=60_000)
        page.wait_for_function(SHOWN, arg="vs context length", timeout=150_000)
        shown = figure(page, "vs context length")
        assert shown[0]["y"] == pytest.approx(base) and shown[1]["y"] == pytest.approx(base)

        page.mouse.click(*page.evaluate(CELL_POSITION, list(head)))
        before = json.dumps(shown[1]["y"], separators=(",", ":"))
        page.wait_for_function(CHANGED, arg=["vs context length", before], timeout=60_000)
        shown = figure(page, "vs context length")
        assert shown[1]["y"] == pytest.approx(edited, abs=1e-9)
        assert shown[0]["y"] == pytest.approx(base, abs=1e-9)
        grid = figure(page, "Head edits")[0]["z"]
        assert grid[head[0]][head[1]] == -1  # pruned: factor 0
        state = json.loads(page.locator("textarea").first.input_value())
        assert state["edits"] == [[head[0], head[1], 0.0]]

        # save from the page: the file lands in the launch directory, the message shows its
        # absolute path, and it outlives the server
        saved = tmp_path / "dashboard_scales.safetensors"
        page.get_by_role("button", name="save scale file").click()
        page.get_by_text(f"saved the scale file to {saved}").wait_for(timeout=30_000)
        page.close()
    finally:
        stop(server)
    factors = load_scales(saved, handle.spec).scales[..., 0]
    expected = torch.ones(handle.spec.n_layers, handle.spec.n_heads)
    expected[head] = 0.0
    assert torch.equal(factors, expected)


LAB_CELL = """import torch
from interp_seal.models import load_model
from interp_seal.widgets import Dashboard

torch.set_num_threads(1)
dashboard = Dashboard.from_model(load_model("organism"), lengths=LENGTHS, n=N, seed=0)
dashboard"""


def test_jupyterlab_renders_the_dashboard_notebook(chromium, tmp_path):
    import nbformat

    cell = LAB_CELL.replace("LENGTHS", repr(list(LENGTHS))).replace("N,", f"{N},")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, tmp_path / "dash.ipynb")
    port = free_port()
    command = ["jupyter", "lab", "--allow-root", "--no-browser", "--ip", "127.0.0.1"]
    command += [f"--port={port}", "--IdentityProvider.token=", "--ServerApp.password="]
    command += [f"--ServerApp.root_dir={tmp_path}", "--LabApp.news_url=None"]
    lab = start(command, "is running at")
    try:
        handle = load_model("organism")
        records = line_retrieval_samples(handle.tokenizer, LENGTHS, n=N, seed=0)
        evaluator = EditEvaluator(handle, records, progress=False)
        base = evaluator.evaluate(None)
        base = base[base.metric == "exact_match"].value.tolist()
        page = chromium.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(f"http://127.0.0.1:{port}/lab/tree/dash.ipynb", timeout=90_000)
        page.get_by_text("| Idle").wait_for(timeout=90_000)  # the kernel is up
        page.locator(".jp-Cell .jp-InputArea-editor").first.click()
        page.keyboard.press("Shift+Enter")
        page.wait_for_function(SHOWN, arg="vs context length", timeout=150_000)
        shown = figure(page, "vs context length")
        assert shown[0]["y"] == pytest.approx(base) and shown[1]["y"] == pytest.approx(base)
        assert figure(page, "Head edits") is not None
        page.close()
    finally:
        stop(lab)
