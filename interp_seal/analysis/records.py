"""Append-only JSONL result files: the storage under every resumable run.

Long runs (sweeps, retrieval scores, masking) append one JSON record per finished unit of work
and flush it to disk before going on, so a killed run loses at most the unit in flight. On
restart the file is read back; a last line cut short by the kill is dropped (and truncated
away), any other unreadable line is an error rather than a silent gap.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path


def read_records(path: str | Path) -> list[dict]:
    """The complete records of ``path`` (none if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    if not data.endswith(b"\n"):  # interrupted write: keep the complete lines
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    records = []
    for lineno, line in enumerate(data.decode().splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise ValueError(
                f"{path}:{lineno} is not valid JSON; delete the file to start over"
            ) from None
    return records


def append_records(path: str | Path, records: Iterable[dict]) -> None:
    """Append ``records`` to ``path`` and flush them to disk before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(json.dumps(rec) + "\n" for rec in records)
        f.flush()
        os.fsync(f.fileno())
