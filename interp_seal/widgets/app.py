"""The dashboard as a web page (``interp-seal dashboard``): Voila serving a one-cell notebook.

The page is a two-cell notebook (``page.py``, the kernel's side): ``loading()`` shows what is
being prepared at once, then ``show()`` builds the dashboard, reporting the clean runs'
progress in that message; Voila runs it in a fresh kernel for each browser tab, renders cells
progressively and shows the widgets, not the code. The dashboard's settings (model, lengths,
records, seed) travel to the kernel in the ``INTERP_SEAL_DASHBOARD`` environment variable. Each
tab's kernel holds one model and one ``Dashboard``, so two tabs never share hooks; inside a tab
the dashboard's lock serialises forwards.

The server is locked down the way Jupyter's own servers are: a random token per start (or
``--token``), printed in the URL, without which every page and kernel request is refused;
requests whose ``Host`` is not a local name (DNS rebinding) or whose ``Origin`` is not the page
itself are refused, even with the token; it listens on 127.0.0.1 only; kernels of closed tabs
are culled after ``idle_timeout`` seconds without a connection (``CULL_IDLE_S`` by default).
Beyond Jupyter's defaults: the token never reaches a log line (``redact.py``; only the URL
printed at start shows it); the login cookie is ``SameSite=Strict; HttpOnly``, and a request
that has only that cookie and comes from another page (another site, or another port of
127.0.0.1) is refused with 403; at most ``max_kernels`` kernels run (one per tab, each holding a
model), a page past the bound gets a one-line 503; every response says ``Referrer-Policy:
no-referrer``; and the page loads nothing from outside the server (``template/index.html.j2``
drops the CDN links of Voila's template).
Scale files and merged checkpoints land in the directory the command was started in
(``save_dir``), never in Voila's temporary directory, and paths outside it are refused.

Why Voila and not Solara: Solara (actively maintained, the better long-run choice, see
docs/design.md Sec. 2) fetches its page assets (``@widgetti/solara-vuetify3-app``, requirejs,
font-awesome) from a CDN at run time, and the offline ``solara-assets`` package (1.58.2) lacks
the app version that solara 1.64 with ipyvue 3 asks for, so with no network its page stays
blank. Voila serves everything from the installed JupyterLab extensions.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import nbformat
from jupyter_server.auth.identity import PasswordIdentityProvider
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from traitlets import Integer, default
from voila.app import Voila
from voila.tornado.handler import TornadoVoilaHandler
from voila.tornado.kernel_websocket_handler import (
    VoilaKernelWebsocketHandler,
    WebsocketHandler,
)

from interp_seal.defaults import DASHBOARD_KERNELS
from interp_seal.widgets.page import ENV, loading_text
from interp_seal.widgets.redact import hide_token

CULL_IDLE_S = 600  # default: a kernel with no open page for this long is shut down
TEMPLATE = Path(__file__).parent / "template"  # the page's template, first on Voila's path


def cross_site(request) -> str | None:
    """Why ``request`` comes from a page other than the dashboard's own, or None.

    Browsers mark every request with ``Sec-Fetch-Site``: ``same-origin`` (the page's own
    scripts), ``none`` (a typed URL, a bookmark), ``same-site`` (a page on another port of
    127.0.0.1: sites ignore ports) or ``cross-site``; ``Origin`` and ``Referer``, when sent,
    name the page that made the request. A client that sends none of them (curl, a script) is
    not a page another site controls.
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site in ("same-site", "cross-site"):
        return f"Sec-Fetch-Site: {site}"
    own = f"{request.protocol}://{request.host}".lower()
    for name in ("Origin", "Referer"):
        if name in request.headers:
            value = request.headers[name]
            url = urlparse(value)
            origin = f"{url.scheme}://{url.netloc}".lower()
            if origin != own:  # the reason never shows a Referer's query (it may hold a token)
                return f"{name}: {origin if url.netloc else value.split('?')[0]}"
    return None


class StrictOriginIdentityProvider(PasswordIdentityProvider):
    """Token login whose requests are origin-checked even when they carry the token, whose
    login cookie is ``SameSite=Strict; HttpOnly``, and whose cookie-only requests from other
    pages are refused.

    ``SameSite=Strict`` keeps pages on other sites from sending the cookie at all, but a page on
    another port of 127.0.0.1 is the same site to a browser, which sends it: ``cross_site``
    tells such requests apart, and they get 403 before any page or kernel exists. A request with
    the token is the user's own link (or a script) and is not refused here; the websockets
    still check its ``Origin``.
    """

    @default("cookie_options")
    def _default_cookie_options(self) -> dict:
        return {"samesite": "Strict", "httponly": True}

    def should_check_origin(self, handler) -> bool:
        return True

    async def get_user(self, handler):
        user = await super().get_user(handler)
        if user is not None and not getattr(handler, "_token_authenticated", False):
            reason = cross_site(handler.request)
            if reason:
                # as Jupyter's Host check does: no user, so that the error page renders
                handler.current_user = handler._jupyter_current_user = None
                raise web.HTTPError(403, f"login cookie sent from another page ({reason})")
        return user


