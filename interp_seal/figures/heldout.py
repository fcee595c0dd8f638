"""Held out by construction: what a tuning saw is never what an evaluation scores.

SEAL's claim is that scales tuned on a few dozen samples help on *other* inputs: a needle the
scales were not tuned on, a record they never saw (SEAL Sec. 5, App. B.2); MuDAF trains on one
set of questions and reports another (Sec. 4.1). A gallery that evaluated its tuning data
would report memorisation as recovery, and would do so for every user's model. So every
sample of a gallery run is reduced to its *content units*, and the run refuses to go on
(``LeakError``) the moment a unit of any tuning set is also a unit of any evaluation set, in
either order of their making.

The units are what a leak would carry, per task (``units``):

- **line retrieval**: the record, i.e. its lines in order (a record seen in tuning, scored
  again). Single lines are not units: with LongChat's integer indices ``line 3: ... <12345>``
  recurs by chance between independent records and carries nothing of the record;
- **needles**: the needle sentence, its question, and the haystack text it is hidden in
  (``Sample.meta["haystack"]``, a digest of the whole text). Tuning needles are generated
  (``tasks.training_needles``) in generated haystacks, so none of SEAL's ten needles nor the
  bundled essays is ever tuned on;
- **passage questions**: the question with its answer, and every passage's text.

``Ledger`` keeps the units of every tuning set (under the name of what it tuned) and of every
evaluation (under the figure that scored it) in ``<out>/work/heldout/`` as digests, so a
resumed run checks against what earlier runs tuned and scored too; each figure's JSON records
its evaluation set and the tuning sets it met (``Ledger.summary``).

Units are shared between samples (ten needle sentences fill a grid of fifty needles), so a
set's size is counted in whole samples (``sample_id``), never in the units they add. A figure's
evaluation set is every sample it scored in the directory, by any run: a figure whose rows are
all stored makes no samples when it is drawn again, and what a plan amendment superseded stays
in the set the leak check covers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from interp_seal.outputs import write_text
from interp_seal.tasks.sample import Sample


class LeakError(RuntimeError):
    """A tuning set and an evaluation set share content (``Ledger``)."""


def _digest(kind: str, text: str) -> str:
    return hashlib.sha256(f"{kind}\0{text}".encode()).hexdigest()[:20]


def sample_id(sample: Sample) -> str:
    """One sample as a digest: its task, prompt and answer."""
    return _digest("sample", f"{sample.task}\0{sample.prompt}\0{sample.answer}")


def units(sample: Sample) -> set[str]:
    """The sample's content units (module docstring), as short digests."""
    if sample.task == "line_retrieval":
        lines = [x.strip() for x in sample.prompt.splitlines() if "REGISTER_CONTENT is <" in x]
        return {_digest("record", "\n".join(lines))}
    if sample.task == "needle":
        start, end = sample.needle
        return {
            _digest("needle", sample.prompt[start:end].strip()),
            _digest("question", sample.meta["question"]),
            _digest("haystack", sample.meta["haystack"]),
        }
    if sample.task == "passages":
        question = sample.meta.get("input", sample.prompt[-300:])
        out = {_digest("question", f"{question}\0{sample.answer.strip()}")}
        return out | {_digest("passage", sample.prompt[a:b].strip()) for a, b in sample.passages}
    raise ValueError(f"no content units for task {sample.task!r}")


class Ledger:
    """Tuning sets and evaluation sets of one gallery directory, kept disjoint.

    ``tuned(name, samples)`` and ``evaluated(figure, samples)`` record a set and raise
    ``LeakError`` when it shares a unit with any set of the other kind (recorded by this run
    or an earlier one in the same directory).
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.sets: dict[str, dict[str, set[str]]] = {"tuning": {}, "evaluation": {}}
        # each set's distinct samples (``sample_id``); ``None``: a file written before they
        # were kept, whose "samples" count is read as it stands
        self.ids: dict[str, dict[str, set[str] | None]] = {"tuning": {}, "evaluation": {}}
        self.counts: dict[tuple[str, str], int] = {}  # (kind, name) -> its distinct samples
        self.figure: str | None = None
        self.met: dict[str, set[str]] = {}  # figure -> tuning sets it used
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else ():
            doc = json.loads(path.read_text())
            self.sets[doc["kind"]][doc["name"]] = set(doc["units"])
            self.ids[doc["kind"]][doc["name"]] = set(doc["ids"]) if "ids" in doc else None
            self.counts[doc["kind"], doc["name"]] = doc["samples"]

    def tuned(self, name: str, samples: Iterable[Sample]) -> None:
        self._add("tuning", name, samples)
        self.used(name)

    def used(self, name: str) -> None:
        """Book the tuning set ``name`` as met by the current figure (a tuned model it reuses)."""
        if self.figure is not None:
            self.met.setdefault(self.figure, set()).add(name)

    def evaluated(self, figure: str | None, samples: Iterable[Sample]) -> None:
        self._add("evaluation", figure or "(outside a figure)", samples)

    def _add(self, kind: str, name: str, samples: Iterable[Sample]) -> None:
        samples = list(samples)
        new = set().union(*(units(x) for x in samples)) if samples else set()
        ids = {sample_id(x) for x in samples}
        other = "evaluation" if kind == "tuning" else "tuning"
        for other_name, seen in self.sets[other].items():
            shared = new & seen
            if shared:
                tuning, scored = (name, other_name) if kind == "tuning" else (other_name, name)
                raise LeakError(
                    f"tuning set {tuning!r} shares {len(shared)} content unit(s) with the "
                    f"evaluation of {scored!r}: a tuned method would be scored on what it was "
                    "tuned on. Tune on another seed or generator (figures.run.DATA_SEED, "
                    "tasks.training_needles) than the evaluation's."
                )
        mine = self.sets[kind].setdefault(name, set())
        known = self.ids[kind].get(name)
        if new <= mine and known is not None and ids <= known:
            return
        mine |= new
        known = (known or set()) | ids
        self.ids[kind][name] = known
        self.counts[kind, name] = max(len(known), self.counts.get((kind, name), 0))
        self.folder.mkdir(parents=True, exist_ok=True)
        doc = {
            "kind": kind,
            "name": name,
            "samples": self.counts[kind, name],
            "units": sorted(mine),
            "ids": sorted(known),
        }
        write_text(self.folder / f"{kind}-{_digest('file', name)[:12]}.json", json.dumps(doc))

    def summary(self, figure: str) -> dict:
        """What ``figure`` scored (its evaluation set: distinct samples and their units) and
        the tuning sets it used, with their (empty) overlap. A set begun in a file without
        sample digests counts at least that file's samples."""
        scored = self.sets["evaluation"].get(figure, set())
        used = sorted(self.met.get(figure, ()))
        return {
            "evaluation": {
                "samples": self.counts.get(("evaluation", figure), 0),
                "units": len(scored),
            },
            "tuning": {
                n: {"samples": self.counts["tuning", n], "units": len(self.sets["tuning"][n])}
                for n in used
            },
            "overlap": sum(len(scored & self.sets["tuning"][n]) for n in used),
        }
