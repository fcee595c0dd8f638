"""Random checkpoints of each supported family, saved like any hub model, and the allocator's
peak while a call runs: for tests and benchmarks.

Useful to test a pipeline end to end without a trained model: the checkpoint is a real
``save_pretrained`` directory (config + safetensors + ``tokenizer.json``) that ``load_model``
reads through the same path as a hub model. RMSNorms scale by ``1 + 0.3 * randn`` (all-ones
norms hide direct-logit-attribution bugs) and other weights ``std * randn``, so next-token
distributions are peaked and argmaxes rarely tie.

``allocated_peak(run)`` is how the memory planner's CPU validation
(``tests/integration/test_plan.py``) and ``benchmarks/bench_paper_scale.py`` measure memory on
the CPU: the most bytes torch's allocator held at once while ``run()`` ran.

This module sits above the library's layers (it takes the organism's word-level tokenizer), so
nothing in the library imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

from interp_seal.models.spec import FAMILIES
from interp_seal.organism.tokenizer import build_tokenizer
from interp_seal.tasks import line_retrieval


def line_retrieval_tokenizer():
    """A word-level tokenizer covering the LongEval format with every adjective-noun index."""
    samples = line_retrieval.generate(line_retrieval.LineRetrievalConfig(num_lines=3), 2)
    keys = [f" {a}-{n}" for a in line_retrieval.ADJECTIVES for n in line_retrieval.NOUNS]
    return build_tokenizer([s.prompt + s.answer for s in samples], extra=keys)


def save_random_checkpoint(
    path: str | Path,
    family: str = "llama",
    *,
    tokenizer=None,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int | None = None,
    d_head: int = 16,
    max_positions: int = 2048,
    seed: int = 0,
    std: float = 0.15,
    config: dict[str, Any] | None = None,
) -> str:
    """Save a random ``family`` checkpoint with ``tokenizer`` (default: line retrieval) to ``path``.

    ``n_kv_heads`` defaults to ``n_heads // 2`` (GQA); pass ``n_heads`` for plain multi-head.
    ``config``: config fields set over the family row's ``random_config`` (e.g. a Qwen3-MoE
    without its dense layer 0: ``{"mlp_only_layers": []}``).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(FAMILIES)}")
    tok = tokenizer if tokenizer is not None else line_retrieval_tokenizer()
    # rows hold sequences as tuples (a row stays hashable); config classes want lists
    overrides = {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in FAMILIES[family].random_config
    }
    fields = dict(
        vocab_size=len(tok),
        hidden_size=n_heads * d_head,
        intermediate_size=2 * n_heads * d_head,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads or max(1, n_heads // 2),
        head_dim=d_head,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    # the row's overrides win (e.g. no num_key_value_heads where a family has no GQA), given
    # to the config class: derived fields follow
    built = transformers.AutoConfig.for_model(family, **(fields | overrides | (config or {})))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(built)
    model.config.architectures = [type(model).__name__]
    offset = FAMILIES[family].norm_offset  # Gemma's norms scale by 1 + weight
    # norm weights by name, or by their module's class where the name does not say (GPT-2's ln_1)
    norms = {f"{m}.weight" for m, mod in model.named_modules() if "Norm" in type(mod).__name__}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ("norm" in name or name in norms) and not name.endswith("bias"):  # 1 + 0.3 randn
                param.copy_(1 - offset + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0, 0.1)
            else:
                param.normal_(0, std)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def allocated_peak(run: Callable[[], object]) -> int:
    """The most bytes torch's allocator held at once while ``run()`` ran, counted from its start:
    the running sum of the profiler's allocation (+) and free (-) events (``torch.profiler``
    with ``profile_memory``). What a device allocator would have to hold beyond what was
    allocated before the call (weights, inputs). The resident set size of the process is no
    good for this: at a few MB it moves by allocator and kernel bookkeeping as much as by
    tensors."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        run()
    events = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak
