"""Running the model's own decoder layers from a given layer, as the model runs them.

An edited forward (an ablation sweep, a patched run, a dashboard edit) changes nothing below
the edited layer, so it can start there. ``LayerInputs`` records, during one real forward,
what enters each decoder layer: the hidden state and the keyword arguments the model passes
(rotary ``position_embeddings``, ``position_ids``, the causal mask, the cache). Later runs call
the same layers with those arguments, so the layers above the edit compute exactly what the
model computes; ``stop_at`` cuts the recorded forward at a layer's input.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from contextlib import ExitStack

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.models import ModelHandle
from interp_seal.models.handle import refuse_uniform_edits
from interp_seal.models.kv_cache import CACHE_ARG


class _StopForward(Exception):
    """Raised by ``LayerInputs``'s hook on its ``stop_at`` layer: the forward ends there."""


class LayerInputs:
    """Keeps what enters decoder layers during a forward, for runs that start there.

    A context manager: inside it, each decoder layer in ``layers`` records the hidden state it
    receives (``resid[layer]``) and the keyword arguments the model passes it
    (``kwargs[layer]``), so that later runs can call the model's own layers exactly as the
    model does. The recorded run's key/value cache is not kept (later runs bring their own,
    ``run_layers``): a patching call would otherwise hold the corrupted run's cache to its end,
    15.5 GiB for LongChat-7B at 31K tokens. With ``stop_at``, the forward is cut at that
    layer's input and the block exits normally.
    """

    def __init__(self, handle: ModelHandle, layers: Sequence[int], *, stop_at: int | None = None):
        self.handle, self.layers, self.stop_at = handle, list(layers), stop_at
        self.resid: dict[int, Tensor] = {}
        self.kwargs: dict[int, dict] = {}
        self._hooks = ExitStack()

    def __enter__(self) -> LayerInputs:
        for layer in self.layers:
            module = self.handle.layers()[layer]
            names = list(inspect.signature(module.forward).parameters)
            hook = module.register_forward_pre_hook(self._hook(layer, names), with_kwargs=True)
            self._hooks.enter_context(hook)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._hooks.close()
        return exc_type is _StopForward

    def _hook(self, layer: int, names: list[str]):
        def hook(_mod, args, kwargs):
            self.resid[layer] = args[0] if args else kwargs["hidden_states"]
            # arguments passed by position, by their names (GPT-2's model hands its blocks the
            # cache and the causal mask positionally)
            named = dict(zip(names[1:], args[1:], strict=False)) | kwargs
            self.kwargs[layer] = {
                k: _shared_mask(x) if k == "attention_mask" else x
                for k, x in named.items()
                if k not in ("hidden_states", CACHE_ARG, self.handle.family.layer_cache)
            }
            if layer == self.stop_at:
                raise _StopForward

        return hook

    def check_shared(self) -> None:
        """Runs of more rows reuse one run's layer kwargs: they must not be per-row."""
        for layer, kwargs in self.kwargs.items():
            for name, value in kwargs.items():
                for t in value if isinstance(value, tuple) else (value,):
                    if isinstance(t, Tensor) and t.dim() > 0 and t.shape[0] != 1:
                        raise ValueError(
                            f"decoder layer {layer} got a per-row {name!r} of shape "
                            f"{tuple(t.shape)}; runs that start at a layer need batch-shared "
                            "positions and masks (right-padded samples, no padding mask)"
                        )


def _shared_mask(mask):
    """A 4-D attention mask whose rows are all the same as one row: eager attention
    materialises the batch-shared causal mask once per row, sdpa (and Gemma 2's capped
    attention) pass None instead."""
    if isinstance(mask, Tensor) and mask.dim() == 4 and mask.shape[0] > 1:
        if mask.stride(0) == 0 or bool((mask == mask[:1]).all()):
            return mask[:1]
    return mask


def layer_output(out) -> Tensor:
    """The hidden state a decoder layer returns (some versions return a tuple)."""
    return out[0] if isinstance(out, tuple) else out


