"""Soft-capped attention by blocks of query rows (``models.capped_attention``, Gemma 2's
attention in ``load_model``) equals eager attention: forward and backward, windowed and global
layers, several blocks or one, padding, cached decoding, the training tuners' gradients and the
engine's last layer; and it never holds a ``T x T`` pattern.

The reference is transformers' own eager attention: in float32 its ``"eager"`` implementation
itself; in float64 the same arithmetic on the full ``T x T`` scores with transformers' own eager
mask (causal, sliding window, padding), its softmax in float64 (transformers' eager attention
takes every softmax in float32, which would cap any float64 comparison near 1e-7).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from conftest import float64
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

import interp_seal.models.capped_attention as capped
from interp_seal.engine import AnswerBatch, clean_run, pad_id_of, run_from_layer
from interp_seal.interventions import ablate
from interp_seal.models import load_model
from interp_seal.models.kv_cache import CACHE_ARG
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.testing import allocated_peak, save_random_checkpoint
from interp_seal.tuning.data import collate, encode_examples, with_line_passages
from interp_seal.tuning.mudaf import MudafConfig, MudafTuner
from interp_seal.tuning.seal import SealTuner

REFERENCE = "interp_seal_test_eager_full"
WINDOW = 5  # shorter than every test sequence
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def eager_full(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """Eager attention (transformers' ``eager_attention_forward``) on the full ``T x T`` scores,
    its softmax in the scores' dtype."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * scaling
    if kw.get("softcap") is not None:
        scores = torch.tanh(scores / kw["softcap"]) * kw["softcap"]
    weights = (scores + attention_mask).softmax(-1)  # transformers' additive eager mask
    return (weights @ value).transpose(1, 2), weights


AttentionInterface.register(REFERENCE, eager_full)
AttentionMaskInterface.register(REFERENCE, eager_mask)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 3-layer Gemma 2 (GQA, soft-cap 10): layers 0 and 2 (the last) windowed to 5 keys."""
    path = save_random_checkpoint(tmp_path_factory.mktemp("gemma2_capped"), "gemma2", n_layers=3)
    config = json.loads((Path(path) / "config.json").read_text())
    (Path(path) / "config.json").write_text(json.dumps(config | {"sliding_window": WINDOW}))
    return path


def reference(path, dtype):
    impl = "eager" if dtype == torch.float32 else REFERENCE
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation=impl)
    return float64(model) if dtype == torch.float64 else model


def loaded(path, dtype):
    handle = load_model(path)
    if dtype == torch.float64:
        float64(handle.model)
    return handle


def test_gemma2_loads_with_capped_attention(checkpoint):
    handle = load_model(checkpoint)
    assert handle.model.config._attn_implementation == capped.ATTENTION_NAME
    assert [handle.sliding_window(layer) for layer in range(3)] == [WINDOW, None, WINDOW]
    assert handle.attn_softcap(0) == 10.0


@pytest.mark.parametrize("budget", [None, 2 * 4 * 23 * 3], ids=["one-block", "blocks-of-3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_forward_and_backward_equal_eager(checkpoint, dtype, budget, monkeypatch):
    """Logits and every parameter's gradient (all three layers, through the soft-cap, the
    windows and the softmax) equal eager attention's, in one block of query rows or in blocks
    of 3 rows (a budget of 3 rows x 23 keys x 8 heads x 2 rows)."""
    if budget is not None:
        monkeypatch.setattr(capped, "SCORES_PER_BLOCK", budget)
    handle, eager = loaded(checkpoint, dtype), reference(checkpoint, dtype)
    ids = torch.randint(
        4, handle.spec.vocab_size, (2, 23), generator=torch.Generator().manual_seed(0)
    )
    probe = torch.randn(2, 23, handle.spec.vocab_size, generator=torch.Generator().manual_seed(1))
    grads = []
    for model in (handle.model, eager):
        model.requires_grad_(True)
        logits = model(ids).logits
        (logits * probe.to(dtype)).sum().backward()
        grads.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
        model.requires_grad_(False)
    (got, got_grads), (want, want_grads) = grads
    tol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=tol * want.abs().max(), rtol=0)
    assert set(got_grads) == set(want_grads)
    for name, grad in want_grads.items():
        torch.testing.assert_close(
            got_grads[name], grad, atol=tol * grad.abs().max(), rtol=0, msg=name
        )


def test_padding_and_cached_decoding_equal_eager(checkpoint, monkeypatch):
    """Left- and right-padded rows (real tokens) and token-by-token decoding from a cache
    whose windowed layers keep their last keys only, in blocks of 2 rows, float64."""
    monkeypatch.setattr(capped, "SCORES_PER_BLOCK", 2 * 4 * 23 * 2)
    handle, eager = loaded(checkpoint, torch.float64), reference(checkpoint, torch.float64)
    ids = torch.randint(
        4, handle.spec.vocab_size, (2, 23), generator=torch.Generator().manual_seed(2)
    )
    right = torch.ones_like(ids)
    right[0, 17:] = 0
    left = torch.ones_like(ids)
    left[1, :4] = 0
    with torch.no_grad():
        for mask, real in ((right, (0, slice(0, 17))), (left, (1, slice(4, None)))):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            got, want = (
                m(ids, attention_mask=mask, position_ids=positions).logits
                for m in (handle.model, eager)
            )
            torch.testing.assert_close(got[real], want[real], atol=1e-10, rtol=0)
            other = 1 - real[0]
            torch.testing.assert_close(got[other], want[other], atol=1e-10, rtol=0)
        decoded = []
        for model in (handle.model, eager):
            out = model(ids[:, :9], use_cache=True)
            cache, logits = out.past_key_values, [out.logits]
            for t in range(9, 23):
                out = model(ids[:, t : t + 1], **{CACHE_ARG: cache}, use_cache=True)
                logits.append(out.logits)
            decoded.append(torch.cat(logits, 1))
        assert cache.layers[0].keys.shape[-2] == WINDOW - 1  # the windowed layers' kept keys
        torch.testing.assert_close(decoded[0], decoded[1], atol=1e-10, rtol=0)
        torch.testing.assert_close(decoded[0], eager(ids).logits, atol=1e-10, rtol=0)


def test_seal_h_and_mudaf_gradients_equal_eager(checkpoint):
    """The training tuners' losses and gradients through capped attention equal those through
    eager attention (float64): SEAL-H's head scales, MuDAF's q / k / v / o weights (its
    contrastive term on a windowed and a global layer's heads, and the LM loss)."""
    handle, eager = loaded(checkpoint, torch.float64), loaded(checkpoint, torch.float64)
    eager.model.set_attn_implementation(REFERENCE)
    samples = [with_line_passages(s) for s in generate(LineRetrievalConfig(num_lines=5), 2)]
    batch = collate(encode_examples(samples, handle.tokenizer), pad_id_of(handle.tokenizer))
    assert batch.input_ids.shape[1] > 4 * WINDOW
    for make in (
        lambda h: SealTuner(h, "head"),
        lambda h: MudafTuner(h, MudafConfig(heads=((0, 1), (1, 2)), trainable="attention")),
    ):
        results = []
        for h in (handle, eager):
            tuner = make(h).double()
            with tuner.step_context():
                loss = tuner(batch)["loss"]
                loss.backward()
            grads = {n: p.grad for n, p in tuner.named_parameters() if p.requires_grad}
            results.append((loss.detach(), grads))
            if isinstance(tuner, MudafTuner):
                tuner.model.requires_grad_(False)
        (got, got_grads), (want, want_grads) = results
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
        assert got_grads.keys() == want_grads.keys() and got_grads
        for name, grad in want_grads.items():
            torch.testing.assert_close(
                got_grads[name], grad, atol=1e-10 * grad.abs().max(), rtol=0, msg=name
            )


def test_engine_last_layer_keeps_to_its_window(checkpoint):
    """The engine's last layer (windowed here) computes its answer rows itself: capped
    attention hands the layer no mask, so the window comes from the attention module. A run
    from the last layer with head (2, 1) zeroed equals eager attention with that head's
    ``o_proj`` columns zeroed."""
    handle, eager = load_model(checkpoint), reference(checkpoint, torch.float32)
    D = handle.spec.d_head
    with torch.no_grad():
        eager.model.layers[2].self_attn.o_proj.weight[:, D : 2 * D] = 0
    samples = generate(LineRetrievalConfig(num_lines=3), 2, seed=3)
    encoded = [e.encoded for e in encode_examples(samples, handle.tokenizer)]
    clean = clean_run(handle, AnswerBatch.from_encoded(encoded, pad_id=0), [2])
    logits = run_from_layer(handle, clean, 2, [ablate(handle.spec, [(2, 1)], "zero")])
    with torch.no_grad():
        for row, enc in enumerate(encoded):
            assert enc.answer_start > 2 * WINDOW
            want = eager(enc.input_ids[None]).logits[0, enc.answer_start - 1 : -1]
            got = logits[row, : len(want)]
            torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max(), rtol=0)


def test_memory_stays_below_one_pattern():
    """At 4096 tokens (8 heads, 2 KV heads) forward and backward hold less than a quarter of
    one layer's float32 pattern (512 MiB): the blocks' scores, not ``T x T``."""
    T, gen = 4096, torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, T, 16, generator=gen, requires_grad=True)
    k, v = (torch.randn(1, 2, T, 16, generator=gen, requires_grad=True) for _ in range(2))
    module = torch.nn.Module()
    pattern = 8 * T * T * 4

    def run():
        out, _ = capped.capped_attention(module, q, k, v, None, scaling=0.25, softcap=10.0)
        out.sum().backward()

    assert allocated_peak(run) < pattern / 4
    with torch.no_grad():  # rows 4000 .. 4095 against the full pattern's
        out, _ = capped.capped_attention(module, q, k, v, None, scaling=0.25, softcap=10.0)
        kk, vv = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
        scores = torch.tanh(q[:, :, 4000:] @ kk.transpose(-1, -2) * 0.25 / 10) * 10
        causal = torch.arange(T)[None, :] <= torch.arange(4000, T)[:, None]
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        want = (weights @ vv).transpose(1, 2)
    torch.testing.assert_close(out[:, 4000:], want, atol=1e-5, rtol=0)


def test_static_cache_is_refused(checkpoint):
    """A static cache's unfilled slots are hidden by a mask only, which capped attention does
    not build: refused, not computed wrong."""
    handle = load_model(checkpoint)
    cache = transformers.StaticCache(config=handle.model.config, max_cache_len=32)
    with pytest.raises(ValueError, match="static cache"):
        handle.model(torch.arange(4, 13)[None], **{CACHE_ARG: cache}, use_cache=True)
