"""A figure's data on disk: ``<out>/data/<name>.json``, the tables the figure is drawn from.

The driver writes it (last and atomically: its presence marks the figure's data complete) and
reads it back to draw; the gallery page reads every figure's. Kept apart from both, so neither
imports the other.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def load_tables(path: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    """A figure's tables (and its JSON's other fields) from ``data/<name>.json``."""
    doc = json.loads(path.read_text())
    tables = {k: pd.DataFrame(v) for k, v in doc.pop("tables").items()}
    return tables, doc