def run_layers(
    handle: ModelHandle,
    hidden: Float[Tensor, "row pos d_model"],
    layers: range,
    kwargs: dict[int, dict],
    cache=None,
) -> Float[Tensor, "row pos d_model"]:
    """The model's own decoder ``layers`` on ``hidden``, with the recorded ``kwargs``, continuing
    the key/value ``cache`` if one is given (never the recorded run's own cache)."""
    for layer in layers:
        args = kwargs[layer] | handle.layer_cache_arg(cache)
        hidden = layer_output(handle.layers()[layer](hidden, **args))
    return hidden


def attn_output(
    handle: ModelHandle,
    layer: int,
    z: Float[Tensor, "row zpos head d_head"],
    v: Float[Tensor, "row vpos kv_head d_head"] | None = None,
    *,
    query: Int[Tensor, "row zpos"] | None = None,
) -> Float[Tensor, "row zpos d_model"]:
    """``o_proj(edit(z))``: the attention output of ``layer`` from head outputs ``z`` as the heads
    computed them, with the handle's active edits (``handle.edit``) applied once.

    Runs restarted mid-model call this instead of ``o_proj`` so that the edit hooks do not apply
    an edit a second time; ``v`` (the layer's values, every position) is needed where an edit
    uses uniform attention at ``layer``. With ``query``, ``z`` holds those positions only (the
    last layer's answer rows); the edit still sees them in place in the whole sequence.
    """
    handle.check_own_hooks(layer)
    edit = handle.active_edit()
    if edit is not None and layer in edit.active_layers():
        if edit.uses_values(layer) and v is None:
            raise ValueError(
                f"an active edit uses uniform attention at layer {layer}, which needs the "
                "layer's value vectors; this run restarts there without them"
            )
        refuse_uniform_edits(handle, layer, edit)
        window = handle.sliding_window(layer)
        if query is None:
            z = edit.edit(layer, z, v, window=window)
        else:  # edit at full length (uniform attention needs every v), keep the query rows
            rows = torch.arange(z.shape[0], device=query.device)[:, None]
            full = z.new_zeros(
                z.shape[0], v.shape[1] if v is not None else int(query.max()) + 1, *z.shape[2:]
            )
            full[rows, query] = z
            z = edit.edit(layer, full, v, window=window)[rows, query]
    return handle.proj(layer, "o_proj").forward(z.flatten(-2))  # forward(): no edit hooks


def attn_half(
    handle: ModelHandle,
    layer: int,
    resid: Float[Tensor, "#row zpos d_model"],  # one row: shared by every row of z
    z: Float[Tensor, "row zpos head d_head"],
    v: Float[Tensor, "row vpos kv_head d_head"] | None = None,
    *,
    query: Int[Tensor, "row zpos"] | None = None,
) -> Float[Tensor, "row zpos d_model"]:
    """``resid + post_attn_norm(o_proj(edit(z)))``: the residual stream after ``layer``'s
    attention, from the stream entering it and its heads' outputs (``attn_output``; the norm
    only where the family puts one on the attention output, as OLMo 2 does)."""
    return resid + handle.apply_norm(
        layer, "post_attn", attn_output(handle, layer, z, v, query=query)
    )


def mlp_half(
    handle: ModelHandle, layer: int, resid: Tensor, entering: Tensor | None = None
) -> Tensor:
    """``resid + post_mlp_norm(mlp(pre_mlp_norm(resid)))``: the second half of a decoder layer
    (each norm only where the family has it). In a parallel-residual family (GPT-NeoX,
    ``ModelHandle.parallel_residual``) the MLP reads ``entering``, the stream that entered the
    layer (``x + attn(ln1(x)) + mlp(ln2(x))``), which such a family must be given."""
    source = resid
    if handle.parallel_residual():
        if entering is None:
            raise ValueError(
                f"{handle.family.name} computes attention and MLP in parallel: mlp_half needs "
                "the stream entering the layer (entering=...)"
            )
        source = entering
    out = handle.mlp(layer)(handle.apply_norm(layer, "pre_mlp", source))
    return resid + handle.apply_norm(layer, "post_mlp", out)
