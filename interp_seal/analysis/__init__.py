"""Analyses: ablation sweeps, head quadrants, logit attribution, patching, retrieval scores."""