class KernelLimitReached(Exception):
    """A page was asked for while ``max_kernels`` kernels run; the message says what to do."""

    def __init__(self, running: int, bound: int):
        kernels = f"{running} kernel{'s' if running != 1 else ''}"
        super().__init__(
            f"The dashboard already runs {kernels}, as many as --max-kernels {bound} allows: close "
            "a dashboard tab (its kernel stops), or restart interp-seal dashboard with a larger "
            "--max-kernels."
        )


class BoundedKernelManager(AsyncMappingKernelManager):
    """Jupyter's kernel manager, starting at most ``max_kernels`` kernels at a time.

    Each tab of the page runs its own kernel with its own copy of the model: unbounded, opening
    or reloading tabs multiplies the memory until the machine swaps. Kernels still starting
    count too: the check and the count's increase have no ``await`` between them, so two tabs
    opened at once cannot both pass.
    """

    max_kernels = Integer(DASHBOARD_KERNELS, help="the most kernels run at once").tag(config=True)
    _starting = 0

    async def start_kernel(self, **kwargs) -> str:
        running = len(self.list_kernel_ids()) + self._starting
        if running >= self.max_kernels:
            raise KernelLimitReached(running, self.max_kernels)
        self._starting += 1
        try:
            return await super().start_kernel(**kwargs)
        finally:
            self._starting -= 1


class PageHandler(TornadoVoilaHandler):
    """Voila's page handler, answering a page past the kernel bound with a one-line 503, and
    setting the ``_xsrf`` cookie.

    When its tab closes, the page asks the server to shut its kernel down (a POST with the
    ``_xsrf`` value read from that cookie). Voila's handler never set the cookie, so the POST
    was refused and a closed tab's kernel kept its place under the bound until culled.
    """

    async def get(self, path=None):
        try:
            if self.current_user:
                self.xsrf_token  # noqa: B018  (reading it sets the cookie)
            await super().get(path)
        except KernelLimitReached as limit:
            self.log.warning("refused a page: %s", limit)
            self.clear()
            self.set_status(503)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"{limit}\n")


class NoReferrer(web.OutputTransform):
    """``Referrer-Policy: no-referrer`` on every response (pages, assets, errors, redirects,
    websocket handshakes): the page's URL holds the token, and browsers otherwise send a page's
    URL, or its origin, with the requests it makes."""

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        headers["Referrer-Policy"] = "no-referrer"
        return status_code, headers, chunk


