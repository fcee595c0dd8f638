"""The dashboard's state: one serialisable object, and the pure transitions a click makes.

Everything a view shows follows from ``DashboardState``: which heads are edited and by how
much, the scale factor the slider holds, the locked head, and the record whose direct logit
attribution is shown. It round-trips through JSON (``to_json`` / ``from_json``), so a view can
be shared and restored; ``from_json`` checks every field (types, ranges, heads inside the
model, the record inside the dashboard's records) before anything is applied, and names the
first bad field in one message: a bad state changes nothing.

A head's edit is one factor on its output (the scale primitive, docs/design.md Sec. 3): 0 prunes it
(SEAL Sec. 3.1), any other value scales it (SEAL Sec. 3.2). A click cycles keep -> prune ->
scale (by the slider's factor) -> keep.

Besides the edits, each KV head attends either to its whole prefix (full) or to its first
``sink`` and last ``window`` positions (streaming, ``models.streaming_heads``; DuoAttention /
RazorAttention): ``streaming`` lists the streaming KV heads, and a click in stream mode
toggles one (under grouped-query attention, with all the query heads that read it). States
saved before streaming heads existed load with every head full.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from interp_seal.inputs import parse_json
from interp_seal.interventions import Head
from interp_seal.models import ModelSpec, StreamingHeads

FORMAT = "interp-seal/dashboard/v1"
FACTOR_RANGE = (0.0, 2.0)
"""The factors the slider offers; a head's edit factor lies in the same range."""
SINK, WINDOW = 4, 64
"""Streaming heads' default sizes: the organism's dashboard prompts run 250-2200 tokens (10-160
lines), so a 64-token window holds about five lines, and four sinks the prompt's first tokens."""

