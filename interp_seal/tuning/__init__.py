"""Tuners: SEAL-H / SEAL-C scales, PEFT baselines, MuDAF, weight merging.

- ``seal.py``: ``SealTuner``, learnable head (SEAL-H) or channel (SEAL-C) scales on a frozen
  model, applied through ``HeadIntervention``; ``scales.py``: their safetensors file format.
- ``merge.py``: fold scales into ``o_proj`` (always exact) or ``v_proj`` and save a plain HF
  checkpoint.
- ``peft_baselines.py``: SEAL-L / SEAL-D (LoRA / DoRA via peft); ``counts.py``: Table 1's
  parameter counts.
- ``mudaf.py``: MuDAF's contrastive attention focusing (and Vanilla SFT), head selection.
- ``tune.py``: ``tune(handle, method, samples) -> TuneResult``, the one entry point for every
  method (``methods.py``: their names and default learning rates).
- ``data.py``: format samples, batches and the answer loss; ``loop.py``: the one training loop
  (accelerate, resumable, multi-process); ``evaluate.py``: before/after tables.
"""

from interp_seal.tuning.counts import ParameterCount, parameter_count
from interp_seal.tuning.data import encode_examples, format_samples
from interp_seal.tuning.evaluate import accuracy_by_method, retrieval_by_method
from interp_seal.tuning.loop import TrainConfig, TrainResult, train
from interp_seal.tuning.merge import merge_into, merged_model, save_merged
from interp_seal.tuning.mudaf import (
    MudafConfig,
    MudafTuner,
    sample_heads,
    score_matrix,
    top_k_heads,
)
from interp_seal.tuning.peft_baselines import PeftBaselineConfig, PeftTuner
from interp_seal.tuning.scales import ScaleFile, load_scales, save_scales
from interp_seal.tuning.seal import SealTuner
from interp_seal.tuning.tune import TuneResult, tune

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
