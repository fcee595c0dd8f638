"""The public API: every exported name resolves, and the top-level names are the subpackages'."""

from __future__ import annotations

import importlib

import pytest

import interp_seal

SUBPACKAGES = (
    "analysis",
    "engine",
    "evaluation",
    "interventions",
    "models",
    "tasks",
    "tuning",
    "viz",
)


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_every_exported_name_exists(name):
    module = importlib.import_module(f"interp_seal.{name}")
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == []
    assert len(module.__all__) == len(set(module.__all__)) >= 5


def test_top_level_names_are_the_subpackages_objects():
    for name in interp_seal.__all__:
        found = getattr(interp_seal, name)
        owner = importlib.import_module(f"interp_seal.{interp_seal._WHERE[name]}")
        assert found is getattr(owner, name)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        interp_seal.not_a_name  # noqa: B018


@pytest.mark.parametrize(
    "package, name, home",
    [
        ("analysis", "head_sweep", "analysis.sweeps"),
        ("analysis", "passage_retrieval_scores", "analysis.retrieval_scores"),
        ("analysis", "patch_heads", "analysis.patching"),
        ("interventions", "ablate", "interventions.head_edit"),
        ("models", "load_model", "models.load"),
        ("models", "register_family", "models.spec"),
    ],
)
def test_notebook_nouns_import_from_their_subpackage(package, name, home):
    """What the notebooks and README import from a subpackage is the function defined there."""
    found = getattr(importlib.import_module(f"interp_seal.{package}"), name)
    assert found.__module__ == f"interp_seal.{home}"
    assert found is getattr(importlib.import_module(f"interp_seal.{home}"), name)


def test_wilson_interval_known_values():
    """Wilson (1927) 95 % intervals, hand-computed: 0/10 -> (0, 0.27754), 5/10 -> (0.2366,
    0.7634), 10/10 -> (0.7225, 1); no records gives (0, 1)."""
    from interp_seal.analysis.statistics import wilson

    assert wilson(0, 10) == pytest.approx((0.0, 0.277540), abs=1e-6)
    assert wilson(5, 10) == pytest.approx((0.236590, 0.763410), abs=1e-6)
    assert wilson(10, 10) == pytest.approx((0.722460, 1.0), abs=1e-6)
    assert wilson(3, 0) == (0.0, 1.0)
