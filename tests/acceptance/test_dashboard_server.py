"""The served dashboard is not an open door: token, Host and Origin checks, the login cookie
from other pages, the kernel bound, headers, the token kept out of the log, kernels, memory.

One ``interp-seal dashboard`` server for the module, started in a fresh launch directory with
a known ``--token``. (The page's static assets, public files of the installed packages, are
served without the token, as Jupyter serves them.) the tests talk to it over HTTP and the kernel websocket as a browser, a
local process or a rebinding web page would. The page itself working with the token (a click,
the numbers, a save landing in the launch directory) is ``test_dashboard_browser.py``'s.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import sys
import time
import uuid

import psutil
import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from interp_seal.browser import kernel_processes, start, stop
from interp_seal.cli import main
from interp_seal.cli.dashboard import free_port
from interp_seal.widgets.app import message_header

TOKEN = "server-test-token-0123456789abcdef"
IDLE_S = 8  # kernels of pages nobody has open are culled after this long
KERNEL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def _no_network():
    """These tests talk to a local server over loopback (conftest blocks sockets elsewhere)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    launch = tmp_path_factory.mktemp("launch")
    port = free_port()
    command = [sys.executable, "-m", "interp_seal.cli", "dashboard", "--model", "organism"]
    command += ["--lengths", "10", "--n", "2", "--port", str(port), "--token", TOKEN]
    command += ["--idle-timeout", str(IDLE_S)]
    proc = start(command, "is running at", cwd=launch)
    yield {"port": port, "launch": launch, "proc": proc}
    stop(proc)


def request(port: int, path: str, headers: dict | None = None) -> http.client.HTTPResponse:
    """One GET, redirects not followed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


def kernels(server) -> list[psutil.Process]:
    """The server's live kernel processes (a kernel shut down just now may linger as a zombie)."""
    return kernel_processes(server["proc"])


def set_cookies(response) -> list[str]:
    return [value for name, value in response.getheaders() if name.lower() == "set-cookie"]


def login_cookie(port: int) -> str:
    """The ``Cookie`` header of a browser that has logged in with the token (a request for a
    kernel that does not exist: it starts nothing)."""
    response = request(port, f"/api/kernels/{uuid.uuid4()}?token={TOKEN}")
    login = [c for c in set_cookies(response) if c.startswith("username-")]
    return login[0].split(";")[0]


def open_page(server) -> str:
    """Load the page with the token; the id of the kernel that runs it."""
    page = request(server["port"], f"/?token={TOKEN}")
    assert page.status == 200
    return KERNEL_ID.search(page.body.decode()).group(0)


async def _websocket(port: int, kernel: str, query: str, headers: dict, *, path: str = ""):
    """The kernel's websocket, or with ``path="execution"`` Voila's execution websocket (the
    page asks it to run the notebook's cells: progressive rendering)."""
    if path == "execution":
        url = f"ws://127.0.0.1:{port}/voila/execution/{kernel}{query}"
    else:
        url = f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels{query}"
    return await websocket_connect(HTTPRequest(url, headers=headers))


def execute_page(port: int, kernel: str) -> None:
    """Run the page's cells in its kernel, as the page's script does, until the last is done."""

    async def run():
        headers = {"Origin": f"http://127.0.0.1:{port}"}
        ws = await _websocket(port, kernel, f"?token={TOKEN}", headers, path="execution")
        await ws.write_message(json.dumps({"action": "execute", "payload": {"kernel_id": kernel}}))
        while True:
            message = json.loads(await asyncio.wait_for(ws.read_message(), 300))
            assert message["action"] != "execution_error", message
            payload = message["payload"]
            if message["action"] == "execution_result":
                if payload["cell_index"] + 1 == payload["total_cell"]:
                    break
        ws.close()

    asyncio.run(run())


def websocket_status(port: int, kernel: str, query: str, headers: dict, *, path: str = "") -> int:
    """101 if the websocket opens, else the HTTP status that refused it."""

    async def probe():
        try:
            ws = await _websocket(port, kernel, query, headers, path=path)
        except HTTPClientError as err:
            return err.code
        ws.close()
        return 101

    return asyncio.run(probe())


