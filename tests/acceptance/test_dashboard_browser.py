"""Real-browser tests: Debian's chromium driven by Playwright's Python package
(``interp_seal.browser``).

1. ``interp-seal dashboard`` serves the page at the dashboard benchmark's sizes; the test clicks
   heads in the grid and checks the numbers shown against the library's (``EditEvaluator`` on
   the same records, itself checked against one full forward per record in
   ``test_widgets_dashboard.py``), how fast the page answers (the cell within 0.3 s of the
   click, the finished update within 0.3 s of the kernel's own compute time), and that the
   grid fits an 800 px window. Then a click in *channels* mode opens a head's channel map
   through the page (its values: the library's channel sweep under the same edits), a
   click made while an update runs shows at once as queued, then lands, and a click in
   *stream KV* mode switches a KV head to sink + window attention: the curve and the table
   under it show the library's accuracy under ``compress_kv`` with the same edits, beside the
   KV bytes ``kv_budget_bytes`` gives.
2. JupyterLab renders ``notebooks/dashboard.ipynb``'s widgets after running it.
3. A small served page loads nothing from outside its server (every request the browser makes,
   and the URLs in its HTML), every response says ``Referrer-Policy: no-referrer``, and closing
   the tab stops its kernel; a page on another port of 127.0.0.1, which the browser sends the
   login cookie from (same site), can neither frame nor open the dashboard.

When no browser can be started the tests skip, except under CI (``$CI`` set), where they fail.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
import uuid
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.analysis.sweeps import SweepOptions, channel_sweep
from interp_seal.browser import (
    CELL_POSITION,
    CELL_VALUE,
    CHROMIUM,
    FIND_FIGURE,
    HOVERED,
    SHOWN,
    click_head,
    curves,
    figure,
    grid_cells_inside,
    kernel_processes,
    launch_chromium,
    open_dashboard,
    serve_dashboard,
    start,
    stop,
)
from interp_seal.cli.dashboard import free_port
from interp_seal.evaluation import evaluate_lengths, line_retrieval_samples
from interp_seal.interventions import scale_table
from interp_seal.models import StreamingHeads, compress_kv, kv_budget_bytes, load_model
from interp_seal.tuning import load_scales

LENGTHS, N = (20, 40, 60, 80), 20  # benchmarks/bench_dashboard.py's sizes
LAB_LENGTHS, LAB_N = (10, 60), 4
FIRST_FEEDBACK_S = 0.3  # click -> the cell changes colour
OVERHEAD_S = 0.3  # click -> done, beyond the kernel's compute time
CLICK_BYTES = 500_000  # what a click may send the page


@pytest.fixture
def _no_network():
    """These tests talk to local servers over loopback (conftest blocks sockets elsewhere)."""


@pytest.fixture(scope="module")
def chromium():
    try:
        playwright, browser = launch_chromium()
    except Exception as err:  # no playwright, no chromium, or it does not start
        message = f"cannot start chromium at {CHROMIUM} through Playwright: {err}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI: browser tests must run; see scripts/install_test_deps.sh)")
        pytest.skip(message)
    yield browser
    browser.close()
    playwright.stop()


def test_served_dashboard_answers_at_once_with_the_library_numbers(chromium, tmp_path):
    port, token = free_port(), "test-token-0123456789abcdef"
    # started in tmp_path: saves land in the launch directory (not Voila's temporary one)
    server = serve_dashboard(port=port, token=token, lengths=LENGTHS, n=N, cwd=tmp_path)
    try:
        # meanwhile: the library's numbers for the same records; a layer-0 head whose pruning
        # changes exact match, found through the library (no organism number is hard-coded)
        handle = load_model("organism")
        records = line_retrieval_samples(handle.tokenizer, LENGTHS, n=N, seed=0)
        evaluator = EditEvaluator(handle, records, progress=False)
        base = evaluator.evaluate(None)
        base = base[base.metric == "exact_match"].value.tolist()
        for index in range(handle.spec.n_heads):
            head = (0, index)
            table = evaluator.evaluate(scale_table(handle.spec, {head: 0.0}))
            edited = table[table.metric == "exact_match"].value.tolist()
            if edited != base:
                break
        assert edited != base, "no head of layer 0 changes exact match"
        top = (handle.spec.n_layers - 1, 0)
        both = evaluator.evaluate(scale_table(handle.spec, {head: 0.0, top: 0.0}))
        both = both[both.metric == "exact_match"].value.tolist()

        page = open_dashboard(chromium, f"http://127.0.0.1:{port}/?token={token}")
        assert curves(page) == {"edited": pytest.approx(base), "unedited": pytest.approx(base)}
        assert "Head-pruning dashboard: organism" in page.content()
        # the loading message reported the clean runs (4 lengths of 20 records, 4 records per
        # forward), then hid
        loading = page.locator("text=the dashboard teacher-forces")
        assert "clean runs 20/20" in loading.text_content() and not loading.is_visible()

        timings = {"layer 0": click_head(page, head)}  # the costliest click: every layer
        assert curves(page) == {"edited": pytest.approx(edited), "unedited": pytest.approx(base)}
        assert figure(page, "Head edits")[0]["z"][head[0]][head[1]] == 0  # pruned: factor 0
        timings["top layer"] = click_head(page, top)
        assert curves(page)["edited"] == pytest.approx(both)
        state = json.loads(page.locator("textarea").first.input_value())
        assert state["edits"] == [[*head, 0.0], [*top, 0.0]]
        for name, timing in timings.items():
            assert timing.first_feedback_s < FIRST_FEEDBACK_S, (name, timing)
            assert timing.overhead_s < OVERHEAD_S, (name, timing)
            # changed values only: one new plotly figure widget alone would send ~5 MB
            assert timing.received_bytes < CLICK_BYTES, (name, timing)

        page.set_viewport_size({"width": 800, "height": 1200})
        page.wait_for_timeout(300)  # the flex rows reflow
        assert grid_cells_inside(page)

        # save from the page: the file lands in the launch directory, the message shows its
        # absolute path, and it outlives the server
        saved = tmp_path / "dashboard_scales.safetensors"
        page.get_by_role("button", name="save scale file").click()
        page.get_by_text(f"saved the scale file to {saved}").wait_for(timeout=30_000)
        factors = load_scales(saved, handle.spec).scales[..., 0]
        expected = torch.ones(handle.spec.n_layers, handle.spec.n_heads)
        expected[head] = expected[top] = 0.0
        assert torch.equal(factors, expected)

        # a channel map through the page, under the edits: the library's sweep of them
        edits = {head: 0.0, top: 0.0}
        mapped = (2, 5)
        page.set_viewport_size({"width": 1400, "height": 2400})
        page.get_by_role("button", name="channels", exact=True).click()
        press(page, mapped)  # locks the head and opens its map, its edit unchanged
        label = f"L{mapped[0]}H{mapped[1]}"
        done = f'[data-channels="{label}"][data-compute-s]'
        page.wait_for_selector(done, state="attached", timeout=300_000)
        ref = channel_sweep(
            handle,
            records,
            heads=[mapped],
            intervention=scale_table(handle.spec, edits),
            options=SweepOptions(progress=False),
        )
        ref = ref[ref.metric == "exact_match"]
        drawn = figure(page, f"Channel map of {label}")[0]["z"]  # rows: lengths, shortest first
        for row, length in enumerate(LENGTHS):
            want = ref[ref.length == length].sort_values("channel").delta.tolist()
            assert drawn[row] == pytest.approx(want, abs=1e-9), length
        assert "L0H" in figure_title(page, f"Channel map of {label}")  # names the edits
        page.get_by_role("button", name="edit", exact=True).click()

        # a click during an update: marked and queued at once, applied after
        first, second = (0, (head[1] + 1) % handle.spec.n_heads), (1, 6)
        press(page, first)  # a new layer-0 edit: about a whole forward
        page.wait_for_function("() => document.body.innerText.includes('computing exact')")
        press(page, second)
        pressed = time.monotonic()
        page.wait_for_selector("[data-queued]", state="attached", timeout=5_000)
        assert page.evaluate(CELL_VALUE, list(second)) == 0  # the cell shows the edit at once
        assert time.monotonic() - pressed < FIRST_FEEDBACK_S + 0.5
        assert "queued: L1H6 pruned" in page.locator("[data-queued]").text_content()
        page.wait_for_function(
            "() => { const s = document.querySelector('[data-update]');"
            " return s && s.textContent.includes('4 edits'); }",
            timeout=300_000,
        )
        four = {**edits, first: 0.0, second: 0.0}
        want = evaluator.evaluate(scale_table(handle.spec, four))
        assert curves(page)["edited"] == pytest.approx(
            want[want.metric == "exact_match"].value.tolist()
        )

        # a stream click: the top layer's KV head of query head 5 to sink + window, under the
        # four edits; the page's numbers are the library's
        page.get_by_role("button", name="stream KV", exact=True).click()
        stream = (handle.spec.n_layers - 1, 5)
        press(page, stream)
        page.wait_for_function(
            "() => { const s = document.querySelector('[data-update]');"
            " return s && s.textContent.includes('4 edits, 1 streaming KV head'); }",
            timeout=300_000,
        )
        kv = (stream[0], stream[1] // handle.spec.group_size)
        config = StreamingHeads(heads={kv}, sink=4, window=64)  # the dashboard's defaults
        with compress_kv(handle, config):
            ref = evaluate_lengths(
                handle, records, intervention=scale_table(handle.spec, four), progress=False
            )
        assert curves(page)["edited"] == pytest.approx(ref.exact_match.tolist(), abs=1e-9)
        table = budget_rows(page)
        assert [row["length"] for row in table] == list(LENGTHS)
        for row, length in zip(table, LENGTHS, strict=True):
            tokens = [len(s.encode(handle.tokenizer).prompt_ids) for s in records[length]]
            kept = [kv_budget_bytes(config, handle.spec, t, itemsize=4) for t in tokens]
            full = [kv_budget_bytes(None, handle.spec, t, itemsize=4) for t in tokens]
            assert row["kvBytes"] == pytest.approx(sum(kept) / len(kept), rel=1e-12)
            assert row["kvShare"] == pytest.approx(sum(kept) / sum(full), rel=1e-12)
            assert row["value"] == pytest.approx(float(ref.set_index("length").exact_match[length]))
        text = page.evaluate("() => (FIND)('Head edits').data[0].text".replace("FIND", FIND_FIGURE))
        group = handle.spec.group_size
        assert [t.endswith("S") for t in text[kv[0]]] == [
            h // group == kv[1] for h in range(handle.spec.n_heads)
        ]
        state = json.loads(page.locator("textarea").first.input_value())
        assert state["streaming"] == [list(kv)]
        page.close()
    finally:
        stop(server)


def press(page, head) -> None:
    """A mouse click on ``head``'s grid cell (hovered first, as a hand does); no waiting."""
    x, y = page.evaluate(CELL_POSITION, list(head))
    page.mouse.move(x, y)
    page.wait_for_function(HOVERED, arg=list(head), polling="raf", timeout=10_000)
    page.mouse.down()
    page.mouse.up()


