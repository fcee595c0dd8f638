"""Checks ``load_model`` runs before any weight is read: fail at once, and say how to fix it.

- **A local checkpoint directory** (``check_checkpoint_dir``): ``config.json`` must be a JSON
  object and every ``*.safetensors`` file must have a complete header that covers the whole
  file; once the config names a supported family, a tokenizer file must be there
  (``check_tokenizer_files``). A copy cut short or overwritten with other bytes fails
  here, naming the file, instead of as a ``SafetensorError`` traceback from deep inside
  ``from_pretrained``. Reading a header costs microseconds (safetensors maps the file).
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

import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import huggingface_hub
import torch
from huggingface_hub import constants
from safetensors import SafetensorError, safe_open

# any one of these makes a checkpoint directory's tokenizer loadable
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
HUB_TIMEOUT_S = 3.0


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


class CheckpointError(ValueError):
    """A checkpoint directory whose files are missing, truncated or corrupt."""


def check_checkpoint_dir(directory: str | Path) -> None:
    """Raise ``CheckpointError`` unless ``directory`` holds a readable checkpoint's files."""
    directory = Path(directory)
    resave = (
        "save the checkpoint again (model.save_pretrained(dir), tokenizer.save_pretrained(dir)) "
        "or copy it again from its source"
    )
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"{directory / 'config.json'} is not valid JSON ({err}); the checkpoint is corrupt: "
            f"{resave}."
        ) from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{directory / 'config.json'} is not a JSON object; {resave}.")
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
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError as err:
            raise CheckpointError(
                f"{file} is truncated or corrupt (safetensors: {err}), so the model's weights "
                f"cannot be read; {resave}."
            ) from None


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
    """Raise ``FileNotFoundError`` (fast) for a hub name that is neither cached nor reachable."""
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