def test_requests_without_the_token_start_nothing(server):
    port = server["port"]
    for path in ("/", "/?token=wrong-token-0123456789"):
        page = request(port, path)
        assert page.status == 302 and page.getheader("Location").startswith("/login")
        assert b"kernelId" not in page.body
    api = request(port, "/api/kernels/00000000-0000-0000-0000-000000000000")
    assert api.status == 403
    assert kernels(server) == []


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:{port}", "10.1.2.3"])
def test_a_foreign_host_is_refused_even_with_the_token(server, host):
    """DNS rebinding: a page on another site reaches 127.0.0.1 under its own name."""
    port = server["port"]
    page = request(port, f"/?token={TOKEN}", {"Host": host.format(port=port)})
    assert page.status == 403
    api = request(
        port, f"/api/kernels/{uuid.uuid4()}?token={TOKEN}", {"Host": host.format(port=port)}
    )
    assert api.status == 403
    assert kernels(server) == []


def test_the_kernel_websocket_needs_the_token_and_the_pages_origin(server):
    port = server["port"]
    kernel = open_page(server)
    own = {"Origin": f"http://127.0.0.1:{port}"}
    assert websocket_status(port, kernel, f"?token={TOKEN}", own) == 101
    assert websocket_status(port, kernel, "", own) == 403
    assert websocket_status(port, kernel, "?token=wrong-token-0123456789", own) == 403
    foreign = {"Origin": "http://evil.example.com"}
    assert websocket_status(port, kernel, f"?token={TOKEN}", foreign) == 403
    rebinding = {"Host": f"evil.example.com:{port}", "Origin": f"http://evil.example.com:{port}"}
    assert websocket_status(port, kernel, f"?token={TOKEN}", rebinding) == 403
    # the execution websocket (it runs the page's cells) is checked the same way
    run = {"path": "execution"}
    assert websocket_status(port, kernel, f"?token={TOKEN}", own, **run) == 101
    assert websocket_status(port, kernel, "", own, **run) == 403
    assert websocket_status(port, kernel, "?token=wrong-token-0123456789", own, **run) == 403
    assert websocket_status(port, kernel, f"?token={TOKEN}", foreign, **run) == 403
    assert websocket_status(port, kernel, f"?token={TOKEN}", rebinding, **run) == 403


def test_the_login_cookies_are_same_site_strict(server):
    """The login cookie is ``HttpOnly`` too; ``_xsrf`` cannot be: the page's script reads it."""
    port = server["port"]
    login = set_cookies(request(port, f"/api/kernels/{uuid.uuid4()}?token={TOKEN}"))
    assert login and all(c.startswith("username-") for c in login)
    assert all("SameSite=Strict" in c and "HttpOnly" in c for c in login), login
    error_page = request(port, "/", {"Host": "evil.example.com"})  # its form sets _xsrf
    xsrf = [c for c in set_cookies(error_page) if c.startswith("_xsrf=")]
    assert xsrf and all("SameSite=Strict" in c for c in xsrf), xsrf


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},  # a page on another site: SameSite=Strict stops the
        {"Sec-Fetch-Site": "same-site"},  # cookie; on another port of 127.0.0.1 it does not
        {"Origin": "http://127.0.0.1:1"},
        {"Origin": "null"},  # a sandboxed frame
        {"Referer": "http://evil.example.com/page"},
    ],
    ids=["cross-site", "another-port", "foreign-origin", "null-origin", "foreign-referer"],
)
def test_the_login_cookie_alone_from_another_page_is_refused(server, headers):
    port = server["port"]
    cookie = {"Cookie": login_cookie(port)}
    before = {k.pid for k in kernels(server)}
    assert request(port, "/", cookie | headers).status == 403
    assert request(port, f"/api/kernels/{uuid.uuid4()}", cookie | headers).status == 403
    kernel = str(uuid.uuid4())
    assert websocket_status(port, kernel, "", cookie | headers) == 403
    assert websocket_status(port, kernel, "", cookie | headers, path="execution") == 403
    assert {k.pid for k in kernels(server)} <= before  # nothing started
    # the same cookie from the page itself, a typed URL or a script logs in (404: no such kernel)
    own = f"http://127.0.0.1:{port}"
    for same in ({"Sec-Fetch-Site": "same-origin", "Origin": own}, {"Sec-Fetch-Site": "none"}, {}):
        assert request(port, f"/api/kernels/{uuid.uuid4()}", cookie | same).status == 404
        assert websocket_status(port, kernel, "", cookie | same) == 404


