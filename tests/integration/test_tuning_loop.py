"""The training loop: resume equivalence, checkpoints, sample order, two processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp_seal.engine import pad_id_of
from interp_seal.models import load_model
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.data import collate, encode_examples
from interp_seal.tuning.loop import TrainConfig, _batches, latest_checkpoint, train
from interp_seal.tuning.scales import load_scales
from interp_seal.tuning.seal import SealTuner

REPO = Path(__file__).resolve().parents[2]


class Interrupt(Exception):
    pass


def _setup(checkpoint, n=6):
    handle = load_model(checkpoint)
    samples = generate(LineRetrievalConfig(num_lines=4), n, seed=1)
    return handle, encode_examples(samples, handle.tokenizer), pad_id_of(handle.tokenizer)


def test_resume_ends_where_an_uninterrupted_run_ends(llama_checkpoint, tmp_path):
    cfg = TrainConfig(lr=3e-2, epochs=2, batch_size=2, checkpoint_every=2, cpu=True, seed=4)
    handle, examples, pad = _setup(llama_checkpoint)
    full_tuner = SealTuner(handle, "channel")
    full = train(full_tuner, examples, cfg, pad_id=pad, out_dir=tmp_path / "full")
    assert full.steps == 6 and full.resumed_from == 0

    def stop_after_3(info):
        if info.step == 3:
            raise Interrupt

    handle, examples, pad = _setup(llama_checkpoint)
    with pytest.raises(Interrupt):
        train(
            SealTuner(handle, "channel"),
            examples,
            cfg,
            pad_id=pad,
            out_dir=tmp_path / "cut",
            callbacks=[stop_after_3],
        )
    assert latest_checkpoint(tmp_path / "cut").name == "step-0000002"

    handle, examples, pad = _setup(llama_checkpoint)  # a fresh process would start like this
    resumed_tuner = SealTuner(handle, "channel")
    resumed = train(resumed_tuner, examples, cfg, pad_id=pad, out_dir=tmp_path / "cut")
    assert resumed.resumed_from == 2
    assert torch.equal(resumed_tuner.scales, full_tuner.scales)
    assert resumed.losses == full.losses
    assert not torch.equal(full_tuner.scales, torch.ones_like(full_tuner.scales))
    # only the newest checkpoint is kept
    assert [p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()] == ["step-0000006"]


def test_resume_refuses_a_different_run(llama_checkpoint, tmp_path):
    handle, examples, pad = _setup(llama_checkpoint)
    train(
        SealTuner(handle, "head"),
        examples,
        TrainConfig(lr=1e-2, cpu=True),
        pad_id=pad,
        out_dir=tmp_path,
    )
    with pytest.raises(ValueError, match="different run"):
        train(
            SealTuner(handle, "head"),
            examples,
            TrainConfig(lr=2e-2, cpu=True),
            pad_id=pad,
            out_dir=tmp_path,
        )
    other_data = encode_examples(
        generate(LineRetrievalConfig(num_lines=4), 6, seed=9), handle.tokenizer
    )
    with pytest.raises(ValueError, match="different run"):
        train(
            SealTuner(handle, "head"),
            other_data,
            TrainConfig(lr=1e-2, cpu=True),
            pad_id=pad,
            out_dir=tmp_path,
        )


def test_sample_order_covers_each_epoch_once_and_splits_across_processes(llama_checkpoint):
    handle, examples, pad = _setup(llama_checkpoint, n=7)
    cfg = TrainConfig(lr=1e-2, epochs=2, batch_size=1, seed=0)
    ids = [tuple(e.encoded.input_ids.tolist()) for e in examples]

    def seen(rank, world):
        return [
            (step, ids.index(tuple(b.input_ids[0].tolist())))
            for step, b in _batches(examples, cfg, rank, world, 0, pad)
        ]

    one = seen(0, 1)
    assert [s for s, _ in one] == list(range(14))
    assert sorted(i for _, i in one[:7]) == list(range(7)) == sorted(i for _, i in one[7:])
    assert [i for _, i in one[:7]] != [i for _, i in one[7:]], "each epoch has its own order"
    rank0, rank1 = seen(0, 2), seen(1, 2)  # 3 steps per epoch; the 7th sample is dropped
    assert [s for s, _ in rank0] == list(range(6))
    order0 = [i for _, i in one[:7]]
    assert [i for _, i in rank0[:3]] == order0[0:6:2] and [i for _, i in rank1[:3]] == order0[1:6:2]


def test_too_few_samples_for_a_batch_is_refused(llama_checkpoint):
    handle, examples, pad = _setup(llama_checkpoint, n=2)
    with pytest.raises(ValueError, match="cannot fill one global batch"):
        train(
            SealTuner(handle, "head"),
            examples,
            TrainConfig(lr=1e-2, batch_size=3, cpu=True),
            pad_id=pad,
        )


def _free_port() -> int:
    with socket.socket() as s:  # bind only; the test forbids connect()
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_follow_the_one_process_trajectory(llama_checkpoint, tmp_path):
    """``torchrun --nproc_per_node 2`` (gloo, batch 1 each) == one process with batch 2."""
    common = [
        "tune",
        "seal-c",
        "--model",
        llama_checkpoint,
        "--task",
        "line_retrieval",
        "--num-lines",
        "4",
        "--samples",
        "6",
        "--lr",
        "3e-2",
        "--epochs",
        "2",
        "--cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            "-m",
            "interp_seal.cli.tune",
            *common[1:],
            "--batch-size",
            "1",
            "--out",
            str(tmp_path / "two"),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    log = json.loads((tmp_path / "two" / "train_log.json").read_text())
    assert log["processes"] == 2 and log["steps"] == 6

    from interp_seal.cli import main

    assert main([*common, "--batch-size", "2", "--out", str(tmp_path / "one")]) == 0
    one_log = json.loads((tmp_path / "one" / "train_log.json").read_text())
    assert one_log["processes"] == 1 and one_log["steps"] == 6
    spec = load_model(llama_checkpoint).spec
    s_two = load_scales(tmp_path / "two" / "scales.safetensors", spec).scales
    s_one = load_scales(tmp_path / "one" / "scales.safetensors", spec).scales
    assert not torch.equal(s_one, torch.ones_like(s_one))
    torch.testing.assert_close(s_two, s_one, rtol=0, atol=1e-5)
    assert log["losses"] == pytest.approx(one_log["losses"], abs=1e-5)


def test_collate_right_pads_and_masks(llama_checkpoint):
    handle, examples, pad = _setup(llama_checkpoint, n=2)
    batch = collate(examples, pad)
    for row, e in enumerate(examples):
        n = len(e.encoded)
        assert torch.equal(batch.input_ids[row, :n], e.encoded.input_ids)
        assert (batch.input_ids[row, n:] == pad).all() and batch.attention_mask[row].sum() == n
        mask = batch.answer_mask()[row]
        assert mask.nonzero().flatten().tolist() == list(range(e.encoded.answer_start, n))


def test_training_runs_where_the_model_lives_unless_told():
    """``figures --device cuda`` once built its trainer with ``cpu=True``; now the default
    follows the weights (a meta-device model stands in for a GPU one here)."""
    from interp_seal.tuning.loop import TrainConfig, train_on_cpu

    on_cpu = torch.nn.Linear(2, 2)
    elsewhere = torch.nn.Linear(2, 2, device="meta")
    assert train_on_cpu(TrainConfig(lr=1e-3), on_cpu) is True
    assert train_on_cpu(TrainConfig(lr=1e-3), elsewhere) is False
    assert train_on_cpu(TrainConfig(lr=1e-3, cpu=True), elsewhere) is True
    assert train_on_cpu(TrainConfig(lr=1e-3, cpu=False), on_cpu) is False
