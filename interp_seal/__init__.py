"""interp-seal: find and fix the attention heads behind long-context retrieval.

Implements SEAL (Scaling to Emphasize Attention for Long-context retrieval, arXiv 2501.15225)
and MuDAF (multi-document attention focusing) around a general analysis core. The nouns a
notebook needs are importable from here (``from interp_seal import load_model, head_sweep``);
each subpackage exports its own in full:

- ``interp_seal.models``: ``load_model``, ``ModelHandle``, ``ModelSpec``;
- ``interp_seal.interventions``: the one primitive, ``HeadIntervention`` / ``ablate``;
- ``interp_seal.engine``: the forward engine every analysis runs on;
- ``interp_seal.tasks``: LongEval lines, needle in a haystack, multi-document QA;
- ``interp_seal.evaluation``: teacher-forced exact match, accuracy vs length, QA F1;
- ``interp_seal.analysis``: sweeps, quadrants, logit attribution, patching, retrieval scores;
- ``interp_seal.tuning``: SEAL-H / SEAL-C, LoRA / DoRA, MuDAF, merging;
- ``interp_seal.viz`` / ``interp_seal.widgets``: plotly figures and Jupyter widgets.

Names are resolved on first use, so ``import interp_seal`` stays cheap.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "models": ["ModelHandle", "ModelSpec", "load_model"],
    "interventions": ["HeadIntervention", "ablate", "scale_table"],
    "tasks": ["LineRetrievalConfig", "NeedleConfig", "PassagesConfig", "Sample"],
    "evaluation": ["evaluate_line_retrieval", "evaluate_niah", "teacher_force"],
    "analysis": [
        "channel_sweep",
        "head_quadrants",
        "head_sweep",
        "line_retrieval_pair",
        "logit_attribution",
        "masking_experiment",
        "mean_head_outputs",
        "passage_retrieval_scores",
        "patch_heads",
        "run_with_cache",
        "scale_table_sweep",
    ],
    "tuning": ["SealTuner", "load_scales", "save_merged", "save_scales", "train"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'interp_seal' has no attribute {name!r}")
    return getattr(import_module(f"interp_seal.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
