"""Head edits on the plain Hugging Face model: what the handle's edit stack leaves to do.

This is the long-context path: the model keeps its sdpa attention (memory linear in sequence
length) and edits act at each layer's ``o_proj`` input, reshaped to ``(batch, pos, head,
d_head)``, through the hooks ``ModelHandle.edit`` installs. This module adds the pieces built
on that stack: the logits of an edited forward (``hf_logits``), the heads' own outputs
(``capture_head_outputs``) and the fingerprint a resumable run records for its active edits
(``edits_manifest``).
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from interp_seal.interventions.head_edit import HeadEdit, HeadIntervention
from interp_seal.models.handle import ModelHandle
from interp_seal.records import fingerprint


def edits_manifest(handle: ModelHandle) -> dict:
    """``{"edits": fingerprint}`` of the handle's active edits, for the manifest of a resumable
    run (``{}`` without edits: a run under an edit never resumes one without, or the reverse)."""
    edit = handle.active_edit()
    return {} if edit is None else {"edits": fingerprint(_tensors(edit))}


def _tensors(edit: HeadEdit) -> list:
    """What defines an edit: its tables, recursively through stacks and compositions."""
    for parts in ("edits", "ivs"):  # ComposedEdit, EditStack
        if hasattr(edit, parts):
            return [_tensors(e) for e in getattr(edit, parts)]
    if isinstance(edit, HeadIntervention):
        return [edit.mode, edit.scale, edit.offset, edit.uniform]
    raise TypeError(f"cannot record an edit of type {type(edit).__name__} in a manifest")


def hf_logits(handle: ModelHandle, input_ids: torch.Tensor, iv: HeadIntervention | None = None):
    """Logits ``(batch, pos, vocab)`` of the HF model with ``iv`` (and the active edits)."""
    with torch.no_grad(), handle.edit(iv):
        return handle.model(input_ids).logits


def capture_head_outputs(handle: ModelHandle, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per-layer head outputs ``z`` ``(batch, pos, head, d_head)``: the ``o_proj`` inputs as the
    heads compute them, before the handle's active edits (the inputs of a model with those
    edits merged into ``o_proj``)."""
    H, D = handle.spec.n_heads, handle.spec.d_head
    zs: list[torch.Tensor] = [None] * handle.spec.n_layers

    def keep(layer):
        def hook(_mod, args):
            zs[layer] = args[0].detach().view(*args[0].shape[:2], H, D)

        return hook

    with torch.no_grad(), ExitStack() as hooks:
        for layer in range(handle.spec.n_layers):
            o_proj = handle.proj(layer, "o_proj")
            hooks.enter_context(o_proj.register_forward_pre_hook(keep(layer), prepend=True))
        handle.model(input_ids)
    return zs
