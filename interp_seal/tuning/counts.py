"""Trainable parameters as SEAL's Table 1 reports them: a count and a percentage of the base.

On LongChat-7B (32 layers, 32 heads, d_head 128, 6.74B parameters) SEAL-H trains 1,024 scales
("1.0K, 1.5e-5%"), SEAL-C 131,072 ("131.1K, 1.9e-3%"), SEAL-L rank-4 LoRA on q/k/v/o
``32 x 4 x 4 x (4096 + 4096)`` = 4.2M ("4.2M, 6.2e-2%") and SEAL-D the same plus one DoRA
magnitude per output row, 4.7M.
"""

from __future__ import annotations

from dataclasses import dataclass

from interp_seal.tuning.loop import Tuner


@dataclass(frozen=True, kw_only=True)
class ParameterCount:
    """Trainable parameters of a tuner and the size of the base model (SEAL, Table 1)."""

    trainable: int
    base: int

    @property
    def percent(self) -> float:
        return 100 * self.trainable / self.base

    @property
    def table_cell(self) -> str:
        """Table 1's ``Params. (#, %)`` cell, e.g. ``"131.1K, 1.9e-3%"``."""
        return f"{_human(self.trainable)}, {_scientific(self.percent)}%"


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _scientific(x: float) -> str:
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def parameter_count(tuner: Tuner) -> ParameterCount:
    """Trainable parameters of ``tuner`` against its base model's parameter count."""
    trainable = sum(p.numel() for p in tuner.trainable_state().values())
    return ParameterCount(trainable=trainable, base=tuner.base_parameters)
