"""Shared fixtures: no network, one torch thread, tiny random checkpoints of each family.

One thread in every process, whatever the shell says. Several tests compare numbers computed
in two processes: a notebook's kernel and this one, a CLI subprocess and an in-process run,
torchrun's ranks and one process. A float32 sum reduced over 1 thread and over 2 differs in
its last bits, and training amplifies that (SEAL-C scales trained on 2 threads in a kernel and
on 1 here differed by 7.7e-4). So the thread count is set here, before torch is imported,
not left to the caller's ``OMP_NUM_THREADS``: this process runs one torch thread, and every
process a test starts inherits ``OMP_NUM_THREADS=1`` (torch reads it at import; the notebooks
pass it to ``torch.set_num_threads``).

Tiny checkpoints are real ``save_pretrained`` directories (config + safetensors +
``tokenizer.json``) loaded back through ``load_model``: the same path a hub model takes.
RMSNorm weights are ``1 + 0.3 * randn`` so that bugs hidden by all-ones norms show up.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile

os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # this process and its children
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# GGUF conversions (SmolLM2 is ~540 MB as float32) go to a cache of this test session, shared
# by its tests and the commands they start, and removed at the end: the user's cache
# (~/.cache/interp_seal) is neither read nor grown.
SESSION_CACHE = tempfile.mkdtemp(prefix="interp-seal-test-cache-")
os.environ["INTERP_SEAL_CACHE"] = SESSION_CACHE

import pytest  # noqa: E402
import torch  # noqa: E402
from beartype import BeartypeConf, beartype  # noqa: E402
from jaxtyping import install_import_hook  # noqa: E402

# ints are floats, as PEP 484's numeric tower says
typechecker = beartype(conf=BeartypeConf(is_pep484_tower=True))

# Check the jaxtyping annotations (shapes and dtypes) of the numerical code at run time, in
# tests only. ``interp_seal.models`` and ``interp_seal.interventions`` stay unchecked: nnsight's
# ``remote`` serialisation looks their classes (``ModelSpec``, ``HeadIntervention``) up by
# source, which the import hook rewrites.
install_import_hook(
    [f"interp_seal.{name}" for name in ("analysis", "engine", "evaluation", "tasks", "tuning")],
    "conftest.typechecker",
)

from interp_seal.tasks import line_retrieval  # noqa: E402
from interp_seal.testing import save_random_checkpoint  # noqa: E402

torch.set_num_threads(1)

FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "olmo2",
    "mixtral",
    "qwen3_moe",
    "phi3",
    "gemma2",
    "gemma3_text",
    "gpt_neox",
    "gpt2",
)
# the other layouts a Qwen3-MoE config can declare, beside the family checkpoint's (a dense
# layer 0 by mlp_only_layers, norm_topk_prob off): experts in every layer with the chosen
# experts' weights renormalised (the released models), and experts in every second layer
# (decoder_sparse_step 2: layers 0 and 2 of 4 dense)
QWEN3_MOE_LAYOUTS = {
    "every_layer_moe": {"mlp_only_layers": [], "norm_topk_prob": True},
    "decoder_sparse_step": {
        "mlp_only_layers": [],
        "decoder_sparse_step": 2,
        "norm_topk_prob": True,
    },
}
# families whose random checkpoints compute different functions: mistral's (window off, see its
# row) is llama's computation under another name, so the slower per-family tests skip it
DISTINCT_FAMILIES = tuple(f for f in FAMILIES if f != "mistral")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.fixture
def unchecked():
    """Run a test without the run-time shape checks: tests of the library's own argument
    validation pass wrong shapes on purpose and assert its error messages."""
    import jaxtyping

    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", False)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Fail any attempt to open a network connection."""

    def refuse(*args, **kwargs):
        raise OSError("network access is disabled in interp-seal's tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def build_checkpoint(path, family: str = "llama", **kwargs) -> str:
    """A tiny random checkpoint: qwen2 multi-head (with q/k/v biases), the others GQA (2 KV
    heads) but gpt_neox and gpt2 (multi-head: their rows drop the KV heads)."""
    n_heads = kwargs.pop("n_heads", 4)
    n_kv_heads = n_heads if family == "qwen2" else 2
    return save_random_checkpoint(path, family, n_heads=n_heads, n_kv_heads=n_kv_heads, **kwargs)


def rms_norm_terms(norm) -> tuple[torch.Tensor, float]:
    """``(w, eps)`` of an RMSNorm module, ``norm(x) = w * x / sqrt(mean(x^2) + eps)``, read
    from what the module computes (``w = norm(1) * sqrt(1 + eps)``), not from its weight: a
    family's offset (Gemma's ``1 + weight``) is then in ``w`` without being assumed."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    ones = torch.ones(norm.weight.shape, dtype=norm.weight.dtype)
    with torch.no_grad():
        return norm(ones).double() * (1 + eps) ** 0.5, eps


def float64(model):
    """``model`` in float64, in place. Mixture-of-experts MLPs then run their experts one at a
    time (``"eager"``): transformers' default grouped-mm kernel has no float64 on the CPU."""
    model.double()
    model.set_experts_implementation("eager")  # changes nothing in a dense model
    return model


@pytest.fixture(scope="session", params=FAMILIES)
def family_checkpoint(request, tmp_path_factory):
    """A tiny random checkpoint directory of each supported family (llama and mistral use GQA)."""
    seed = FAMILIES.index(request.param)  # distinct weights per family
    return build_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=seed)


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory):
    """A tiny random GQA Llama checkpoint directory."""
    return build_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


def byte_level_tokenizer():
    """A small byte-level BPE (GPT-2 conventions, like SmolLM2's) trained on LongEval text.

    BOS and EOS are ``<|endoftext|>``; BOS is not added by the tokenizer (as in GPT-2).
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    samples = line_retrieval.generate(line_retrieval.LineRetrievalConfig(num_lines=20), 3)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([s.prompt + s.answer for s in samples], trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


@pytest.fixture(scope="session")
def eager(llama_checkpoint):
    """``llama_checkpoint`` with eager attention: full attention matrices for reference rows."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        llama_checkpoint, attn_implementation="eager"
    )
