"""Tuners: SEAL-H / SEAL-C scales, PEFT baselines, MuDAF, weight merging."""
