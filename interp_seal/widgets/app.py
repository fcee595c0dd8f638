"""The dashboard as a web page (``interp-seal dashboard``): Voila serving a one-cell notebook.

The page is a notebook whose only cell calls ``show()``; Voila runs it in a fresh kernel for
each browser tab and shows the widgets, not the code. The dashboard's settings (model, lengths,
records, seed) travel to the kernel in the ``INTERP_SEAL_DASHBOARD`` environment variable. Each
tab's kernel holds one model and one ``Dashboard``, so two tabs never share hooks; inside a tab
the dashboard's lock serialises forwards.

Why Voila and not Solara: Solara (actively maintained, the better long-run choice, see
docs/design.md Sec. 2) fetches its page assets (``@widgetti/solara-vuetify3-app``, requirejs,
font-awesome) from a CDN at run time, and the offline ``solara-assets`` package (1.58.2) lacks
the app version that solara 1.64 with ipyvue 3 asks for, so with no network its page stays
blank. Voila serves everything from the installed JupyterLab extensions.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

import nbformat

ENV = "INTERP_SEAL_DASHBOARD"


def page_notebook() -> nbformat.NotebookNode:
    """The one-cell notebook Voila serves."""
    cell = nbformat.v4.new_code_cell("from interp_seal.widgets.app import show\n\nshow()")
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def show() -> None:
    """Build and display the dashboard described by ``$INTERP_SEAL_DASHBOARD`` (in a kernel)."""
    from IPython.display import display

    from interp_seal.models import load_model
    from interp_seal.widgets.dashboard import Dashboard

    settings = json.loads(os.environ[ENV])
    if settings.get("threads"):
        import torch

        torch.set_num_threads(int(settings["threads"]))
    handle = load_model(settings["model"])
    dashboard = Dashboard.from_model(
        handle,
        lengths=settings["lengths"],
        n=settings["n"],
        seed=settings["seed"],
        lock=threading.Lock(),
    )
    display(dashboard.widget)


def serve(
    *, model: str, lengths: list[int], n: int, seed: int, port: int, threads: int | None = None
) -> None:
    """Serve the dashboard page on ``127.0.0.1:port`` until interrupted."""
    from voila.app import Voila

    settings = {"model": model, "lengths": lengths, "n": n, "seed": seed, "threads": threads}
    os.environ[ENV] = json.dumps(settings)
    with tempfile.TemporaryDirectory(prefix="interp-seal-dashboard-") as tmp:
        path = Path(tmp) / "dashboard.ipynb"
        nbformat.write(page_notebook(), path)
        print(f"interp-seal dashboard for {model}: http://127.0.0.1:{port}/", flush=True)
        Voila.launch_instance(
            argv=[
                str(path),
                "--no-browser",
                f"--port={port}",
                "--Voila.ip=127.0.0.1",
                "--Voila.port_retries=0",
                "--show_tracebacks=False",
            ]
        )
