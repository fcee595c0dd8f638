"""Tuners: SEAL-H / SEAL-C scales, PEFT baselines, MuDAF, weight merging.

- ``seal.py``: ``SealTuner``, learnable head (SEAL-H) or channel (SEAL-C) scales on a frozen
  model, applied through ``HeadIntervention``; ``scales.py``: their safetensors file format.
- ``merge.py``: fold scales into ``o_proj`` (always exact) or ``v_proj`` and save a plain HF
  checkpoint.
- ``peft_baselines.py``: SEAL-L / SEAL-D (LoRA / DoRA via peft); ``counts.py``: Table 1's
  parameter counts.
- ``mudaf.py``: MuDAF's contrastive attention focusing (and Vanilla SFT), head selection.
- ``data.py``: format samples, batches and the answer loss; ``loop.py``: the one training loop
  (accelerate, resumable, multi-process); ``evaluate.py``: before/after tables.
"""
