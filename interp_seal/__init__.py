"""interp-seal: find and fix the attention heads behind long-context retrieval.

Implements SEAL (Scaling to Emphasize Attention for Long-context retrieval, arXiv 2501.15225)
and MuDAF (multi-document attention focusing) around a general analysis core. Start with
``interp_seal.models.load_model`` and ``interp_seal.interventions``.
"""

__version__ = "0.1.0"
