"""Training state on disk: optimizer moments round-trip exactly; a checkpoint is replaced whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from interp_seal.checkpoints import load_optimizer, save_optimizer
from interp_seal.outputs import atomic_dir, recover_dir


def test_optimizer_state_round_trips_exactly(tmp_path):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    opt = torch.optim.AdamW(params, lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        sum((p**2).sum() for p in params).backward()
        opt.step()
    save_optimizer(opt, tmp_path / "opt.safetensors")
    fresh = torch.optim.AdamW(params, lr=0.1)
    load_optimizer(fresh, tmp_path / "opt.safetensors")
    saved, loaded = opt.state_dict()["state"], fresh.state_dict()["state"]
    assert saved.keys() == loaded.keys() == {0, 1}
    for i in saved:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(saved[i][name]), torch.as_tensor(loaded[i][name]))
    assert float(loaded[0]["step"]) == 3.0


def test_checkpoint_is_replaced_whole(tmp_path, monkeypatch):
    state = tmp_path / "state"
    with atomic_dir(state, mode="replace") as d:
        (d / "a.txt").write_text("1")
        (d / "b.txt").write_text("1")
    with pytest.raises(RuntimeError), atomic_dir(state, mode="replace") as d:  # fails while writing
        (d / "a.txt").write_text("2")
        raise RuntimeError("killed")
    assert [(state / n).read_text() for n in ("a.txt", "b.txt")] == ["1", "1"]

    renames = []
    real_rename = os.rename

    def rename_once(src, dst):  # the process dies after moving the old checkpoint aside
        if renames:
            raise KeyboardInterrupt
        renames.append((src, dst))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_once)
    with pytest.raises(KeyboardInterrupt), atomic_dir(state, mode="replace") as d:
        (d / "a.txt").write_text("3")
    monkeypatch.setattr(os, "rename", real_rename)
    assert not state.exists()
    assert recover_dir(state) == state  # the previous checkpoint is back
    assert [(state / n).read_text() for n in ("a.txt", "b.txt")] == ["1", "1"]
    assert recover_dir(tmp_path / "none") is None


def test_pickle_only_checkpoints_are_refused_without_unpickling(tmp_path, monkeypatch):
    """``pytorch_model.bin`` (a pickle) is never loaded: the directory is refused, naming the
    safetensors conversion, before ``torch.load`` could run."""
    import torch

    from interp_seal.models import load_model
    from interp_seal.models.checks import CheckpointError
    from interp_seal.testing import save_random_checkpoint

    path = Path(save_random_checkpoint(tmp_path / "ckpt", "llama"))
    state = load_model(str(path)).model.state_dict()
    torch.save(state, path / "pytorch_model.bin")
    (path / "model.safetensors").unlink()

    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was called on a pickle")

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(
        CheckpointError, match="only as pickle files.*pytorch_model.bin.*safetensors"
    ):
        load_model(str(path))
