"""Format-faithful task generators and readers; every task yields ``Sample`` objects.

- ``line_retrieval``: LongEval line retrieval (LongChat);
- ``needle``: needle in a haystack (gkamradt) with SEAL's needles;
- ``passages``: synthetic multi-document QA in LongBench's passage format;
- ``longbench``: LongBench multi-document QA records <-> ``Sample``;
- ``chat``: a prompt wrapped in a chat template (the tokenizer's own, LongChat's vicuna);
- ``jsonl``: task files in each task's native JSONL format (LongChat's own layout too), and the
  LongBench loader.
"""

from interp_seal.tasks.chat import TEMPLATES, wrap_sample, wrap_samples
from interp_seal.tasks.jsonl import (
    load_longbench,
    read_golden,
    read_samples,
    write_longchat,
    write_samples,
)
from interp_seal.tasks.line_retrieval import LineRetrievalConfig
from interp_seal.tasks.needle import SAN_FRANCISCO, SEAL_NEEDLES, Needle, NeedleConfig
from interp_seal.tasks.passages import PassagesConfig
from interp_seal.tasks.sample import Encoded, Sample

__all__ = [
    "SAN_FRANCISCO",
    "SEAL_NEEDLES",
    "TEMPLATES",
    "Encoded",
    "LineRetrievalConfig",
    "Needle",
    "NeedleConfig",
    "PassagesConfig",
    "Sample",
    "load_longbench",
    "read_golden",
    "read_samples",
    "wrap_sample",
    "wrap_samples",
    "write_longchat",
    "write_samples",
]
