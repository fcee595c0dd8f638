"""One entry point for analysis code: ``logits(handle, ids, iv)`` and ``intervene(handle, iv)``.

The same ``HeadIntervention`` runs on three backends, which agree to float precision (the
tests hold them to 1e-5 in fp32):

- ``"hf"``: forward hooks on the Hugging Face model (sdpa attention, memory linear in length:
  the long-context path);
- ``"nnsight"``: the same weights through ``nnsight.TransformersModel``;
- ``"transformer_lens"``: the TransformerLens 4 bridge (eager attention, short contexts).

``backend=None`` means ``handle.backend``. ``intervene`` keeps the edit installed for a block
and yields the backend's model object (``handle.model``, ``handle.nnsight()`` or
``handle.bridge()``); ``logits`` inside the block sees it, and blocks nest. The nnsight edit
applies to traces of ``handle.nnsight()`` only, not to direct calls of ``handle.model``.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.interventions.head_edit import HeadIntervention
from interp_seal.interventions.hf import hf_logits
from interp_seal.interventions.nnsight_backend import nnsight_edit, nnsight_logits
from interp_seal.interventions.tl_backend import tl_hooks, tl_logits
from interp_seal.models.handle import BACKENDS, ModelHandle

# backend name -> (context manager installing an intervention, logits function)
_IMPLEMENTATIONS = {
    "hf": (ModelHandle.edit, hf_logits),
    "nnsight": (nnsight_edit, nnsight_logits),
    "transformer_lens": (tl_hooks, tl_logits),
}


def _backend(handle: ModelHandle, backend: str | None) -> str:
    backend = handle.backend if backend is None else backend
    if backend not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


@contextmanager
def intervene(handle: ModelHandle, iv: HeadIntervention, backend: str | None = None):
    """Apply ``iv`` on ``backend`` for the duration of the block; removed on exit, exception or not."""
    install, _ = _IMPLEMENTATIONS[_backend(handle, backend)]
    with install(handle, iv) as model:
        yield model


def _check_input_ids(handle: ModelHandle, input_ids: Tensor) -> None:
    if input_ids.dim() != 2:
        raise ValueError(
            f"input_ids has shape {tuple(input_ids.shape)}; expected (batch, pos). "
            "Add a batch axis with input_ids[None] for a single sequence."
        )
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be integer token ids (torch.long), got {input_ids.dtype}")
    if input_ids.numel() == 0:
        raise ValueError("input_ids is empty; pass at least one token per row")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= handle.spec.vocab_size:
        raise ValueError(
            f"token ids must lie in [0, {handle.spec.vocab_size}) for {handle.name_or_path}; got "
            f"ids in [{low}, {high}] (another tokenizer's ids?)"
        )


def logits(
    handle: ModelHandle,
    input_ids: Int[Tensor, "batch pos"],
    iv: HeadIntervention | None = None,
    backend: str | None = None,
) -> Float[Tensor, "batch pos vocab"]:
    """Logits of ``handle``'s model on ``input_ids`` with ``iv`` applied, on ``backend``.

    Runs without gradients. A batched intervention (scale ``(B, L, H, D)``) needs ``B`` rows.
    """
    _, run = _IMPLEMENTATIONS[_backend(handle, backend)]
    _check_input_ids(handle, input_ids)
    return run(handle, input_ids, iv)
