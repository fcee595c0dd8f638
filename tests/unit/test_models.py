"""``load_model``: local checkpoints load with the right geometry; everything else fails clearly.

Tiny checkpoints are written with ``save_pretrained`` and loaded back through the same path a
hub model takes. The network is blocked (``conftest._no_network``), so a hub name that is not
cached must raise ``ModelNotFoundError``, and a checkpoint needing custom code must never run
it unless asked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from transformers.pytorch_utils import Conv1D

from interp_seal.models import (
    FAMILIES,
    ModelNotFoundError,
    UnsupportedModelError,
    load_model,
)

SUPPORTED = ", ".join(sorted(FAMILIES))


def test_local_checkpoint_loads_with_the_right_spec(family_checkpoint):
    handle = load_model(family_checkpoint)
    config = json.loads((Path(family_checkpoint) / "config.json").read_text())
    heads = config.get("num_attention_heads") or config["n_head"]  # GPT-2's config: n_head
    n_kv = config.get("num_key_value_heads") or heads  # GPT-NeoX, GPT-2: MHA
    assert handle.family.name == config["model_type"]
    assert handle.spec.as_dict() == {
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": n_kv,
        "d_head": 16,
        "d_model": 64,
        "vocab_size": len(handle.tokenizer),
        "max_positions": 2048,
    }
    assert handle.spec.group_size == 4 // n_kv
    assert handle.spec.shape == (2, 4, 16)
    assert handle.backend == "hf"
    assert handle.model.config._attn_implementation == handle.family.attn_implementation
    assert not handle.model.training
    assert not any(p.requires_grad for p in handle.model.parameters())


def test_saved_tokenizer_is_loaded_exactly(family_checkpoint):
    """transformers 5 would swap in the family's tokenizer class (Qwen2Tokenizer drops spaces)."""
    handle = load_model(family_checkpoint)
    saved = transformers.PreTrainedTokenizerFast.from_pretrained(family_checkpoint)
    text = "line happy-tiger: REGISTER_CONTENT is <12345>"
    assert handle.tokenizer.tokenize(" 5 line") == [" 5", " line"]
    assert handle.encode(text) == saved(text, add_special_tokens=False)["input_ids"]


def test_module_map_points_at_the_models_modules(family_checkpoint):
    handle = load_model(family_checkpoint)
    spec, family = handle.spec, handle.family
    layers = handle.model.get_submodule(family.layers)
    assert handle.attn(1) is layers[1].get_submodule(family.attn)
    o_proj = handle.proj(1, "o_proj")
    # GPT-2's Conv1D stores its weight (in, out), nn.Linear (out, in)
    conv1d = isinstance(o_proj, Conv1D)
    assert o_proj.weight.shape[0 if conv1d else 1] == spec.n_heads * spec.d_head
    x = torch.randn(1, 3, spec.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        projected = handle.project(0, x, "q", "k", "v")
        heads_of = (spec.n_heads, spec.n_kv_heads, spec.n_kv_heads)
        for which, out, heads in zip("qkv", projected, heads_of, strict=True):
            weight, bias = handle.projection_weights(0, which)
            assert weight.shape == (heads * spec.d_head, spec.d_model)
            expected = x @ weight.T + (0 if bias is None else bias)
            torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    if conv1d:  # GPT-2's c_attn, split as its attention splits it: [q | k | v] blocks
        fused = handle.attn(0).get_submodule(family.qkv_proj)
        with torch.no_grad():
            blocks = (x @ fused.weight + fused.bias).split(spec.d_model, dim=-1)
        for out, block in zip(projected, blocks, strict=True):
            torch.testing.assert_close(out, block, atol=1e-6, rtol=0)
        # learned absolute positions: the module GPT-2 adds to the token embeddings
        assert handle.pos_embed() is handle.model.get_submodule(family.pos_embed)
        assert handle.pos_embed().weight.shape == (spec.max_positions, spec.d_model)
    else:
        assert handle.pos_embed() is None
    if family.qkv_interleaved:  # GPT-NeoX's layout, written out: (H, [q_h | k_h | v_h])
        fused = handle.attn(0).get_submodule(family.qkv_proj)
        with torch.no_grad():
            per_head = fused(x).view(1, 3, spec.n_heads, 3, spec.d_head)
        for part, out in enumerate(projected):
            torch.testing.assert_close(out, per_head[..., part, :].flatten(-2), atol=0, rtol=0)
    if handle.family.qkv_proj is None:
        assert handle.proj(0, "v_proj").out_features == spec.n_kv_heads * spec.d_head
    else:  # fused: q, k and v are rows of one module, read through project and its kin
        with pytest.raises(ValueError, match=f"fused '{family.qkv_proj}'"):
            handle.proj(0, "v_proj")
    assert handle.mlp(0) is layers[0].mlp
    # the model's own names (GPT-NeoX: final_layer_norm, embed_in, embed_out)
    assert handle.final_norm() is handle.model.get_submodule(family.final_norm)
    assert any(handle.final_norm() is m for m in handle.model.base_model.children())
    assert handle.embed() is handle.model.get_input_embeddings()
    assert handle.unembed() is handle.model.get_output_embeddings()
    assert len(handle.layers()) == spec.n_layers


def test_loaded_weights_are_the_saved_ones(llama_checkpoint):
    handle = load_model(llama_checkpoint)
    direct = transformers.AutoModelForCausalLM.from_pretrained(
        llama_checkpoint, dtype=torch.float32
    )
    ids = torch.tensor([handle.encode("line swift-river: REGISTER_CONTENT is")])
    with torch.no_grad():
        assert torch.equal(handle.model(ids).logits, direct(ids).logits)


def test_other_backends_leave_the_hf_model_alone(llama_checkpoint):
    handle = load_model(llama_checkpoint, backend="nnsight")
    before = {k: v.clone() for k, v in handle.model.state_dict().items()}
    bridge = handle.bridge()
    assert bridge is handle.bridge() and handle.nnsight() is handle.nnsight()
    assert type(handle.model).__name__ == "LlamaForCausalLM"
    after = handle.model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_unknown_hub_name_is_not_found():
    with pytest.raises(ModelNotFoundError, match="not found.*offline"):
        load_model("interp-seal-tests/no-such-model")


def test_missing_local_path_is_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no checkpoint directory"):
        load_model(str(tmp_path / "absent" / "model" / "dir"))


def test_directory_without_config_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(tmp_path)
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(tmp_path / "model.safetensors")


def test_encoder_checkpoint_is_unsupported(tmp_path):
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    transformers.BertModel(config).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=f"'bert'.*{SUPPORTED}"):
        load_model(tmp_path)


