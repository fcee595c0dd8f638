"""Ctrl-C ends a command with one line saying what was kept and how to go on, no traceback,
and a resumable run continues from what it had finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def test_ctrl_c_is_one_line_and_the_run_resumes(tmp_path):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "interp_seal.cli", "analysis", "head-sweep", "--model",
           "organism", "--lengths", "20", "40", "--n", "6", "--out", str(out), "--threads", "1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    records = out / "records.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (records.exists() and records.stat().st_size):
        time.sleep(0.2)
    assert records.exists(), "the sweep never started writing"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err
    last = [line for line in err.replace("\r", "\n").splitlines() if line.strip()][-1]
    assert last == (
        f"interp-seal analysis: interrupted; finished parts are kept in {out}: rerun with "
        "--resume to continue"
    )
    kept = records.read_text().count("\n")
    assert kept >= 1
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert records.read_text().count("\n") > kept
