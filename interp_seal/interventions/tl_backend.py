"""Applying a ``HeadIntervention`` on the TransformerLens 4 bridge (``handle.bridge()``).

The bridge exposes each head's output before ``o_proj`` as ``blocks.{l}.attn.hook_z``, already
split per head ``(B, T, H, D)`` (an alias of ``blocks.{l}.attn.o.hook_in``), and the value
vectors as ``blocks.{l}.attn.hook_v`` ``(B, T, KV, D)``: GQA is kept, so there are
``n_kv_heads`` of them, exactly what ``HeadIntervention.edit`` expects. ``hook_v`` fires before
``hook_z`` in a layer, so a ``hook_v`` hook hands the values to the ``hook_z`` edit.

The bridge computes eager attention (a ``T x T`` pattern per head): use it for short contexts
and cross-checks, and the HF backend for long ones. Hooks go through ``bridge.hooks(...)``,
which removes them when the block exits, exception or not.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.interventions.head_edit import HeadIntervention
from interp_seal.models.handle import ModelHandle


def _layer_hooks(iv: HeadIntervention, layer: int, window: int | None) -> list[tuple[str, object]]:
    """``(hook name, hook fn)`` pairs applying ``iv`` to ``layer`` (attention ``window``)."""
    values: dict[str, Tensor] = {}
    hooks = []
    if iv.uses_values(layer):

        def keep_v(v: Float[Tensor, "batch pos kv_head d_head"], hook):
            values["v"] = v

        hooks.append((f"blocks.{layer}.attn.hook_v", keep_v))

    def edit_z(z: Float[Tensor, "batch pos head d_head"], hook):
        return iv.edit(layer, z, values.pop("v", None), window=window)

    hooks.append((f"blocks.{layer}.attn.hook_z", edit_z))
    return hooks


@contextmanager
def tl_hooks(handle: ModelHandle, iv: HeadIntervention):
    """Install ``iv`` on ``handle.bridge()`` for the duration of the block; yields the bridge."""
    iv.check_model(handle.spec, handle.name_or_path)
    bridge = handle.bridge()
    fwd_hooks = [
        hook
        for layer in iv.active_layers()
        for hook in _layer_hooks(iv, layer, handle.sliding_window(layer))
    ]
    with bridge.hooks(fwd_hooks=fwd_hooks):
        yield bridge


def tl_logits(
    handle: ModelHandle,
    input_ids: Int[Tensor, "batch pos"],
    iv: HeadIntervention | None = None,
) -> Float[Tensor, "batch pos vocab"]:
    """Logits of the bridge on ``input_ids`` with ``iv`` applied (hooks already installed count too)."""
    bridge = handle.bridge()
    with torch.no_grad():
        if iv is None:
            return bridge(input_ids)
        with tl_hooks(handle, iv):
            return bridge(input_ids)
