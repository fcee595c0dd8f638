"""The gallery page ``<out>/README.md``: every figure, its reading, the papers' numbers, claims.

Written only from what is on disk (``run.json``, ``data/<name>.json``, ``plan.json`` and its
amendments ``plan_amendment_<N>.json``, each with its SHA-256), so it can be rebuilt at any time
and always matches the data beside it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from interp_seal.figures.claims import claims_table
from interp_seal.figures.plan import AMENDMENT, AMENDMENTS, registered_sizes
from interp_seal.figures.registry import FIGURES
from interp_seal.figures.tables import load_tables
from interp_seal.outputs import write_table, write_text

ORGANISM_NOTE = (
    "The organism v2 was trained on all three formats (LongEval lines, needles answered by their "
    "key phrase, LongBench-format passage QA); its model card "
    "(`interp_seal/organism/checkpoint/README.md`) lists which of the issue's properties it "
    "meets. Its line documents in training had 2-150 lines (about 2.0K tokens), inside its "
    "4,096-token window (`max_position_embeddings`, marked on the Table 2 figure). SEAL's "
    "needles are hidden in a haystack written for the organism in its own word-level "
    "vocabulary (nine essays, 4,502 tokens, none unknown; `interp_seal/tasks/data/README.md`), "
    "never repeated: the longest needle context, Fig. 6's 4,000 tokens, reads it once. The "
    "claims table's verdicts say what these numbers can and cannot show."
)

SMOLLM2_NOTE = (
    "SmolLM2-135M-Instruct (8,192-token window) in the regimes where it retrieves and degrades: "
    "LongEval records with integer line indices, every prompt inside its own chat template, "
    "needles and passage questions with their answer's lead-in forced (`lead_in`). How each "
    "size was picked, from measurements: `figures/README.md` (section on this gallery) and "
    "`interp_seal/figures/presets/smollm2.json`. SEAL Table 2 runs on needles past the window, "
    "not on line retrieval as in the paper: on records whose queried line is not the last, "
    "SmolLM2's base accuracy is 0.05-0.15 at 3-10 lines (a few hundred tokens), so there is no "
    "line-retrieval regime past its window in which an extension could be told to recover. "
    "The figures on this page were computed under the pre-registered design, six on H100s "
    "lent for 15 minutes in each of two sessions (float32; each marked with its device), the "
    "others on one CPU thread; SEAL Fig. 5, Table 2 and Fig. 6, first computed on an H100, "
    "were computed again on the CPU under plan amendment 4 (below). "
    "MuDAF Fig. 7's SFT and MuDAF models were retrained on the CPU (tuned models are not "
    "committed), so its k = 0 and k = 4 points are not the very models of Table 2. A "
    "retraining need not give the same weights (another CPU's kernels, a change of code or "
    "library): the models retrained on 2026-11-28 for "
    "Fig. 5 moved a fresh question's target-head F1 by up to 0.083 from the rows of an "
    "earlier training, so those rows were dropped. Fig. 5 and 9 come from the retrained "
    "models, MuDAF Table 2 and Fig. 7 from earlier trainings (Table 2's on the H100); each "
    "figure's rows come from one training, and a weight digest kept beside each tuned model "
    "(`work/<model>/weights.json`) now refuses a retrained model that differs. The "
    "plan registered SEAL's needles in the bundled essays (970 tokens), repeated to fill "
    "each context (at 12K twelve times). Plan amendment 4 moves them to the long haystack "
    "that other models get (15,664 tokens, never repeated here) and recomputes only what "
    "read needles, all on the CPU: SEAL Fig. 5, Table 2 and Fig. 6, the needle copy-paste "
    "scores with the masking and KV conditions they choose (`heads_definitions`, `kv_budget`), "
    "and MuDAF Fig. 4's NIAH arm (its top-14 NIAH heads, one head changed, zeroed again on the "
    "pilot's 40 and the 1,880 fresh questions). Each figure's `data/<name>.json` records its "
    "needles' haystack."
)

NOTES = {"organism": ORGANISM_NOTE, "smollm2": SMOLLM2_NOTE}


def _compute(doc: dict) -> str:
    """A figure's compute time, with the device the model ran on when it was not the CPU (the
    CPU seconds are then the driving process's, the wall clock is the figure's)."""
    device = doc.get("device", "cpu")
    if device == "cpu":
        return f"{doc['cpu_seconds']:.0f} s CPU"
    return f"{doc['wall_seconds']:.0f} s wall clock on {device}"


def write_gallery(out: str | Path, *, command: str, png: bool = True, png_problem=None) -> Path:
    """Write ``README.md`` and ``claims.csv`` in ``out`` from its data files."""
    out = Path(out)
    run = json.loads((out / "run.json").read_text())
    data, docs = {"_sizes": run["sizes"], "_planned": registered_sizes(out)}, {}
    for spec in FIGURES:
        path = out / "data" / f"{spec.name}.json"
        if path.exists():
            data[spec.name], docs[spec.name] = load_tables(path)
    claims = claims_table(data)
    write_table(claims, out / "claims.csv")
    on_cpu = [d for d in docs.values() if d.get("device", "cpu") == "cpu"]
    off_cpu = [d for d in docs.values() if d.get("device", "cpu") != "cpu"]
    cpu = sum(d["cpu_seconds"] for d in on_cpu)
    wall = sum(d["wall_seconds"] for d in on_cpu)
    accelerated = {d["device"] for d in off_cpu}
    elsewhere = sum(d["wall_seconds"] for d in off_cpu)
    lines = [
        f"# Paper figures regenerated on `{run['model']}`",
        "",
        "Regenerate (resumable; with the data present it only redraws):",
        "",
        "```bash",
        f"OMP_NUM_THREADS=1 {command}",
        "```",
        "",
        f"Compute time of the data on disk: **{cpu / 60:.1f} min CPU** ({wall / 60:.1f} min wall "
        "clock), one torch thread, summed over the figures (a figure that first needs a shared "
        "step, e.g. a tuned model, carries its cost)"
        + (
            f"; and {elsewhere / 60:.1f} min wall clock on {', '.join(sorted(accelerated))} for "
            f"{len(off_cpu)} figure(s), each marked below."
            if accelerated
            else "."
        ),
        "",
    ]
    if run["model"] in NOTES:
        lines += [NOTES[run["model"]], ""]
    if not png:
        lines += [f"PNG images were not written: {png_problem}", ""]
    sizes = ", ".join(f"{k}={v}" for k, v in run["sizes"].items())
    lines += [f"Sizes (`interp_seal/figures/sizes.py`): {sizes}.", ""]
    if "plan_sha256" in run:
        lines += [
            "Pre-registered plan ([plan.json](plan.json), written before any data; "
            f"SHA-256 `{run['plan_sha256']}`): every claim's test, population, records and "
            "seeds. No tuning set shares a record, needle, haystack, question or passage with "
            "any evaluation (`interp_seal/figures/heldout.py`, checked as the run went).",
            "",
        ]
        lines += _amendments(out)
    else:
        lines += [
            "**Made before the pre-registered design** (no `plan.json`): tunings and "
            "evaluations were not checked for shared content, and claims whose figures "
            "predate it say so in their rows.",
            "",
        ]
    missing = [f"`{spec.name}` ({spec.paper})" for spec in FIGURES if spec.name not in docs]
    if missing:
        lines += [
            f"Not computed yet ({len(missing)} of {len(FIGURES)}; the command above resumes "
            f"and adds them): {', '.join(missing)}.",
            "",
        ]
    lines += ["## Claims", "", _claims_markdown(claims), ""]
    for spec in FIGURES:
        if spec.name not in docs:
            continue
        tables = data[spec.name]
        image = (
            f"![{spec.title}]({spec.name}.png)" if png else f"[{spec.name}.html]({spec.name}.html)"
        )
        csvs = ", ".join(f"[{t}.csv](data/{spec.name}/{t}.csv)" for t in tables)
        lines += [
            f"## {spec.title} ({spec.paper})",
            "",
            image,
            "",
            f"**Ours:** {spec.read(tables)}",
            "",
        ]
        against = spec.compare(data) if spec.compare else ""
        if against:
            lines += [f"**Against the paper's description:** {against}", ""]
        lines += [
            f"Interactive: [{spec.name}.html]({spec.name}.html). Data: {csvs}. "
            f"Compute: {_compute(docs[spec.name])}.",
            "",
            f"**Paper ({spec.paper}):**",
            "",
            spec.paper_numbers,
            "",
        ]
    return write_text(out / "README.md", "\n".join(lines))


def _amendments(out: Path) -> list[str]:
    """One paragraph per plan amendment on disk (``figures.plan``): its date, reason, figures
    and claims (or the sizes it changes) and the SHA-256 of its file, written before the data
    it makes."""
    lines = []
    for number in range(1, len(AMENDMENTS) + 1):
        path = out / AMENDMENT.format(number)
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        figures, claims = doc["figures"], len(doc["claims"])
        if figures:
            what = (
                f"It adds the figure{'s' * (len(figures) > 1)} "
                f"{', '.join(f'`{f}`' for f in figures)} and {claims} claim{'s' * (claims > 1)} "
                "in the plan's form (test, population, records, seeds); it changes nothing of "
                "the plan."
            )
        else:  # a change of sizes (amendment 4: the needles' haystack)
            changes = ", ".join(f"{k} = {v!r}" for k, v in doc["sizes"].items())
            what = f"It adds no figure or claim; it sets the sizes {changes}."
        before = "any data of its figures" if figures else "the data it recomputes"
        lines += [
            f"Plan amendment {number} ([{path.name}]({path.name}), {doc['date']}, written "
            f"before {before}; SHA-256 `{digest}`): {doc['reason']}. {what} "
            f"{doc['correction']}.",
            "",
        ]
    return lines


def _claims_markdown(claims: pd.DataFrame) -> str:
    if claims.empty:
        return "(no claim has its figures in this directory)"
    rows = [
        "Verdicts are computed (`interp_seal/figures/claims.py`; the statistical tests are in "
        "`interp_seal/analysis/statistics.py`) at level 0.05, each by the test `plan.json` named "
        "before the data: methods scored on the same records are compared record by record "
        "(exact McNemar test, paired bootstrap 95 % interval); per-question retrieval scores by "
        "the Wilcoxon signed-rank test, logit margins per record by the exact sign test; "
        "*comparable* needs a TOST equivalence test within 0.10 (the plan says why) and both "
        "arms above the baseline; outcomes on different records use Fisher's exact test. "
        "*supported*: significant in the claimed direction; *contradicted*: significant the "
        "other way; *not shown*: neither, with the records a new plan would need (80 % power) "
        "in *n needed*. Each p is adjusted by Holm's step-down procedure within its family "
        "(*Holm p*): the plan's claims form one family, as `plan.json` registered them, and "
        "each amendment's claims another (*family*), a claim not yet tested counting as "
        "p = 1; a verdict stands only where the adjusted p is below 0.05 (so the gallery "
        "as a whole at most 0.05 per family). A verdict is read only at the n the plan "
        "registered: a figure whose records differ in number from it gives an *off plan* "
        "row, untested. A row's "
        "test, n, difference, interval and p are those of the test that decides it; a row of "
        "several tests (each tuning run, each method) is supported only if all are. SEAL "
        "Table 1's claims are read on `confirm_n` fresh records per length (seed 2) whose "
        "queried line is not the last, every length pooled, for each of `tuning_seeds` tuning "
        "runs; heads a sweep chose and SEAL Fig. 4's records on fresh records too; Fig. 2d's "
        "scaling on a replication of its own seed (3); MuDAF's masking and target claims on "
        "fresh questions (seed 2), their heads chosen on the pilot's.",
        "",
        "| claim | paper | family | measured | test | n | difference [95 % interval] | p "
        "| Holm p | n needed | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in claims.itertuples():
        interval = f" [{r.low:+.2f}, {r.high:+.2f}]" if r.low == r.low else ""
        diff = f"{r.difference:+.3f}{interval}" if r.difference == r.difference else "-"
        p = f"{r.p_value:.3g}" if r.p_value == r.p_value else "-"
        adjusted = f"{r.p_holm:.3g}" if r.p_holm == r.p_holm else "-"
        needed = r.n_needed if isinstance(r.n_needed, str) and r.n_needed else "-"
        rows.append(
            f"| {r.claim} | {r.paper} | {r.family} | {r.measured} | {r.test} | {r.n} | {diff} "
            f"| {p} "
            f"| {adjusted} | {needed} | **{r.verdict}** |"
        )
    return "\n".join(rows)
