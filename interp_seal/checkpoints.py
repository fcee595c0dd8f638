"""Resumable training state on disk: safetensors for tensors, JSON for the rest, never pickle.

Tuning runs (``interp_seal.tuning.loop``) and the organism's training
(``interp_seal.organism.train``) both resume after ``kill -9`` from a checkpoint of the
trainable weights and the optimizer's moments. Both write them the same way: tensors as
safetensors (no code runs on loading, unlike ``torch.load`` of a pickle), the optimizer's
per-parameter state flattened to ``"{param index}.{name}"`` keys, everything else as JSON.
A checkpoint directory is replaced whole (``interp_seal.outputs.atomic_dir``): a kill at any
moment leaves either the previous checkpoint or the new one, never a mix of the two.
"""

from __future__ import annotations

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
