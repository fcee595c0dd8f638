"""The gallery's pre-registered plan: what will be tested, how, on how many records, before
any data is computed.

A verdict read off data that could have been looked at first is not a test: extending a
sample after a non-significant look, changing the analysis after a pilot, or picking the
population afterwards all inflate the false-positive rate however exact the statistics are.
``figures`` therefore writes ``<out>/plan.json`` before its first computation: every claim
with its test, the population it is decided on, the records each arm gets (from the sizes),
the seeds, the level, the multiplicity correction and the margins with their justification.
Its SHA-256 goes into ``run.json``, the directory's identity, so a run with another plan
(more records, another seed, another test) is refused in the same directory: extending a
sample is a new plan in a new directory, on fresh seeds. The gallery page prints the hash.
"""

from __future__ import annotations

import hashlib
import json

from interp_seal.figures.sizes import FigureSizes

PLAN = "plan.json"


def gallery_plan(model: str, sizes: FigureSizes) -> dict:
    """The plan of ``model``'s gallery at ``sizes`` (module docstring)."""
    from interp_seal.figures import claims as C
    from interp_seal.figures import mudaf as M
    from interp_seal.figures import run as R
    from interp_seal.figures import seal as S

    s = sizes
    runs = s.tuning_seeds
    table1 = (
        f"{s.confirm_n} fresh line records per length (seed {S.FRESH_SEED}) at "
        f"{list(s.lengths)} lines, those whose queried line is not the last, lengths pooled"
    )
    questions = f"{s.fresh_questions} fresh passage questions (seed {M.FRESH_SEED})"
    decided = {
        "Accuracy falls with context length": (
            "Fisher exact, shortest vs longest length, base model",
            table1.replace(", lengths pooled", ""),
        ),
        "Single-head pruning moves accuracy both ways, consistently across lengths": (
            "exact McNemar (best head pruned > baseline; baseline > worst head pruned) and "
            "Pearson r of the sweep's deltas; all must hold",
            f"{s.confirm_n} fresh records at {s.long} lines (seed {S.FRESH_SEED}); heads "
            f"chosen on the sweep's {s.sweep_n} records per length (seed 0)",
        ),
        "Group scaling (Q1 x 0.9 + Q3 x 1.1) beats the baseline at long length": (
            "exact McNemar, Q1 x 0.9 + Q3 x 1.1 > baseline; Q3 x 0.9 drawn as the control",
            f"{s.replicate_n} fresh records at {s.long} lines (seed {S.REPLICATE_SEED})",
        ),
        "SEAL-H and SEAL-C raise long-context accuracy": (
            f"exact McNemar, each of {runs} tuning runs of SEAL-H and of SEAL-C > base; all "
            "must hold",
            table1,
        ),
        "SEAL-C beats SEAL-H": (
            f"exact McNemar, SEAL-C run k > SEAL-H run k for each of {runs} runs; all must hold",
            table1,
        ),
        "SEAL-H uses ~1/4000 of LoRA's parameters at comparable accuracy": (
            f"TOST equivalence within {C.MARGIN} (SEAL-H run k vs LoRA run k) and exact McNemar "
            f"of each > base, for each of {runs} runs; all must hold",
            table1,
        ),
        "NTK / Self-Extend + SEAL-C recover beyond the trained length": (
            "exact McNemar, each extension + SEAL-C > the extension alone; both must hold",
            f"{s.extension_task} records at {list(s.extension_lengths)}, pooled (seed 0)",
        ),
        "After SEAL the final logit moves from the wrong to the correct token": (
            "exact sign test of the change in logit(correct) - logit(strongest wrong), SEAL-H "
            "and SEAL-C vs base; both must hold",
            f"the first {S.DLA_RECORDS} fresh records at {s.long} lines (seed {S.FRESH_SEED}), "
            "not chosen on any model's answer",
        ),
        "SEAL-H / C / L / D recover needles the baseline misses": (
            "exact McNemar, each method > base; all must hold",
            f"the needle grid {list(s.needle_lengths)} tokens x {list(s.needle_depths)} % "
            f"depth, {s.needle_n} SEAL needle(s) per cell (seed 0), methods tuned on generated "
            "needles",
        ),
        "MuDAF raises target heads' retrieval scores more than Vanilla SFT": (
            "Wilcoxon signed-rank on the targets' mean F1 per question",
            questions + f"; targets: the top {s.mudaf_k} heads on the pilot's questions",
        ),
        "Masking retrieval heads hurts more than masking random heads": (
            f"exact McNemar, each of {len(s.mask_seeds)} random draws of {s.mask_k} heads > "
            f"the top {s.mask_k} retrieval heads, zeroed; all must hold",
            questions,
        ),
        "MDQA retrieval heads differ from NIAH retrieval heads": (
            f"exact McNemar, top {s.mask_k} NIAH heads zeroed > top {s.mask_k} MDQA heads zeroed",
            questions,
        ),
        "MuDAF and MuDAF-weak beat Vanilla SFT on the task": (
            "exact McNemar, MuDAF > SFT and MuDAF-weak > SFT; both must hold",
            f"{s.retrieval_n} passage questions (seed {M.EVAL_SEED})",
        ),
    }
    claims = []
    for claim, paper, _ in C.CLAIMS:
        test, population = decided[claim]
        claims.append({"claim": claim, "paper": paper, "test": test, "population": population})
    return {
        "model": model,
        "sizes": s.as_dict() | {"more_questions": s.more_questions},
        "alpha": C.ALPHA,
        "correction": f"Holm's step-down across the {len(claims)} claims",
        "verdicts": "supported / contradicted: the claimed / opposite direction at Holm p < "
        "alpha; not shown otherwise. A row of several tests is supported only if all are.",
        "margins": {
            "equivalence": C.MARGIN,
            "why": "the papers' resolution: SEAL Table 1 reports 50 records per length, where "
            "a 95 % interval spans about +-0.1 exact match; differences inside it are what it "
            "calls comparable",
            "planning effect": C.MIN_EFFECT,
        },
        "seeds": {
            "evaluation": 0,
            "fresh": S.FRESH_SEED,
            "replication": S.REPLICATE_SEED,
            "tuning data": [R.DATA_SEED + k for k in range(runs)],
        },
        "held out": "no tuning set shares a record, needle, haystack, question or passage "
        "with any evaluation (figures.heldout; checked as the run goes)",
        "claims": claims,
    }


def plan_bytes(plan: dict) -> bytes:
    return (json.dumps(plan, indent=1) + "\n").encode()


def plan_hash(plan: dict) -> str:
    """SHA-256 of the plan's bytes as written."""
    return hashlib.sha256(plan_bytes(plan)).hexdigest()
