"""Tuners: SEAL-H / SEAL-C scales, PEFT baselines, MuDAF, weight merging.

- ``seal.py``: ``SealTuner``, learnable head (SEAL-H) or channel (SEAL-C) scales on a frozen
  model, applied through ``HeadIntervention``; ``scales.py``: their safetensors file format.
- ``merge.py``: fold scales into ``o_proj`` (always exact) or ``v_proj`` and save a plain HF
  checkpoint.
- ``peft_baselines.py``: SEAL-L / SEAL-D (LoRA / DoRA via peft); ``counts.py``: Table 1's
  parameter counts.
- ``mudaf.py``: MuDAF's contrastive attention focusing (and Vanilla SFT), head selection.
- ``duo_gates.py``: DuoAttention's learned gates per KV head (full vs sink + window), which
  rank KV heads for compression (a retrieval-head definition, not a model improvement).
- ``job.py``: ``tune(handle, method, samples) -> TuneResult``, the one entry point for every
  method (``methods.py``: their names and default learning rates).
- ``data.py``: format samples, batches and the answer loss; ``loop.py``: the one training loop
  (accelerate, resumable, multi-process); ``evaluate.py``: before/after tables.
"""

# Names are resolved on first use (PEP 562), so that importing one light module of this
# package (``methods``: the command line's parser) does not load torch and transformers.
_EXPORTS = {
    "counts": ["ParameterCount", "parameter_count"],
    "data": ["encode_examples", "format_samples"],
    "evaluate": ["accuracy_by_method", "retrieval_by_method"],
    "loop": ["TrainConfig", "TrainResult", "train"],
    "merge": ["merge_into", "merged_model", "save_merged"],
    "mudaf": ["MudafConfig", "MudafTuner", "sample_heads", "score_matrix", "top_k_heads"],
    "peft_baselines": ["PeftBaselineConfig", "PeftTuner"],
    "scales": ["ScaleFile", "load_scales", "save_scales"],
    "seal": ["SealTuner"],
    "job": ["TuneResult", "tune"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


__all__ = [
    "TuneResult",
    "accuracy_by_method",
    "encode_examples",
    "retrieval_by_method",
    "sample_heads",
    "score_matrix",
    "top_k_heads",
    "tune",
    "MudafConfig",
    "MudafTuner",
    "ParameterCount",
    "PeftBaselineConfig",
    "PeftTuner",
    "ScaleFile",
    "SealTuner",
    "TrainConfig",
    "TrainResult",
    "format_samples",
    "load_scales",
    "merge_into",
    "merged_model",
    "parameter_count",
    "save_merged",
    "save_scales",
    "train",
]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'interp_seal.tuning' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"interp_seal.tuning.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
