"""The one primitive: an edit of each head's output channels (the input of ``o_proj``).

SEAL's pruning, SEAL's scaling, SEAL-H, SEAL-C, the dashboard and weight merging are all a
scale ``s[l, h, c]`` on head ``h``'s output ``z[l, h, c]`` in layer ``l`` (SEAL, Sec. 3-4):
pruning a head is ``s[l, h, :] = 0``, pruning a channel ``s[l, h, c] = 0``, SEAL-H learns
``s`` of shape ``(L, H, 1)``, SEAL-C of shape ``(L, H, D)``. Papers mean different things by
"masking a head", so the ablation modes are named:

- ``"zero"``: ``z -> 0`` (SEAL's pruning);
- ``"scale"``: ``z -> s * z``;
- ``"mean"``: ``z -> mean z`` over a reference set (mean ablation);
- ``"uniform"``: the head attends uniformly to positions ``0..t`` (what the Retrieval Head and
  MuDAF code do by zeroing pre-softmax scores). No attention matrix is needed: the output at
  ``t`` is the running mean of the head's value vectors, ``cumsum(v)[t] / (t + 1)`` (in a
  layer with a sliding window, over the window's positions only: ``uniform_attention``).

All of them are one affine edit per head, ``z' = scale * (uniform ? z_uniform : z) + offset``,
held by ``HeadIntervention``. ``scale`` may carry a leading batch axis ``(B, L, H, D)`` so
that each row of a batch runs its own scale table (batched ablation sweeps).

Batches must be right-padded (causal attention keeps real tokens blind to the padding); the
running mean for ``"uniform"`` relies on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp_seal.models.spec import ModelSpec

ABLATION_MODES = ("zero", "scale", "mean", "uniform")
REAL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""What a scale table may hold: complex factors would lose their imaginary part (``1j`` would
prune every head), float8 and integers are not the trained values."""
Head = tuple[int, int]  # (layer, head): the one name for a head across the library


