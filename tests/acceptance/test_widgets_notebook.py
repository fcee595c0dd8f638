"""``notebooks/dashboard.ipynb`` runs headless on the organism, displays the dashboard and shows
the library's numbers for its scripted click."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
from nbclient import NotebookClient

from interp_seal.analysis.live_eval import EditEvaluator
from interp_seal.evaluation import evaluate_lengths, line_retrieval_samples
from interp_seal.interventions import ablate
from interp_seal.models import StreamingHeads, compress_kv, kv_budget_bytes, load_model

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "dashboard.ipynb"


def test_dashboard_notebook_matches_library(tmp_path, monkeypatch):
    monkeypatch.undo()  # the kernel connects over loopback sockets
    env = {"INTERP_SEAL_MODEL": "organism", "NOTEBOOK_LENGTHS": "10 60", "NOTEBOOK_N": "4"}
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=False).execute(
        cwd=str(tmp_path)
    )
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert "application/vnd.jupyter.widget-view+json" in code[0].outputs[-1]["data"]
    table = code[1].outputs[-1]["data"]["text/plain"]
    state = json.loads(code[2].outputs[-1]["text"])

    handle = load_model("organism")
    records = line_retrieval_samples(handle.tokenizer, (10, 60), n=4, seed=0)
    evaluator = EditEvaluator(handle, records, progress=False)
    expected = evaluator.evaluate(ablate(handle.spec, [(0, 3)], "zero"))
    expected = expected[expected.metric == "exact_match"][["length", "value", "baseline", "delta"]]
    assert table.strip() == expected.reset_index(drop=True).to_string().strip()
    assert state["edits"] == [[0, 3, 0.0]] and state["geometry"] == handle.spec.as_dict()

    # the stream click: KV head 1 of layer 3 on sink 4 + window 64, with L0H3 pruned, scored by
    # teacher forcing under compress_kv; the KV bytes by kv_budget_bytes at each prompt
    streamed = code[3].outputs[-1]["data"]["text/plain"]
    config = StreamingHeads(heads={(3, 1)}, sink=4, window=64)
    with compress_kv(handle, config):
        ref = evaluate_lengths(
            handle, records, intervention=ablate(handle.spec, [(0, 3)], "zero"), progress=False
        )
    rows = []
    for length, group in records.items():
        tokens = [len(s.encode(handle.tokenizer).prompt_ids) for s in group]
        kept = [kv_budget_bytes(config, handle.spec, t, itemsize=4) for t in tokens]
        full = [kv_budget_bytes(None, handle.spec, t, itemsize=4) for t in tokens]
        rows.append(
            {
                "length": length,
                "value": float(ref.set_index("length").exact_match[length]),
                "baseline": float(expected.set_index("length").baseline[length]),
                "tokens": float(np.mean(tokens)),
                "kv_bytes": float(np.mean(kept)),
                "kv_share": float(np.mean(kept) / np.mean(full)),
            }
        )
    assert streamed.strip() == pd.DataFrame(rows).round(3).to_string().strip()