def budget_rows(page) -> list[dict]:
    """The accuracy / KV budget table under the curve, from its rows' data attributes."""
    return page.evaluate(
        """() => [...document.querySelectorAll('[data-kv-budget] tr[data-length]')].map(r => ({
            length: Number(r.dataset.length), value: Number(r.dataset.value),
            kvBytes: Number(r.dataset.kvBytes), kvShare: Number(r.dataset.kvShare)}))"""
    )


def figure_title(page, title: str) -> str:
    return page.evaluate(
        "(t) => [...document.querySelectorAll('.js-plotly-plot')].map(g => g.layout.title.text)"
        ".find(x => x && x.includes(t))",
        title,
    )


LAB_CELL = """import torch
from interp_seal.models import load_model
from interp_seal.widgets import Dashboard

torch.set_num_threads(1)
dashboard = Dashboard.from_model(load_model("organism"), lengths=LENGTHS, n=N, seed=0)
dashboard"""


def test_jupyterlab_renders_the_dashboard_notebook(chromium, tmp_path):
    import nbformat

    cell = LAB_CELL.replace("LENGTHS", repr(list(LAB_LENGTHS))).replace("N,", f"{LAB_N},")
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
    lab = start(command, "is running at", cwd=tmp_path)
    try:
        handle = load_model("organism")
        records = line_retrieval_samples(handle.tokenizer, LAB_LENGTHS, n=LAB_N, seed=0)
        evaluator = EditEvaluator(handle, records, progress=False)
        base = evaluator.evaluate(None)
        base = base[base.metric == "exact_match"].value.tolist()
        page = chromium.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(f"http://127.0.0.1:{port}/lab/tree/dash.ipynb", timeout=90_000)
        page.get_by_text("| Idle").wait_for(timeout=90_000)  # the kernel is up
        page.locator(".jp-Cell .jp-InputArea-editor").first.click()
        page.keyboard.press("Shift+Enter")
        page.wait_for_function(SHOWN, arg="vs context length", timeout=150_000)
        assert curves(page) == {"edited": pytest.approx(base), "unedited": pytest.approx(base)}
        assert figure(page, "Head edits") is not None
        page.close()
    finally:
        stop(lab)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """A dashboard on one length of two records: the page, not the numbers, is under test."""
    port, token = free_port(), "small-token-0123456789abcdef"
    proc = serve_dashboard(
        port=port, token=token, lengths=(10,), n=2, cwd=tmp_path_factory.mktemp("small")
    )
    yield {"url": f"http://127.0.0.1:{port}/", "token": token, "proc": proc}
    stop(proc)


