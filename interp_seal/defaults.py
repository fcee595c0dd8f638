"""The default sizes every entry point shares: library functions, CLI flags and the gallery.

Each is defined here once and referred to everywhere else (``tests/unit/test_defaults.py``
finds a literal copy): change it here and every default changes with it.
"""

RECORDS_PER_LENGTH = 50
"""Evaluation records per context length (lines per record, or tokens), the default ``n`` of
accuracy-vs-length tables, sweeps' record sets and method comparisons."""

TUNING_SAMPLES = 50
"""Training samples of a tuning run: SEAL tunes its scales on ~50 samples in the task's format
(SEAL Sec. 4.1); the baselines and MuDAF get the same set."""