def test_every_response_says_no_referrer(server):
    """The page's URL holds the token: no response lets the browser pass it on. Jupyter's own
    security headers stay."""
    port = server["port"]
    page = request(port, f"/?token={TOKEN}")  # (its kernel is culled once idle)
    asset = re.search(r'(?:src|href)="(/voila/[^"]+)"', page.body.decode()).group(1)
    responses = {
        "page": page,
        "asset": request(port, asset),
        "login redirect": request(port, "/"),
        "login page": request(port, "/login"),
        "refused host": request(port, f"/?token={TOKEN}", {"Host": "evil.example.com"}),
        "no such kernel": request(port, f"/api/kernels/{uuid.uuid4()}?token={TOKEN}"),
    }
    assert [page.status, responses["login redirect"].status] == [200, 302]
    for name, response in responses.items():
        assert response.getheader("Referrer-Policy") == "no-referrer", name
    assert page.getheader("X-Content-Type-Options") == "nosniff"
    assert "frame-ancestors 'self'" in page.getheader("Content-Security-Policy")

    async def handshake():
        kernel = KERNEL_ID.search(page.body.decode()).group(0)
        ws = await _websocket(
            port, kernel, f"?token={TOKEN}", {"Origin": f"http://127.0.0.1:{port}"}
        )
        ws.close()
        return ws.headers.get("Referrer-Policy")

    assert asyncio.run(handshake()) == "no-referrer"


def test_the_token_never_reaches_the_log(server):
    """Accepted and refused requests carry the token in the query and in headers; the only
    line with the token is the URL printed at start (the user needs it)."""
    port = server["port"]
    kernel = open_page(server)
    assert request(port, f"/api/kernels/{kernel}?token={TOKEN}").status == 200
    assert (
        request(port, f"/api/kernels/{kernel}", {"Authorization": f"token {TOKEN}"}).status == 200
    )
    refused = [
        (f"/api/kernels/{uuid.uuid4()}?token={TOKEN}", {}),  # 404, logged with its URL
        (f"/api/kernels/{uuid.uuid4()}?token={TOKEN}x", {}),  # a near miss
        (f"/?token={TOKEN}", {"Host": "evil.example.com"}),
        (f"/api/kernels/{kernel}", {"Authorization": f"token {TOKEN}", "Host": "10.1.2.3"}),
        (f"/login?next=%2F%3Ftoken%3D{TOKEN}", {"Host": "10.1.2.3"}),
        ("/", {"Cookie": login_cookie(port), "Referer": f"http://evil.example.com/?token={TOKEN}"}),
        (
            f"/voila/files/nothing?token={TOKEN}",
            {"Referer": f"http://127.0.0.1:{port}/?token={TOKEN}"},
        ),
    ]
    for path, headers in refused:
        assert request(port, path, headers).status >= 400, path
    foreign = {"Origin": "http://evil.example.com", "Authorization": f"token {TOKEN}"}
    assert websocket_status(port, kernel, f"?token={TOKEN}", foreign) == 403
    end = str(uuid.uuid4())  # the last request: once its line shows, the others' have
    assert request(port, f"/api/kernels/{end}?token={TOKEN}").status == 404
    deadline = time.monotonic() + 30
    while end not in "".join(server["proc"].output) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = "".join(server["proc"].output)
    assert end in log
    assert f"/api/kernels/{end}?token=[redacted]" in log  # the requests were logged, hidden
    url = f"interp-seal dashboard for organism: http://127.0.0.1:{port}/?token={TOKEN}"
    assert [line for line in log.splitlines() if TOKEN in line] == [url]


