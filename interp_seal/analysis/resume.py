"""Sweep results on disk as they are computed, so a killed sweep resumes where it stopped.

An output directory holds two files:

- ``manifest.json``: what the sweep is (model, per-length fingerprints of the tokenised samples,
  a fingerprint of every intervention in order, and the human-readable arguments). A sweep
  restarted on the directory must have the same manifest, or it refuses rather than mix results
  of different sweeps.
- ``records.jsonl``: one line per finished (length, sample, unit) with its metrics, appended
  and flushed after every forward. A line cut short by a kill is dropped on reading.

Batch sizes are not part of the manifest: they change how work is grouped, not the results.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from interp_seal.analysis.records import append_records, read_records
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Encoded

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
RecordKey = tuple[int, int, int]  # (length, sample, unit)


def sweep_manifest(
    handle: ModelHandle,
    encoded: Mapping[int, Sequence[Encoded]],
    interventions: Sequence[HeadIntervention],
    labels: Sequence[Mapping],
    args: Mapping,
) -> dict:
    """The identity of a sweep: same manifest, same results."""
    per_length = {}
    for length, batch in encoded.items():
        samples = hashlib.sha256()
        for enc in batch:
            samples.update(enc.input_ids.numpy().tobytes())
            samples.update(str(enc.answer_start).encode())
        per_length[str(length)] = f"{len(batch)} samples, sha256 {samples.hexdigest()[:16]}"
    units = hashlib.sha256(json.dumps([dict(x) for x in labels], default=str).encode())
    for iv in interventions:
        for tensor in (iv.scale, iv.offset, iv.uniform):
            data = b"-" if tensor is None else tensor.detach().cpu().double().numpy().tobytes()
            units.update(data)
    return {
        "model": handle.name_or_path,
        "geometry": handle.spec.as_dict(),
        "dtype": str(handle.dtype),
        "samples": per_length,
        "units": f"{len(interventions)} interventions, sha256 {units.hexdigest()[:16]}",
        "args": json.loads(json.dumps(dict(args), default=str)),
    }


class SweepStore:
    """The records of one sweep in ``out``; ``open`` checks the manifest."""

    def __init__(self, out: Path):
        self.out = out

    @classmethod
    def open(cls, out: str | Path, manifest: dict, *, resume: bool) -> SweepStore:
        """Start a sweep in ``out``, or continue the one there (``resume``) if it is the same."""
        out = Path(out)
        path = out / MANIFEST
        if path.exists():
            old = json.loads(path.read_text())
            if not resume:
                raise ValueError(
                    f"{out} already holds a sweep; pass resume=True (--resume) to continue it, "
                    "or choose another output directory"
                )
            if old != manifest:
                raise ValueError(
                    f"{out} holds a sweep made with different arguments, refusing to mix "
                    f"results ({_differences(old, manifest)}); use another output directory "
                    "or delete this one to start over"
                )
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(manifest, indent=1))
        return cls(out)

    def load(self) -> dict[RecordKey, dict]:
        """Finished records by (length, sample, unit); drops a last line cut short by a kill."""
        return {
            (rec["length"], rec["sample"], rec["unit"]): rec
            for rec in read_records(self.out / RECORDS)
        }

    def append(self, records: Iterable[dict]) -> None:
        """Append records and flush them to disk before returning (call ``load`` first)."""
        append_records(self.out / RECORDS, records)


def _differences(old: dict, new: dict) -> str:
    """``key: old -> new`` for the manifest entries that differ."""
    parts = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if key == "args" and isinstance(a, dict) and isinstance(b, dict):
            parts += [
                f"{k}: {a.get(k)!r} -> {b.get(k)!r}"
                for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)
            ]
        elif a != b:
            parts.append(f"{key}: {a!r} -> {b!r}")
    return "; ".join(parts)
