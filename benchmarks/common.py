"""What every benchmark shares: the model it measures, where it runs, and the clock it reads.

The model is the bundled model organism when its checkpoint exists (the numbers in the issues'
notes are on it), else a random GQA Llama of the organism's geometry (4 layers, 8 query heads,
2 KV heads) saved in a temporary directory and loaded through ``load_model`` like any checkpoint.

Every benchmark takes ``--device`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``auto``) and
``--dtype`` (``float32``, ``bfloat16``, ``float16``), passed to ``load_model``, and times with one
``Clock``:

- on the CPU, the CPU seconds of this process (``time.process_time``): with one torch thread
  they do not depend on what else runs on a shared machine (``wall=True`` reads wall seconds
  instead, for the benchmarks that always did);
- on a GPU, wall seconds (``time.perf_counter``) read after waiting for the device's queued work
  (``torch.cuda.synchronize`` / ``torch.mps.synchronize``): CUDA kernels run asynchronously,
  so the CPU seconds of the launching process say nothing about them.

Every RESULT line ends with ``result_tags``: ``device=<device> dtype=<dtype> clock=<cpu_s or
wall_s>``, the last saying which seconds its ``*_s`` keys are (a key named ``..._cpu_s`` holds
wall seconds on a GPU).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from interp_seal.cli.common import DTYPES
from interp_seal.cli.common import add_device_arguments as cli_device_arguments
from interp_seal.models import ModelHandle, ModelSpec, load_model
from interp_seal.models.load import ORGANISM_DIR
from interp_seal.testing import save_random_checkpoint

T = TypeVar("T")


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--dtype``, as every ``interp-seal`` command that loads a model has
    (in float32 a benchmark's two paths must agree exactly, in bfloat16 / float16 their
    disagreements are counted instead)."""
    cli_device_arguments(parser, device_map=False)


def load(name_or_path: str | Path, *, device: str = "cpu", dtype: str = "float32") -> ModelHandle:
    """``load_model`` with a benchmark's ``--device`` and ``--dtype`` (a dtype's name)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return load_model(name_or_path, device=device, dtype=getattr(torch, dtype))


def benchmark_model(
    tmp: str | Path,
    *,
    d_head: int = 32,
    device: str = "cpu",
    dtype: str = "float32",
    family: str | None = None,
) -> tuple[ModelHandle, str]:
    """``(handle, description)`` of the model a benchmark runs on, on ``device`` in ``dtype``:
    the organism, or with ``family`` a random checkpoint of that family (``FAMILIES``, with its
    row's test particulars: Gemma 2's soft-caps, ...) of the organism's geometry."""
    if family is None and (ORGANISM_DIR / "config.json").exists():
        return load("organism", device=device, dtype=dtype), "organism"
    family = family or "llama"
    path = save_random_checkpoint(
        Path(tmp) / "random", family, n_layers=4, n_heads=8, n_kv_heads=2, d_head=d_head
    )
    handle = load(path, device=device, dtype=dtype)
    return handle, model_tag(family, handle.spec)


def model_tag(family: str, spec: ModelSpec) -> str:
    """``random-<family>-<layers>x<heads>-<attention>-dhead<d_head>``, the ``model=`` of a random
    checkpoint's RESULT line, from its geometry: attention ``gqa`` (2 to ``heads - 1`` KV
    heads), ``mqa`` (one) or ``mha`` (one per query head: GPT-2 and GPT-NeoX, whose rows drop
    the KV-head count a benchmark asks for)."""
    if spec.n_kv_heads == spec.n_heads:
        attention = "mha"
    else:
        attention = "mqa" if spec.n_kv_heads == 1 else "gqa"
    return f"random-{family}-{spec.n_layers}x{spec.n_heads}-{attention}-dhead{spec.d_head}"


def add_family_argument(parser: argparse.ArgumentParser) -> None:
    """``--family``: run on a random checkpoint of that family instead of the organism."""
    from interp_seal.models import FAMILIES

    parser.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        help="a random checkpoint of this family (organism geometry) instead of the organism",
    )


class Clock:
    """Seconds on ``device``: CPU seconds of this process on the CPU (wall seconds if ``wall``),
    wall seconds after synchronising the device on a GPU. Call it for a reading."""

    def __init__(self, device: str | torch.device, *, wall: bool = False):
        self.device = torch.device(device)
        self.wall = wall or self.device.type != "cpu"

    @property
    def unit(self) -> str:
        """``"CPU s"`` or ``"wall s"``, for the lines a benchmark prints."""
        return "wall s" if self.wall else "CPU s"

    def __call__(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()
        return time.perf_counter() if self.wall else time.process_time()


def timed(fn: Callable[..., T], *args, clock: Clock, repeat: int = 1, **kwargs) -> tuple[T, float]:
    """``(fn(*args, **kwargs), seconds)``: the least seconds on ``clock`` over ``repeat`` calls,
    and the last call's result."""
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        result = fn(*args, **kwargs)
        best = min(best, clock() - start)
    return result, best


def result_tags(args: argparse.Namespace, clock: Clock) -> str:
    """The keys every RESULT line ends with: where it ran (``clock``'s device, ``auto``
    resolved), in which ``--dtype``, and which seconds its times are."""
    return f"device={clock.device} dtype={args.dtype} clock={'wall_s' if clock.wall else 'cpu_s'}"


def check_agreement(mismatches: list[str], *, dtype: str, what: str) -> int:
    """The benchmark's two paths agree: in float32 exactly (``AssertionError`` naming the first
    mismatch otherwise); in bfloat16 / float16 they round in different orders, so mismatches
    are printed and their number returned (docs/design.md, Precision)."""
    if mismatches and dtype == "float32":
        raise AssertionError(f"{what}: {len(mismatches)} disagree; first: {mismatches[0]}")
    if mismatches:
        print(f"{what}: {len(mismatches)} disagree in {dtype}; first: {mismatches[0]}")
    return len(mismatches)
