"""What every benchmark shares: the model it measures.

The bundled model organism when its checkpoint exists (the numbers in the issues' notes are on
it), else a random GQA Llama of the organism's geometry (4 layers, 8 query heads, 2 KV heads)
saved in a temporary directory and loaded through ``load_model`` like any checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from interp_seal.models import ModelHandle, load_model
from interp_seal.models.load import ORGANISM_DIR
from interp_seal.models.random_checkpoint import save_random_checkpoint


def benchmark_model(tmp: str | Path, *, d_head: int = 32) -> tuple[ModelHandle, str]:
    """``(handle, description)`` of the model a benchmark runs on."""
    if (ORGANISM_DIR / "config.json").exists():
        return load_model("organism"), "organism"
    path = save_random_checkpoint(
        Path(tmp) / "random", "llama", n_layers=4, n_heads=8, n_kv_heads=2, d_head=d_head
    )
    return load_model(path), f"random-llama-4x8-gqa-dhead{d_head}"
