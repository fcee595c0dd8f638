"""What a figure's data was computed from, so a resumed gallery never redraws stale data.

The driver keeps a figure's finished tables in ``<out>/data/<name>.json`` and draws from that
file on every later run instead of recomputing. The tables are derived from the stores under
``<out>/work/`` (rows, score logs, sweeps, trained scales and models), and those can change
after the figure was written: a retrained model's rows are recomputed, a store is deleted and
rebuilt, a side worker merges records into a log. A figure drawn from the old file would then
show numbers that no stored record supports, and nothing on the page would say so.

So each figure's JSON carries ``inputs``: a digest of every store it read, taken when its
tables were written (``digests``). On a later run the driver recomputes those digests
(``changed``) and recomputes the figure from its stores when any differs; the stores resume,
so this costs the drawing, not the analyses. Two kinds of store are digested:

- **rows** (``FigureRun.rows``): only the rows the figure read, by key (their fingerprint and
  values, the last record of a key as the store returns it), so rows that another figure adds
  to a shared store later do not make this one stale;
- **folders** (``FigureRun.timed``: a sweep, a score log, a tuning): every file in the folder
  except its time ledger (``compute.jsonl``, appended by every run that merely opens it), the
  training checkpoints (``train/``) and a tuned model's weights (``model/``: their digest is
  ``weights.json``, kept and checked by ``figures.run.same_weights``, and ``--quick`` removes
  the weights themselves).

A store that is not on disk any more (not committed, or removed to save space) cannot be
checked and does not count as changed: the figure's JSON is then the only record of it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from interp_seal.records import read_records

SKIPPED = ("compute.jsonl", "train", "model")  # not what a figure's numbers depend on


def row_digest(record: Mapping) -> str:
    """A stored row's digest: its fingerprint (what it was computed from) and its values."""
    text = json.dumps([record["fingerprint"], record["values"]], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def rows_digest(rows: Mapping[str, str]) -> str:
    """The digest of the rows a figure read from one store, ``{key: row_digest}``."""
    return hashlib.sha256(json.dumps(sorted(rows.items())).encode()).hexdigest()


def folder_digest(folder: Path) -> str | None:
    """The digest of a store folder's files (names and bytes), less ``SKIPPED``; None if the
    folder is not there."""
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        part = path.relative_to(folder).parts[0]
        if part in SKIPPED or not path.is_file():
            continue
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def digests(work: Path, rows: Mapping[str, Mapping[str, str]], folders: set[str]) -> dict:
    """The ``inputs`` record of a figure that read ``rows`` (store -> {key: row_digest}) and
    the store ``folders`` under ``work``."""
    return {
        "rows": {
            name: {"keys": sorted(read), "sha256": rows_digest(read)}
            for name, read in sorted(rows.items())
        },
        "folders": {name: folder_digest(work / name) for name in sorted(folders)},
    }


def changed(work: Path, inputs: Mapping | None) -> list[str]:
    """The stores under ``work`` whose content differs from a figure's recorded ``inputs``
    (a row the figure read now differs or is gone; a folder's files differ). Stores not on disk
    are not counted (see the module docstring); nor is anything when ``inputs`` is None (data
    written before figures recorded their inputs)."""
    if not inputs:
        return []
    stale = []
    for name, read in inputs.get("rows", {}).items():
        path = work / name / "records.jsonl"
        if not path.exists():
            continue
        last = {r["key"]: r for r in read_records(path, repair=False)}
        now = {key: row_digest(last[key]) if key in last else None for key in read["keys"]}
        if None in now.values() or rows_digest(now) != read["sha256"]:
            stale.append(name)
    for name, then in inputs.get("folders", {}).items():
        now = folder_digest(work / name)
        if now is not None and now != then:
            stale.append(name)
    return sorted(stale)
