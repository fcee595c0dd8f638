"""Greedy decoding, the one loop: generated text for QA F1 and the Retrieval Head score.

Where one forward is enough (exact match of a known answer) the library teacher-forces
(``engine.batch``); free generation needs a loop. This one feeds the prompt once and then one
token per step from the model's key/value cache, taking the argmax each time (what
``generate(do_sample=False)`` does). A head edit that needs every value vector of a layer
(uniform attention: a running mean of values from position 0) cannot see cached positions
through its hooks, so under such an edit each step re-reads the whole sequence instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Int
from torch import Tensor

from interp_seal.interventions import HeadEdit
from interp_seal.models import ModelHandle
from interp_seal.models.kv_cache import cache_arg, returned_cache


@torch.no_grad()
def greedy_decode(
    handle: ModelHandle,
    prompt_ids: Int[Tensor, " pos"],
    max_new_tokens: int,
    *,
    intervention: HeadEdit | None = None,
    stop: Callable[[int], bool] | None = None,
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """The greedy continuation of ``prompt_ids``: at most ``max_new_tokens`` tokens, ending
    with (and including) EOS or the first token for which ``stop`` is true.

    ``on_token(token)`` is called right after each step's forward, while whatever hooks the
    caller installed still hold that step's activations (e.g. attention rows).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(prompt_ids) < 1:
        raise ValueError("greedy decoding needs at least one prompt token")
    eos = handle.tokenizer.eos_token_id
    ids = prompt_ids.to(handle.device)[None]
    new: list[int] = []
    with handle.edit(intervention):
        full = handle.edits_use_values()  # the handle's edits and this one
        cache = None
        if not full and ids.shape[1] > 1:
            cache = returned_cache(handle.model(ids[:, :-1], use_cache=True, logits_to_keep=1))
        feed = ids if full else ids[:, -1:]
        for _ in range(max_new_tokens):
            out = handle.model(feed, **cache_arg(cache), use_cache=not full, logits_to_keep=1)
            token = int(out.logits[0, -1].argmax())
            if on_token is not None:
                on_token(token)
            new.append(token)
            if token == eos or (stop is not None and stop(token)):
                break
            step = ids.new_tensor([[token]])
            if full:
                feed = torch.cat([feed, step], dim=1)
            else:
                cache, feed = returned_cache(out), step
    return new
