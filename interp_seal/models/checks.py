"""Checks ``load_model`` runs before any weight is read: fail at once, and say how to fix it.

- **A local checkpoint directory** (``check_checkpoint_dir``): every file in it must be a
  regular file (a FIFO named ``config.json`` would block the read forever); ``config.json``
  must pass ``check_config``; every ``*.safetensors`` file must have a complete header that
  covers the whole file and hold floating-point weights only (an int8 or float8 tensor would
  be cast to float silently, giving wrong numbers); once the config names a supported family,
  a tokenizer file must be there (``check_tokenizer_files``). A copy cut short or overwritten
  with other bytes fails here, naming the file, instead of as a ``SafetensorError`` traceback
  from deep inside ``from_pretrained``. Reading a header costs microseconds (safetensors maps
  the file).
- **The config** (``check_config``, also on a cached hub model's ``config.json``): JSON within
  ``interp_seal.inputs``' limits, a ``model_type`` transformers knows, sizes that are whole
  numbers of a possible geometry (heads a multiple of KV heads, an even ``head_dim`` for RoPE),
  an activation transformers knows, finite positive RoPE bases and norm epsilons, typed RoPE
  scaling with the parameters its type needs, and no quantisation. Each problem is one line naming the file, the
  field and the fix, before transformers builds anything. ``check_vocabulary`` then checks the
  tokenizer against ``vocab_size``.
- **The loaded weights** (``check_loaded_weights``): transformers' own load report says which
  tensors the checkpoint lacks (they would be left randomly initialised), which it has that
  the model does not use, and which have the wrong shape; each is an error naming the tensor,
  and so is a weight holding NaN or infinity. Without this a checkpoint missing one ``o_proj``
  loads with a note and evaluates to exact match 0 with exit status 0.
- **A hub name** (``check_hub_name``): a model in the local Hugging Face cache loads as usual;
  one that is not cached cannot load while offline (``HF_HUB_OFFLINE=1``) or while the hub is
  unreachable, so say so at once. Without this the hub client spends ~28 s retrying before the
  same conclusion.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import huggingface_hub
import torch
import transformers
from huggingface_hub import constants
from safetensors import SafetensorError, safe_open
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from interp_seal.inputs import check_input_file, read_json
from interp_seal.models.spec import FAMILIES, UnsupportedModelError

# any one of these makes a checkpoint directory's tokenizer loadable
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
HUB_TIMEOUT_S = 3.0


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


class CheckpointError(ValueError):
    """A checkpoint directory whose files are missing, truncated or corrupt."""


RESAVE = (
    "save the checkpoint again (model.save_pretrained(dir), tokenizer.save_pretrained(dir)) or "
    "copy it again from its source"
)
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
"""The safetensors dtypes of weights interp-seal reads (anything else would be cast silently)."""


def check_checkpoint_dir(directory: str | Path) -> None:
    """Raise ``CheckpointError`` unless ``directory`` holds a readable checkpoint's files."""
    directory = Path(directory)
    for entry in sorted(directory.iterdir()):
        if not entry.is_dir():
            check_input_file(entry, "checkpoint file")
    check_config_file(directory / "config.json")
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles and not any(directory.glob("*.safetensors")):
        raise CheckpointError(
            f"{directory} holds its weights only as pickle files ({', '.join(pickles)}); "
            "interp-seal never unpickles weights (a pickle can run code when loaded). Convert "
            "them to safetensors where you trust the file, e.g. AutoModelForCausalLM."
            "from_pretrained(dir).save_pretrained(dir), then load the directory again."
        )
    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
        except SafetensorError as err:
            raise CheckpointError(
                f"{file} is truncated or corrupt (safetensors: {err}), so the model's weights "
                f"cannot be read; {RESAVE}."
            ) from None
        for name, dtype in dtypes.items():
            if dtype not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"{file}: weight {name} is stored as {dtype}, not as floating point; "
                    "quantised or integer weights are never cast to float silently (the numbers "
                    "would be wrong). Dequantise the model with the tool that quantised it and "
                    "save it in float16, bfloat16 or float32 (a GGUF file: load_model(path.gguf) "
                    "dequantises it explicitly)."
                )


FIX_CONFIG = "fix it in config.json (the value the model was trained with), or " + RESAVE


