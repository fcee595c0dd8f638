"""Model loading, geometry and module maps (``load.py``, ``gguf.py``, ``spec.py``, ``handle.py``)."""

from interp_seal.models.gguf import GGUFError, convert_gguf, smollm2_path
from interp_seal.models.handle import BACKENDS, ModelHandle, soft_cap
from interp_seal.models.load import DEFAULT_MODEL, ModelNotFoundError, load_model
from interp_seal.models.rope_extension import ContextExtension, extend_context
from interp_seal.models.spec import (
    FAMILIES,
    Family,
    ModelSpec,
    UnsupportedModelError,
    register_family,
    unregister_family,
)
from interp_seal.models.streaming_heads import StreamingHeads, compress_kv, kv_budget_bytes

__all__ = [
    "BACKENDS",
    "ContextExtension",
    "DEFAULT_MODEL",
    "FAMILIES",
    "Family",
    "GGUFError",
    "ModelHandle",
    "ModelNotFoundError",
    "ModelSpec",
    "StreamingHeads",
    "UnsupportedModelError",
    "compress_kv",
    "convert_gguf",
    "extend_context",
    "kv_budget_bytes",
    "load_model",
    "register_family",
    "smollm2_path",
    "soft_cap",
    "unregister_family",
]
