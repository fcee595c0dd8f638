"""The one resume policy, on every command that runs long: ``kill -9`` mid-run, then the same
command is refused on the same ``--out`` without ``--resume`` (an earlier run's results are
never reused or overwritten silently) and with ``--resume`` ends with the results of a run that
was never interrupted.

Each command runs for real in a subprocess, on the bundled organism; the kill comes when the
command's first unit of work is on disk, and the test checks the run had not finished then.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

from interp_seal.figures import load_tables

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Long:
    """A long command: its arguments (after any ``setup`` commands, whose files it reads), the
    file or directory whose appearance means a unit of work is saved, and the result compared
    after resuming."""

    args: list[str]
    progress: str
    result: str
    setup: tuple[tuple[str, ...], ...] = ()


PASSAGES = ("tasks", "generate", "--task", "passages", "--n", "12", "--out", "qa.jsonl")
NEEDLES = ("tasks", "generate", "--task", "needle", "--tokenizer", "organism", "--lengths", "300")
NEEDLES += ("600", "--depths", "0", "50", "100", "--out", "niah.jsonl")
SCORES = ("retrieval", "passage-scores", "--samples", "qa.jsonl", "--out", "scores")
TUNE = ["--samples", "16", "--num-lines", "20", "--batch-size", "1", "--checkpoint-every", "2"]
QA_TUNE = ["--task", "passages", "--samples", "12", "--batch-size", "1", "--checkpoint-every", "2"]

COMMANDS = {
    "head-sweep": Long(
        ["analysis", "head-sweep", "--lengths", "3", "6", "--n", "6", "--threads", "1"],
        progress="records.jsonl",
        result="results.csv",
    ),
    "channel-sweep": Long(
        ["analysis", "channel-sweep", "--heads", "1.3", "--lengths", "3", "6", "--n", "4"],
        progress="records.jsonl",
        result="results.csv",
    ),
    "passage-scores": Long(
        ["retrieval", "passage-scores", "--samples", "qa.jsonl", "--threads", "1"],
        progress="per_sample.jsonl",
        result="head_scores.csv",
        setup=(PASSAGES,),
    ),
    "needle-scores": Long(
        ["retrieval", "needle-scores", "--samples", "niah.jsonl", "--threads", "1"],
        progress="per_sample.jsonl",
        result="head_scores.csv",
        setup=(NEEDLES,),
    ),
    "masking": Long(
        ["retrieval", "masking", "--samples", "qa.jsonl", "--scores", "scores/head_scores.csv"]
        + ["--ks", "1", "2", "--seeds", "0", "1", "--threads", "1"],
        progress="conditions.jsonl",
        result="masking.csv",
        setup=(PASSAGES, SCORES),
    ),
    "seal-h": Long(["tune", "seal-h", *TUNE], progress="checkpoints", result="scales.safetensors"),
    "seal-c": Long(["tune", "seal-c", *TUNE], progress="checkpoints", result="scales.safetensors"),
    "lora": Long(["tune", "lora", *TUNE], progress="checkpoints", result="model/model.safetensors"),
    "dora": Long(["tune", "dora", *TUNE], progress="checkpoints", result="model/model.safetensors"),
    "mudaf": Long(
        ["tune", "mudaf", *QA_TUNE, "--heads", "1.3", "2.5"],
        progress="checkpoints",
        result="model/model.safetensors",
    ),
    "sft": Long(
        ["tune", "sft", *QA_TUNE], progress="checkpoints", result="model/model.safetensors"
    ),
    "organism-train": Long(
        ["organism", "train", "--smoke", "--steps", "40", "--set", "checkpoint_every=2"],
        progress="state",
        result="model.safetensors",
    ),
    "figures": Long(
        ["figures", "--quick", "--only", "seal_table1_methods", "--no-png"],
        progress="work",
        result="data/seal_table1_methods.json",
    ),
}
DEFAULT = ("head-sweep",)  # the others run with -m slow


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "interp_seal.cli", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def killed_mid_run(args: list[str], cwd: Path, out: Path, progress: str) -> None:
    """Start the command, SIGKILL it once ``out/progress`` exists and holds something."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "interp_seal.cli", *args]
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    marker, deadline = out / progress, time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if marker.exists() and (marker.is_dir() or marker.stat().st_size > 0):
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the command ended before it could be killed: {proc.stderr.read()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def same_result(a: Path, b: Path) -> None:
    if a.suffix == ".safetensors":
        first, second = load_file(a), load_file(b)
        assert first.keys() == second.keys()
        for key in first:
            assert (first[key] == second[key]).all(), key
    elif a.suffix == ".json":
        first, second = load_tables(a)[0], load_tables(b)[0]
        assert first.keys() == second.keys()
        for name in first:
            pd.testing.assert_frame_equal(first[name], second[name])
    else:
        pd.testing.assert_frame_equal(pd.read_csv(a), pd.read_csv(b))


@pytest.mark.parametrize(
    "name",
    [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in COMMANDS],
)
def test_killed_run_resumes_only_when_asked(name, tmp_path):
    long = COMMANDS[name]
    for setup in long.setup:
        done = run(list(setup), tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    args = long.args
    straight = run([*args, "--out", "straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-2000:]

    out = tmp_path / "killed"
    killed_mid_run([*args, "--out", "killed"], tmp_path, out, long.progress)
    assert not (out / long.result).exists()  # killed before the end

    refused = run([*args, "--out", "killed"], tmp_path)
    assert refused.returncode == 2
    assert "holds the results of an earlier run" in refused.stderr
    assert "pass --resume" in refused.stderr
    resumed = run([*args, "--out", "killed", "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    same_result(tmp_path / "straight" / long.result, out / long.result)
