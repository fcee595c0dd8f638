"""The default sizes and the names of choices every entry point shares: library functions,
CLI flags and the gallery.

Each is defined here once and referred to everywhere else (``tests/unit/test_defaults.py``
finds a literal copy of a size): change it here and every default changes with it. The module
imports nothing, so the command line can build its parser (``--help``) without loading torch.
"""

RECORDS_PER_LENGTH = 50
"""Evaluation records per context length (lines per record, or tokens), the default ``n`` of
accuracy-vs-length tables, sweeps' record sets and method comparisons."""

TUNING_SAMPLES = 50
"""Training samples of a tuning run: SEAL tunes its scales on ~50 samples in the task's format
(SEAL Sec. 4.1); the baselines and MuDAF get the same set."""

TASKS = ("line_retrieval", "needle", "passages")
"""The task formats (``interp_seal.tasks``): LongEval lines, needle in a haystack, passage QA."""

INDEX_STYLES = ("adjective-noun", "integers", "letters", "uuid")
"""LongEval's line-index styles (``tasks.line_retrieval``)."""

CHAT_TEMPLATES = ("none", "tokenizer", "vicuna")
"""How a prompt is wrapped (``tasks.chat``): raw, the tokenizer's template, LongChat's vicuna."""

NEEDLE_ANSWERS = ("sentence", "key_phrase")
"""What a needle's answer is (``tasks.needle``): the whole sentence or its key phrase."""

CORRUPTIONS = ("key", "value")
"""Line-retrieval corruptions for patching (``tasks.line_retrieval.corrupt``)."""

DLA_VARIANTS = ("frozen_norm", "seal")
"""Direct logit attribution variants (``analysis.logit_attribution``)."""

PLANNED_ANALYSES = (
    "teacher-forcing",
    "head-sweep",
    "channel-sweep",
    "screen",
    "passage-scores",
    "needle-scores",
    "patching",
    "dla",
)
"""The analyses ``interp-seal plan`` predicts memory for (``analysis.plan``)."""

DASHBOARD_KERNELS = 4
"""The most kernels ``interp-seal dashboard`` runs at once (``--max-kernels``): one per open tab,
each holding its own copy of the model."""