@runtime_checkable
class HeadEdit(Protocol):
    """What every backend and the forward engine need of an edit of head outputs.

    ``HeadIntervention`` is one; ``interp_seal.engine.EditStack`` (one intervention per block
    of batch rows) is another.
    """

    def check_model(self, spec: ModelSpec, model_name: str) -> None:
        """Raise if the edit was made for another geometry."""

    def active_layers(self) -> list[int]:
        """The layers whose head outputs the edit changes."""

    def uses_values(self, layer: int) -> bool:
        """Whether ``edit`` at ``layer`` needs the layer's value vectors (uniform attention)."""

    def edit(
        self,
        layer: int,
        z: Float[Tensor, "row pos head d_head"],
        v: Float[Tensor, "row pos kv_head d_head"] | None = None,
        *,
        window: int | None = None,
    ) -> Float[Tensor, "row pos head d_head"]:
        """The edited head outputs of ``layer`` (``window``: its attention window, if any)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class HeadIntervention:
    """``z' = scale * (uniform ? z_uniform : z) + offset`` for every head of every layer.

    Attributes:
        spec: geometry of the model this intervention is for.
        scale: ``(L, H, D)``, or ``(B, L, H, D)`` for one table per batch row.
        offset: ``(L, H, D)`` added after scaling (mean ablation), or None.
        uniform: ``(L, H)`` bool, heads whose attention is replaced by uniform attention, or None.
        mode: the ablation mode that built it (informational).
    """

    spec: ModelSpec
    scale: Float[Tensor, "*batch layer head d_head"]
    offset: Float[Tensor, "layer head d_head"] | None = None
    uniform: Bool[Tensor, "layer head"] | None = None
    mode: str = "scale"

    def __post_init__(self):
        L, H, D = self.spec.shape
        if self.scale.dim() not in (3, 4) or tuple(self.scale.shape[-3:]) != (L, H, D):
            raise ValueError(
                f"scale has shape {tuple(self.scale.shape)}; this model needs (L, H, D) = "
                f"{(L, H, D)} or (batch, L, H, D). Scales made for another model cannot be applied."
            )
        check_real(self.scale, "scale")
        if self.offset is not None and tuple(self.offset.shape) != (L, H, D):
            raise ValueError(f"offset has shape {tuple(self.offset.shape)}, expected {(L, H, D)}")
        if self.offset is not None:
            check_real(self.offset, "offset")
        if self.uniform is not None and tuple(self.uniform.shape) != (L, H):
            raise ValueError(f"uniform has shape {tuple(self.uniform.shape)}, expected {(L, H)}")
        if self.mode not in ABLATION_MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {ABLATION_MODES}")

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def identity(cls, spec: ModelSpec) -> HeadIntervention:
        return cls(spec=spec, scale=torch.ones(spec.shape))

    @classmethod
    def from_scales(cls, spec: ModelSpec, scales: Tensor) -> HeadIntervention:
        """From a scale tensor of shape ``(L, H, D)``, ``(L, H, 1)`` (per head) or batched."""
        scales = check_real(torch.as_tensor(scales), "scales").float()
        if scales.shape[-1] == 1 and spec.d_head != 1:
            scales = scales.expand(*scales.shape[:-1], spec.d_head)
        return cls(spec=spec, scale=scales.clone())

    @property
    def batched(self) -> bool:
        return self.scale.dim() == 4

    def __repr__(self) -> str:
        """One line: the mode, the edited layers and how many heads / channels it changes."""
        scale = self.scale.detach()
        changed = (scale != 1).reshape(-1, *scale.shape[-3:]).any(0)  # (L, H, D)
        if self.offset is not None:
            changed |= self.offset != 0
        heads = changed.any(-1)
        if self.uniform is not None:
            heads |= self.uniform
        batch = f"{scale.shape[0]} tables, " if self.batched else ""
        return (
            f"HeadIntervention({self.mode}, {batch}layers {self.active_layers()}, "
            f"{int(heads.sum())} heads, {int(changed.sum())} channels changed)"
        )

    def active_layers(self) -> list[int]:
        """Layers where this intervention changes anything (every layer while ``scale`` requires
        grad: a learnable scale still at 1 needs its hook for the gradient to reach it)."""
        if self.scale.requires_grad:
            return list(range(self.spec.n_layers))
        scale = self.scale if self.batched else self.scale[None]
        touched = (scale != 1).flatten(2).any(-1).any(0)
        if self.offset is not None:
            touched |= (self.offset != 0).flatten(1).any(-1)
        if self.uniform is not None:
            touched |= self.uniform.any(-1)
        return [int(i) for i in torch.nonzero(touched).flatten()]

    def check_model(self, spec: ModelSpec, model_name: str) -> None:
        """Raise unless this intervention was built for a model of geometry ``spec``."""
        if spec != self.spec:
            raise ValueError(
                f"intervention built for geometry {self.spec.as_dict()} cannot be applied to "
                f"{model_name} with geometry {spec.as_dict()}; build it from this model's "
                "handle.spec."
            )

    def uses_values(self, layer: int) -> bool:
        """Whether ``layer`` needs the value vectors (uniform attention)."""
        return self.uniform is not None and bool(self.uniform[layer].any())

    # -- application -----------------------------------------------------------------------
    def edit(
        self,
        layer: int,
        z: Float[Tensor, "batch pos head d_head"],
        v: Float[Tensor, "batch pos kv_head d_head"] | None = None,
        *,
        window: int | None = None,
    ) -> Float[Tensor, "batch pos head d_head"]:
        """The edited head outputs of ``layer``; ``window``: the layer's attention window
        (``handle.sliding_window(layer)``), which uniform attention keeps to."""
        if self.batched and self.scale.shape[0] != z.shape[0]:
            raise ValueError(
                f"this intervention holds {self.scale.shape[0]} scale tables (one per batch row) "
                f"but the batch has {z.shape[0]} rows; pass a batch of matching size."
            )
        if self.uses_values(layer):
            if v is None:
                raise ValueError(f"layer {layer} uses uniform attention but no values were given")
            z = torch.where(
                self.uniform[layer][:, None].to(z.device),
                uniform_attention(v, self.spec, window),
                z,
            )
        scale = self.scale[..., layer, :, :].to(z)  # (H, D) or (B, H, D)
        z = z * (scale[:, None] if self.batched else scale)
        if self.offset is not None:
            z = z + self.offset[layer].to(z)
        return z


def check_real(values: Tensor, name: str) -> Tensor:
    """``values`` if it holds real, finite floats (``REAL_DTYPES``); else ``ValueError``."""
    if values.dtype not in REAL_DTYPES:
        raise ValueError(
            f"{name} are {str(values.dtype).removeprefix('torch.')}, but a scale table holds real "
            "floats (float32): convert it with .float() if that is what you meant (complex "
            "factors would lose their imaginary part; float8 and integers are not trained values)"
        )
    if not torch.isfinite(values).all():
        bad = int((~torch.isfinite(values)).sum())
        raise ValueError(f"{name} contain {bad} NaN or inf values; refusing to use them")
    return values


def uniform_attention(
    v: Float[Tensor, "batch pos kv_head d_head"], spec: ModelSpec, window: int | None = None
) -> Float[Tensor, "batch pos head d_head"]:
    """Each query head's output under uniform causal attention over the positions it sees: the
    running mean of its values over ``0..t``, or, in a layer that attends within a sliding
    ``window`` (Mistral; Qwen2 / Qwen3 / Phi-3 configs with one), over ``t - window + 1..t``
    as the model's own mask (``j > t - window``)."""
    T = v.shape[1]
    total = v.cumsum(dim=1)
    count = torch.arange(1, T + 1, device=v.device, dtype=v.dtype)
    if window is not None and window < T:
        earlier = torch.nn.functional.pad(total, (0, 0, 0, 0, window, 0))[:, :T]
        total, count = total - earlier, count.clamp(max=window)
    mean = total / count[None, :, None, None]
    return mean.repeat_interleave(spec.group_size, dim=2)


