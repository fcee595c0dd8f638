"""The KV-cache compatibility module: cached runs equal uncached runs on every family.

Each check compares a run that goes through a cache (a prefix run once, its cache handed to
the model through ``cache_arg``, read back through ``returned_cache``) with one plain forward
over the whole sequence: the installed transformers must compute the same logits both ways.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers
from packaging.version import Version

from interp_seal.analysis.attention_rows import post_rope_qk_hooks
from interp_seal.engine.layers import LayerInputs, run_layers
from interp_seal.models import load_model
from interp_seal.models.kv_cache import (
    CACHE_ARG,
    cache_arg,
    layer_keys,
    received_cache,
    repeat_rows,
    returned_cache,
)

PREFIX, SUFFIX = 17, 6


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    """Three sequences sharing their first ``PREFIX`` tokens."""
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(4, 200, (1, PREFIX), generator=gen).expand(3, -1)
    return torch.cat([prefix, torch.randint(4, 200, (3, SUFFIX), generator=gen)], dim=1)


def test_cache_arg_names_the_installed_versions_keyword():
    """5.0-5.23 take ``past_key_values``; 5.24 renamed it ``cache``."""
    renamed = Version(transformers.__version__).release >= (5, 24)
    assert CACHE_ARG == ("cache" if renamed else "past_key_values")
    assert cache_arg(None) == {CACHE_ARG: None}


@torch.no_grad()
def test_cached_run_equals_uncached_run(family_checkpoint, ids):
    handle = load_model(family_checkpoint)
    full = handle.model(ids[:1]).logits  # (1, T, vocab)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecated name on the way
        cache = returned_cache(handle.model(ids[:1, :PREFIX], use_cache=True))
        assert cache.get_seq_length() == PREFIX
        cont = handle.model(ids[:1, PREFIX:], **cache_arg(cache), use_cache=True)
    torch.testing.assert_close(cont.logits, full[:, PREFIX:], atol=1e-5, rtol=0)
    assert returned_cache(cont).get_seq_length() == PREFIX + SUFFIX


@torch.no_grad()
def test_repeated_prefix_cache_continues_each_row(family_checkpoint, ids):
    """One prefix cache expanded to three rows equals three whole-sequence forwards."""
    handle = load_model(family_checkpoint)
    full = handle.model(ids).logits[:, PREFIX:]
    cache = returned_cache(handle.model(ids[:1, :PREFIX], use_cache=True))
    cache = repeat_rows(cache, 3)
    assert layer_keys(cache, 0).shape[0] == 3
    cont = handle.model(ids[:, PREFIX:], **cache_arg(cache), use_cache=True).logits
    torch.testing.assert_close(cont, full, atol=1e-5, rtol=0)


@torch.no_grad()
def test_layer_keys_are_the_post_rope_keys(family_checkpoint, ids):
    """The cached keys of each layer equal the keys the model computes with RoPE applied."""
    handle = load_model(family_checkpoint)
    seen: dict[int, torch.Tensor] = {}
    layers = range(handle.spec.n_layers)
    with post_rope_qk_hooks(handle, layers, lambda i, _m, _kw, _q, k: seen.setdefault(i, k)):
        cache = returned_cache(handle.model(ids[:1], use_cache=True))
    for layer in layers:
        torch.testing.assert_close(layer_keys(cache, layer), seen[layer], atol=1e-6, rtol=0)
        assert layer_keys(cache, layer).shape == (
            1,
            handle.spec.n_kv_heads,
            ids.shape[1],
            handle.spec.d_head,
        )


@torch.no_grad()
def test_attention_modules_receive_the_cache(llama_checkpoint, ids):
    handle = load_model(llama_checkpoint)
    cache = returned_cache(handle.model(ids[:1, :PREFIX], use_cache=True))
    got = []
    hook = handle.attn(0).register_forward_hook(
        lambda _m, _a, kwargs, _o: got.append(received_cache(kwargs)), with_kwargs=True
    )
    with hook:
        handle.model(ids[:1, PREFIX:], **cache_arg(cache), use_cache=True)
        handle.model(ids[:1], use_cache=False)
    assert got[0] is cache
    assert got[1] is None


@torch.no_grad()
def test_layers_rerun_from_recorded_inputs_continue_a_cache(family_checkpoint, ids):
    """``run_layers`` with recorded kwargs and a prefix cache equals the whole forward: the
    recorded run's own cache argument is replaced, not kept beside the new one."""
    handle = load_model(family_checkpoint)
    L = handle.spec.n_layers
    full = handle.model.base_model(ids[:1]).last_hidden_state[:, PREFIX:]
    prefix = returned_cache(handle.model.base_model(ids[:1, :PREFIX], use_cache=True))
    with LayerInputs(handle, range(L)) as inputs:
        recorded = copy.deepcopy(prefix)
        handle.model.base_model(ids[:1, PREFIX:], **cache_arg(recorded), use_cache=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hidden = run_layers(handle, inputs.resid[0], range(L), inputs.kwargs, cache=prefix)
    hidden = handle.final_norm()(hidden)
    torch.testing.assert_close(hidden, full, atol=1e-5, rtol=0)


@torch.no_grad()
def test_cached_greedy_decoding_equals_full_recomputation(family_checkpoint, ids):
    """The decoding loop (prompt once, then one cached token a step) picks the tokens that
    re-running the whole sequence at every step picks, and warns about no deprecated name."""
    from interp_seal.engine.decode import greedy_decode

    handle = load_model(family_checkpoint)
    prompt = ids[0, :PREFIX]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cached = greedy_decode(handle, prompt, 8)
    seq = prompt.tolist()
    for _ in range(len(cached)):
        seq.append(int(handle.model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert cached == seq[PREFIX:]
