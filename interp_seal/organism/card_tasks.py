"""The organism v2 card's task measurements: needles, passages, retrieval heads, masking, SEAL-H.

Command (the numbers in ``interp_seal/organism/checkpoint/README.md``)::

    interp-seal organism evaluate --write-card

Every number goes through the library, on the evaluation data only (the model was trained on
generated needles, generated haystacks and other seeds of the passage generator):

1. **Needle grid** (SEAL Fig. 5 layout): SEAL's ten needles (appendix B.2) in a shipped
   haystack, by default the organism's own (``"organism"``: 4,502 tokens in its word-level
   vocabulary), never repeated: in a repeated text the needle is the one sentence not read
   before; ``n_per_cell`` seeded needles per (depth, context length) cell; teacher-forced
   exact match of the needle's key phrase, the part of the sentence the question asks for
   (``interp_seal.evaluation.evaluate_niah``).
2. **QA F1 by passages**: greedy answers (up to a newline) to synthetic multi-document QA in
   LongBench's prompt (``tasks.passages``, seed 0), scored with LongBench's token F1
   (``analysis.masking.evaluate_condition`` with no head masked), 1- and 2-hop.
3. **MuDAF retrieval F1 per head** (Sec. 3.1; eps 0.3 as in the official code):
   ``analysis.passage_retrieval_scores``.
4. **Masking** (MuDAF Fig. 4): zero the top-``k`` retrieval heads vs ``k`` random heads from
   outside that set (one draw per seed), QA F1 and teacher-forced exact match
   (``analysis.masking_experiment``).
5. **SEAL-H** (SEAL Sec. 4): one learnable scale per head, tuned on 50 synthetic line-retrieval
   samples (seed 1) at the longest card length with SEAL's lr 1e-2 for one epoch (Sec. 5),
   evaluated before/after on the card's records (seed 0) with ``tuning.accuracy_by_method``:
   exact match, and the mean answer log-probability the tuning maximises.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from interp_seal.analysis.masking import (
    MaskingConfig,
    evaluate_condition,
    masking_experiment,
)
from interp_seal.analysis.retrieval_scores import PassageScoreConfig, passage_retrieval_scores
from interp_seal.engine import pad_id_of
from interp_seal.evaluation import evaluate_niah
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle
from interp_seal.tasks import needle, passages
from interp_seal.tuning.data import encode_examples, format_samples
from interp_seal.tuning.evaluate import accuracy_by_method
from interp_seal.tuning.loop import TrainConfig, train
from interp_seal.tuning.seal import SealTuner

SEED = 0


@dataclass(frozen=True, kw_only=True)
class TaskSettings:
    """What the card measures beyond line retrieval (defaults: the shipped card).

    Attributes:
        niah_lengths, niah_depths, niah_per_cell: the needle grid.
        niah_haystack: the built-in haystack the needles hide in (``needle.HAYSTACKS``), never
            repeated; it must cover the longest length.
        passage_counts, passage_samples: QA F1 per number of passages (per hop count).
        retrieval_passages, retrieval_samples: the MuDAF retrieval-score setting.
        mask_k, mask_seeds: masking top-k vs random k (one random draw per seed).
        max_new_tokens: greedy answer budget for QA F1.
        seal_lines, seal_lr, seal_epochs, seal_samples: SEAL-H tuning setting.
        seal_eval_samples: records of the before/after evaluation.
        seed: evaluation seed.
    """

    niah_lengths: tuple[int, ...] = (500, 1000, 1500, 2000, 2500, 3000, 3500, 4000)
    niah_depths: tuple[int, ...] = needle.linear_grid(0, 100, 11)
    niah_per_cell: int = 2
    niah_haystack: str = "organism"
    passage_counts: tuple[int, ...] = (5, 10, 20, 30, 40, 60)
    passage_samples: int = 30
    retrieval_passages: int = 10
    retrieval_samples: int = 50
    mask_k: int = 4
    mask_seeds: tuple[int, ...] = (0, 1, 2)
    max_new_tokens: int = 6
    seal_lines: int = 200
    seal_lr: float = 0.01  # SEAL Sec. 5: SEAL-H lr 1e-2, one epoch
    seal_epochs: int = 1
    seal_samples: int = 50
    seal_eval_samples: int = 50
    seed: int = SEED

    def __post_init__(self):
        if max(self.niah_lengths) > 4096 or min(self.niah_lengths) <= 200:
            raise ValueError(
                f"niah_lengths must lie in (200, 4096] (the needle buffer is 200 tokens and the "
                f"window 4,096), got {self.niah_lengths}"
            )
        if min(self.passage_counts) < 2 or self.retrieval_passages < 2:
            raise ValueError("passage counts must be >= 2 (a question needs its golden passage)")


@dataclass(frozen=True, kw_only=True)
class TaskReport:
    """The measured task properties (``write_card`` renders ``text()``; JSON keeps them all)."""

    settings: dict
    niah: dict[str, dict[str, float]]  # depth -> context length -> exact match
    passages_f1: dict[str, dict[str, float]]  # "1-hop"/"2-hop" -> passages -> F1
    retrieval_f1: list[list[float]]  # (layers, heads) MuDAF mean F1
    masking: list[dict]
    seal: dict

    def retrieval_heads(self, threshold: float = 0.5) -> list[tuple[int, int, float]]:
        """(layer, head, F1) of heads with retrieval F1 >= ``threshold``, best first."""
        found = [
            (layer, head, f1)
            for layer, row in enumerate(self.retrieval_f1)
            for head, f1 in enumerate(row)
            if f1 >= threshold
        ]
        return sorted(found, key=lambda x: -x[2])

    def text(self) -> str:
        """Markdown tables of every measurement."""
        s = self.settings
        lengths = list(next(iter(self.niah.values())))
        out = [
            f"Needle in a haystack (SEAL's ten needles in the shipped haystack "
            f"`{s['niah_haystack']}`, never repeated, {s['niah_per_cell']} needles per cell, "
            "teacher-forced exact match of the needle's key phrase):",
            "",
            "| depth % \\ tokens | " + " | ".join(lengths) + " |",
            "|---|" + "---|" * len(lengths),
        ]
        out += [
            f"| {d} | " + " | ".join(f"{row[n]:.2f}" for n in lengths) + " |"
            for d, row in self.niah.items()
        ]
        means = [np.mean([row[n] for row in self.niah.values()]) for n in lengths]
        out.append("| mean | " + " | ".join(f"{m:.2f}" for m in means) + " |")
        counts = list(next(iter(self.passages_f1.values())))
        out += [
            "",
            f"Multi-document QA (LongBench hotpotqa prompt, synthetic passages, "
            f"{s['passage_samples']} questions per cell, greedy answer, token F1):",
            "",
            "| passages | " + " | ".join(counts) + " |",
            "|---|" + "---|" * len(counts),
        ]
        out += [
            f"| {hops} F1 | " + " | ".join(f"{row[c]:.3f}" for c in counts) + " |"
            for hops, row in self.passages_f1.items()
        ]
        heads = self.retrieval_heads()
        listed = ", ".join(f"L{la}H{h} {f:.2f}" for la, h, f in heads) or "none"
        out += [
            "",
            f"MuDAF passage-retrieval F1 (eps 0.3, {s['retrieval_samples']} questions with "
            f"{s['retrieval_passages']} passages): {len(heads)} heads >= 0.5: {listed}",
            "",
            f"Masking (zero) {s['mask_k']} heads, {s['retrieval_samples']} questions with "
            f"{s['retrieval_passages']} passages:",
            "",
            "| masked | heads | QA F1 | exact match |",
            "|---|---|---|---|",
        ]
        for row in self.masking:
            name = row["strategy"] + ("" if row["seed"] < 0 else f" (seed {row['seed']})")
            out.append(
                f"| {name} | {row['heads'] or '-'} | {row['qa_f1']:.3f} | "
                f"{row['exact_match']:.3f} |"
            )
        g = self.seal
        out += [
            "",
            f"SEAL-H on line retrieval at {g['lines']} lines: tuned on {g['train_samples']} "
            f"synthetic samples (seed {g['train_seed']}, lr {g['lr']}, {g['epochs']} epochs, "
            f"{g['seconds']:.0f} s); exact match on {g['eval_samples']} records (seed "
            f"{g['eval_seed']}): before {g['before']:.3f}, after {g['after']:.3f}; mean answer "
            f"log-probability (the tuned objective) {g['logprob_before']:.3f} -> "
            f"{g['logprob_after']:.3f}.",
        ]
        return "\n".join(out)


def measure_needle(handle: ModelHandle, settings: TaskSettings) -> dict[str, dict[str, float]]:
    """SEAL's needles in the shipped haystack ``settings.niah_haystack``, never repeated: exact
    match of the key phrase per depth and context length (the organism is trained to answer
    with the key phrase)."""
    cfg = needle.NeedleConfig(
        context_lengths=settings.niah_lengths,
        depths=settings.niah_depths,
        haystack=needle.read_haystack(settings.niah_haystack),
        answer="key_phrase",
    )
    samples = needle.generate(cfg, handle.tokenizer, settings.niah_per_cell, seed=settings.seed)
    grid = evaluate_niah(handle, samples, progress=False)
    return {
        str(int(d)): {str(int(n)): float(grid.loc[d, n]) for n in grid.columns} for d in grid.index
    }


def qa_samples(n_passages: int, n: int, hops: int, seed: int):
    """The card's synthetic multi-document QA questions (``tasks.passages``)."""
    return passages.generate(passages.PassagesConfig(num_passages=n_passages, hops=hops), n, seed)


