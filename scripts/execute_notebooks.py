"""Execute the notebooks at their default sizes and save them with outputs that render statically.

    OMP_NUM_THREADS=1 python -m scripts.execute_notebooks                 # every notebook
    OMP_NUM_THREADS=1 python -m scripts.execute_notebooks quickstart seal # some of them
    python -m scripts.execute_notebooks --workdir runs/notebooks seal     # resume sweeps, tuning

A committed notebook is meant to be read without running it (on a code host, in nbconvert's
HTML), so each one is executed top to bottom in a fresh kernel and rewritten in place with:

- the sizes in its code: every ``NOTEBOOK_*`` / ``INTERP_SEAL_MODEL`` variable is removed from the
  kernel's environment, and ``OMP_NUM_THREADS=1`` (one torch thread: the notebooks call
  ``torch.set_num_threads`` with it), so the numbers are the defaults the code shows;
- a PNG beside every plotly figure: the kernel renders figures as plotly JSON only
  (``PLOTLY_RENDERER=plotly_mimetype``), which JupyterLab draws interactively, and this script
  adds ``image/png`` to the same output bundle (kaleido, one browser for the whole run:
  ``interp_seal.figures.export.PngExporter``), which static viewers show instead;
- no progress bars: ``tqdm.auto`` draws a widget per loop (or ``\\r`` lines on stderr); they are
  dropped from the outputs, nothing else is;
- in each code cell's metadata, ``interp_seal.source_sha256``: the SHA-256 of the source the
  outputs came from; the notebook's metadata ``interp_seal`` holds the hash of all its code
  cells together (a cell's outputs depend on the cells above it) and how it was executed.

``tests/acceptance/test_notebooks.py`` fails when a committed notebook's code differs from what was
executed, a figure lacks its PNG or a progress bar is left. By default each notebook runs in
a new temporary directory (its results under ``runs/...`` start empty); ``--workdir DIR`` runs
in ``DIR/<name>`` instead, where the notebooks' sweeps and tuning runs resume from an earlier
execution (the same results, in less time).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
# tqdm's bar: "desc:  40%|####      | 2/5 [00:01<00:02,  1.2it/s]", or without a total (a
# resumed sweep with nothing left to do) "desc: 0it [00:00, ?it/s]"
TQDM_BAR = re.compile(r"\d+%\|.*\|\s*[\d.?]+[kMG]?/[\d.?]+[kMG]?\s*\[|\d+it \[\d+:\d\d")
KEY = "interp_seal"


def source_hash(source: str) -> str:
    """The SHA-256 of a cell's source text (UTF-8)."""
    return hashlib.sha256(source.encode()).hexdigest()


def code_hash(nb) -> str:
    """The SHA-256 of all code cells' sources in order (what every output depends on)."""
    return source_hash("\0".join(c.source for c in nb.cells if c.cell_type == "code"))


def is_progress_bar(output) -> bool:
    """A tqdm bar: its widget (``tqdm.auto`` in a kernel) or its text on stderr."""
    if output.get("output_type") == "stream":
        return output.get("name") == "stderr" and bool(TQDM_BAR.search(output.get("text", "")))
    data = output.get("data", {})
    return WIDGET in data and bool(TQDM_BAR.search(data.get("text/plain", "")))


def kernel_env() -> dict[str, str]:
    """This process's environment without size overrides, with one thread and plotly JSON."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NOTEBOOK_") and k != "INTERP_SEAL_MODEL"
    }
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PLOTLY_RENDERER="plotly_mimetype")
    # this checkout's package, whatever is installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def execute(path: Path, cwd: Path, timeout: int) -> nbformat.NotebookNode:
    """Run ``path`` in a fresh kernel in ``cwd``; the executed notebook, not yet cleaned."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", store_widget_state=False, record_timing=False
    )
    client.execute(cwd=str(cwd), env=kernel_env())
    return nb


def finish(nb, png) -> tuple[int, int]:
    """Drop progress bars, add PNGs and source hashes in place; (bars dropped, PNGs added)."""
    import plotly.graph_objects as go

    dropped = added = 0
    with tempfile.TemporaryDirectory() as tmp:
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            kept = [out for out in cell.outputs if not is_progress_bar(out)]
            dropped += len(cell.outputs) - len(kept)
            cell.outputs = kept
            for out in kept:
                data = out.get("data", {})
                if PLOTLY in data:
                    image = Path(tmp) / "figure.png"
                    if not png.write(go.Figure(data[PLOTLY]), image):
                        raise RuntimeError(f"no PNG for a figure: {png.problem}")
                    data["image/png"] = base64.b64encode(image.read_bytes()).decode()
                    added += 1
            cell.metadata[KEY] = {"source_sha256": source_hash(cell.source)}
    nb.metadata[KEY] = {
        "code_sha256": code_hash(nb),
        "executed_by": "scripts/execute_notebooks.py",
        "environment": "default sizes (no NOTEBOOK_* variables), OMP_NUM_THREADS=1",
    }
    return dropped, added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="notebook names (default: every notebook)")
    parser.add_argument("--workdir", type=Path, help="run in DIR/<name> (resumes results)")
    parser.add_argument("--timeout", type=int, default=7200, help="seconds per cell")
    args = parser.parse_args(argv)
    names = args.names or sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    missing = [n for n in names if not (NOTEBOOKS / f"{n}.ipynb").exists()]
    if missing:
        parser.error(f"no notebook {missing} in {NOTEBOOKS}")

    from interp_seal.figures.export import PngExporter

    with PngExporter() as png:
        if not png.available:
            return 1
        for name in names:
            start = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
                cwd = Path(tmp) if args.workdir is None else args.workdir / name
                cwd.mkdir(parents=True, exist_ok=True)
                nb = execute(NOTEBOOKS / f"{name}.ipynb", cwd, args.timeout)
            dropped, added = finish(nb, png)
            nbformat.write(nb, NOTEBOOKS / f"{name}.ipynb")
            print(
                f"{name}: {time.perf_counter() - start:.0f} s, {added} figures with PNG, "
                f"{dropped} progress bars dropped",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
