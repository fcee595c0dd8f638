"""Adding a model family is one ``Family`` row: families transformers has never heard of (a
Llama registered under a new model type, and one whose decoder layers name their attention,
MLP and norms differently) run the engine, sweeps, both row-capture routes and merging once
their rows are registered with ``register_family``, with the same numbers as plain forwards."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from interp_seal.analysis import capture_attention_rows
from interp_seal.engine import AnswerBatch, answer_logits, clean_run, pad_id_of, run_from_layer
from interp_seal.interventions import HeadIntervention, ablate, hf_logits
from interp_seal.models import (
    FAMILIES,
    Family,
    UnsupportedModelError,
    load_model,
    register_family,
    unregister_family,
)
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.testing import save_random_checkpoint
from interp_seal.tuning.merge import save_merged

NEW_TYPE = "interp-seal-test-llama"
RENAMED_TYPE = "interp-seal-test-renamed"


class NewConfig(transformers.LlamaConfig):
    model_type = NEW_TYPE


class NewForCausalLM(transformers.LlamaForCausalLM):
    config_class = NewConfig


class RenamedConfig(transformers.LlamaConfig):
    model_type = RENAMED_TYPE


class RenamedLayer(LlamaDecoderLayer):
    """A Llama decoder layer whose modules have other names (as in other code bases)."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.attention, self.feed_forward = self.self_attn, self.mlp
        self.attention_norm, self.ffn_norm = self.input_layernorm, self.post_attention_layernorm
        del self.self_attn, self.mlp, self.input_layernorm, self.post_attention_layernorm

    def forward(self, hidden_states, attention_mask=None, position_ids=None, **kwargs):
        kwargs.pop("use_cache", None)
        attended, _ = self.attention(
            hidden_states=self.attention_norm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            **kwargs,
        )
        hidden_states = hidden_states + attended
        return hidden_states + self.feed_forward(self.ffn_norm(hidden_states))


class RenamedModel(transformers.LlamaModel):
    config_class = RenamedConfig

    def __init__(self, config):
        super().__init__(config)
        self.layers = torch.nn.ModuleList(
            RenamedLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.post_init()


class RenamedForCausalLM(transformers.LlamaForCausalLM):
    config_class = RenamedConfig

    def __init__(self, config):
        super().__init__(config)
        self.model = RenamedModel(config)
        self.post_init()


for config, model in ((NewConfig, NewForCausalLM), (RenamedConfig, RenamedForCausalLM)):
    transformers.AutoConfig.register(config.model_type, config)
    transformers.AutoModelForCausalLM.register(config, model)

ROWS = {
    NEW_TYPE: Family(name=NEW_TYPE),
    RENAMED_TYPE: Family(
        name=RENAMED_TYPE,
        attn="attention",
        mlp="feed_forward",
        pre_attn_norm="attention_norm",
        pre_mlp_norm="ffn_norm",
    ),
}


@pytest.fixture(scope="module", params=sorted(ROWS))
def new_family(request, tmp_path_factory):
    """A checkpoint of a new model type, saved and loaded like any other, with its row."""
    register_family(ROWS[request.param])
    try:
        path = save_random_checkpoint(tmp_path_factory.mktemp("new"), request.param, seed=5)
        handle = load_model(path)
        yield path, handle
    finally:
        unregister_family(request.param)


def test_unregistered_family_is_refused(new_family):
    path, handle = new_family
    name = handle.family.name
    with pytest.raises(ValueError, match="registered already; pass replace=True"):
        register_family(Family(name=name))
    row = unregister_family(name)
    try:
        with pytest.raises(UnsupportedModelError, match=f"{name}.*not supported.*Family row"):
            load_model(path)
    finally:
        register_family(row)
    assert FAMILIES[name] is row


def test_engine_and_sweep_equal_plain_forwards(new_family):
    _, handle = new_family
    expected = NewForCausalLM if handle.family.name == NEW_TYPE else RenamedForCausalLM
    assert type(handle.model) is expected
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
    for backend in ("hf", "nnsight"):
        rows = capture_attention_rows(handle, ids, (-1, 7), backend=backend)
        torch.testing.assert_close(rows, expected, atol=1e-6, rtol=0)

    handle.model.double()  # merging is exact: compare in float64
    try:
        scales = 1 + 0.5 * torch.randn(
            handle.spec.shape, generator=torch.Generator().manual_seed(1)
        )
        scaled = hf_logits(handle, ids, HeadIntervention.from_scales(handle.spec, scales))
        out = save_merged(handle, scales, tmp_path / "merged")
        merged = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
        assert type(merged) is type(handle.model)
        with torch.no_grad():
            torch.testing.assert_close(merged(ids).logits, scaled, atol=1e-10, rtol=0)
    finally:
        handle.model.float()