def measure_passages(handle: ModelHandle, settings: TaskSettings) -> dict[str, dict[str, float]]:
    """Greedy-answer QA F1 per number of passages, 1- and 2-hop (no head masked)."""
    config = MaskingConfig(
        ks=(1,), modes=("zero",), qa_f1=True, max_new_tokens=settings.max_new_tokens
    )
    none = {"strategy": "none", "mode": "none", "k": 0, "seed": -1, "heads": []}
    return {
        f"{hops}-hop": {
            str(n): evaluate_condition(
                handle, qa_samples(n, settings.passage_samples, hops, settings.seed), none, config
            )["qa_f1"]
            for n in settings.passage_counts
        }
        for hops in (1, 2)
    }


def measure_retrieval(handle: ModelHandle, settings: TaskSettings):
    """MuDAF retrieval F1 per head, and masking top-k vs random k on the same questions."""
    samples = qa_samples(settings.retrieval_passages, settings.retrieval_samples, 1, settings.seed)
    scores = passage_retrieval_scores(handle, samples, PassageScoreConfig(eps=0.3), progress=False)
    f1 = np.zeros((handle.spec.n_layers, handle.spec.n_heads))
    f1[scores.heads["layer"], scores.heads["head"]] = scores.heads["f1"]
    config = MaskingConfig(
        ks=(settings.mask_k,),
        modes=("zero",),
        seeds=settings.mask_seeds,
        qa_f1=True,
        max_new_tokens=settings.max_new_tokens,
    )
    table = masking_experiment(handle, samples, scores.heads, config=config, progress=False)
    return np.round(f1, 4).tolist(), json.loads(table.to_json(orient="records"))


