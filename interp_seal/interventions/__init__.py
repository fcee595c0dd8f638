"""The head-output edit primitive and how each backend applies it.

Apply an edit with ``with handle.edit(iv):`` (``ModelHandle.edit``: nestable, every engine path
sees it once) or pass ``intervention=iv`` to any analysis; ``intervene`` / ``logits`` run the
same edit on the nnsight and TransformerLens backends for cross-checks.
"""

from interp_seal.interventions.backends import intervene, logits
from interp_seal.interventions.head_edit import (
    ABLATION_MODES,
    Head,
    HeadEdit,
    HeadIntervention,
    ablate,
    scale_table,
    uniform_attention,
)
from interp_seal.interventions.hf import capture_head_outputs, hf_logits
from interp_seal.interventions.nnsight_backend import nnsight_edit, nnsight_logits
from interp_seal.interventions.tl_backend import tl_hooks, tl_logits
from interp_seal.models.edits import ComposedEdit

__all__ = [
    "ABLATION_MODES",
    "ComposedEdit",
    "Head",
    "HeadEdit",
    "HeadIntervention",
    "ablate",
    "capture_head_outputs",
    "hf_logits",
    "intervene",
    "logits",
    "nnsight_edit",
    "nnsight_logits",
    "scale_table",
    "tl_hooks",
    "tl_logits",
    "uniform_attention",
]
