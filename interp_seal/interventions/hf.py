"""Applying head edits on the plain Hugging Face model: the handle's edit stack.

This is the long-context path: the model keeps its sdpa attention (memory linear in sequence
length) and the edit happens at each layer's ``o_proj`` input, reshaped to
``(batch, pos, head, d_head)``. For uniform attention a hook on ``v_proj`` hands the layer's
value vectors to the edit.

A handle owns its active edits. ``handle.edit(iv)`` (this module's ``hf_hooks``) pushes ``iv``
on the handle's stack for the block and pops it on exit, exception or not; blocks nest, and an
inner block removes only its own edit. One hook per layer, installed while the stack is not
empty, applies the composition of every active edit (``ComposedEdit``: the outermost acts last,
as if merged into ``o_proj``) exactly once per forward. The forward engine, which restarts the
model mid-layer from cached head outputs, asks the same stack for the composed edit
(``active_edit``) and applies it itself (``interp_seal.engine.layers.attn_output``), so every
path sees each edit once. Hooks on ``o_proj`` that the handle did not install would be applied
twice or not at all by such restarts; the engine refuses them (``check_no_foreign_hooks``).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from interp_seal.interventions.head_edit import ComposedEdit, HeadEdit, HeadIntervention
from interp_seal.models.handle import ModelHandle
from interp_seal.records import fingerprint


def active_edit(handle: ModelHandle, extra: HeadEdit | None = None) -> HeadEdit | None:
    """The composition of ``handle``'s active edits (outermost last) and ``extra`` (innermost,
    applied first), or None when there is nothing to apply."""
    edits = [*handle._edits.values(), *([extra] if extra is not None else [])]
    if not edits:
        return None
    return edits[0] if len(edits) == 1 else ComposedEdit(tuple(edits))


def edits_manifest(handle: ModelHandle) -> dict:
    """``{"edits": fingerprint}`` of the handle's active edits, for the manifest of a resumable
    run (``{}`` without edits: a run under an edit never resumes one without, or the reverse)."""
    edit = active_edit(handle)
    return {} if edit is None else {"edits": fingerprint(_tensors(edit))}


def _tensors(edit: HeadEdit) -> list:
    """What defines an edit: its tables, recursively through stacks and compositions."""
    for parts in ("edits", "ivs"):  # ComposedEdit, EditStack
        if hasattr(edit, parts):
            return [_tensors(e) for e in getattr(edit, parts)]
    if isinstance(edit, HeadIntervention):
        return [edit.mode, edit.scale, edit.offset, edit.uniform]
    raise TypeError(f"cannot record an edit of type {type(edit).__name__} in a manifest")


@contextmanager
def hf_hooks(handle: ModelHandle, iv: HeadEdit | None):
    """``handle.edit(iv)``: apply ``iv`` (any ``HeadEdit``) to every forward of
    ``handle.model`` in the block, composed with the edits already active; yields the model.
    ``None`` applies nothing (so callers can pass an optional edit straight through)."""
    if iv is None:
        yield handle.model
        return
    iv.check_model(handle.spec, handle.name_or_path)
    key = object()
    handle._edits[key] = iv
    try:
        if handle._edit_hooks is None:
            handle._edit_hooks = _install(handle)
        yield handle.model
    finally:
        del handle._edits[key]
        if not handle._edits and handle._edit_hooks is not None:
            handle._edit_hooks.close()
            handle._edit_hooks = None


def _install(handle: ModelHandle) -> ExitStack:
    """One ``o_proj`` pre-hook (and one ``v_proj`` hook) per layer applying ``active_edit``."""
    H, D, KV = handle.spec.n_heads, handle.spec.d_head, handle.spec.n_kv_heads
    hooks = ExitStack()
    values: dict[int, torch.Tensor] = {}

    def keep_v(layer):
        def hook(_mod, _inp, out):
            edit = active_edit(handle)
            if edit is not None and edit.uses_values(layer):
                values[layer] = out.view(*out.shape[:2], KV, D)

        return hook

    def edit_o_input(layer):
        def hook(_mod, args):
            edit = active_edit(handle)
            v = values.pop(layer, None)
            if edit is None or layer not in edit.active_layers():
                return None
            x = args[0]  # (B, T, H*D)
            z = edit.edit(layer, x.view(*x.shape[:2], H, D), v)
            return (z.reshape(x.shape), *args[1:])

        return hook

    for layer in range(handle.spec.n_layers):
        v_hook = handle.proj(layer, "v_proj").register_forward_hook(keep_v(layer))
        o_hook = handle.proj(layer, "o_proj").register_forward_pre_hook(edit_o_input(layer))
        for removable in (v_hook, o_hook):
            handle._hook_ids.add(removable.id)
            hooks.callback(handle._hook_ids.discard, removable.id)
            hooks.enter_context(removable)
    return hooks


def check_no_foreign_hooks(handle: ModelHandle, layer: int) -> None:
    """Refuse ``o_proj`` hooks the handle did not install: a run restarted from cached head
    outputs calls ``o_proj`` itself and cannot apply them exactly once."""
    o_proj = handle.proj(layer, "o_proj")
    ids = [*o_proj._forward_pre_hooks, *o_proj._forward_hooks]
    if any(i not in handle._hook_ids for i in ids):
        raise RuntimeError(
            f"layer {layer}'s o_proj carries a hook interp-seal did not install; runs restarted "
            "mid-model would apply it twice or not at all. Remove it and apply the edit with "
            "`with handle.edit(intervention):` (or pass intervention=...)."
        )


def hf_logits(handle: ModelHandle, input_ids: torch.Tensor, iv: HeadIntervention | None = None):
    """Logits ``(batch, pos, vocab)`` of the HF model with ``iv`` (and the active edits)."""
    with torch.no_grad(), hf_hooks(handle, iv):
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
