"""Pure functions from analysis results to plotly figures."""

from interp_seal.viz.paper_figures import (
    dla_comparison,
    lr_samples,
    method_curves,
    niah_panels,
    passage_grid,
)
from interp_seal.viz.tuning import loss_curves, method_accuracy, scale_heatmap, target_head_scores

__all__ = [
    "dla_comparison",
    "loss_curves",
    "lr_samples",
    "method_accuracy",
    "method_curves",
    "niah_panels",
    "passage_grid",
    "scale_heatmap",
    "target_head_scores",
]