def message_header(message) -> dict | None:
    """The header of a kernel message as the server sends it to a browser, or None.

    Three forms reach a kernel websocket: a dict, a JSON string (Jupyter's legacy protocol
    without buffers), and bytes: with the ``v1.kernel.websocket.jupyter.org`` protocol an
    8-byte little-endian count of offsets, the offsets, then channel, header, ... parts;
    with the legacy protocol a 4-byte big-endian buffer count first. Anything that does not
    parse as the v1 layout (its offset table must fit inside the message) gives None.
    """
    if isinstance(message, dict):
        return message.get("header")
    if isinstance(message, str):
        try:
            return json.loads(message).get("header")
        except (ValueError, AttributeError):
            return None
    if not isinstance(message, bytes) or len(message) < 8:
        return None
    count = int.from_bytes(message[:8], "little")
    if not 3 <= count <= len(message) // 8 - 1:
        return None
    offsets = [int.from_bytes(message[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(3)]
    try:
        return json.loads(message[offsets[1] : offsets[2]].decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


class KernelWebsocketHandler(VoilaKernelWebsocketHandler):
    """Voila's kernel websocket, hiding ``execute_input`` (the page's code) as Voila does, with
    a header parser that cannot blow up.

    Voila 0.5's own handler reads the first 8 bytes of every binary message as the length of
    an offset table and builds a list that long. A client that does not ask for the v1
    websocket protocol gets legacy binary messages (a widget's state with buffers), whose first
    bytes read as ~1e18: the server then grew by ~50 MB/s until killed (measured here after one
    ``request_state`` sent to each widget). ``message_header`` checks that the table fits.
    """

    def write_message(self, message, binary: bool = False):
        header = message_header(message)
        if header and header.get("msg_type") == "execute_input":
            return None
        return WebsocketHandler.write_message(self, message, binary)


class LocalVoila(Voila):
    """Voila answering only requests addressed to this machine by a local name, with the
    handlers, headers, cookies, template and logs described above.

    Voila turns Jupyter's ``Host`` check off (``allow_remote_access=True``); a page on any
    site could then reach the server through a name it resolves to 127.0.0.1 (DNS
    rebinding). Here only loopback addresses and ``localhost`` are accepted, as in
    ``jupyter lab``.
    """

    def initialize(self, argv=None) -> None:
        super().initialize(argv)
        hide_token(self.token, logging.getLogger(), self.log)

    def setup_template_dirs(self) -> None:
        super().setup_template_dirs()
        self.template_paths = [str(TEMPLATE), *self.template_paths]

    def init_settings(self) -> dict:
        settings = super().init_settings()
        settings.update(
            allow_remote_access=False,
            local_hostnames=["localhost"],
            xsrf_cookie_kwargs={"samesite": "Strict"},  # not HttpOnly: the page's script reads it
        )
        return settings

    def init_handlers(self) -> list:
        replace = {
            VoilaKernelWebsocketHandler: KernelWebsocketHandler,
            TornadoVoilaHandler: PageHandler,
        }
        return [
            (route[0], replace.get(route[1], route[1]), *route[2:])
            for route in super().init_handlers()
        ]

    def listen(self) -> None:
        self.app.transforms.append(NoReferrer)
        super().listen()


def page_notebook(settings: dict) -> nbformat.NotebookNode:
    """The notebook Voila serves: a first cell that shows the loading message at once (Voila
    renders cells progressively; the cell imports only ipywidgets), a second that builds the
    dashboard and reports its progress in that message."""
    message = loading_text(settings, "loading the model")
    cells = [
        "import ipywidgets\nfrom IPython.display import display\n\n"
        f"status = ipywidgets.HTML({message!r})\ndisplay(status)",
        "from interp_seal.widgets.page import show\n\nshow(status)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def new_token() -> str:
    """A random token, as ``jupyter lab`` makes one per start."""
    return secrets.token_hex(24)


def serve(
    *,
    model: str,
    lengths: list[int],
    n: int,
    seed: int,
    port: int,
    save_dir: str | os.PathLike,
    token: str,
    threads: int | None = None,
    idle_timeout: int = CULL_IDLE_S,
    max_kernels: int = DASHBOARD_KERNELS,
    device: str = "cpu",
    dtype: str = "float32",
    device_map: str | None = None,
) -> None:
    """Serve the dashboard page on ``127.0.0.1:port`` until interrupted.

    ``model`` and ``save_dir`` are resolved here, against the directory the command runs in
    (the kernel runs in a temporary directory). Requests need ``token``; at most
    ``max_kernels`` pages (kernels) are open at once.
    """
    name = Path(model).name if Path(model).exists() else model
    if Path(model).exists():
        model = str(Path(model).resolve())
    settings = {
        "model": model,
        "name": name,
        "lengths": lengths,
        "n": n,
        "seed": seed,
        "threads": threads,
        "save_dir": str(Path(save_dir).resolve()),
        "device": device,
        "dtype": dtype,
        "device_map": device_map,
    }
    os.environ[ENV] = json.dumps(settings)
    with tempfile.TemporaryDirectory(prefix="interp-seal-dashboard-") as tmp:
        path = Path(tmp) / "dashboard.ipynb"
        nbformat.write(page_notebook(settings), path)
        print(
            f"interp-seal dashboard for {model}: http://127.0.0.1:{port}/?token={token}\n"
            f"scale files and merged checkpoints are saved in {settings['save_dir']}",
            flush=True,
        )
        LocalVoila.launch_instance(
            argv=[
                str(path),
                "--no-browser",
                f"--port={port}",
                "--Voila.ip=127.0.0.1",
                "--Voila.port_retries=0",
                "--VoilaConfiguration.progressive_rendering=True",
                "--show_tracebacks=False",
                f"--Voila.token={token}",
                "--Voila.identity_provider_class="
                "interp_seal.widgets.app.StrictOriginIdentityProvider",
                "--VoilaConfiguration.multi_kernel_manager_class="
                "interp_seal.widgets.app.BoundedKernelManager",
                f"--BoundedKernelManager.max_kernels={max_kernels}",
                "--VoilaConfiguration.allow_template_override=NO",  # ?template= could load CDNs
                f"--MappingKernelManager.cull_idle_timeout={idle_timeout}",
                f"--MappingKernelManager.cull_interval={max(1, min(60, idle_timeout // 2))}",
            ]
        )