def measure_seal(handle: ModelHandle, settings: TaskSettings) -> dict:
    """SEAL-H tuned on synthetic line retrieval; exact match before and after."""
    train_seed = settings.seed + 1
    samples = format_samples(
        "line_retrieval",
        handle.tokenizer,
        settings.seal_samples,
        num_lines=settings.seal_lines,
        seed=train_seed,
    )
    tuner = SealTuner(handle, "head")
    start = time.monotonic()
    train(
        tuner,
        encode_examples(samples, handle.tokenizer),
        TrainConfig(lr=settings.seal_lr, epochs=settings.seal_epochs),
        pad_id=pad_id_of(handle.tokenizer),
    )
    seconds = time.monotonic() - start
    tuned = HeadIntervention.from_scales(handle.spec, tuner.scales.detach())
    table = accuracy_by_method(
        handle,
        {"seal-h": tuned},
        [settings.seal_lines],
        n=settings.seal_eval_samples,
        seed=settings.seed,
        progress=False,
    )
    handle.model.requires_grad_(False)
    em = dict(zip(table["method"], table["exact_match"], strict=True))
    logprob = dict(zip(table["method"], table["answer_logprob"], strict=True))
    return {
        "lines": settings.seal_lines,
        "train_samples": settings.seal_samples,
        "train_seed": train_seed,
        "lr": settings.seal_lr,
        "epochs": settings.seal_epochs,
        "eval_samples": settings.seal_eval_samples,
        "eval_seed": settings.seed,
        "seconds": seconds,
        "before": float(em["base"]),
        "after": float(em["seal-h"]),
        "logprob_before": float(logprob["base"]),
        "logprob_after": float(logprob["seal-h"]),
        "scales": tuner.scales.detach().flatten().tolist(),
    }
