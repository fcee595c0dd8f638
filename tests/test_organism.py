"""The bundled model organism: shipped checkpoint properties (CI-sized) and training smoke.

The card (``interp_seal/organism/checkpoint/README.md``) holds the full measurements (200
samples per length); these tests re-check them on subsets, on the exact same samples as the
card (seed 0 prefixes), so the asserted margins are wide enough for float noise only.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from interp_seal.cli import main
from interp_seal.evaluation import evaluate_line_retrieval
from interp_seal.interventions import ablate
from interp_seal.models import load_model
from interp_seal.models.load import ORGANISM_DIR
from interp_seal.organism.train import OrganismConfig, train

SHORT, LONG = 10, 80  # lines; the card's pruning length is LONG


@pytest.fixture(scope="module")
def organism():
    torch.set_num_threads(1)
    return load_model("organism")


@pytest.fixture(scope="module")
def card():
    return json.loads((ORGANISM_DIR / "measurements.json").read_text())


def test_checkpoint_geometry_and_size(organism):
    spec = organism.spec
    assert spec.n_layers >= 4 and spec.n_heads >= 8
    assert spec.n_kv_heads < spec.n_heads  # grouped-query attention
    assert organism.model.config.model_type == "llama"
    size = sum(f.stat().st_size for f in ORGANISM_DIR.iterdir() if f.is_file())
    assert size <= 20 * 2**20
    # a line index is one token; digits are one token each
    assert len(organism.tokenizer(" humble-pebble", add_special_tokens=False)["input_ids"]) == 1
    assert len(organism.tokenizer(" 45041.", add_special_tokens=False)["input_ids"]) == 6


def exact_match(handle, num_lines: int, n: int, intervention=None) -> float:
    """Teacher-forced exact match on the card's samples (seed 0)."""
    table = evaluate_line_retrieval(
        handle, [num_lines], n=n, seed=0, intervention=intervention, progress=False
    )
    return float(table["exact_match"].iloc[0])


def test_accuracy_high_when_short_and_degrades_when_long(organism, card):
    short, long = exact_match(organism, SHORT, 40), exact_match(organism, LONG, 40)
    assert short >= 0.95
    assert 0.1 <= long <= 0.8
    assert card["accuracy"][str(SHORT)] >= 0.95
    assert 0.2 <= card["accuracy"][str(max(card["accuracy"], key=int))] <= 0.7


def test_pruning_moves_accuracy_both_ways(organism, card):
    """The card's two strongest heads in each direction, re-measured on 60 of its samples."""
    delta = torch.tensor(card["prune_delta"])
    n, lines = 60, card["prune_lines"]
    base = exact_match(organism, lines, n)
    order = delta.flatten().argsort()
    heads = organism.spec.n_heads
    for flat, sign in ((order[-1], 1), (order[-2], 1), (order[0], -1), (order[1], -1)):
        layer, head = divmod(int(flat), heads)
        assert sign * delta[layer, head] >= 0.02
        pruned = exact_match(organism, lines, n, ablate(organism.spec, [(layer, head)], "zero"))
        assert sign * (pruned - base) > 0, (layer, head, pruned, base)


def test_pruning_equals_zeroing_o_proj_columns(organism):
    """Independent check of the primitive on the real model: zero the head's weight columns."""
    layer, head, d = 0, 3, organism.spec.d_head
    via_primitive = exact_match(organism, LONG, 30, ablate(organism.spec, [(layer, head)], "zero"))
    weight = organism.proj(layer, "o_proj").weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight[:, head * d : (head + 1) * d] = 0
        via_weights = exact_match(organism, LONG, 30)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert via_primitive == via_weights
    assert via_primitive < exact_match(organism, LONG, 30)  # L0H3 is a retrieval head


def test_training_resumes_to_the_same_model(tmp_path):
    torch.set_num_threads(1)
    cfg = OrganismConfig.smoke()
    train(cfg, tmp_path / "straight", progress=False)
    train(cfg, tmp_path / "resumed", stop_at=3, progress=False)
    assert not (tmp_path / "resumed" / "model.safetensors").exists()
    assert json.loads((tmp_path / "resumed" / "state" / "trainer.json").read_text())["step"] == 3
    train(cfg, tmp_path / "resumed", resume=True, progress=False)
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_cli_smoke_trains_a_loadable_checkpoint(tmp_path):
    assert main(["organism", "train", "--out", str(tmp_path), "--smoke"]) == 0
    handle = load_model(tmp_path)
    assert handle.spec.n_kv_heads < handle.spec.n_heads
