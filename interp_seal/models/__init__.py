"""Model loading, geometry and module maps (see ``load.py``, ``spec.py``, ``handle.py``)."""

from interp_seal.models.handle import BACKENDS, ModelHandle
from interp_seal.models.load import DEFAULT_MODEL, ModelNotFoundError, load_model
from interp_seal.models.spec import FAMILIES, ModelSpec, UnsupportedModelError

__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "FAMILIES",
    "ModelHandle",
    "ModelNotFoundError",
    "ModelSpec",
    "UnsupportedModelError",
    "load_model",
]