def test_unsupported_causal_architecture_names_supported_families(tmp_path):
    config = transformers.BloomConfig(vocab_size=50, hidden_size=16, n_layer=1, n_head=2)
    transformers.BloomForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=f"'bloom'.*{SUPPORTED}") as refused:
        load_model(tmp_path)
    # one line, naming what a row cannot express and the nearest family it can
    message = str(refused.value)
    assert "\n" not in message and "ALiBi" in message
    assert "closest supported family is 'gpt_neox'" in message


def test_supported_family_without_causal_lm_head_is_unsupported(tmp_path, llama_checkpoint):
    config = transformers.AutoConfig.from_pretrained(llama_checkpoint)
    config.architectures = ["LlamaForSequenceClassification"]
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="not causal LMs"):
        load_model(tmp_path)


def write_custom_code(path, model_type: str) -> None:
    """A config whose ``auto_map`` points at modules that fail loudly if anything imports them."""
    config = (
        json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    )
    config.update(
        model_type=model_type,
        architectures=["FancyForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_fancy.FancyConfig",
            "AutoModelForCausalLM": "modeling_fancy.FancyForCausalLM",
        },
    )
    (path / "config.json").write_text(json.dumps(config))
    for module in ("configuration_fancy", "modeling_fancy"):
        (path / f"{module}.py").write_text("raise RuntimeError('remote code was executed')\n")


def test_remote_code_is_never_run_silently(tmp_path):
    write_custom_code(tmp_path, "fancy")
    with pytest.raises(UnsupportedModelError, match="trust_remote_code=True"):
        load_model(tmp_path)


def test_known_family_with_auto_map_uses_the_builtin_code(tmp_path, llama_checkpoint):
    for item in Path(llama_checkpoint).iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    write_custom_code(tmp_path, "llama")
    handle = load_model(tmp_path)
    assert type(handle.model) is transformers.LlamaForCausalLM


def test_unknown_backend_is_refused(llama_checkpoint):
    with pytest.raises(ValueError, match="unknown backend 'vllm'"):
        load_model(llama_checkpoint, backend="vllm")


def test_a_gguf_conversion_is_named_the_same_under_any_cache_root(monkeypatch, tmp_path):
    """Resume manifests record ``handle.identity``: a run converted under one machine's cache
    and resumed under another's meets the same name (the entry's content digest)."""
    import dataclasses

    from interp_seal.models import load_model

    organism = load_model("organism")
    assert organism.identity == organism.name_or_path
    for root in (tmp_path / "a", tmp_path / "b"):
        monkeypatch.setenv("INTERP_SEAL_CACHE", str(root))
        entry = root / "gguf" / "Model.Q4_1-0123456789abcdef"
        moved = dataclasses.replace(organism, name_or_path=str(entry))
        assert moved.identity == "gguf-conversion:Model.Q4_1-0123456789abcdef"
