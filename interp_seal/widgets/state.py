"""The dashboard's state: one serialisable object, and the pure transitions a click makes.

Everything a view shows follows from ``DashboardState``: which heads are edited and by how
much, the scale factor the slider holds, the locked head, and the record whose direct logit
attribution is shown. It round-trips through JSON (``to_json`` / ``from_json``), so a view can
be shared and restored; ``from_json`` checks the geometry and every head against the model
before anything is applied.

A head's edit is one factor on its output (the scale primitive, docs/design.md Sec. 3): 0 prunes it
(SEAL Sec. 3.1), any other value scales it (SEAL Sec. 3.2). A click cycles keep -> prune ->
scale (by the slider's factor) -> keep.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from interp_seal.models import ModelSpec

FORMAT = "interp-seal/dashboard/v1"
Head = tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class DashboardState:
    """What the dashboard shows.

    Attributes:
        model: name or path of the model the edits are for.
        geometry: that model's ``ModelSpec.as_dict()``.
        edits: ``((layer, head, factor), ...)`` in the order they were made.
        factor: the factor a click's "scale" step applies (the slider).
        selected: the locked head, or None.
        dla_length: length of the record whose logit attribution is shown.
        dla_record: its index among that length's records.
    """

    model: str
    geometry: dict
    edits: tuple[tuple[int, int, float], ...] = ()
    factor: float = 0.9
    selected: Head | None = None
    dla_length: int = 0
    dla_record: int = 0

    def __post_init__(self):
        spec = ModelSpec(**self.geometry)
        for layer, head, factor in self.edits:
            check_head(spec, (layer, head))
            if not factor >= 0 or factor == float("inf"):
                raise ValueError(f"head L{layer}H{head} has factor {factor}; use a finite >= 0")
        if len({(a, b) for a, b, _ in self.edits}) != len(self.edits):
            raise ValueError("each head may be edited once; the state lists a head twice")
        if self.selected is not None:
            check_head(spec, self.selected)

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(**self.geometry)

    def table(self) -> dict[Head, float]:
        """``{(layer, head): factor}``, the scale table of the edits."""
        return {(layer, head): factor for layer, head, factor in self.edits}

    def with_edit(self, head: Head, factor: float | None) -> DashboardState:
        """The state with ``head`` set to ``factor`` (None: no edit), keeping the edit order."""
        check_head(self.spec, head)
        edits = [e for e in self.edits if (e[0], e[1]) != tuple(head)]
        if factor is not None and factor != 1:
            kept = [e for e in self.edits if (e[0], e[1]) == tuple(head)]
            position = self.edits.index(kept[0]) if kept else len(edits)
            edits.insert(position, (int(head[0]), int(head[1]), float(factor)))
        return replace(self, edits=tuple(edits))

    def cycled(self, head: Head) -> DashboardState:
        """A click on ``head``: keep -> prune -> scale by ``factor`` -> keep; locks it."""
        current = self.table().get(tuple(head))
        if current is None:
            nxt = 0.0
        elif current == 0:
            nxt = self.factor
        else:
            nxt = None
        return replace(self.with_edit(head, nxt), selected=(int(head[0]), int(head[1])))

    def to_json(self) -> str:
        data = asdict(self)
        data["edits"] = [list(e) for e in self.edits]
        data["selected"] = list(self.selected) if self.selected is not None else None
        return json.dumps({"format": FORMAT, **data}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, spec: ModelSpec | None = None) -> DashboardState:
        """Parse a saved view; with ``spec``, refuse one made for another geometry."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"the dashboard state is not valid JSON ({err})") from None
        if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
            raise ValueError(
                f"this is not a dashboard state (expected a JSON object with format={FORMAT!r});"
                " copy it from a dashboard's 'state' box"
            )
        fields = set(cls.__dataclass_fields__)
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)} in the dashboard state")
        if spec is not None and data.get("geometry") != spec.as_dict():
            raise ValueError(
                f"the state was made for a model with geometry {data.get('geometry')}, but this "
                f"model has {spec.as_dict()}; head edits only apply to the geometry they were "
                "made for"
            )
        data["edits"] = tuple((int(a), int(b), float(f)) for a, b, f in data.get("edits", ()))
        if data.get("selected") is not None:
            data["selected"] = tuple(int(x) for x in data["selected"])
        try:
            return cls(**data)
        except TypeError as err:
            raise ValueError(f"the dashboard state is incomplete ({err})") from None


def check_head(spec: ModelSpec, head) -> None:
    """Raise unless ``head`` is a ``(layer, head)`` of a model of geometry ``spec``."""
    layer, index = (int(x) for x in head)
    if not (0 <= layer < spec.n_layers and 0 <= index < spec.n_heads):
        raise ValueError(
            f"head L{layer}H{index} does not exist: the model has {spec.n_layers} layers x "
            f"{spec.n_heads} heads (layers 0..{spec.n_layers - 1}, heads 0..{spec.n_heads - 1})"
        )
