"""Runs that share a prefix: the prefix once, every run continues from its key/value cache.

Attention is causal, so every activation before the first token where two prompts differ is
the same in both. Activation patching (clean vs corrupted prompt, every patched run) and
attribution patching run that prefix once and continue each run from a copy of its key/value
cache (the model's own ``DynamicCache``, as in chunked prefill): their activations and
gradients cover the positions after it only. For a key corruption of line retrieval the
prompts differ only in the question, so a run covers a few dozen positions, not the record.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers import Cache

from interp_seal.models import ModelHandle
from interp_seal.models.kv_cache import cache_arg, repeat_rows, returned_cache


def last_logits(handle: ModelHandle, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch vocab"]:
    """Logits at the last position only (the unembedding runs on one position)."""
    return handle.model(ids.to(handle.device), logits_to_keep=1).logits[:, -1]


@dataclass(frozen=True, kw_only=True, eq=False)
class SharedPrefix:
    """The positions ``[0, start)`` two prompts share, run once and cached.

    Runs that differ only from ``start`` on continue from ``cache`` over ``ids[start:]``.
    ``start`` is the first position where the prompts differ (at most the last position, which
    every run needs for its logits); ``start = 0`` runs whole prompts.
    """

    start: int = 0
    cache: Cache | None = None

    @classmethod
    def of(
        cls, handle: ModelHandle, first: Int[Tensor, " pos"], second: Int[Tensor, " pos"]
    ) -> SharedPrefix:
        """The shared prefix of two equally long prompts (none under an active uniform-attention
        edit: its running mean of values needs every position in the same run)."""
        differ = (first != second).nonzero()
        last = first.shape[0] - 1
        start = min(int(differ[0, 0]) if len(differ) else last, last)
        if handle.edits_use_values():
            start = 0
        if start == 0:
            return cls()
        with torch.no_grad():
            out = handle.model.base_model(first[None, :start].to(handle.device), use_cache=True)
        return cls(start=start, cache=returned_cache(out))

    def suffix(self, ids: Int[Tensor, "*batch pos"]) -> Int[Tensor, "*batch suffix"]:
        return ids[..., self.start :]

    def fresh_cache(self, rows: int) -> Cache | None:
        """A copy of the prefix's cache for ``rows`` runs (a forward appends to its cache)."""
        if self.cache is None:
            return None
        return repeat_rows(copy.deepcopy(self.cache), rows)

    def last_logits(
        self, handle: ModelHandle, suffix: Int[Tensor, "batch suffix"]
    ) -> Float[Tensor, "batch vocab"]:
        """Last-position logits of prompts ``prefix + suffix[row]``."""
        if self.cache is None:
            return last_logits(handle, suffix)
        out = handle.model(
            suffix.to(handle.device),
            **cache_arg(self.fresh_cache(suffix.shape[0])),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]


WHOLE_PROMPT = SharedPrefix()  # no shared prefix: runs cover every position
