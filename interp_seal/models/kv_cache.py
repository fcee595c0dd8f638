"""The key/value cache, one way on every transformers version the package allows.

Runs that share a prefix (``engine.prefix``), the decoding loop (``engine.decode``), runs that
start at a layer (``engine.layers``) and row capture while decoding
(``analysis.attention_rows``) hand a ``transformers.Cache`` to the model, read the one a
forward returns, or read the one an attention module receives. Only the *name* of that
argument moved between supported releases:

- transformers 5.0-5.23: ``past_key_values`` (the model, each decoder layer and each attention
  module take ``past_key_values=``; outputs carry ``.past_key_values``);
- transformers 5.24 and later: ``cache``. The old name still works through a deprecation shim
  that warns on every call, and when both names reach a module (a decoder layer called with
  recorded keyword arguments plus ``past_key_values=``) the shim silently drops the old one.

Everything else used here is the public ``Cache`` interface, unchanged across 5.x:
``batch_repeat_interleave`` (one prefix for several runs), ``get_seq_length`` and
``layers[i].keys`` (the post-RoPE keys of layer ``i``, every cached position).

Callers never spell the argument's name: they use ``cache_arg``, ``returned_cache`` and
``received_cache``. The name is read from the signature of the Llama decoder layer (every
supported family is generated from the same template), not from the version string, so
development builds are handled too.
"""

from __future__ import annotations

import inspect

from torch import Tensor
from transformers import Cache
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

_RENAMED = "cache" in inspect.signature(LlamaDecoderLayer.forward).parameters  # 5.24 and later
CACHE_ARG = "cache" if _RENAMED else "past_key_values"
"""The keyword the installed transformers takes for a KV cache (``cache`` from 5.24)."""


def cache_arg(cache: Cache | None) -> dict[str, Cache | None]:
    """``{name: cache}`` to pass to a model or decoder layer: ``model(ids, **cache_arg(c))``."""
    return {CACHE_ARG: cache}


def returned_cache(output) -> Cache | None:
    """The cache a forward with ``use_cache=True`` returned (``output.cache`` from 5.24)."""
    return getattr(output, CACHE_ARG)


def received_cache(kwargs: dict, name: str | None = None) -> Cache | None:
    """The cache a module's forward received, from the keyword arguments a hook sees (by
    ``name`` where the family's layers take it by another keyword: ``Family.layer_cache``)."""
    return kwargs.get(CACHE_ARG if name is None else name)


def layer_keys(cache: Cache, layer: int) -> Tensor:
    """``(batch, kv_head, pos, d_head)``: the post-RoPE keys layer ``layer`` has cached."""
    if getattr(cache.layers[layer], "streaming", None):  # models.streaming_heads.StreamingLayer
        raise ValueError(
            f"layer {layer}'s cache dropped its streaming heads' middle positions; read "
            "attention rows without streaming heads"
        )
    return cache.layers[layer].keys


def repeat_rows(cache: Cache, rows: int) -> Cache:
    """The cache with each batch row repeated ``rows`` times, in place (one prefix, ``rows``
    runs continuing it); returned for chaining."""
    if rows > 1:
        cache.batch_repeat_interleave(rows)
    return cache
