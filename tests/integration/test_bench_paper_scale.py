"""``benchmarks/bench_paper_scale.py`` at its tiny geometry on the CPU (~20 s): every analysis
runs at every length, its memory grows with the record, and the planner predicts it.

The script runs as a subprocess, as on a GPU (``--tiny``: LongChat-7B-32K's, Llama-3.1-8B's and
Qwen2.5-7B's configs cut to 4 layers x 4 heads of 16, float32, records of 250 and 505 tokens,
with ``--peers``: TransformerLens's ``run_with_cache`` and patching written with nnsight), and
its RESULT lines are checked:

- every analysis of ``ANALYSES`` at both lengths of every geometry, ``status=ok``, positive wall
  seconds, peak and bytes allocated during the call (``work_gib``);
- the bytes allocated during each call grow with the record (at least 1.5x from 250 to 505
  tokens; ~2x measured): an analysis that silently did nothing, or less than its command does,
  fails here;
- the planner (``interp-seal plan``): within ``TOLERANCE`` (25%, the claim of
  ``tests/integration/test_plan.py``) of the measured bytes above the weights for every
  planned analysis (``PLANNED``);
- the sampled head sweep and both patchings name their sample (8 of 16 heads) and an
  extrapolation to every head.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_paper_scale.py"
GEOMETRIES = ("longchat", "llama31", "qwen25")
ANALYSES = (
    "teacher-forcing",
    "head-sweep",
    "dla",
    "patching",
    "screen",
    "passage-scores",
    "needle-scores",
    "seal-h",
    "seal-c",
    "generate",
    "tl-run-with-cache",
    "nnsight-patch",
)
PLANNED = ("teacher-forcing", "head-sweep", "dla", "patching", "screen")
PLANNED += ("passage-scores", "needle-scores")
TOLERANCE = 0.25
TARGETS = (256, 512)


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, int, str], dict[str, str]]:
    """``(geometry, target, analysis) -> RESULT keys`` of one ``--tiny`` run."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--peers", "--geometry", *GEOMETRIES],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = {}
    for line in run.stdout.splitlines():
        if line.startswith("RESULT paper_scale "):
            keys = dict(item.split("=", 1) for item in line.split()[2:])
            rows[keys["geometry"], int(keys["target"]), keys["analysis"]] = keys
    for geometry in GEOMETRIES:  # the markdown table for docs/scale.md closes the output
        assert f"### {geometry}: " in run.stdout
    assert "| analysis | 256 (" in run.stdout
    return rows


def test_every_analysis_runs_at_every_length(results):
    expected = {(g, t, a) for g in GEOMETRIES for t in TARGETS for a in ANALYSES}
    assert set(results) == expected
    for key, row in results.items():
        assert row["status"] == "ok", (key, row)
        assert float(row["wall_s"]) > 0, (key, row)
        assert float(row["peak_gib"]) > float(row["work_gib"]) > 0, (key, row)
        assert int(row["length"]) <= int(row["target"]) and int(row["lines"]) > 0
        assert row["device"] == "cpu" and row["dtype"] == "float32" and row["clock"] == "wall_s"


def test_memory_grows_with_the_record(results):
    for geometry in GEOMETRIES:
        for analysis in ANALYSES:
            short, long = (results[geometry, t, analysis] for t in TARGETS)
            assert int(long["length"]) > 1.9 * int(short["length"])
            growth = float(long["work_gib"]) / float(short["work_gib"])
            assert growth > 1.5, (geometry, analysis, short, long)


def test_planned_peaks_match_the_measured_ones(results):
    for (geometry, target, analysis), row in results.items():
        if analysis in PLANNED:
            ratio = float(row["work_ratio"])
            assert abs(ratio - 1) <= TOLERANCE, (geometry, target, analysis, row)
        else:  # tuning, generation and the peers: not planned
            assert row["plan_gib"] == row["ratio"] == "na", (geometry, analysis, row)


def test_sampled_analyses_state_their_sample(results):
    for geometry in GEOMETRIES:
        for target in TARGETS:
            for analysis in ("head-sweep", "patching", "nnsight-patch"):
                row = results[geometry, target, analysis]
                assert row["units"] == "8/16"  # 2 heads in each of the 4 layers, of 4 x 4
                assert float(row["all_heads_s"]) > 0
