"""Analyses: ablation sweeps, head quadrants, logit attribution, patching, retrieval scores.

- ``sweeps.py``: per-head, per-channel and scale-table ablation sweeps over several lengths
  (SEAL Sec. 3.1, Fig. 2b-d), resumable; ``screening.py``: screened sweeps for models with many
  heads (attribution estimates, exact confirmation of the top heads);
- ``quadrants.py``: head quadrants from pruning deltas at two lengths (SEAL Fig. 2b);
- ``logit_attribution.py``: direct logit attribution of heads and MLPs (SEAL Fig. 4);
- ``patching.py`` / ``attribution_patching.py``: activation patching and its gradient estimate;
- ``activation_cache.py``: ``run_with_cache``, logits and a named activation cache of one
  forward (TransformerLens's names; positions selectable for long contexts);
- ``attention_rows.py``: attention rows of a few query positions, never ``T x T``;
- ``retrieval_scores.py``: MuDAF passage retrieval scores, Retrieval-Head copy-paste scores
  (``peer_conventions.py``: the peers' own code conventions as options);
- ``qrhead.py``: QRHead's query-focused retrieval scores (null-query calibrated) and
  QRRetriever's passage ranking by the selected heads, with recall@k;
- ``masking.py``: masking top retrieval heads vs random heads (MuDAF Fig. 4);
- ``live_eval.py``: accuracy under an edit from a cached clean run (the dashboard);
- ``token_views.py``: one head's direct effect split by source token, and the spans a long
  prompt is windowed around (token-level views);
- ``statistics.py``: intervals for error bars and paired tests for claims.
"""

from interp_seal.analysis.activation_cache import ActivationCache, run_with_cache
from interp_seal.analysis.attention_rows import attention_row_hooks, capture_attention_rows
from interp_seal.analysis.attribution_patching import (
    ablate_heads,
    attribution_ablate_heads,
    attribution_patch_heads,
    compare_with_exact,
)
from interp_seal.analysis.logit_attribution import (
    LogitAttribution,
    logit_attribution,
    logit_diff_attribution,
    token_label,
)
from interp_seal.analysis.masking import MaskingConfig, masking_experiment
from interp_seal.analysis.patching import (
    Patch,
    PatchingPair,
    line_retrieval_pair,
    patch,
    patch_heads,
    patch_residual,
)
from interp_seal.analysis.qrhead import (
    QRConfig,
    qr_scores,
    rank_passages,
    recall_at_k,
    top_heads,
)
from interp_seal.analysis.quadrants import HeadQuadrants, head_quadrants, quadrant_scale_table
from interp_seal.analysis.retrieval_scores import (
    CopyPasteConfig,
    PassageScoreConfig,
    needle_retrieval_scores,
    passage_retrieval_scores,
    rank_heads,
)
from interp_seal.analysis.screening import ScreenedSweep, screened_head_sweep
from interp_seal.analysis.sweeps import (
    SweepOptions,
    SweepUnit,
    all_heads,
    channel_sweep,
    head_sweep,
    mean_head_outputs,
    run_sweep,
    scale_table_sweep,
)
from interp_seal.analysis.token_views import line_retrieval_focus, source_token_attribution

__all__ = [
    "ActivationCache",
    "CopyPasteConfig",
    "HeadQuadrants",
    "LogitAttribution",
    "MaskingConfig",
    "PassageScoreConfig",
    "Patch",
    "PatchingPair",
    "QRConfig",
    "ScreenedSweep",
    "SweepOptions",
    "SweepUnit",
    "ablate_heads",
    "all_heads",
    "attention_row_hooks",
    "attribution_ablate_heads",
    "attribution_patch_heads",
    "capture_attention_rows",
    "channel_sweep",
    "compare_with_exact",
    "head_quadrants",
    "head_sweep",
    "line_retrieval_focus",
    "line_retrieval_pair",
    "logit_attribution",
    "logit_diff_attribution",
    "masking_experiment",
    "mean_head_outputs",
    "needle_retrieval_scores",
    "passage_retrieval_scores",
    "patch",
    "patch_heads",
    "patch_residual",
    "qr_scores",
    "quadrant_scale_table",
    "rank_heads",
    "rank_passages",
    "recall_at_k",
    "run_with_cache",
    "run_sweep",
    "scale_table_sweep",
    "screened_head_sweep",
    "source_token_attribution",
    "token_label",
    "top_heads",
]
