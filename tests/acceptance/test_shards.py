"""Sharded runs: N torchrun processes (gloo on CPU) give exactly the one-process results.

The partition and the record files are checked directly; the commands run for real under
``python -m torch.distributed.run`` with 2 processes, and their tables are compared byte for
byte with one process's. A resumed sharded run is checked to skip what is on disk by planting a
recognisable value in a finished record: the result keeps it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from interp_seal.analysis.sweeps import SweepOptions, _plan, _share
from interp_seal.records import RecordStore
from interp_seal.shards import Shard

ROOT = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], *, procs: int, cwd: Path) -> subprocess.CompletedProcess:
    """``interp-seal ARGS`` in one process, or under torchrun with ``procs`` processes."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if procs == 1:
        cmd = [sys.executable, "-m", "interp_seal.cli", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={procs}", "-m", "interp_seal.cli", *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_shares_cover_the_plan_once():
    encoded = {3: [None] * 5, 6: [None] * 3}
    starts = [0, 0, 1, 1, 1, 2, 4, 4]  # 4 = n_layers: a unit that edits nothing
    options = SweepOptions(batch_rows=4, batch_samples=2)
    steps = _plan(encoded, starts, {}, options, n_layers=4)
    for world in (1, 2, 3):
        shares = [_share(steps, Shard(rank, world)) for rank in range(world)]
        groups = [(s.length, s.chunk, g) for share in shares for s in share for g in s.groups]
        assert sorted(groups) == sorted((s.length, s.chunk, g) for s in steps for g in s.groups)
        baselines = [(s.length, s.chunk) for share in shares for s in share if s.baseline]
        assert sorted(baselines) == sorted((s.length, s.chunk) for s in steps)
    # rank 1 of 2 runs every second edited forward, in the plan's order
    flat = [(s.chunk, g) for s in steps for g in s.groups]
    second = [(s.chunk, g) for s in _share(steps, Shard(1, 2)) for g in s.groups]
    assert second == flat[1::2]


def test_rank_files_are_read_together_and_merged(tmp_path):
    path = tmp_path / "records.jsonl"
    rank0, rank1 = RecordStore(path, Shard(0, 2)), RecordStore(path, Shard(1, 2))
    assert rank1.own == tmp_path / "records.rank1.jsonl"
    rank0.append([{"key": "a", "fingerprint": "f", "v": 1}])
    rank1.append([{"key": "b", "fingerprint": "f", "v": 2}])
    with rank1.own.open("a") as f:
        f.write('{"key": "c", "fing')  # rank 1 killed mid-line
    assert [r["key"] for r in rank0.load()] == ["a", "b"]
    assert rank1.own.read_text().endswith('"fing')  # not rank 0's file to repair
    with rank1.own.open("rb") as reader:  # rank 0 reading while rank 1 repairs its own file
        assert [r["key"] for r in rank1.load()] == ["a", "b"]
        # the repair replaced the file whole: a reader never sees it truncated (the race that
        # once gave two ranks different plans of a resumed sweep)
        assert reader.read().endswith(b'"fing')
    assert rank1.own.read_text().endswith('"v": 2}\n')
    assert rank0.get("b", "f")["v"] == 2
    with pytest.raises(ValueError, match="different input"):
        RecordStore(path, Shard(0, 2)).get("b", "other")
    rank0.merge()
    assert not rank1.own.exists()
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["a", "b"]
    # a one-process resume reads the rank files a sharded run left behind
    rank1.append([{"key": "d", "fingerprint": "f", "v": 4}])
    assert [r["key"] for r in RecordStore(path, Shard()).load()] == ["a", "b", "d"]


SWEEP = ["analysis", "head-sweep", "--lengths", "3", "6", "--records", "3", "--threads", "1"]


def test_two_processes_sweep_exactly_like_one(tmp_path):
    run_cli([*SWEEP, "--out", "one"], procs=1, cwd=tmp_path)
    run_cli([*SWEEP, "--out", "two"], procs=2, cwd=tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    assert (two / "results.csv").read_bytes() == (one / "results.csv").read_bytes()
    assert sorted((two / "records.jsonl").read_text().splitlines()) == sorted(
        (one / "records.jsonl").read_text().splitlines()
    )
    assert not list(two.glob("records.rank*"))  # merged
    table = pd.read_csv(one / "results.csv")
    assert len(table) == 2 * 2 * 32  # 2 lengths x 2 metrics x 32 heads: nothing lost


def test_resumed_shards_keep_finished_units(tmp_path):
    run_cli([*SWEEP, "--out", "one"], procs=1, cwd=tmp_path)
    one, part = tmp_path / "one", tmp_path / "part"
    part.mkdir()
    (part / "manifest.json").write_bytes((one / "manifest.json").read_bytes())
    records = [json.loads(line) for line in (one / "records.jsonl").read_text().splitlines()]
    # unit 9 is L1H1 (8 heads a layer); plant a value in one of its finished records
    planted = next(i for i, r in enumerate(records) if r["unit"] == 9 and r["length"] == 6)
    original = records[planted]["answer_logprob"]
    records[planted] = records[planted] | {"answer_logprob": -123.0}
    # as a killed 2-process run leaves it: some units in rank 1's file, a cut line, no rank 0
    kept = [r for r in records if r["unit"] in (9, 11)]
    lines = "".join(json.dumps(r) + "\n" for r in kept) + '{"length": 3, "sam'
    (part / "records.rank1.jsonl").write_text(lines)
    run_cli([*SWEEP, "--out", "part", "--resume"], procs=2, cwd=tmp_path)

    def logprob(table: pd.DataFrame) -> pd.Series:
        rows = table[table.metric == "answer_logprob"]
        return rows.set_index(["layer", "head", "length"]).value

    resumed, expected = (
        logprob(pd.read_csv(part / "results.csv")),
        logprob(pd.read_csv(one / "results.csv")),
    )
    # the planted record was read back, not recomputed: L1H1's mean over 3 records moved
    moved = expected[1, 1, 6] + (-123.0 - original) / 3
    assert resumed[1, 1, 6] == pytest.approx(moved, rel=1e-12)
    assert resumed.drop((1, 1, 6)).equals(expected.drop((1, 1, 6)))
    assert not list(part.glob("records.rank*"))


@pytest.mark.slow  # 75 s: nine processes; the sweep tests above cover sharding in the default run
def test_two_processes_score_passages_and_mask_exactly_like_one(tmp_path):
    generate = ["tasks", "generate", "--task", "passages", "--n", "5", "--out", "qa.jsonl"]
    run_cli(generate, procs=1, cwd=tmp_path)
    for procs, out in ((1, "one"), (2, "two")):
        scores = ["retrieval", "passage-scores", "--samples", "qa.jsonl", "--threads", "1"]
        run_cli([*scores, "--out", f"{out}/scores"], procs=procs, cwd=tmp_path)
        masking = ["retrieval", "masking", "--samples", "qa.jsonl", "--ks", "1", "2"]
        masking += ["--seeds", "0", "1", "--scores", "one/scores/head_scores.csv", "--threads", "1"]
        run_cli([*masking, "--out", f"{out}/masking"], procs=procs, cwd=tmp_path)
    for name in ("scores/head_scores.csv", "scores/per_sample_scores.csv", "masking/masking.csv"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    assert len(pd.read_csv(tmp_path / "one/masking/masking.csv")) == 1 + 2 * 2 * 3
    per_sample = (tmp_path / "two/scores/per_sample.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["sample"] for line in per_sample) == [0, 1, 2, 3, 4]


def test_commands_that_do_not_shard_refuse_torchrun(tmp_path):
    env = os.environ | {"WORLD_SIZE": "2", "RANK": "0", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "interp_seal.cli", "evaluate", "lines", "--lengths", "3"]
    done = subprocess.run([*cmd, "--n", "1"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert "runs in one process; under torchrun only the sweeps" in done.stderr
