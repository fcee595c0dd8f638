"""Fold learned scales into the weights: zero inference overhead (SEAL, end of Sec. 4.3).

Head ``h``'s output channel ``c`` in layer ``l`` is ``z[h, c]``, the input column
``h * D + c`` of ``o_proj``. Scaling it by ``s[l, h, c]`` is the same as scaling that column of
``o_proj.weight``: ``W (s * z) = (W diag(s)) z``. That is exact for every attention layout
(``into="o_proj"``, the default). GPT-2's ``Conv1D`` stores that weight ``(in, out)``, so there
the column is a row (``ModelHandle.linear_weight`` gives the ``(out, in)`` view).

Alternatively the scale can go into ``v_proj``'s output rows: ``z_h = sum_t a_t v_t`` is linear
in the values, so scaling value channel ``c`` scales ``z[h, c]``, bias included. But with GQA
one KV head feeds ``group_size`` query heads, so this is exact only when every query head of a
group has the same scale vector (always true without GQA); ``into="v_proj"`` refuses otherwise.

The merged model has exactly the base architecture (same config class, same state dict keys
and shapes) and is saved as a standard Hugging Face checkpoint that
``AutoModelForCausalLM.from_pretrained`` loads with no interp-seal code.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_seal.models.handle import ModelHandle
from interp_seal.outputs import atomic_dir
from interp_seal.tuning.scales import check_scales

MERGE_TARGETS = ("o_proj", "v_proj")
MAX_SCALE = 1e3
"""The largest factor a merge accepts: SEAL's learned scales lie near 1 (the dashboard offers
0..2); a factor of 1e30 only turns a head's output into an overflow."""


def _full(scales: Tensor, d_head: int) -> Float[Tensor, "layer head d_head"]:
    return scales.detach().float().expand(*scales.shape[:2], d_head)


def check_mergeable(
    handle: ModelHandle, scales: Tensor, into: str, *, allow_negative: bool = True
) -> None:
    """Raise with an explanation if ``scales`` cannot be folded exactly into ``into``, hold a
    factor beyond ``MAX_SCALE``, or (unless ``allow_negative``) a negative factor."""
    if into not in MERGE_TARGETS:
        raise ValueError(f"unknown merge target {into!r}; choose one of {MERGE_TARGETS}")
    check_scales(scales, handle.spec)
    refused = [(scales.abs() > MAX_SCALE, f"beyond {MAX_SCALE:g} in size")]
    if not allow_negative:
        why = "negative (it flips the sign of the head's output; pass --allow-negative if meant)"
        refused.append((scales < 0, why))
    for bad, what in refused:
        if bad.any():
            layer, head, channel = bad.nonzero()[0].tolist()
            where = f"layer {layer}, head {head}" + (
                f", channel {channel}" if bad.shape[-1] > 1 else ""
            )
            raise ValueError(
                f"the scales hold {int(bad.sum())} factors {what}; the first is "
                f"{float(scales[layer, head, channel]):g} at {where}"
            )
    if into == "o_proj" or handle.spec.group_size == 1:
        return
    spec = handle.spec
    grouped = _full(scales, spec.d_head).view(spec.n_layers, spec.n_kv_heads, spec.group_size, -1)
    unequal = (grouped != grouped[:, :, :1]).flatten(2).any(-1).nonzero().tolist()
    if unequal:
        layer, group = unequal[0]
        heads = list(range(group * spec.group_size, (group + 1) * spec.group_size))
        raise ValueError(
            f"cannot merge into v_proj exactly: the model uses GQA ({spec.group_size} query heads "
            f"per KV head) and the query heads sharing a KV head have different scales (first "
            f"case: layer {layer}, heads {heads}; {len(unequal)} groups in all). Merge into "
            "o_proj instead (exact for any layout)."
        )


@torch.no_grad()
def merge_into(handle: ModelHandle, scales: Tensor, *, into: str = "o_proj") -> None:
    """Fold ``scales`` (``(L, H, 1)`` or ``(L, H, D)``) into ``handle.model``'s weights in place."""
    check_mergeable(handle, scales, into)
    spec = handle.spec
    full = _full(scales, spec.d_head)
    for layer in range(spec.n_layers):
        if into == "o_proj":
            weight = handle.linear_weight(handle.proj(layer, "o_proj"))  # (d_model, H*D) view
            column = full[layer].reshape(-1).to(weight)  # (H*D,); a Conv1D's input rows
            weight.mul_(column[None, :])
        else:
            # one query head per KV group carries the group's (shared) scale
            row = full[layer, :: spec.group_size].reshape(-1)  # (KV*D,)
            handle.scale_projection(layer, "v", row)  # the value rows of a fused one too


def copy_handle(handle: ModelHandle, model: nn.Module | None = None) -> ModelHandle:
    """A handle like ``handle`` on ``model`` (default: a deep copy of ``handle.model``), with
    no edits, hooks or backends of its own yet; ``handle`` is untouched."""
    if handle._edits:
        raise ValueError(
            "copying a model copies its hooks: copy it outside `with handle.edit(...)`"
        )
    copied = copy.copy(handle)
    copied.model = copy.deepcopy(handle.model) if model is None else model
    copied._nnsight = copied._bridge = copied._edit_hooks = None
    copied._edits, copied._hook_ids = {}, set()
    return copied


def merged_model(
    handle: ModelHandle, scales: Tensor, *, into: str = "o_proj", allow_negative: bool = True
) -> ModelHandle:
    """A copy of ``handle`` with ``scales`` folded into its weights (``handle`` is untouched)."""
    check_mergeable(handle, scales, into, allow_negative=allow_negative)
    merged = copy_handle(handle)
    merge_into(merged, scales, into=into)
    return merged


def save_merged(
    handle: ModelHandle,
    scales: Tensor,
    out_dir: str | Path,
    *,
    into: str = "o_proj",
    allow_negative: bool = True,
) -> Path:
    """Save the merged model and its tokenizer as a standard HF checkpoint in ``out_dir``."""
    merged = merged_model(handle, scales, into=into, allow_negative=allow_negative)
    return save_checkpoint(merged.model, handle.tokenizer, out_dir)


def save_checkpoint(model: nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """``save_pretrained`` for model and tokenizer, refusing non-finite weights.

    The files are written to a temporary directory and moved into ``out_dir`` when all are
    complete, so an interrupted save leaves no half-written weight file.
    """
    for name, param in model.state_dict().items():
        if param.is_floating_point() and not torch.isfinite(param).all():
            raise ValueError(f"weight {name} holds NaN or inf values; refusing to save")
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out_dir
