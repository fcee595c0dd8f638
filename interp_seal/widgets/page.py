"""The kernel's side of the served dashboard page (``app.py`` serves it): what its two cells run.

The first cell is written by ``app.page_notebook`` with the loading message already rendered
(``loading_text``), so it imports only ``ipywidgets`` and shows within a second or two of the
kernel starting; the second calls ``show``, which reports progress in that message. The settings (model, lengths,
records, seed, device) come from the ``INTERP_SEAL_DASHBOARD`` environment variable that
``app.serve`` sets.
"""

from __future__ import annotations

import json
import os
import threading
from html import escape

ENV = "INTERP_SEAL_DASHBOARD"


def loading_text(settings: dict, what: str) -> str:
    """The loading message: the model, the records being prepared and ``what`` runs now."""
    lengths = settings["lengths"]
    return (
        f"<h3>Head-pruning dashboard: {escape(str(settings['name']))}</h3>"
        f"<p style='background:#fff3bf;padding:4px 8px;display:inline-block'>{escape(what)}: "
        f"the dashboard teacher-forces {settings['n']} LongEval records at each of "
        f"{', '.join(map(str, lengths))} lines once, and caches the clean run every click "
        "starts from.</p>"
    )


def show(status=None) -> None:
    """Build and display the dashboard described by ``$INTERP_SEAL_DASHBOARD`` (in a kernel),
    reporting progress in ``status`` (the loading message) and then hiding it."""
    import torch
    from IPython.display import display
    from transformers.utils import logging as transformers_logging

    from interp_seal.models import load_model
    from interp_seal.widgets.dashboard import Dashboard

    settings = json.loads(os.environ[ENV])
    if settings.get("threads"):
        torch.set_num_threads(int(settings["threads"]))
    transformers_logging.disable_progress_bar()  # the page shows its own progress, not tqdm's
    handle = load_model(
        settings["model"],
        device=settings["device"],
        dtype=getattr(torch, settings["dtype"]),
        device_map=settings["device_map"],
    )

    def progress(done: int, total: int) -> None:
        if status is not None:
            status.value = loading_text(settings, f"clean runs {done}/{total}")

    dashboard = Dashboard.from_model(
        handle,
        lengths=settings["lengths"],
        n=settings["n"],
        seed=settings["seed"],
        lock=threading.Lock(),
        save_dir=settings["save_dir"],
        name=settings["name"],
        on_progress=progress,
        background=True,  # clicks during an update show at once, queued (worker.py)
    )
    if status is not None:
        status.layout.display = "none"
    display(dashboard.widget)
