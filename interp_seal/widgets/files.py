"""Writing a head scale table as a scale file, whole or not at all.

The dashboard and the scale-table editor save ``{(layer, head): factor}`` tables as per-head
(SEAL-H shaped, ``(L, H, 1)``) scale files (``interp_seal.tuning.scales``), which the tuning
and merge commands accept. The file is written beside its target and renamed into place, so an
error leaves no half-written file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from interp_seal.interventions import Head
from interp_seal.models import ModelHandle
from interp_seal.tuning import ScaleFile, save_scales
from interp_seal.viz.dashboard import edit_factors


def head_scales(handle: ModelHandle, table: Mapping[Head, float]) -> torch.Tensor:
    """``(L, H, 1)`` scales of ``table`` (1 where a head is not listed)."""
    spec = handle.spec
    return torch.tensor(edit_factors(spec.n_layers, spec.n_heads, table), dtype=torch.float32)[
        ..., None
    ]


def write_head_scale_file(
    handle: ModelHandle, table: Mapping[Head, float], path: str | os.PathLike, *, source: str
) -> Path:
    """Save ``table`` as a per-head scale file at ``path``; returns the path."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{target} is a directory; give a file name for the scale file")
    scale_file = ScaleFile(
        scales=head_scales(handle, table),
        spec=handle.spec,
        model=handle.name_or_path,
        granularity="head",
        task="line_retrieval",
        hyperparameters={"source": source, "table": [[a, b, f] for (a, b), f in table.items()]},
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        save_scales(partial, scale_file)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
