"""Measure the organism's line-retrieval properties and write its model card.

Command (the numbers in ``interp_seal/organism/checkpoint/README.md``)::

    interp-seal organism evaluate --write-card

The card's other tasks (needles, passages, retrieval heads, masking, SEAL-H) are measured in
``card_tasks.py``; ``write_card`` writes both.

1. **Accuracy vs length.** Greedy exact match on LongEval line retrieval (``force_prefix``
   format: the prompt ends ``... in line humble-pebble is``, the answer is `` 45041.``) for a
   range of line counts. Exact match is computed by teacher forcing: one forward pass on
   prompt + answer ids; a sample is correct iff the argmax at every answer position is the next
   answer token, which is exactly what greedy decoding would produce.
2. **Per-head pruning.** Zero one head's output (SEAL's pruning, ``ablate(..., "zero")``; the
   same as zeroing its ``d_head`` input columns of ``o_proj``) and re-measure exact match at a
   long length with the batched sweep of ``interp_seal.analysis.sweeps``. Heads whose removal
   *raises* exact match are the SEAL paper's harmful heads; heads whose removal lowers it are
   retrieval heads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from interp_seal.analysis.sweeps import SweepOptions, head_sweep
from interp_seal.evaluation import evaluate_line_retrieval
from interp_seal.models import ModelHandle
from interp_seal.organism import card_tasks
from interp_seal.organism.card_tasks import TaskReport, TaskSettings
from interp_seal.records import RecordStore, fingerprint
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate

SEED = 0


def pruning_sweep(
    handle: ModelHandle, num_lines: int, n_samples: int, seed: int = SEED
) -> tuple[float, torch.Tensor]:
    """Baseline exact match and its change ``(layers, heads)`` when each head is zeroed."""
    samples = {num_lines: generate(LineRetrievalConfig(num_lines=num_lines), n_samples, seed)}
    table = head_sweep(handle, samples, mode="zero", options=SweepOptions(progress=False))
    em = table[table["metric"] == "exact_match"]
    delta = torch.zeros(handle.spec.n_layers, handle.spec.n_heads)
    delta[em["layer"].to_numpy(dtype=int), em["head"].to_numpy(dtype=int)] = torch.tensor(
        em["delta"].to_numpy(dtype=float), dtype=delta.dtype
    )
    return float(em["baseline"].iloc[0]), delta


@dataclass(frozen=True, kw_only=True)
class Report:
    """Everything the card states: accuracy by length and the pruning sweep."""

    n_samples: int
    prune_samples: int
    seed: int
    accuracy: dict[int, float]
    prune_lines: int
    prune_base: float
    prune_delta: list[list[float]]
    threshold: float = 0.02

    def heads(self, sign: int) -> list[tuple[int, int, float]]:
        """(layer, head, delta) of heads whose pruning moves exact match by >= threshold in ``sign``."""
        found = [
            (layer, head, d)
            for layer, row in enumerate(self.prune_delta)
            for head, d in enumerate(row)
            if sign * d >= self.threshold - 1e-9
        ]
        return sorted(found, key=lambda x: -sign * x[2])

    def text(self) -> str:
        """The accuracy table and the pruning counts, as printed by ``evaluate``."""
        lines = ["| lines | " + " | ".join(str(n) for n in self.accuracy) + " |"]
        lines.append("|---|" + "---|" * len(self.accuracy))
        lines.append(
            "| exact match | " + " | ".join(f"{a:.3f}" for a in self.accuracy.values()) + " |"
        )
        lines.append("")
        lines.append(
            f"Pruning sweep at {self.prune_lines} lines ({self.prune_samples} samples, baseline exact "
            f"match {self.prune_base:.3f}):"
        )
        for sign, verb in ((1, "raise"), (-1, "lower")):
            heads = self.heads(sign)
            listed = ", ".join(f"L{la}H{h} {d:+.3f}" for la, h, d in heads) or "none"
            lines.append(
                f"- {len(heads)} heads {verb} exact match by >= {self.threshold:.2f}: {listed}"
            )
        return "\n".join(lines)


PARTS = ("lines", "prune", "needle", "passages", "retrieval", "seal")


@dataclass(frozen=True, kw_only=True)
class LineSettings:
    """The line-retrieval measurements: lengths and samples of the accuracy table, the sweep."""

    lengths: tuple[int, ...]
    prune_lines: int
    n_samples: int
    prune_samples: int
    seed: int = SEED


def measure_parts(
    handle: ModelHandle,
    lines: LineSettings,
    tasks: TaskSettings,
    *,
    parts: Sequence[str] = PARTS,
    results: str | Path | None = None,
) -> dict:
    """Measure the card's ``parts`` (any of ``PARTS``); returns ``{part: value}``.

    With ``results`` (a JSONL file), each finished part is appended to it under a fingerprint
    of the model weights and the part's settings, and read back instead of recomputed: parts
    can run in separate processes (``--parts``) and a final run assembles the card. Parts not
    asked for are taken from ``results`` when there.
    """
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        raise ValueError(f"unknown card parts {bad}; choose from {PARTS}")
    store = RecordStore(results) if results is not None else None
    weights = hashlib.sha256(
        (Path(handle.name_or_path) / "model.safetensors").read_bytes()
    ).hexdigest()
    t = asdict(tasks)

    def only(*names):  # the settings a part depends on (its cache fingerprint)
        return {n: t[n] for n in (*names, "seed")}

    jobs = {
        "lines": (
            {"lengths": lines.lengths, "n": lines.n_samples, "seed": lines.seed},
            lambda: {
                str(int(n)): float(a)
                for n, a in evaluate_line_retrieval(
                    handle, lines.lengths, n=lines.n_samples, seed=lines.seed, progress=False
                )[["length", "exact_match"]].itertuples(index=False)
            },
        ),
        "prune": (
            {"lines": lines.prune_lines, "n": lines.prune_samples, "seed": lines.seed},
            lambda: pruning_sweep(handle, lines.prune_lines, lines.prune_samples, lines.seed),
        ),
        "needle": (
            only("niah_lengths", "niah_depths", "niah_per_cell", "niah_haystack"),
            lambda: card_tasks.measure_needle(handle, tasks),
        ),
        "passages": (
            only("passage_counts", "passage_samples", "max_new_tokens"),
            lambda: card_tasks.measure_passages(handle, tasks),
        ),
        "retrieval": (
            only(
                "retrieval_passages", "retrieval_samples", "mask_k", "mask_seeds", "max_new_tokens"
            ),
            lambda: card_tasks.measure_retrieval(handle, tasks),
        ),
        "seal": (
            only("seal_lines", "seal_lr", "seal_epochs", "seal_samples", "seal_eval_samples"),
            lambda: card_tasks.measure_seal(handle, tasks),
        ),
    }
    values = {}
    for name, (setting, run) in jobs.items():
        key, print_ = name, fingerprint(weights, setting)
        record = store.get(key, print_) if store is not None else None
        if record is None and name in parts:
            value = run()
            if isinstance(value, tuple):
                value = [v.tolist() if isinstance(v, torch.Tensor) else v for v in value]
            record = {"key": key, "fingerprint": print_, "value": value}
            if store is not None:
                store.add(record)
        if record is not None:
            values[name] = record["value"]
    return values


def reports(values: dict, lines: LineSettings, tasks: TaskSettings) -> tuple[Report, TaskReport]:
    """The card's two reports from ``measure_parts``'s values (all parts needed)."""
    missing = [p for p in PARTS if p not in values]
    if missing:
        raise ValueError(
            f"card parts {missing} are not measured yet: run them (--parts {' '.join(missing)}) "
            "with the same --results file before --write-card"
        )
    base, delta = values["prune"]
    report = Report(
        n_samples=lines.n_samples,
        prune_samples=lines.prune_samples,
        seed=lines.seed,
        accuracy={int(n): a for n, a in values["lines"].items()},
        prune_lines=lines.prune_lines,
        prune_base=base,
        prune_delta=[[round(x, 4) for x in row] for row in delta],
    )
    retrieval_f1, masking = values["retrieval"]
    task_report = TaskReport(
        settings=asdict(tasks),
        niah=values["needle"],
        passages_f1=values["passages"],
        retrieval_f1=retrieval_f1,
        masking=masking,
        seal=values["seal"],
    )
    return report, task_report


def write_card(
    checkpoint: Path,
    report: Report,
    command: str,
    tasks: TaskReport | None = None,
    training: dict | None = None,
) -> Path:
    """Write the reports into the checkpoint's model card between the measurement markers.

    The card's prose (``README.md``, written by hand) keeps a ``<!-- measurements -->`` ...
    ``<!-- /measurements -->`` block that this replaces; the raw numbers also go to
    ``measurements.json`` next to it (line retrieval at the top level, ``tasks`` and
    ``training`` as keys). ``training``: the run's record (steps, seconds) to keep with them.
    """
    card = checkpoint / "README.md"
    parts = [f"Measured with `{command}`:", "", report.text()]
    if tasks is not None:
        parts += ["", tasks.text()]
    block = "<!-- measurements -->\n" + "\n".join(parts) + "\n<!-- /measurements -->"
    text = card.read_text() if card.exists() else "<!-- measurements -->\n<!-- /measurements -->\n"
    head, _, rest = text.partition("<!-- measurements -->")
    _, _, tail = rest.partition("<!-- /measurements -->")
    card.write_text(head + block + tail)
    raw = {k: v for k, v in report.__dict__.items()}
    raw["accuracy"] = {str(k): v for k, v in report.accuracy.items()}
    if tasks is not None:
        raw["tasks"] = asdict(tasks)
    if training is not None:
        raw["training"] = training
    (checkpoint / "measurements.json").write_text(json.dumps(raw, indent=1))
    return card