KVHead = tuple[int, int]  # (layer, KV head)


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
        streaming: ``((layer, kv_head), ...)`` on sink + window attention, in the order they
            were switched; every other KV head attends to its whole prefix.
        sink, window: the streaming heads' first and most recent positions seen.
    """

    model: str
    geometry: dict
    edits: tuple[tuple[int, int, float], ...] = ()
    factor: float = 0.9
    selected: Head | None = None
    dla_length: int = 0
    dla_record: int = 0
    streaming: tuple[KVHead, ...] = ()
    sink: int = SINK
    window: int = WINDOW

    def __post_init__(self):
        spec = ModelSpec(**self.geometry)
        object.__setattr__(self, "streaming", tuple((int(a), int(b)) for a, b in self.streaming))
        for kv in self.streaming:
            check_kv_head(spec, kv)
        if len(set(self.streaming)) != len(self.streaming):
            raise ValueError("each KV head streams once; the state lists a KV head twice")
        check_sizes(self.sink, self.window)
        for layer, head, factor in self.edits:
            check_head(spec, (layer, head))
            check_factor(factor, f"head L{layer}H{head}'s factor")
        check_factor(self.factor, "the slider's factor")
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

    def attention(self) -> StreamingHeads | None:
        """The streaming KV heads as ``compress_kv`` takes them (None: every head full)."""
        if not self.streaming:
            return None
        return StreamingHeads(heads=frozenset(self.streaming), sink=self.sink, window=self.window)

    def computed(self) -> tuple:
        """What the accuracy and attribution depend on: the edits and the attention mode."""
        return self.edits, self.attention()

    def kv_head(self, head: Head) -> KVHead:
        """The KV head query head ``head`` reads (``head // group`` under GQA)."""
        check_head(self.spec, head)
        return int(head[0]), int(head[1]) // self.spec.group_size

    def stream_toggled(self, head: Head) -> DashboardState:
        """A click in stream mode on query head ``head``: its KV head switches between full
        and streaming attention; locks ``head``."""
        kv = self.kv_head(head)
        on = [h for h in self.streaming if h != kv]
        if len(on) == len(self.streaming):
            on.append(kv)
        return replace(self, streaming=tuple(on), selected=(int(head[0]), int(head[1])))

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
        data["streaming"] = [list(kv) for kv in self.streaming]
        return json.dumps({"format": FORMAT, **data}, sort_keys=True)

    @classmethod
    def from_json(
        cls,
        text: str,
        spec: ModelSpec | None = None,
        *,
        records: dict[int, int] | None = None,
    ) -> DashboardState:
        """Parse a saved view, checking each field; ``ValueError`` names the first bad one.

        With ``spec``, refuse a view made for another geometry; with ``records`` (number of
        records per length of the dashboard), refuse a DLA record the dashboard does not have.
        """
        if not isinstance(text, str | bytes):
            raise ValueError(f"the dashboard state must be JSON text, got {type(text).__name__}")
        data = parse_json(text, "the dashboard state", fix="copy it from a dashboard's 'state' box")
        if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
            raise ValueError(
                f"this is not a dashboard state (expected a JSON object with format={FORMAT!r});"
                " copy it from a dashboard's 'state' box"
            )
        fields = set(cls.__dataclass_fields__)
        unknown, missing = set(data) - fields, {"model", "geometry"} - set(data)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)} in the dashboard state")
        if missing:
            raise ValueError(f"the dashboard state lacks the fields {sorted(missing)}")
        if not isinstance(data["model"], str):
            raise ValueError(f"state field 'model' must be a string, got {data['model']!r}")
        if not isinstance(data["geometry"], dict):
            raise ValueError("state field 'geometry' must be an object (the model's geometry)")
        if spec is not None and data["geometry"] != spec.as_dict():
            raise ValueError(
                f"the state was made for a model with geometry {data.get('geometry')}, but this "
                f"model has {spec.as_dict()}; head edits only apply to the geometry they were "
                "made for"
            )
        try:
            spec = spec or ModelSpec(**data["geometry"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"state field 'geometry' is not a model geometry ({err})") from None
        edits = _field_list(data.get("edits", []), "edits")
        parsed = []
        for i, edit in enumerate(edits):
            entry = _field_list(edit, f"edits[{i}]")
            if len(entry) != 3:
                raise ValueError(f"state field 'edits[{i}]' must be [layer, head, factor]")
            head = _head(entry[:2], spec, f"edits[{i}]")
            parsed.append((*head, _factor(entry[2], f"edits[{i}] factor")))
        data["edits"] = tuple(parsed)
        if "factor" in data:
            data["factor"] = _factor(data["factor"], "factor")
        if data.get("selected") is not None:
            data["selected"] = _head(_field_list(data["selected"], "selected"), spec, "selected")
        for name in ("dla_length", "dla_record", "sink", "window"):
            if name in data:
                data[name] = _int(data[name], name)
        try:
            check_sizes(data.get("sink", SINK), data.get("window", WINDOW))
        except ValueError as err:
            raise ValueError(f"state fields 'sink' / 'window': {err}") from None
        streaming = []
        for i, kv in enumerate(_field_list(data.get("streaming", []), "streaming")):
            entry = _field_list(kv, f"streaming[{i}]")
            if len(entry) != 2:
                raise ValueError(f"state field 'streaming[{i}]' must be [layer, kv_head]")
            pair = (
                _int(entry[0], f"streaming[{i}] layer"),
                _int(entry[1], f"streaming[{i}] kv_head"),
            )
            try:
                check_kv_head(spec, pair)
            except ValueError as err:
                raise ValueError(f"state field 'streaming[{i}]': {err}") from None
            streaming.append(pair)
        data["streaming"] = tuple(streaming)
        if records is not None:
            length = data.setdefault("dla_length", max(records))
            if length not in records:
                raise ValueError(
                    f"state field 'dla_length' is {length}, but the dashboard's lengths are "
                    f"{sorted(records)}"
                )
            record = data.get("dla_record", 0)
            if not 0 <= record < records[length]:
                raise ValueError(
                    f"state field 'dla_record' is {record}, but the dashboard has records "
                    f"0..{records[length] - 1} at {length} lines"
                )
        return cls(**data)


def _field_list(value, name: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"state field {name!r} must be a list, got {value!r}")
    return value


def _int(value, name: str) -> int:
    """A JSON integer (not a bool, not 0.7)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"state field {name!r} must be a whole number, got {value!r}")
    return value


def _head(value: Sequence, spec: ModelSpec, name: str) -> Head:
    if len(value) != 2:
        raise ValueError(f"state field {name!r} must be [layer, head], got {value!r}")
    head = (_int(value[0], f"{name} layer"), _int(value[1], f"{name} head"))
    try:
        check_head(spec, head)
    except ValueError as err:
        raise ValueError(f"state field {name!r}: {err}") from None
    return head


def _factor(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"state field {name!r} must be a number, got {value!r}")
    check_factor(float(value), f"state field {name!r}")
    return float(value)


def check_factor(factor: float, name: str) -> None:
    """Raise unless ``factor`` is a finite number in ``FACTOR_RANGE`` (the slider's range)."""
    low, high = FACTOR_RANGE
    if not (math.isfinite(factor) and low <= factor <= high):
        raise ValueError(
            f"{name} is {factor}; use a finite factor in {low:g}..{high:g} (0 prunes the head, "
            "1 keeps it)"
        )


def check_sizes(sink: int, window: int) -> None:
    """Raise unless ``sink >= 0`` and ``window >= 1`` (``StreamingHeads``' own rule)."""
    if sink < 0 or window < 1:
        raise ValueError(
            f"streaming heads see the first sink >= 0 and the last window >= 1 positions; got "
            f"sink {sink}, window {window}"
        )


def check_kv_head(spec: ModelSpec, kv) -> None:
    """Raise unless ``kv`` is a ``(layer, kv_head)`` of a model of geometry ``spec``."""
    layer, index = (int(x) for x in kv)
    if not (0 <= layer < spec.n_layers and 0 <= index < spec.n_kv_heads):
        raise ValueError(
            f"KV head L{layer} KV{index} does not exist: the model has {spec.n_layers} layers x "
            f"{spec.n_kv_heads} KV heads"
        )


def check_head(spec: ModelSpec, head) -> None:
    """Raise unless ``head`` is a ``(layer, head)`` of a model of geometry ``spec``."""
    layer, index = (int(x) for x in head)
    if not (0 <= layer < spec.n_layers and 0 <= index < spec.n_heads):
        raise ValueError(
            f"head L{layer}H{index} does not exist: the model has {spec.n_layers} layers x "
            f"{spec.n_heads} heads (layers 0..{spec.n_layers - 1}, heads 0..{spec.n_heads - 1})"
        )