def check_config_file(path: str | Path) -> dict:
    """The checked config (``check_config``) read from the JSON file ``path``."""
    path = Path(path)
    try:
        config = read_json(path, "config file", fix=f"the checkpoint is damaged: {RESAVE}")
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object; {RESAVE}.")
    check_config(config, str(path))
    return config


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# config fields checked when present: what each must be, and the test
CONFIG_RULES: dict[str, tuple[str, Callable[[object], bool]]] = {
    **{
        name: ("a whole number >= 1", _whole)
        for name in (
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "hidden_size",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        )
    },
    "rms_norm_eps": ("a finite number >= 0", lambda v: _number(v) and v >= 0),
    "layer_norm_eps": ("a finite number >= 0", lambda v: _number(v) and v >= 0),
    "rope_theta": ("a finite number > 0", lambda v: _number(v) and v > 0),
    "partial_rotary_factor": ("a number in (0, 1]", lambda v: _number(v) and 0 < v <= 1),
    "hidden_act": (
        f"an activation transformers knows ({', '.join(sorted(ACT2FN))})",
        lambda v: isinstance(v, str) and v in ACT2FN,
    ),
}
ROPE_TYPES = ("default", *ROPE_INIT_FUNCTIONS)
# the parameters typed RoPE scalings need (transformers' modeling_rope_utils)
ROPE_NEEDS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
ROPE_RULES = {  # RoPE parameters checked when present
    "rope_theta": CONFIG_RULES["rope_theta"],
    "factor": ("a finite number >= 1", lambda v: _number(v) and v >= 1),
    "partial_rotary_factor": CONFIG_RULES["partial_rotary_factor"],
    "original_max_position_embeddings": CONFIG_RULES["max_position_embeddings"],
    **{
        name: ("a finite number > 0", lambda v: _number(v) and v > 0)
        for name in ("low_freq_factor", "high_freq_factor", "attention_factor")
    },
    **{name: ("a finite number", _number) for name in ("beta_fast", "beta_slow")},
    **{
        name: (
            "a list of finite numbers > 0",
            lambda v: isinstance(v, list) and all(_number(x) and x > 0 for x in v),
        )
        for name in ("short_factor", "long_factor")
    },
}


