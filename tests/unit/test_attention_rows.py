"""Row-wise attention capture against eager attention, across backends, families and caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from conftest import build_checkpoint

from interp_seal.analysis.attention_rows import (
    attention_row_hooks,
    attention_rows,
    capture_attention_rows,
)
from interp_seal.models import load_model
from interp_seal.models.kv_cache import cache_arg, returned_cache

POSITIONS = (-1, 0, 7, 15)


def eager_rows(path: str, ids: torch.Tensor, positions) -> torch.Tensor:
    """``(layer, batch, head, query, key)`` rows of the full eager attention pattern."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    with torch.no_grad():
        patterns = model(ids, output_attentions=True).attentions  # (B, H, T, T) per layer
    return torch.stack([p[:, :, list(positions)] for p in patterns])


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(4, 200, (2, 24), generator=torch.Generator().manual_seed(0))


def test_rows_equal_eager_attention(family_checkpoint, ids):
    handle = load_model(family_checkpoint)
    rows = capture_attention_rows(handle, ids, POSITIONS)
    L, H = handle.spec.n_layers, handle.spec.n_heads
    assert rows.shape == (L, 2, H, len(POSITIONS), ids.shape[1])
    torch.testing.assert_close(
        rows, eager_rows(family_checkpoint, ids, POSITIONS), atol=1e-5, rtol=0
    )
    # causal: row of position 7 puts no weight on later keys and sums to 1
    assert rows[..., 2, 8:].abs().max() == 0
    torch.testing.assert_close(rows.sum(-1), torch.ones(rows.shape[:-1]))


def test_nnsight_rows_equal_hf_rows(family_checkpoint, ids):
    handle = load_model(family_checkpoint)
    hf = capture_attention_rows(handle, ids, POSITIONS)
    traced = capture_attention_rows(handle, ids, POSITIONS, backend="nnsight")
    torch.testing.assert_close(traced, hf, atol=1e-7, rtol=0)


def test_reduce_is_applied_per_layer(llama_checkpoint, ids):
    handle = load_model(llama_checkpoint)
    full = capture_attention_rows(handle, ids, (-1,))
    argmax = capture_attention_rows(handle, ids, (-1,), reduce=lambda r: r.argmax(-1))
    assert torch.equal(argmax, full.argmax(-1))


def test_cached_decoding_rows_equal_eager(family_checkpoint, ids):
    """One KV-cache step: the fed token's row over all cached keys is the eager last row."""
    handle = load_model(family_checkpoint)
    seq = ids[:1]
    with torch.no_grad():
        cache = returned_cache(handle.model(seq[:, :-1], use_cache=True))
        with attention_row_hooks(handle) as capture:
            handle.model(seq[:, -1:], **cache_arg(cache), use_cache=True)
            rows = capture.take()
    torch.testing.assert_close(rows, eager_rows(family_checkpoint, seq, (-1,)), atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="no attention rows"):
        capture.take()  # cleared after take(); hooks gone after the block


# layers with the 5-position window: all (Mistral), or every other one (Gemma 2 / 3)
WINDOWED = {"mistral": [0, 1], "gemma2": [0], "gemma3_text": [0]}


@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_sliding_window_rows_equal_eager(tmp_path, ids, family):
    path = build_checkpoint(tmp_path / family, family)
    config = json.loads((Path(path) / "config.json").read_text())
    (Path(path) / "config.json").write_text(json.dumps(config | {"sliding_window": 5}))
    handle = load_model(path)
    expected = eager_rows(path, ids, POSITIONS)
    for backend in ("hf", "nnsight"):
        rows = capture_attention_rows(handle, ids, POSITIONS, backend=backend)
        for layer in range(2):  # the last row sees only the last 5 keys in windowed layers
            seen = rows[layer, ..., 0, :-5].abs().max()
            assert (seen == 0) == (layer in WINDOWED[family])
        torch.testing.assert_close(rows, expected, atol=1e-5, rtol=0)


def test_attention_rows_by_hand():
    """GQA: query head h uses key head h // group; one explicit softmax per (head, row)."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 4, 2, 3, generator=gen), torch.randn(1, 2, 5, 3, generator=gen)
    positions = torch.tensor([4, 2])
    rows = attention_rows(q, k, positions, scaling=0.5)
    for h in range(4):
        for i, pos in enumerate(positions.tolist()):
            scores = torch.tensor(
                [float(q[0, h, i] @ k[0, h // 2, j]) * 0.5 for j in range(pos + 1)]
            )
            expected = torch.cat([scores.softmax(0), torch.zeros(4 - pos)])
            torch.testing.assert_close(rows[0, h, i], expected)
    windowed = attention_rows(q, k, positions, scaling=0.5, sliding_window=2)
    assert windowed[0, :, 0, :3].abs().max() == 0 and windowed[0, :, 1, :1].abs().max() == 0


def test_bad_capture_arguments(llama_checkpoint, ids):
    handle = load_model(llama_checkpoint)
    with pytest.raises(ValueError, match="not inside a sequence of 24 tokens"):
        capture_attention_rows(handle, ids, (24,))
    with pytest.raises(ValueError, match="not inside a sequence"):
        capture_attention_rows(handle, ids, (-25,))
    with pytest.raises(ValueError, match="unknown capture backend"):
        capture_attention_rows(handle, ids, backend="eager")


@pytest.mark.parametrize(
    "options", [{"scale_attn_weights": False}, {"reorder_and_upcast_attn": True}], ids=str
)
def test_gpt2_attention_options(tmp_path, ids, options):
    """GPT-2's attention options: ``scale_attn_weights`` off (no ``1 / sqrt(d_head)``) and
    ``scale_attn_by_inverse_layer_idx`` on (every ``gpt2`` test checkpoint: layer ``l`` also
    scaled by ``1 / (l + 1)``) change the scale, which the analyses read from the module's
    ``scaling``; ``reorder_and_upcast_attn`` only computes eager scores in float32 (the same
    numbers in float32). Rows equal eager attention's on both routes, and the engine's answer
    logits under a uniform-attention edit equal the edited plain forward."""
    from interp_seal.engine import AnswerBatch, answer_logits, pad_id_of
    from interp_seal.interventions import ablate, hf_logits
    from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate

    path = build_checkpoint(tmp_path, "gpt2")
    config = json.loads((Path(path) / "config.json").read_text())
    assert config["scale_attn_by_inverse_layer_idx"]
    (Path(path) / "config.json").write_text(json.dumps(config | options))
    handle = load_model(path)
    for option, value in options.items():
        assert getattr(handle.model.config, option) == value
    expected = eager_rows(path, ids, POSITIONS)
    for backend in ("hf", "nnsight"):
        rows = capture_attention_rows(handle, ids, POSITIONS, backend=backend)
        torch.testing.assert_close(rows, expected, atol=1e-5, rtol=0)
    samples = generate(LineRetrievalConfig(num_lines=4), 2, seed=1)
    encoded = [s.encode(handle.tokenizer) for s in samples]
    batch = AnswerBatch.from_encoded(encoded, pad_id=pad_id_of(handle.tokenizer))
    iv = ablate(handle.spec, [(1, 2)], "uniform")
    got = answer_logits(handle, batch, iv)
    for s, enc in enumerate(encoded):
        ref = hf_logits(handle, enc.input_ids[None], iv)[0, enc.answer_start - 1 : len(enc) - 1]
        torch.testing.assert_close(got[s, : len(ref)], ref, atol=1e-5 * ref.abs().max(), rtol=0)
