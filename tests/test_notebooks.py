"""Notebooks run headless on a tiny checkpoint and show the same numbers as the package."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pandas as pd
from nbclient import NotebookClient

from interp_seal.evaluation import evaluate_line_retrieval
from interp_seal.interventions import ablate
from interp_seal.models import load_model

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def test_quickstart_matches_package(tmp_path, monkeypatch):
    """On the organism, where accuracy and the pruning delta are non-zero."""
    monkeypatch.undo()  # the kernel connects over loopback sockets
    env = {"INTERP_SEAL_MODEL": "organism", "NOTEBOOK_LENGTHS": "10 80", "NOTEBOOK_N": "12"}
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=False).execute(
        cwd=str(tmp_path)
    )
    last = nb.cells[-1].outputs[-1]["data"]["text/plain"]

    handle = load_model("organism")
    base = evaluate_line_retrieval(handle, [10, 80], n=12, seed=0, progress=False)
    pruned = evaluate_line_retrieval(
        handle,
        [10, 80],
        n=12,
        seed=0,
        progress=False,
        intervention=ablate(handle.spec, [(0, 3)], mode="zero"),
    )
    expected = pd.DataFrame(
        {"length": [10, 80], "exact_match": base["exact_match"], "pruned": pruned["exact_match"]}
    )
    expected["delta"] = expected["pruned"] - expected["exact_match"]
    assert last.strip() == expected.to_string().strip()
    assert expected["exact_match"].iloc[0] > 0.9 and expected["delta"].iloc[1] < 0
