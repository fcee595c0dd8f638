"""Applying a ``HeadIntervention`` through nnsight 0.8 (``handle.nnsight()``).

nnsight runs the model and, in lock-step, the body of a ``with model.trace(ids):`` block:
reading ``envoy.input`` waits until that module is called and hands over its input;
assigning ``envoy.input = ...`` replaces it. The head edit is therefore the same as with plain
hooks: for each edited layer read ``o_proj``'s input ``(B, T, H*D)``, view it per head
``(B, T, H, D)``, apply ``HeadIntervention.edit`` and assign it back. Uniform attention also
needs the layer's values, so ``v_proj.output`` is read first (the body must ask for modules in
the order the forward pass calls them).

Two ways to apply it:

- ``nnsight_logits(handle, ids, iv)`` writes the edit into one trace. ``remote="local"``
  serialises that trace (body, intervention tensors and all) and runs it in-process, the dry
  run of ``remote=True`` (NDIF), which needs a hub model served there and an API key.
- ``nnsight_edit(handle, iv)`` stores the edit on the envoy with ``model.edit(inplace=True)``;
  every trace of ``handle.nnsight()`` inside the block replays it, and leaving the block
  restores the edits that were stored before (so blocks nest, like stacked hooks). An nnsight
  edit lives on the envoy, not on the torch module: ``handle.model(ids)`` called directly
  inside the block runs unedited.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.interventions.head_edit import HeadIntervention
from interp_seal.models.handle import ModelHandle
from interp_seal.models.spec import Family


def _windows(handle: ModelHandle, iv: HeadIntervention) -> dict[int, int | None]:
    """Each edited layer's attention window, read before the trace: a remote trace serialises
    what its body refers to, and the handle is not for sending."""
    return {layer: handle.sliding_window(layer) for layer in iv.active_layers()}


def _edit_in_trace(
    model, family: Family, iv: HeadIntervention, windows: dict[int, int | None]
) -> None:
    """The trace body applying ``iv``; call it inside a ``trace`` or ``edit`` block of ``model``."""
    H, D, KV = iv.spec.n_heads, iv.spec.d_head, iv.spec.n_kv_heads
    for layer in iv.active_layers():
        attn = model.get(f"{family.layers}.{layer}.{family.attn}")
        v = None
        if iv.uses_values(layer):
            path, rows = family.projection("v", iv.spec)  # rows of a fused qkv_proj
            out = attn.get(path).output  # (B, T, KV*D), or the fused (B, T, (H+2KV)*D)
            v = (out if rows is None else out[..., rows]).reshape(*out.shape[:2], KV, D)
        o_proj = attn.get(family.o_proj)
        x = o_proj.input  # (B, T, H*D)
        z = iv.edit(layer, x.view(*x.shape[:2], H, D), v, window=windows[layer])
        o_proj.input = z.reshape(x.shape)


def nnsight_logits(
    handle: ModelHandle,
    input_ids: Int[Tensor, "batch pos"],
    iv: HeadIntervention | None = None,
    *,
    remote: bool | str = False,
) -> Float[Tensor, "batch pos vocab"]:
    """Logits of ``handle.nnsight()`` on ``input_ids`` with ``iv`` applied inside the trace.

    ``remote`` is nnsight's: ``"local"`` round-trips the trace through serialisation in this
    process; ``True`` ships it to NDIF. Edits stored by ``nnsight_edit`` apply as well.
    """
    if iv is not None:
        iv.check_model(handle.spec, handle.name_or_path)
    model, family = handle.nnsight(), handle.family
    windows = _windows(handle, iv) if iv is not None else {}
    with torch.no_grad(), model.trace(input_ids, remote=remote):
        if iv is not None:
            _edit_in_trace(model, family, iv, windows)
        logits = model.output.logits.save()
    return logits


@contextmanager
def nnsight_edit(handle: ModelHandle, iv: HeadIntervention):
    """Store ``iv`` as a persistent nnsight edit on ``handle.nnsight()`` for the block.

    Yields the edited envoy. The previously stored edits are restored on exit, exception or not.
    """
    iv.check_model(handle.spec, handle.name_or_path)
    model, family, windows = handle.nnsight(), handle.family, _windows(handle, iv)
    before = list(model._edits)  # nnsight's own snapshot idiom (Envoy._shallow_copy)
    try:
        with model.edit(inplace=True):
            _edit_in_trace(model, family, iv, windows)
        yield model
    finally:
        model._edits = before
