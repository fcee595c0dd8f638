"""Pure functions from analysis results to plotly figures (``analysis`` returns data, ``viz``
draws it, ``widgets`` composes figures into interactive views).

- ``evaluation.py``: accuracy vs context length, needle-in-a-haystack heatmaps (SEAL Fig. 5);
- ``sweeps.py``: head-pruning heatmaps, channel maps, head quadrants, scale-table curves
  (SEAL Fig. 2b-d);
- ``attribution.py``: direct logit attribution (SEAL Fig. 4), patching results;
- ``passages.py``: passage-level attention and retrieval-score heatmaps, masking (MuDAF Fig.
  3, 4, 10);
- ``tuning.py``: loss curves, scale heatmaps, accuracy by method, target-head scores;
- ``dashboard.py``: the dashboard's edit grid, accuracy curves, one head's channel map and the
  quadrant map;
- ``paper_figures.py``: the multi-panel figures of the regenerated gallery;
- ``tokens.py``: token-level views: a prompt's tokens coloured by one head's attention or by a
  signed per-token effect (DLA by source token, patching by position), windowed when long.
"""

from interp_seal.viz.attribution import attribution_scatter, dla_figure, patching_figure
from interp_seal.viz.dashboard import accuracy_curves, edit_grid, quadrant_map
from interp_seal.viz.evaluation import accuracy_figure, niah_heatmap
from interp_seal.viz.paper_figures import (
    digit_effects,
    lr_samples,
    method_curves,
    niah_panels,
    passage_grid,
)
from interp_seal.viz.passages import (
    head_score_heatmap,
    masking_bars,
    passage_heatmap,
    ranked_score_curve,
)
from interp_seal.viz.sweeps import (
    channel_map,
    head_delta_heatmap,
    quadrant_scatter,
    scale_table_curves,
)
from interp_seal.viz.tokens import (
    attention_html,
    attention_view,
    effect_html,
    pair_labels,
    position_effects,
    token_labels,
    token_windows,
)
from interp_seal.viz.tuning import loss_curves, method_accuracy, scale_heatmap, target_head_scores

__all__ = [
    "accuracy_curves",
    "accuracy_figure",
    "attention_html",
    "attention_view",
    "attribution_scatter",
    "channel_map",
    "digit_effects",
    "dla_figure",
    "edit_grid",
    "effect_html",
    "head_delta_heatmap",
    "head_score_heatmap",
    "loss_curves",
    "lr_samples",
    "masking_bars",
    "method_accuracy",
    "method_curves",
    "niah_heatmap",
    "niah_panels",
    "pair_labels",
    "passage_grid",
    "passage_heatmap",
    "patching_figure",
    "position_effects",
    "quadrant_map",
    "quadrant_scatter",
    "ranked_score_curve",
    "scale_heatmap",
    "scale_table_curves",
    "target_head_scores",
    "token_labels",
    "token_windows",
]
