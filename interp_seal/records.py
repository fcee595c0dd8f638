"""The one record store under every resumable run: append-only JSONL, a manifest, a fingerprint.

Long runs (ablation sweeps, retrieval scores, masking conditions, figure data) append one JSON
record per finished unit of work and flush it to disk before going on, so a killed run (even
``kill -9``) loses at most the unit in flight. On restart the file is read back; a last line
cut short by the kill is dropped (and truncated away); any other unreadable line is an error
rather than a silent gap.

What a run *is* (model, samples, arguments) is written once, atomically, to a manifest beside
the records; a run restarted on the same directory must have the same manifest or it refuses
rather than mix results of different runs. Records may also carry their own key and
fingerprint (``get`` / ``add``): a restart skips finished keys and refuses a key whose inputs
changed, or, inside ``recompute_changed``, computes it again and appends the new record (the
last record of a key is the one read). ``fingerprint`` is the one hash of run identities across the library (sweeps, retrieval
scores, masking, tuning checkpoints).

Under torchrun (``interp_seal.shards``) each rank appends to its own file beside the run's
(``records.rank1.jsonl`` for ``records.jsonl``), so no two processes write one file; every
rank reads all of them, so a run resumes whatever its number of processes, and rank 0 folds
the rank files into the run's file when the run is complete (``merge``).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from interp_seal.inputs import RESTART, check_input_file, parse_json, read_json
from interp_seal.outputs import atomic_path, write_text
from interp_seal.shards import Shard

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"


def fingerprint(*parts) -> str:
    """A short stable hash (sha256, 16 hex digits) of ``parts``.

    ``parts`` are JSON-able values, tensors or arrays (hashed by dtype, shape and bytes).
    """
    digest = hashlib.sha256()

    def encode(value):
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            digest.update(f"{value.dtype}{value.shape}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
            return "<array>"
        raise TypeError(f"cannot fingerprint a {type(value).__name__}")

    digest.update(json.dumps(parts, sort_keys=True, default=encode).encode())
    return digest.hexdigest()[:16]


START_OVER = "delete the file to start over"
_RECOMPUTE = contextvars.ContextVar("recompute_changed", default=False)


@contextmanager
def recompute_changed() -> Iterator[None]:
    """Inside the block, ``RecordStore.get`` treats a record whose inputs changed as not yet
    computed (with a warning naming the store) instead of refusing it: its key is computed
    again and the new record appended, and the later record of a key is the one read.

    For stores whose run is identified as a whole elsewhere and whose readers notice a record
    that changed: a gallery's (``run.json`` holds its model and sizes, and a figure whose rows
    changed is recomputed, ``figures.inputs``), where a declared change of design (a plan
    amendment that hides the needles in another haystack) must recompute the records it
    touches and only those. Elsewhere a changed record is an error: a results file reused for
    another model or other samples.
    """
    token = _RECOMPUTE.set(True)
    try:
        yield
    finally:
        _RECOMPUTE.reset(token)


def read_records(path: str | Path, *, repair: bool = True) -> list[dict]:
    """The complete records of ``path`` (none if it does not exist).

    A last line cut short by a kill is skipped, and with ``repair`` truncated away (only the
    file's writer may repair it: another rank may be appending to it right now).
    """
    path = Path(path)
    if not path.exists():
        return []
    data = check_input_file(path, "record file").read_bytes()
    if not data.endswith(b"\n"):  # interrupted write: keep the complete lines
        data = data[: data.rfind(b"\n") + 1]
        if repair:  # atomically: another rank may be reading the file right now
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
    records = []
    for lineno, raw in enumerate(data.splitlines(), 1):
        record = parse_json(raw, f"{path}:{lineno}", fix=f"damaged? {START_OVER}")
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{lineno} is not a JSON object; {START_OVER}")
        records.append(record)
    return records


def check_fields(path: Path, records: list[dict], fields: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the first record of ``path`` that lacks one of ``fields``."""
    for lineno, record in enumerate(records, 1):
        missing = [name for name in fields if name not in record]
        if missing:
            raise ValueError(
                f"{path}:{lineno} lacks the fields {missing} (damaged, or written by another "
                "program); delete the file to start over"
            )


def append_records(path: str | Path, records: Iterable[dict]) -> None:
    """Append ``records`` to ``path`` and flush them to disk before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(json.dumps(rec) + "\n" for rec in records)
        f.flush()
        os.fsync(f.fileno())


class RecordStore:
    """The records of one run in a JSONL file, optionally under a manifest.

    ``RecordStore.open(out, manifest, resume=...)`` keeps ``out/records.jsonl`` under
    ``out/manifest.json``; ``RecordStore(path)`` is a bare record file whose records carry
    their own ``key`` and ``fingerprint``. Under torchrun this process appends to its rank's
    file (``own``) and reads every rank's.
    """

    def __init__(self, path: str | Path, shard: Shard | None = None):
        self.path = Path(path)
        self.shard = shard or Shard.current()
        self.own = self.path if self.shard.world == 1 else self._rank_file(self.shard.rank)
        self._by_key: dict[str, dict] | None = None

    @classmethod
    def open(cls, out: str | Path, manifest: dict, *, resume: bool) -> RecordStore:
        """Start a run in directory ``out``, or continue the one there (``resume``) if it is
        the same run (equal manifests). Under torchrun rank 0 starts it, the others join."""
        store = cls(Path(out) / RECORDS)
        if store.shard.main:
            open_manifest(Path(out) / MANIFEST, manifest, resume=resume)
        store.shard.barrier()
        if not store.shard.main:
            open_manifest(Path(out) / MANIFEST, manifest, resume=True)
        return store

    def _rank_file(self, rank: int | str) -> Path:
        return self.path.with_name(f"{self.path.stem}.rank{rank}{self.path.suffix}")

    def files(self) -> list[Path]:
        """The run's file and every rank file beside it."""
        return [self.path, *sorted(self.path.parent.glob(self._rank_file("*").name))]

    def load(self, fields: Iterable[str] = ()) -> list[dict]:
        """The finished records of every file of the run; a last line cut short by a kill is
        dropped; ``ValueError`` naming the line if a record lacks one of ``fields``."""
        records = []
        for path in self.files():
            found = read_records(path, repair=path == self.own)
            check_fields(path, found, fields)
            records += found
        return records

    def merge(self) -> None:
        """Fold the rank files into the run's file: rank 0 does it once every rank has finished
        (after ``Shard.gather``); the other ranks do nothing."""
        if self.shard.main:
            lines = set()
            if self.path.exists():
                lines = {json.dumps(r) for r in read_records(self.path)}
            for path in self.files()[1:]:
                new = [r for r in read_records(path, repair=False) if json.dumps(r) not in lines]
                append_records(self.path, new)
                lines |= {json.dumps(r) for r in new}
                path.unlink()

    def append(self, records: Iterable[dict]) -> None:
        """Append records to this process's file and flush them to disk before returning."""
        records = list(records)
        append_records(self.own, records)
        if self._by_key is not None:
            self._by_key.update({rec["key"]: rec for rec in records})

    def get(self, key: str, fingerprint: str) -> dict | None:
        """The finished record of ``key``, or None; an error if its inputs differ (None with a
        warning inside ``recompute_changed``)."""
        if self._by_key is None:
            records = self.load(fields=("key", "fingerprint"))
            self._by_key = {rec["key"]: rec for rec in records}
        record = self._by_key.get(key)
        if record is not None and record["fingerprint"] != fingerprint:
            if _RECOMPUTE.get():
                warnings.warn(
                    f"{self.path}: {key!r} was computed on other inputs; computing it again",
                    stacklevel=2,
                )
                return None
            raise ValueError(
                f"{self.path} holds a result for {key!r} computed on a different input or "
                "setting (model, samples, options); write to a new output file or delete this one"
            )
        return record

    def add(self, record: dict) -> None:
        """Append one keyed record (with ``key`` and ``fingerprint`` fields)."""
        self.append([record])


def open_manifest(path: Path, manifest: dict, *, resume: bool, what: str = "run") -> None:
    """Write ``manifest`` (what a run is) to ``path`` atomically, or check that the one there is
    the same when continuing (``resume``); refuse to mix the results of different runs."""
    out = path.parent
    manifest = json.loads(json.dumps(manifest, default=str))  # as it reads back
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(manifest, indent=1))
        return
    old = read_json(path, "run manifest", fix=RESTART)
    if not resume:
        raise ValueError(
            f"{out} already holds a {what}; pass resume=True (--resume) to continue it, "
            "or choose another output directory"
        )
    if old != manifest:
        raise ValueError(
            f"{out} holds a {what} made with other arguments, refusing to mix results "
            f"(different arguments: {_differences(old, manifest)}); use another output "
            "directory or delete this one to start over"
        )


def _differences(old: dict, new: dict, prefix: str = "") -> str:
    """``key: old -> new`` for the manifest entries that differ (nested keys dotted)."""
    parts = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            parts.append(_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            parts.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return "; ".join(p for p in parts if p)
