"""The gallery's pre-registered plan: what will be tested, how, on how many records, before
any data is computed; and its amendments, which add figures and claims later, in the open.

A verdict read off data that could have been looked at first is not a test: extending a
sample after a non-significant look, changing the analysis after a pilot, or picking the
population afterwards all inflate the false-positive rate however exact the statistics are.
``figures`` therefore writes ``<out>/plan.json`` before its first computation: every claim
with its test, the population it is decided on, the records each arm gets (from the sizes),
the seeds, the level, the multiplicity correction and the margins with their justification.
Its SHA-256 goes into ``run.json``, the directory's identity, so a run with another plan
(more records, another seed, another test) is refused in the same directory: extending a
sample is a new plan in a new directory, on fresh seeds. The gallery page prints the hash.

**Amendments.** A gallery that grows (a new figure with new claims) must not rewrite its plan:
that would change the hash of a directory whose data was made under the old one. Instead
``AMENDMENTS`` lists, in order, what was added after the plan, each dated, with its reason,
its figures and their claims in the plan's form (test, population, records, seeds), and their
multiplicity correction: Holm within the amendment's claims, a family of its own. Folding them
into the plan's family would change the correction the plan registered for its own claims,
and with it verdicts already read; each family holds its error rate at the level, the gallery
at most the level times the number of families. ``regenerate`` writes each as ``<out>/plan_amendment_<N>.json`` before any of its
figures computes (a fresh directory gets ``plan.json`` and every amendment at the start), and
the page prints each file's SHA-256 beside the plan's; ``run.json`` keeps the plan's hash, so
galleries made before an amendment stay valid. ``check_amendments`` refuses, before any work:

- an amendment file on disk whose bytes differ from the code's (another amendment, like
  another plan);
- an amendment that does anything but add: a figure or claim of the plan (or of an earlier
  amendment) declared again;
- an amendment written where data of one of its figures (``data/<name>.json``) already
  exists: that data was made before its plan.

An amendment may also change a size: amendment 4 moves SEAL's needles out of a haystack that
repeats (issue 37), a fix of the design declared, dated and with its reason, before the data
it recomputes; no claim's test, records, seeds or correction changes. The run computes with the
amended sizes (``amended_sizes``), while ``plan.json`` and ``run.json`` keep the registered
ones; the rows that read needle samples are fingerprinted by the amended sizes and the others
by the registered ones (``figures.run``), so exactly what read the needles is recomputed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields, replace
from pathlib import Path

from interp_seal.figures.sizes import FigureSizes, from_json

PLAN = "plan.json"
AMENDMENT = "plan_amendment_{}.json"
# the figures of the plan itself (everything in the registry before amendment 1)
PLAN_FIGURES = (
    "seal_fig2b_quadrants",
    "seal_fig2c_channels",
    "seal_fig2d_scaling",
    "seal_fig4_dla",
    "seal_table1_methods",
    "seal_fig5_needle",
    "seal_table4_lr_samples",
    "seal_table2_extension",
    "seal_fig6_needle_extension",
    "seal_table3_generalization",
    "mudaf_fig3_scores",
    "mudaf_fig4_masking",
    "mudaf_fig5_targets",
    "mudaf_fig9_diff",
    "mudaf_fig7_num_heads",
    "mudaf_table3_layers",
    "mudaf_fig10_heatmaps",
    "mudaf_table2_methods",
)


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
    for claim, paper, _ in C.PLAN_CLAIMS:
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


# -- amendments ---------------------------------------------------------------------------------
def amendment_1(model: str, sizes: FigureSizes) -> dict:
    """Issue 41: the five-definition comparison and the accuracy-vs-KV-budget figure."""
    from interp_seal.figures import claims as C
    from interp_seal.figures import definitions as D
    from interp_seal.figures import mudaf as M
    from interp_seal.figures import run as R

    s = sizes
    draws = len(s.mask_seeds)
    fresh = (
        f"{s.definition_questions} fresh passage questions of {s.retrieval_passages} passages "
        f"(seed {M.FRESH_SEED}; the detection questions are seed {M.EVAL_SEED})"
    )
    detection = {
        "copy_paste": "needle copy-paste scores on SEAL's needles (MuDAF Fig. 4's NIAH scores)",
        "passage": f"MuDAF Fig. 3's passage scores on the {s.retrieval_n} detection questions",
        "qr": f"QRHead scores on the same {s.retrieval_n} detection questions",
        "causal": "each head zeroed alone on the first "
        f"{s.causal_n or s.retrieval_n} detection questions, ranked by the answer's "
        "log-probability lost",
        "duo": f"DuoAttention gates trained on {s.tune_n} tuning line records of {s.duo_lines} "
        f"lines (seed {R.DATA_SEED}), sink {s.kv_sink}, window {s.kv_window}",
    }
    kv_records = (
        f"{s.kv_n} fresh line records per length at {list(s.kv_lengths)} lines (seed {D.KV_SEED})"
    )
    population = (
        f"of the {kv_records}, those at {max(s.kv_lengths)} lines whose queried line lies "
        f"entirely before the recent window: its tokens start after the {s.kv_sink} sinks and "
        f"end at or before prompt tokens - {s.kv_window}, so no streaming head sees it at any "
        "answer position; decided by token position, never by outcome"
    )
    budget = (
        f"the budget of ceil({D.BUDGET_SHARE:.0%} of the KV heads) kept full, the rest sink "
        f"{s.kv_sink} + window {s.kv_window}"
    )
    tests = {}
    for d in D.DEFINITIONS:
        tests[C.masking_claim(d)] = (
            f"exact McNemar, each of {draws} random draws of the top 5 % count of heads "
            f"(seeds {list(s.mask_seeds)}, outside passage's top set) > the top 5 % of heads "
            f"by {d} ({detection[d]}), zeroed; all must hold",
            fresh,
        )
    tests[C.DUO_CLAIM] = (
        f"exact McNemar, duo's full-KV set > each of {draws} random KV-head orders' set "
        f"(seeds {list(s.mask_seeds)}) at {budget}, at {max(s.kv_lengths)} lines; all must hold",
        population,
    )
    tests[C.CAUSAL_CLAIM] = (
        "exact McNemar, causal's full-KV set > the set of each of copy_paste, passage, qr and "
        f"duo at {budget}, at {max(s.kv_lengths)} lines; all must hold",
        population,
    )
    claims = []
    for claim, paper, _ in C.AMENDMENT_1_CLAIMS:
        test, pop = tests[claim]
        claims.append({"claim": claim, "paper": paper, "test": test, "population": pop})
    return {
        "amendment": 1,
        "date": "2026-11-28",
        "reason": "issue 41 adds two figures: retrieval heads by five definitions "
        "(heads_definitions) and accuracy vs KV budget with heads chosen by each "
        "(kv_budget); their claims are declared here before any of their data",
        "amends": plan_hash(gallery_plan(model, sizes)),
        "figures": ["heads_definitions", "kv_budget"],
        "sizes": s.amendment_sizes(),
        "seeds": {
            "detection questions": M.EVAL_SEED,
            "fresh questions": M.FRESH_SEED,
            "kv records": D.KV_SEED,
            "duo tuning data": R.DATA_SEED,
            "random heads": list(s.mask_seeds),
        },
        "held out": "the gates' tuning records are a tuning set of the held-out ledger: no "
        "evaluation of the gallery may share a record with them",
        "correction": f"Holm's step-down across this amendment's {len(claims)} claims, one "
        "family; the plan's claims keep the plan's correction, so adding this family changes "
        "no verdict of the plan",
        "claims": claims,
    }


def amendment_2(model: str, sizes: FigureSizes) -> dict:
    """Issue 41: DuoAttention's masking arm at its own unit, whole KV heads (amendment 1's
    top 5 % cuts a tie of gates wherever it is not a multiple of the group size)."""
    from interp_seal.figures import claims as C
    from interp_seal.figures import mudaf as M
    from interp_seal.figures import run as R

    s = sizes
    test = (
        f"exact McNemar, each of {len(s.mask_seeds)} random draws of as many heads (seeds "
        f"{list(s.mask_seeds)}, outside duo's set) > duo's set zeroed: the query heads of its "
        "top KV heads by gate, the top 5 % of heads rounded up to whole KV heads (gates "
        f"trained as amendment 1 says: {s.tune_n} tuning line records of {s.duo_lines} lines, "
        f"seed {R.DATA_SEED}, sink {s.kv_sink}, window {s.kv_window}); all must hold; a set "
        "that still cuts a tie of gates is not read"
    )
    population = (
        f"amendment 1's {s.definition_questions} fresh passage questions of "
        f"{s.retrieval_passages} passages (seed {M.FRESH_SEED})"
    )
    claims = [
        {"claim": claim, "paper": paper, "test": test, "population": population}
        for claim, paper, _ in C.AMENDMENT_2_CLAIMS
    ]
    return {
        "amendment": 2,
        "date": "2026-11-28",
        "reason": "amendment 1 masks the top 5 % of heads by each definition; DuoAttention's "
        "gates give the query heads of a KV head one score, so where the top 5 % is not a "
        "multiple of the group size (SmolLM2: 14 heads, 3 per KV head) duo's set is cut from "
        "a tie and its claim reads not shown by construction. This figure masks duo's heads "
        "as its gates choose them, whole KV heads; declared before any data of SmolLM2's "
        "masking stage, and it changes no claim of amendment 1",
        "amends": plan_hash(gallery_plan(model, sizes)),
        "figures": ["heads_duo_groups"],
        "sizes": {"definition_questions": s.definition_questions},
        "seeds": {
            "fresh questions": M.FRESH_SEED,
            "duo tuning data": R.DATA_SEED,
            "random heads": list(s.mask_seeds),
        },
        "held out": "as amendment 1: the gates' tuning records share none with the fresh questions",
        "correction": f"Holm's step-down across this amendment's {len(claims)} claim, one "
        "family; the plan's and amendment 1's claims keep their correction",
        "claims": claims,
    }


def amendment_3(model: str, sizes: FigureSizes) -> dict:
    """Issue 41: DuoAttention's masking arm as amendment 2's, its set extended to the whole
    tie of gates at the cut (the clamped gates saturate together)."""
    from interp_seal.figures import claims as C

    doc = amendment_2(model, sizes)
    test = (
        doc["claims"][0]["test"]
        .replace(
            "the top 5 % of heads rounded up to whole KV heads",
            "the top 5 % of heads rounded up to whole KV heads and extended to every KV head whose "
            "gate ties the last of them",
        )
        .replace("; a set that still cuts a tie of gates is not read", "")
    )
    claims = [
        {"claim": claim, "paper": paper, "test": test, "population": doc["claims"][0]["population"]}
        for claim, paper, _ in C.AMENDMENT_3_CLAIMS
    ]
    return doc | {
        "amendment": 3,
        "reason": "amendment 2's set, duo's top 5 % rounded up to whole KV heads, cuts a tie "
        "wherever more KV heads share the gate of its last one, and the paper's gates are "
        "clamped to [0, 1] at every step, so the heads that need the whole context saturate "
        "at 1 together: SmolLM2's trained gates (seen before any masking data of the gallery) "
        "put 7 of 90 KV heads at 1.0, so amendment 2's 5 are index order and its claim reads "
        "not shown by construction. This figure masks the whole tie; it changes no claim of "
        "amendments 1 and 2",
        "figures": ["heads_duo_tied"],
        "correction": f"Holm's step-down across this amendment's {len(claims)} claim, one "
        "family; the plan's and the earlier amendments' claims keep their correction",
        "claims": claims,
    }


def amendment_4(model: str, sizes: FigureSizes) -> dict | None:
    """Issue 37: SEAL's needles in a haystack that does not repeat, for a gallery whose plan
    registered a repeated one (SmolLM2's: the 970-token essays, twelve times at 12K tokens);
    None for a gallery whose haystack already does not repeat."""
    if not sizes.haystack_repeat:
        return None
    from interp_seal.tasks.needle import HAYSTACKS

    return {
        "amendment": 4,
        "date": "2026-12-07",
        "reason": f"the plan hid SEAL's needles in the {sizes.haystack!r} haystack, repeated "
        "to fill each context, so past its length every needle sits in a text that repeats "
        "around it and its novelty alone can give it away (issue 37: the haystack must not "
        "repeat within the longest context used). The needle figures move to the 'long' "
        f"haystack (interp_seal/tasks/{HAYSTACKS['long']}: thirty essays written for this "
        "project, read once "
        "up to its length); every claim keeps its test, records, seeds and correction. Only "
        "what read needle samples is recomputed: the rows of stores declared to read them "
        "(SEAL Fig. 5, Table 2 and Fig. 6 on needles), the needle copy-paste scores (MuDAF Fig. "
        "4's NIAH heads, the copy-paste definition) and the masking or KV-budget conditions "
        "whose head sets those scores choose",
        "amends": plan_hash(gallery_plan(model, sizes)),
        "figures": [],
        "sizes": {"haystack": "long", "haystack_repeat": False},
        "correction": "No claim is added: the claims of the figures it recomputes keep their "
        "family and correction",
        "claims": [],
    }


AMENDMENTS = (amendment_1, amendment_2, amendment_3, amendment_4)  # amendment N: AMENDMENTS[N - 1]


def gallery_amendments(model: str, sizes: FigureSizes) -> list[dict]:
    """The amendments of ``model``'s plan at ``sizes``, in order (module docstring), as each
    file reads back (lists, not tuples); one that does not apply to these sizes (None) is
    left out, and its number is not used."""
    made = (make(model, sizes) for make in AMENDMENTS)
    return [json.loads(json.dumps(doc)) for doc in made if doc is not None]


def amended_sizes(sizes: FigureSizes, amendments: list[dict]) -> FigureSizes:
    """``sizes`` with every amendment's ``sizes`` applied in order: what the run computes with
    (amendment 4 changes the needles' haystack; the others name sizes the plan already had)."""
    changes = {}
    for doc in amendments:
        changes |= doc["sizes"]
    return replace(sizes, **from_json(changes))


def check_amendments(out: Path, plan: dict, amendments: list[dict]) -> list[bytes]:
    """Refuse the amendments that cannot be written to (or kept in) ``out``: one that changes
    the plan or an earlier amendment instead of adding, one whose file on disk differs, one
    that would be written after data of its figures; returns each amendment's path and bytes."""
    figures, claims = set(PLAN_FIGURES), {c["claim"] for c in plan["claims"]}
    written, last = [], 0
    for doc in amendments:
        number = doc["amendment"]
        if number <= last:
            raise ValueError(f"amendment {number} is listed after amendment {last}")
        last = number
        again = sorted(set(doc["figures"]) & figures)
        again += sorted({c["claim"] for c in doc["claims"]} & claims)
        if again:
            raise ValueError(
                f"plan amendment {number} declares {again} again: an amendment may only add "
                "figures and claims, never change those of the plan or an earlier amendment"
            )
        figures |= set(doc["figures"])
        claims |= {c["claim"] for c in doc["claims"]}
        data = plan_bytes(doc)
        path = out / AMENDMENT.format(number)
        if path.exists():
            if path.read_bytes() != data:
                raise ValueError(
                    f"{path} differs from plan amendment {number} of this code: it is another "
                    "amendment, refusing to mix results (use another output directory)"
                )
        else:
            early = [f for f in doc["figures"] if (out / "data" / f"{f}.json").exists()]
            if early:
                raise ValueError(
                    f"{out} already holds data of {early}, made before plan amendment "
                    f"{number} that declares them: data before its plan is refused (delete "
                    "that data or use another output directory)"
                )
        written.append((path, data))
    return written


def write_amendments(out: Path, plan: dict, amendments: list[dict]) -> None:
    """``check_amendments``, then each amendment not on disk written."""
    from interp_seal.outputs import write_text

    for path, data in check_amendments(out, plan, amendments):
        if not path.exists():
            write_text(path, data.decode())


def registered_sizes(out: Path) -> FigureSizes:
    """The sizes ``out``'s registered plan and amendments name (``plan.json``, then each
    ``plan_amendment_<N>.json`` on disk): the n every claim must be read at. ``plan.json``
    holds ``FigureSizes.as_dict()``, which leaves the later fields out where they are at their
    defaults, so a field it lacks is at its default."""
    found = json.loads((out / PLAN).read_text())["sizes"]
    for number in range(1, len(AMENDMENTS) + 1):
        path = out / AMENDMENT.format(number)
        if path.exists():
            found |= json.loads(path.read_text())["sizes"]
    names = {f.name for f in fields(FigureSizes)}
    return FigureSizes(**from_json({k: v for k, v in found.items() if k in names}))