def _head_mask(spec: ModelSpec, heads: Iterable) -> Tensor:
    """``(L, H, D)`` bool mask of the ``(layer, head)`` or ``(layer, head, channel)`` entries."""
    mask = torch.zeros(spec.shape, dtype=torch.bool)
    for entry in heads:
        if len(entry) not in (2, 3):
            raise ValueError(f"expected (layer, head) or (layer, head, channel), got {entry!r}")
        layer, head = int(entry[0]), int(entry[1])
        if not (0 <= layer < spec.n_layers and 0 <= head < spec.n_heads):
            raise ValueError(
                f"head {entry!r} does not exist: the model has {spec.n_layers} layers x "
                f"{spec.n_heads} heads"
            )
        if len(entry) == 3:
            channel = int(entry[2])
            if not 0 <= channel < spec.d_head:
                raise ValueError(f"channel {channel} out of range (d_head = {spec.d_head})")
            mask[layer, head, channel] = True
        else:
            mask[layer, head] = True
    return mask


def ablate(
    spec: ModelSpec,
    heads: Iterable,
    mode: str = "zero",
    *,
    factor: float | None = None,
    mean_z: Tensor | None = None,
) -> HeadIntervention:
    """Ablate ``heads`` (``(layer, head)`` or ``(layer, head, channel)`` entries) in ``mode``.

    ``factor`` is the multiplier for ``"scale"``; ``mean_z`` the ``(L, H, D)`` reference mean
    for ``"mean"`` (``interp_seal.analysis.mean_head_outputs``). ``"uniform"`` acts
    on whole heads.
    """
    mask = _head_mask(spec, heads)
    scale = torch.ones(spec.shape)
    if mode == "zero":
        return HeadIntervention(spec=spec, scale=scale.masked_fill(mask, 0.0), mode=mode)
    if mode == "scale":
        if factor is None:
            raise ValueError("mode 'scale' needs a factor")
        return HeadIntervention(spec=spec, scale=scale.masked_fill(mask, factor), mode=mode)
    if mode == "mean":
        if mean_z is None:
            raise ValueError("mode 'mean' needs mean_z, the (L, H, D) mean head output")
        mean_z = torch.as_tensor(mean_z, dtype=torch.float32)
        return HeadIntervention(
            spec=spec, scale=scale.masked_fill(mask, 0.0), offset=mean_z * mask, mode=mode
        )
    if mode == "uniform":
        return HeadIntervention(spec=spec, scale=scale, uniform=mask.any(-1), mode=mode)
    raise ValueError(f"unknown ablation mode {mode!r}; choose one of {ABLATION_MODES}")


def scale_table(spec: ModelSpec, table: Mapping[Head, float]) -> HeadIntervention:
    """A multi-head scale table, e.g. every Q1 head x 0.9 and every Q3 head x 1.1 (SEAL Fig. 2d)."""
    scale = torch.ones(spec.shape)
    for head, factor in table.items():
        scale[_head_mask(spec, [head])] = float(factor)
    return HeadIntervention(spec=spec, scale=scale, mode="scale")
