"""Pure functions from analysis results to plotly figures."""

from interp_seal.viz.tuning import loss_curves, method_accuracy, scale_heatmap, target_head_scores

__all__ = ["loss_curves", "method_accuracy", "scale_heatmap", "target_head_scores"]
