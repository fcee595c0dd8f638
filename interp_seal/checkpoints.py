"""Resumable training state on disk: safetensors for tensors, JSON for the rest, never pickle.

Tuning runs (``interp_seal.tuning.loop``) and the organism's training
(``interp_seal.organism.train``) both resume after ``kill -9`` from a checkpoint of the
trainable weights and the optimizer's moments. Both write them the same way: tensors as
safetensors (no code runs on loading, unlike ``torch.load`` of a pickle), the optimizer's
per-parameter state flattened to ``"{param index}.{name}"`` keys, everything else as JSON.
A checkpoint directory is replaced whole (``replacing_dir``): a kill at any moment leaves
either the previous checkpoint or the new one, never a mix of the two.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def save_optimizer(optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """The optimizer's per-parameter state (AdamW moments, step counts) as safetensors.

    Hyper-parameters (``param_groups``) are not saved: a resumed run rebuilds the optimizer
    from the same settings, which its checkpoint identity checks.
    """
    moments = {}
    for i, state in optimizer.state_dict()["state"].items():
        for name, tensor in state.items():
            tensor = torch.as_tensor(tensor)
            moments[f"{i}.{name}"] = tensor.reshape(-1) if tensor.ndim == 0 else tensor.contiguous()
    save_file(moments, str(path))


def load_optimizer(optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Restore ``save_optimizer``'s state into ``optimizer`` (built with the same parameters)."""
    state: dict[int, dict] = {}
    for key, tensor in load_file(str(path)).items():
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = tensor.reshape(()) if name == "step" else tensor
    optimizer.load_state_dict(
        {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}
    )


@contextmanager
def replacing_dir(path: str | Path) -> Iterator[Path]:
    """Write a new version of directory ``path``: files go into a temporary directory that
    replaces ``path`` only once the block has finished (the old one is moved aside first and
    removed last; ``checkpoint_dir`` recovers it after a kill between the two renames)."""
    path = Path(path)
    tmp, old = path.with_name(f".{path.name}.new"), path.with_name(f".{path.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_dir(path: str | Path) -> Path | None:
    """``path`` if it holds a complete checkpoint written by ``replacing_dir`` (restoring the
    previous one if a kill struck between its renames), else None."""
    path = Path(path)
    old = path.with_name(f".{path.name}.old")
    if not path.exists() and old.exists():
        os.rename(old, path)
    return path if path.exists() else None