def kernel_ids(server) -> set[int]:
    return {k.pid for k in kernel_processes(server["proc"])}


# XML namespace names (the loading spinner's SVG) are identifiers, never fetched
NAMESPACES = re.compile(r'(?:xmlns(?::\w+)?|rdf:resource)="[^"]*"')


def test_the_page_loads_only_from_its_server_and_its_kernel_stops_with_the_tab(
    chromium, small_server
):
    own = small_server["url"]
    before = kernel_ids(small_server)
    context = chromium.new_context()  # outlives the tab, as a browser does (its beacon is sent)
    page = context.new_page()
    requested, responses = [], []
    page.on("request", lambda r: requested.append(r.url))
    page.on("response", lambda r: responses.append(r))
    html = page.goto(f"{own}?token={small_server['token']}", timeout=60_000).text()
    page.wait_for_function(SHOWN, arg="vs context length", timeout=300_000)
    assert figure(page, "Head edits") is not None  # the widgets (font-awesome icons too) drew
    assert [u for u in requested if not u.startswith((own, f"blob:{own}"))] == []
    assert re.findall(r"https?://[^\s\"'<>]+", NAMESPACES.sub("", html)) == []
    served = [r for r in responses if r.url.startswith(own)]
    assert served and all(r.headers.get("referrer-policy") == "no-referrer" for r in served)
    opened = kernel_ids(small_server) - before
    assert len(opened) == 1
    # the page's beforeunload POST shuts its kernel down (not the idle culling, 10 minutes away)
    page.close(run_before_unload=True)
    deadline = time.monotonic() + 30
    while opened & kernel_ids(small_server) and time.monotonic() < deadline:
        time.sleep(0.5)
    context.close()
    assert not opened & kernel_ids(small_server)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_a_page_on_another_port_can_neither_frame_nor_open_the_dashboard(
    chromium, small_server, tmp_path
):
    dashboard = small_server["url"]
    (tmp_path / "index.html").write_text(
        f'<a id="go" href="{dashboard}">dashboard</a><iframe src="{dashboard}"></iframe>'
    )
    site = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(tmp_path))
    )
    threading.Thread(target=site.serve_forever, daemon=True).start()
    context = chromium.new_context()
    try:
        # log in as the printed URL does (a request that starts no kernel): the cookie
        login = f"{dashboard}api/kernels/{uuid.uuid4()}?token={small_server['token']}"
        assert context.request.get(login).status == 404
        before = kernel_ids(small_server)
        page = context.new_page()
        answers = []
        page.on("response", lambda r: answers.append(r) if r.url == dashboard else None)
        page.goto(f"http://127.0.0.1:{site.server_port}/")  # the iframe loads
        page.click("#go")
        page.wait_for_url(dashboard)
        assert [r.status for r in answers] == [403, 403]  # the frame, then the link
        # the browser did send the cookie (same site): the server refused it
        assert all("username-" in r.request.all_headers().get("cookie", "") for r in answers)
        assert "Head-pruning dashboard" not in page.content()
        assert kernel_ids(small_server) <= before
        # the same cookie with the URL typed in opens the page
        assert page.goto(dashboard, timeout=60_000).status == 200
        page.close(run_before_unload=True)
    finally:
        context.close()
        site.shutdown()
