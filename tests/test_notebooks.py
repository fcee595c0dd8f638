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


def test_quickstart_matches_package(llama_checkpoint, tmp_path, monkeypatch):
    monkeypatch.undo()  # the kernel connects over loopback sockets
    env = {"INTERP_SEAL_MODEL": llama_checkpoint, "NOTEBOOK_LENGTHS": "2 4", "NOTEBOOK_N": "6"}
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=False).execute(
        cwd=str(tmp_path)
    )
    last = nb.cells[-1].outputs[-1]["data"]["text/plain"]

    handle = load_model(llama_checkpoint)
    base = evaluate_line_retrieval(handle, [2, 4], n=6, seed=0, progress=False)
    layer = handle.spec.n_layers - 1
    pruned = evaluate_line_retrieval(
        handle,
        [2, 4],
        n=6,
        seed=0,
        progress=False,
        intervention=ablate(handle.spec, [(layer, 0)], mode="zero"),
    )
    expected = pd.DataFrame(
        {"length": [2, 4], "exact_match": base["exact_match"], "pruned": pruned["exact_match"]}
    )
    expected["delta"] = expected["pruned"] - expected["exact_match"]
    assert last.strip() == expected.to_string().strip()
