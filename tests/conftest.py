"""Shared fixtures: no network, one torch thread, tiny random checkpoints of each family.

Tiny checkpoints are real ``save_pretrained`` directories (config + safetensors +
``tokenizer.json``) loaded back through ``load_model``: the same path a hub model takes.
RMSNorm weights are ``1 + 0.3 * randn`` so that bugs hidden by all-ones norms show up.
"""

from __future__ import annotations

import os
import socket

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from interp_seal.organism.tokenizer import build_tokenizer  # noqa: E402
from interp_seal.tasks import line_retrieval  # noqa: E402

torch.set_num_threads(1)

# (config class, extra kwargs) per family; n_kv_heads < n_heads exercises GQA
FAMILY_CONFIGS = {
    "llama": (transformers.LlamaConfig, {"num_key_value_heads": 2}),
    "mistral": (transformers.MistralConfig, {"num_key_value_heads": 2, "sliding_window": None}),
    "qwen2": (transformers.Qwen2Config, {"num_key_value_heads": 4}),  # plain multi-head
}


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Fail any attempt to open a network connection."""

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in interp-seal's tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def tiny_tokenizer():
    """A word-level tokenizer covering the line-retrieval format (all adjective-noun indices)."""
    samples = line_retrieval.generate(line_retrieval.LineRetrievalConfig(num_lines=3), 2)
    keys = [f" {a}-{n}" for a in line_retrieval.ADJECTIVES for n in line_retrieval.NOUNS]
    return build_tokenizer([s.prompt + s.answer for s in samples], extra=keys)


def build_checkpoint(path, family: str = "llama", *, seed: int = 0, n_layers: int = 2,
                     n_heads: int = 4, d_head: int = 16) -> str:
    """Save a random tiny checkpoint of ``family`` with its tokenizer to ``path``."""
    config_cls, extra = FAMILY_CONFIGS[family]
    tok = tiny_tokenizer()
    config = config_cls(
        vocab_size=len(tok),
        hidden_size=n_heads * d_head,
        intermediate_size=2 * n_heads * d_head,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        head_dim=d_head,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **extra,
    )
    config.architectures = [config_cls.__name__.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0, 0.1)
            else:
                param.normal_(0, 0.15)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session", params=sorted(FAMILY_CONFIGS))
def family_checkpoint(request, tmp_path_factory):
    """A tiny random checkpoint directory of each supported family (llama and mistral use GQA)."""
    seed = sorted(FAMILY_CONFIGS).index(request.param)  # distinct weights per family
    return build_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=seed)


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory):
    """A tiny random GQA Llama checkpoint directory."""
    return build_checkpoint(tmp_path_factory.mktemp("llama"), "llama")
