"""Edits of head outputs composed: what lets a handle keep several active at once.

An edit is anything with the ``HeadEdit`` protocol of ``interp_seal.interventions``
(``check_model``, ``active_layers``, ``uses_values``, ``edit``); this module only composes
them, so that ``ModelHandle.edit`` can keep several active at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass(frozen=True, eq=False)
class ComposedEdit:
    """Edits applied one after another, ``edits[0]`` last: ``z -> e0(e1(...en(z)))``.

    The order is that of nested ``handle.edit`` blocks: the outermost edit is part of the model
    being analysed, so it acts last, nearest ``o_proj``, exactly as if it were merged into
    ``o_proj``'s weights (``interp_seal.tuning.merge``); an inner edit (an analysis's own
    ablation) acts on the head outputs first. A ``HeadEdit``.
    """

    edits: tuple  # of HeadEdit (interp_seal.interventions.head_edit)
    _layers: tuple = field(init=False, repr=False)  # each edit's active layers, found once

    def __post_init__(self):
        object.__setattr__(self, "_layers", tuple(frozenset(e.active_layers()) for e in self.edits))

    def check_model(self, spec, model_name: str) -> None:
        for e in self.edits:
            e.check_model(spec, model_name)

    def active_layers(self) -> list[int]:
        return sorted(frozenset().union(*self._layers))

    def uses_values(self, layer: int) -> bool:
        return any(e.uses_values(layer) for e in self.edits)

    def edit(
        self, layer: int, z: Tensor, v: Tensor | None = None, *, window: int | None = None
    ) -> Tensor:
        for e, layers in zip(reversed(self.edits), reversed(self._layers), strict=True):
            if layer in layers:
                z = e.edit(layer, z, v, window=window)
        return z
