"""Applying a ``HeadIntervention`` on the plain Hugging Face model with forward hooks.

This is the long-context path: the model keeps its sdpa attention (memory linear in sequence
length) and the edit happens at each edited layer's ``o_proj`` input, reshaped to
``(batch, pos, head, d_head)``. For uniform attention a hook on ``v_proj`` hands the layer's
value vectors to the edit. Hooks are removed when the context exits, exception or not.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from interp_seal.interventions.head_edit import HeadEdit, HeadIntervention
from interp_seal.models.handle import ModelHandle


@contextmanager
def hf_hooks(handle: ModelHandle, iv: HeadEdit):
    """Install ``iv`` (a ``HeadIntervention`` or any ``HeadEdit``) on ``handle.model`` for the
    duration of the block."""
    iv.check_model(handle.spec, handle.name_or_path)
    H, D, KV = handle.spec.n_heads, handle.spec.d_head, handle.spec.n_kv_heads
    with ExitStack() as hooks:
        for layer in iv.active_layers():
            values: dict[str, torch.Tensor] = {}
            if iv.uses_values(layer):

                def keep_v(_mod, _inp, out, values=values):
                    values["v"] = out.view(*out.shape[:2], KV, D)

                hooks.enter_context(handle.proj(layer, "v_proj").register_forward_hook(keep_v))

            def edit_o_input(_mod, args, layer=layer, values=values):
                x = args[0]  # (B, T, H*D)
                z = iv.edit(layer, x.view(*x.shape[:2], H, D), values.pop("v", None))
                return (z.reshape(x.shape), *args[1:])

            o_proj = handle.proj(layer, "o_proj")
            hooks.enter_context(o_proj.register_forward_pre_hook(edit_o_input))
        yield handle.model


def hf_logits(handle: ModelHandle, input_ids: torch.Tensor, iv: HeadIntervention | None = None):
    """Logits ``(batch, pos, vocab)`` of the HF model with ``iv`` applied."""
    with torch.no_grad():
        if iv is None:
            return handle.model(input_ids).logits
        with hf_hooks(handle, iv):
            return handle.model(input_ids).logits


def capture_head_outputs(handle: ModelHandle, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per-layer head outputs ``z`` ``(batch, pos, head, d_head)`` (the ``o_proj`` inputs)."""
    H, D = handle.spec.n_heads, handle.spec.d_head
    zs: list[torch.Tensor] = [None] * handle.spec.n_layers

    def keep(layer):
        def hook(_mod, args):
            zs[layer] = args[0].detach().view(*args[0].shape[:2], H, D)

        return hook

    with torch.no_grad(), ExitStack() as hooks:
        for layer in range(handle.spec.n_layers):
            o_proj = handle.proj(layer, "o_proj")
            hooks.enter_context(o_proj.register_forward_pre_hook(keep(layer)))
        handle.model(input_ids)
    return zs
