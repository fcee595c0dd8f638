"""Adding a model family is one ``Family`` row: a family transformers has never heard of (a
Llama registered under a new model type) runs the engine, sweeps, row capture and merging once
its row is registered, with the same numbers as plain forwards."""

from __future__ import annotations

import pytest
import torch
import transformers

from interp_seal.analysis import capture_attention_rows
from interp_seal.engine import AnswerBatch, answer_logits, clean_run, pad_id_of, run_from_layer
from interp_seal.interventions import HeadIntervention, ablate, hf_logits
from interp_seal.models import FAMILIES, UnsupportedModelError, load_model
from interp_seal.testing import save_random_checkpoint
from interp_seal.models.spec import Family
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.merge import save_merged

NEW_TYPE = "interp-seal-test-llama"


class NewConfig(transformers.LlamaConfig):
    model_type = NEW_TYPE


class NewForCausalLM(transformers.LlamaForCausalLM):
    config_class = NewConfig


transformers.AutoConfig.register(NEW_TYPE, NewConfig)
transformers.AutoModelForCausalLM.register(NewConfig, NewForCausalLM)


@pytest.fixture(scope="module")
def new_family(tmp_path_factory):
    """A checkpoint of the new model type, saved and loaded like any other, with its row."""
    row = Family(name=NEW_TYPE)
    FAMILIES[NEW_TYPE] = row
    try:
        path = save_random_checkpoint(tmp_path_factory.mktemp("new"), NEW_TYPE, seed=5)
        handle = load_model(path)
        yield path, handle
    finally:
        del FAMILIES[NEW_TYPE]


def test_unregistered_family_is_refused(new_family):
    path, _ = new_family
    row = FAMILIES.pop(NEW_TYPE)
    try:
        with pytest.raises(UnsupportedModelError, match=f"{NEW_TYPE}.*not supported.*Family row"):
            load_model(path)
    finally:
        FAMILIES[NEW_TYPE] = row


def test_engine_and_sweep_equal_plain_forwards(new_family):
    _, handle = new_family
    assert type(handle.model) is NewForCausalLM and handle.family.name == NEW_TYPE
    samples = generate(LineRetrievalConfig(num_lines=5), 3, seed=1)
    encoded = [s.encode(handle.tokenizer) for s in samples]
    batch = AnswerBatch.from_encoded(encoded, pad_id=pad_id_of(handle.tokenizer))
    iv = ablate(handle.spec, [(1, 2)], "uniform")
    got = answer_logits(handle, batch, iv)
    clean = clean_run(handle, batch, [0])
    heads = [ablate(handle.spec, [(0, h)]) for h in range(handle.spec.n_heads)]
    per_head = run_from_layer(handle, clean, 0, heads)  # rows: head-major
    for s, enc in enumerate(encoded):
        answer = slice(enc.answer_start - 1, len(enc) - 1)
        n = len(enc) - enc.answer_start
        ref = hf_logits(handle, enc.input_ids[None], iv)[0, answer]
        scale = ref.abs().max()
        torch.testing.assert_close(got[s, :n], ref, atol=1e-5 * scale, rtol=0)
        for h, head_iv in enumerate(heads):
            ref = hf_logits(handle, enc.input_ids[None], head_iv)[0, answer]
            row = h * len(encoded) + s
            torch.testing.assert_close(per_head[row, :n], ref, atol=1e-5 * scale, rtol=0)


def test_rows_and_merge_equal_direct_computations(new_family, tmp_path):
    path, handle = new_family
    ids = torch.randint(4, 200, (1, 20), generator=torch.Generator().manual_seed(0))
    eager = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    with torch.no_grad():
        patterns = eager(ids, output_attentions=True).attentions
    expected = torch.stack([p[:, :, [-1, 7]] for p in patterns])
    torch.testing.assert_close(
        capture_attention_rows(handle, ids, (-1, 7)), expected, atol=1e-6, rtol=0
    )

    handle.model.double()  # merging is exact: compare in float64
    try:
        scales = 1 + 0.5 * torch.randn(
            handle.spec.shape, generator=torch.Generator().manual_seed(1)
        )
        scaled = hf_logits(handle, ids, HeadIntervention.from_scales(handle.spec, scales))
        out = save_merged(handle, scales, tmp_path / "merged")
        merged = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
        assert type(merged) is NewForCausalLM
        with torch.no_grad():
            torch.testing.assert_close(merged(ids).logits, scaled, atol=1e-10, rtol=0)
    finally:
        handle.model.float()