def test_a_page_past_the_kernel_bound_gets_a_short_503(tmp_path):
    port = free_port()
    command = [sys.executable, "-m", "interp_seal.cli", "dashboard", "--model", "organism"]
    command += ["--lengths", "10", "--n", "2", "--port", str(port), "--token", TOKEN]
    proc = start(command + ["--max-kernels", "1"], "is running at", cwd=tmp_path)
    try:
        bounded = {"proc": proc, "port": port}
        assert request(port, f"/?token={TOKEN}").status == 200
        assert len(kernels(bounded)) == 1
        second = request(port, f"/?token={TOKEN}")
        assert second.status == 503
        assert second.body.decode() == (
            "The dashboard already runs 1 kernel, as many as --max-kernels 1 allows: close a "
            "dashboard tab (its kernel stops), or restart interp-seal dashboard with a larger "
            "--max-kernels.\n"
        )
        assert second.getheader("Referrer-Policy") == "no-referrer"
        assert len(kernels(bounded)) == 1
    finally:
        stop(proc)


def _message(msg_type: str, content: dict) -> str:
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "", "session": "t"}
    return json.dumps(
        {
            "header": header | {"version": "5.3", "date": ""},
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": "shell",
            "buffers": [],
        }
    )


def test_asking_every_widget_for_its_state_does_not_grow_the_server(server):
    """The request that made Voila's own handler grow by ~50 MB/s until killed."""
    port = server["port"]
    kernel = open_page(server)
    execute_page(port, kernel)  # the dashboard's widgets exist once its cells have run

    async def ask_all(seconds: float) -> int:
        ws = await _websocket(
            port, kernel, f"?token={TOKEN}", {"Origin": f"http://127.0.0.1:{port}"}
        )
        await ws.write_message(_message("comm_info_request", {"target_name": "jupyter.widget"}))
        comms = None
        while comms is None:
            reply = json.loads(await ws.read_message())
            if reply["header"]["msg_type"] == "comm_info_reply":
                comms = reply["content"]["comms"]
        for comm in comms:
            await ws.write_message(
                _message("comm_msg", {"comm_id": comm, "data": {"method": "request_state"}})
            )
        received, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                received += bool(await asyncio.wait_for(ws.read_message(), 1))
            except TimeoutError:
                pass
        ws.close()
        return received

    process = psutil.Process(server["proc"].pid)
    before = process.memory_info().rss
    assert asyncio.run(ask_all(4)) > 50  # every widget answered with its state
    time.sleep(3)
    after = process.memory_info().rss
    assert after - before < 150e6, f"server grew by {(after - before) / 1e6:.0f} MB"
    assert process.cpu_percent(interval=1.0) < 50  # not stuck in a runaway loop


def test_a_port_in_use_is_refused_before_serving(server, capsys):
    port = server["port"]
    assert main(["dashboard", "--port", str(port), "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use; pass --port 0 for a free one" in err


def test_the_kernel_of_a_closed_page_is_shut_down(server):
    """A tab that loaded the page and went away leaves no kernel behind (Jupyter's culling)."""
    open_page(server)
    assert kernels(server), "the page started no kernel"
    deadline = time.monotonic() + IDLE_S + 60
    while kernels(server) and time.monotonic() < deadline:
        time.sleep(1)
    assert kernels(server) == []


def test_message_headers_parse_only_what_fits():
    header = {"msg_type": "execute_input", "msg_id": "1"}
    parts = [b"iopub", json.dumps(header).encode(), b"{}", b"{}", b"{}"]
    offsets, position = [], 8 * (len(parts) + 1)
    for part in parts:
        offsets.append(position)
        position += len(part)
    v1 = (len(parts)).to_bytes(8, "little") + b"".join(o.to_bytes(8, "little") for o in offsets)
    v1 += b"".join(parts)
    assert message_header(v1) == header
    assert message_header({"header": header}) == header
    assert message_header(json.dumps({"header": header})) == header
    legacy = (1).to_bytes(4, "big") + (12).to_bytes(4, "big") + json.dumps({"a": 1}).encode()
    assert message_header(legacy) is None  # Voila's own parser built a list ~1e17 long here
    assert message_header(json.dumps({"header": header}).encode()) is None
    assert message_header(b"\x00" * 4) is None
