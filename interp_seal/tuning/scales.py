"""SEAL's learnable scales and their file format.

SEAL-H learns one scalar per attention head, a tensor of shape ``(L, H, 1)``; SEAL-C one scalar
per head output channel, ``(L, H, D)`` (SEAL, Sec. 4.2). Both multiply the head outputs ``z``
(the input of ``o_proj``) through the one primitive, ``HeadIntervention``, and both start at 1,
so an untrained tuner is the identity. On LongChat-7B (32 layers x 32 heads x 128 channels)
that is 1,024 and 131,072 parameters (SEAL, Table 1).

A scale file is a safetensors file with one tensor, ``"scales"``, and string metadata: the model
it was tuned on, its geometry (JSON of ``ModelSpec``), the granularity, the task and the
hyperparameters (JSON). ``load_scales`` refuses files whose geometry differs from the model's,
files holding anything but real finite floats (NaN, inf, complex, float8, integers), special
files (``inputs.check_input_file``), truncated or corrupt files and files without this metadata
(its JSON read within ``inputs.parse_json``'s limits), each with a message saying what is wrong;
``save_scales`` writes the file whole or not at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from jaxtyping import Float
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from interp_seal.inputs import check_input_file, parse_json
from interp_seal.interventions.head_edit import check_real
from interp_seal.models.spec import ModelSpec
from interp_seal.outputs import atomic_path

GRANULARITIES = ("head", "channel")
FORMAT = "interp-seal/scales/v1"
# the geometry a scale table depends on (vocabulary and context window do not matter)
SCALE_GEOMETRY = ("n_layers", "n_heads", "n_kv_heads", "d_head", "d_model")


def scale_shape(spec: ModelSpec, granularity: str) -> tuple[int, int, int]:
    """``(L, H, 1)`` for ``"head"`` (SEAL-H), ``(L, H, D)`` for ``"channel"`` (SEAL-C)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; choose one of {GRANULARITIES}")
    L, H, D = spec.shape
    return (L, H, 1 if granularity == "head" else D)


def init_scales(spec: ModelSpec, granularity: str) -> Float[Tensor, "layer head chan"]:
    """All-ones scales (the identity) of the shape ``granularity`` needs."""
    return torch.ones(scale_shape(spec, granularity))


def check_scales(scales: Tensor, spec: ModelSpec) -> str:
    """The granularity of ``scales`` for a model of geometry ``spec``; raises if they don't fit
    or are not real finite floats (``check_real``)."""
    L, H, D = spec.shape
    shape = tuple(scales.shape)
    if shape == (L, H, 1):
        granularity = "head"
    elif shape == (L, H, D):
        granularity = "channel"
    else:
        raise ValueError(
            f"scales of shape {shape} do not fit this model: it needs (L, H, 1) = {(L, H, 1)} "
            f"for per-head scales or (L, H, D) = {(L, H, D)} for per-channel scales"
        )
    check_real(scales, "scales")
    return granularity


@dataclass(frozen=True, kw_only=True)
class ScaleFile:
    """What a scale file holds.

    Attributes:
        scales: ``(L, H, 1)`` or ``(L, H, D)``.
        spec: geometry of the model the scales were tuned on.
        model: name or path of that model.
        granularity: ``"head"`` or ``"channel"``.
        task: the task the scales were tuned for (e.g. ``"line_retrieval"``).
        hyperparameters: training settings (learning rate, epochs, samples, seed, ...).
    """

    scales: Float[Tensor, "layer head chan"]
    spec: ModelSpec
    model: str
    granularity: str
    task: str
    hyperparameters: dict = field(default_factory=dict)

    def __post_init__(self):
        granularity = check_scales(self.scales, self.spec)
        if granularity != self.granularity:
            raise ValueError(
                f"granularity {self.granularity!r} does not match scales of shape "
                f"{tuple(self.scales.shape)} (that is {granularity!r})"
            )


def save_scales(path: str | Path, scale_file: ScaleFile) -> Path:
    """Write ``scale_file`` as safetensors with its metadata; returns the path."""
    path = Path(path)
    metadata = {
        "format": FORMAT,
        "model": scale_file.model,
        "geometry": json.dumps(scale_file.spec.as_dict(), sort_keys=True),
        "granularity": scale_file.granularity,
        "task": scale_file.task,
        "hyperparameters": json.dumps(scale_file.hyperparameters, sort_keys=True),
    }
    scales = scale_file.scales.detach().to("cpu", torch.float32).contiguous()
    with atomic_path(path) as tmp:
        save_file({"scales": scales}, str(tmp), metadata=metadata)
    return path


REQUIRED_METADATA = ("model", "geometry", "granularity", "task", "hyperparameters")
REMEDY = "write it again with `interp-seal tune seal-h` / `seal-c` (or save_scales)"


def _read(path: Path) -> tuple[dict, Tensor]:
    """The metadata and the ``scales`` tensor of a scale file; ValueError if it is not one."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata, keys = f.metadata() or {}, set(f.keys())
            scales = f.get_tensor("scales") if "scales" in keys else None
    except SafetensorError as err:
        raise ValueError(
            f"{path} is not a readable safetensors file ({err}): it is truncated or corrupt. "
            f"Copy it again, or {REMEDY}."
        ) from None
    if metadata.get("format") != FORMAT or scales is None:
        raise ValueError(
            f"{path} is not an interp-seal scale file (expected a 'scales' tensor and metadata "
            f"format={FORMAT!r}; found tensors {sorted(keys)} and metadata keys "
            f"{sorted(metadata)}); {REMEDY}."
        )
    missing = [k for k in REQUIRED_METADATA if k not in metadata]
    if missing:
        raise ValueError(f"{path} lacks the metadata {missing} of a scale file; {REMEDY}.")
    return metadata, scales


def _json_field(path: Path, metadata: dict, key: str) -> dict:
    value = parse_json(metadata[key], f"{path}: metadata {key!r}", fix=REMEDY)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: metadata {key!r} must be a JSON object, got {value!r:.60}")
    return value


def load_scales(path: str | Path, spec: ModelSpec | None = None) -> ScaleFile:
    """Read a scale file; with ``spec``, refuse it unless it was tuned on that geometry
    (layers, heads, KV heads, d_head, d_model).

    A missing file raises FileNotFoundError; a truncated or corrupt file, one that is not a
    scale file, or one whose metadata is incomplete raises ValueError naming the file.
    """
    path = check_input_file(path, "scale file")
    metadata, scales = _read(path)
    try:
        saved = ModelSpec(**_json_field(path, metadata, "geometry"))
    except TypeError as err:
        raise ValueError(f"{path}: metadata 'geometry' is not a model geometry ({err})") from None
    diff = {k: (getattr(saved, k), getattr(spec, k)) for k in SCALE_GEOMETRY} if spec else {}
    diff = {k: ab for k, ab in diff.items() if ab[0] != ab[1]}
    if diff:
        raise ValueError(
            f"{path} holds scales tuned on {metadata['model']!r}, whose geometry differs from "
            f"this model's ({', '.join(f'{k}: file {a} vs model {b}' for k, (a, b) in diff.items())}); "
            "scales only transfer between models of identical geometry"
        )
    try:
        check_scales(scales, saved)
    except ValueError as err:  # the tensor: its shape, its dtype, its values
        raise ValueError(f"{path}: {err}") from None
    return ScaleFile(
        scales=scales,
        spec=saved,
        model=metadata["model"],
        granularity=metadata["granularity"],
        task=metadata["task"],
        hyperparameters=_json_field(path, metadata, "hyperparameters"),
    )