def check_config(config: dict, source: str) -> None:
    """Raise ``CheckpointError`` (``UnsupportedModelError`` for a model type transformers does not
    know) naming the first field of the raw ``config`` (read from ``source``) that is impossible."""

    def bad(field: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{source}: field {field!r} {problem}; {FIX_CONFIG}")

    model_type = config.get("model_type")
    if not (isinstance(model_type, str) and (model_type in CONFIG_MAPPING or "auto_map" in config)):
        raise UnsupportedModelError(
            f"{source}: field 'model_type' is {model_type!r:.40}, not a model type the installed "
            f"transformers {transformers.__version__} knows (the version the lock pins); "
            f"interp-seal supports {', '.join(sorted(FAMILIES))}: use a checkpoint of one of them"
        )
    quantized = config.get("quantization_config")
    if quantized is not None:
        method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized
        raise CheckpointError(
            f"{source}: field 'quantization_config' says the weights are quantised "
            f"({method!r:.40}); interp-seal reads float weights only and never dequantises "
            "silently: dequantise the model and save it in float16, bfloat16 or float32 without "
            "quantization_config (a GGUF file: load_model(path.gguf) dequantises it explicitly)"
        )
    _check_fields(config, CONFIG_RULES, "", bad)
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if _whole(heads) and _whole(kv) and heads % kv:
        raise bad(
            "num_key_value_heads",
            f"is {kv}, which does not divide num_attention_heads {heads}: an impossible model "
            "(each KV head serves the same number of query heads)",
        )
    head_dim, hidden = config.get("head_dim"), config.get("hidden_size")
    if head_dim is None and _whole(hidden) and _whole(heads):
        if hidden % heads:
            raise bad(
                "hidden_size",
                f"is {hidden}, not a multiple of num_attention_heads {heads}, and no head_dim "
                "is given: an impossible model",
            )
        head_dim = hidden // heads
    field = "rope_parameters" if config.get("rope_parameters") is not None else "rope_scaling"
    rope = config.get(field)  # transformers 5's, or the older name
    partial = "partial_rotary_factor" in config or (
        isinstance(rope, dict) and "partial_rotary_factor" in rope
    )
    if _whole(head_dim) and head_dim % 2 and not partial:
        raise bad("head_dim", f"is {head_dim}: RoPE rotates channel pairs, so it must be even")
    if rope is None:
        return
    if not isinstance(rope, dict):
        raise bad(field, f"must be an object of RoPE parameters, got {rope!r:.60}")
    nested = rope and all(isinstance(v, dict) or v is None for v in rope.values())
    for where, params in rope.items() if nested else [("", rope)]:
        name = f"{field}.{where}" if where else field
        if params is None:
            continue
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise bad(
                f"{name}.rope_type",
                f"is {kind!r:.40}, not a RoPE type transformers knows ({', '.join(ROPE_TYPES)})",
            )
        missing = [key for key in ROPE_NEEDS.get(kind, ()) if key not in params]
        if missing:
            raise bad(
                f"{name}.{missing[0]}",
                f"is missing: RoPE type {kind!r} needs {', '.join(ROPE_NEEDS[kind])}",
            )
        _check_fields(params, ROPE_RULES, f"{name}.", bad)


def _check_fields(values: dict, rules: dict, prefix: str, bad) -> None:
    for name, (what, test) in rules.items():
        value = values.get(name)
        if value is not None and not test(value):
            raise bad(
                f"{prefix}{name}", f"must be {what}, got {value!r:.60} ({type(value).__name__})"
            )


def check_vocabulary(source: str, config, tokenizer) -> None:
    """Raise ``CheckpointError`` if ``tokenizer`` makes ids the model has no embedding for."""
    size = len(tokenizer)
    if size > config.vocab_size:
        raise CheckpointError(
            f"{source}: field 'vocab_size' of config.json is {config.vocab_size}, but the "
            f"tokenizer has {size} tokens: ids {config.vocab_size}..{size - 1} would have no "
            "embedding. Use the tokenizer this model was trained with, or fix vocab_size "
            "(and the embedding) to cover it."
        )


def check_loaded_weights(source: str, model, loading_info: dict) -> None:
    """Raise ``CheckpointError`` naming the tensors the checkpoint at ``source`` lacked, had in
    excess or had in the wrong shape (``loading_info`` from ``from_pretrained``), or any
    parameter of ``model`` that is not finite."""
    problems = []
    for kind, what in (
        ("missing_keys", "lacks the weights"),
        ("unexpected_keys", "has weights the model does not use"),
    ):
        names = sorted(loading_info.get(kind) or ())
        if names:
            problems.append(f"{what} {_listed(names)}")
    mismatched = sorted(loading_info.get("mismatched_keys") or ())
    if mismatched:
        shapes = [
            f"{name} ({list(have)} in the file, {list(want)} in the model)"
            for name, have, want in mismatched
        ]
        problems.append(f"has weights of the wrong shape: {_listed(shapes)}")
    if problems:
        raise CheckpointError(
            f"the checkpoint {source} {'; it '.join(problems)}. Its config.json does not "
            "describe these weights: save the model again with save_pretrained, or fix the "
            "config's sizes."
        )
    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            bad = int((~torch.isfinite(param)).sum())
            raise CheckpointError(
                f"the checkpoint {source}: weight {name} holds {bad} NaN or infinite values of "
                f"{param.numel()}; every result computed with it would be NaN. Use the "
                "checkpoint from before the training step that diverged."
            )


def _listed(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_tokenizer_files(directory: str | Path) -> None:
    """Raise ``CheckpointError`` if checkpoint ``directory`` holds no tokenizer file."""
    directory = Path(directory)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(
            f"{directory} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save it "
            "next to the weights with tokenizer.save_pretrained(dir)."
        )


def hub_offline() -> bool:
    """True when the Hugging Face hub must not be contacted (``HF_HUB_OFFLINE`` and friends)."""
    flags = (os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(
        f.strip().lower() in ("1", "true", "yes", "on") for f in flags
    )


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub endpoint opens within ``timeout`` seconds."""
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_hub_name(name: str) -> None:
    """Raise ``FileNotFoundError`` (fast) for a hub name that is neither cached nor reachable;
    check a cached model's config (``check_config_file``)."""
    where = (
        "pass a local checkpoint directory, the bundled 'organism', or a model already in the "
        "Hugging Face cache"
    )
    try:
        cached = huggingface_hub.try_to_load_from_cache(name, "config.json")
    except ValueError as err:  # huggingface_hub's HFValidationError: not a valid repository id
        raise FileNotFoundError(
            f"model {name!r} is not a local checkpoint directory and not a valid hub name "
            f"({err}); {where}."
        ) from None
    if isinstance(cached, str):
        check_config_file(cached)
        return
    if hub_offline():
        raise FileNotFoundError(
            f"model {name!r} not found: it is not a local checkpoint directory and not in the "
            "Hugging Face cache, and the hub is switched off (offline: HF_HUB_OFFLINE is set). "
            f"Check the name, {where}, or unset HF_HUB_OFFLINE on a machine with network "
            "access to download it."
        )
    if not hub_reachable():
        raise FileNotFoundError(
            f"model {name!r} not found: it is not a local checkpoint directory and not in the "
            f"Hugging Face cache, and the hub ({constants.ENDPOINT}) cannot be reached (offline?). "
            f"Check the name, {where}, or download it on a machine with network access."
        )
