"""``regenerate``: every SEAL / MuDAF figure for one model, resumable, then the gallery page.

For each figure of ``interp_seal.figures.registry.FIGURES`` (or the ``only`` ones):

1. if ``<out>/data/<name>.json`` exists and the stores it was computed from are unchanged
   (``figures.inputs``: the JSON records their digests), its tables are loaded (nothing is
   recomputed); otherwise ``compute`` runs the analyses (their own steps resume from
   ``<out>/work/``) and the tables are written as CSV files and as that JSON, the JSON last
   and atomically: it is the mark that the figure's data is complete, so a kill at any moment
   loses at most the step in flight;
2. ``draw`` turns the loaded tables into a figure and ``finish`` writes the model and the
   records per point under its title (and the trained window where it matters):
   ``<out>/<name>.html`` (plotly; the pages load ``<out>/plotly.min.js``, written once per
   gallery, so they open offline) and ``<out>/<name>.png`` (kaleido; skipped with a message
   if no browser);
3. the gallery page ``<out>/README.md`` and ``<out>/claims.csv`` are written from all the data.

A directory holds one model at one size under one plan: before any work, ``<out>/plan.json``
pre-registers every claim's test, population, records and seeds (``figures.plan``), and
``<out>/run.json`` records the model, the sizes and the plan's hash; a run with other
arguments or another plan is refused rather than mixing results. The plan's amendments
(``figures.plan.AMENDMENTS``: figures and claims added later) are written beside it as
``<out>/plan_amendment_<N>.json`` before any figure computes; one that differs from the code's,
changes the plan instead of adding to it, or comes after data of its own figures is refused. While the figures compute,
no tuning set may share content with any evaluation (``figures.heldout``); each figure's JSON
records its evaluation set and the tuning sets it used.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from interp_seal.figures import inputs
from interp_seal.figures.export import PngExporter
from interp_seal.figures.gallery import write_gallery
from interp_seal.figures.plan import (
    PLAN,
    amended_sizes,
    gallery_amendments,
    gallery_plan,
    plan_bytes,
    plan_hash,
    write_amendments,
)
from interp_seal.figures.registry import Drawing, FigureSpec, select
from interp_seal.figures.run import FigureRun
from interp_seal.figures.sizes import preset_sizes
from interp_seal.figures.tables import load_tables
from interp_seal.outputs import write_html, write_table, write_text
from interp_seal.records import open_manifest


@dataclass(kw_only=True)
class GalleryResult:
    """What a regeneration produced: per figure its files, tables and whether it was computed."""

    out: Path
    computed: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    stale: dict[str, list[str]] = field(default_factory=dict)  # recomputed: stores changed
    unchecked: list[str] = field(default_factory=list)  # reused, data without input digests
    png: bool = True
    png_problem: str | None = None


def regenerate(
    model: str = "organism",
    out: str | Path = "figures/organism",
    *,
    only: list[str] | None = None,
    quick: bool = False,
    png: bool = True,
    progress: bool = True,
    command: str | None = None,
    load_options: dict | None = None,
) -> GalleryResult:
    """Regenerate the figures of ``model`` into ``out`` (see the module docstring);
    ``load_options`` go to every ``load_model`` of the run (device, dtype, device_map)."""
    specs = select(only)  # unknown names fail before any work
    sizes = preset_sizes(model, quick=quick)
    out = Path(out)
    plan = gallery_plan(model, sizes)
    identity = {"model": model, "sizes": sizes.as_dict(), "plan_sha256": plan_hash(plan)}
    amendments = gallery_amendments(model, sizes)
    registered, sizes = sizes, amended_sizes(sizes, amendments)
    run = FigureRun(
        model, sizes, out, registered=registered, progress=progress, load_options=load_options
    )
    run.check_haystack()  # before anything is written
    open_manifest(out / "run.json", identity, resume=True, what="gallery")
    if not (out / PLAN).exists():  # the same plan when run.json matched
        write_text(out / PLAN, plan_bytes(plan).decode())
    write_amendments(out, plan, amendments)  # refused: another, a change, data before it
    (out / "data").mkdir(parents=True, exist_ok=True)
    result = GalleryResult(out=out)
    window = getattr(run.handle.model.config, "max_position_embeddings", None)
    drawing_sizes = sizes.as_dict() | sizes.amendment_sizes()
    drawing = Drawing(model=model, sizes=drawing_sizes, window=window)
    with PngExporter(enabled=png) as exporter:
        for spec in tqdm(specs, desc="figures", disable=not progress):
            tables = _data(spec, run, result)
            fig = spec.finish(spec.draw(tables), tables, drawing)
            write_html(fig, out / f"{spec.name}.html", div_id=spec.name)
            exporter.write(fig, out / f"{spec.name}.png")
        result.png, result.png_problem = exporter.available, exporter.problem
    write_gallery(
        out,
        command=command or _command(model, out, quick),
        png=result.png,
        png_problem=result.png_problem,
    )
    return result


def _data(spec: FigureSpec, run: FigureRun, result: GalleryResult) -> dict[str, pd.DataFrame]:
    path = run.out / "data" / f"{spec.name}.json"
    if path.exists():
        tables, doc = load_tables(path)
        stale = inputs.changed(run.out / "work", doc.get("inputs"))
        if needles_moved(doc, run, spec):
            stale.append("the needles' haystack (plan amendment 4)")
        if not stale:
            result.reused.append(spec.name)
            if "inputs" not in doc:
                result.unchecked.append(spec.name)
            return tables
        result.stale[spec.name] = stale
    cpu, wall = time.process_time(), time.perf_counter()
    run.start_figure()
    run.ledger.figure = spec.name  # what it scores and tunes on is booked to it
    tables = spec.compute(run)
    run.ledger.figure = None
    if run.made_needles and not spec.needles:
        raise RuntimeError(
            f"{spec.name} made needle samples but its FigureSpec does not declare needles=True: "
            "its data would be kept when a plan amendment moves the needles (figures.registry)"
        )
    folder = run.out / "data" / spec.name
    for name, table in tables.items():
        write_table(table, folder / f"{name}.csv")
    doc = {
        "figure": spec.name,
        "paper": spec.paper,
        "model": run.model,
        "device": _device(run),
        # this run's time plus that of the records earlier (interrupted) runs computed
        "cpu_seconds": round(time.process_time() - cpu + run.earlier.cpu, 1),
        "wall_seconds": round(time.perf_counter() - wall + run.earlier.wall, 1),
        # its evaluation set and the tuning sets it used: disjoint (figures.heldout)
        "heldout": run.ledger.summary(spec.name),
        # the stores its tables come from, checked before the file is reused (figures.inputs)
        "inputs": inputs.digests(run.out / "work", run.read_rows, run.read_folders),
        # the haystack of the needles it read, made now or in stored rows (None: none)
        "haystack": needles_read(run),
        "tables": {k: json.loads(v.to_json(orient="records")) for k, v in tables.items()},
    }
    write_text(path, json.dumps(doc, indent=1, default=str))
    result.computed.append(spec.name)
    return load_tables(path)[0]  # draw from what is on disk, as a later run will


def _haystack(sizes) -> list:
    """The needles' haystack as a figure's data records it: ``[name, repeated]``."""
    return [sizes.haystack, sizes.haystack_repeat]


def needles_read(run: FigureRun) -> list | None:
    """The haystack of the needles the current figure read, made now or in its stored rows
    (None: it read none), as its data records it."""
    return _haystack(run.sizes) if run.made_needles or run.needle_rows else None


def needles_moved(doc: dict, run: FigureRun, spec: FigureSpec) -> bool:
    """Whether a figure's stored data hid its needles in another haystack than the run's
    (an amendment moved them, ``figures.plan``). Data that made no needles records None; data
    written before figures recorded their haystack used the registered one if the figure is
    declared to read needles (``FigureSpec.needles``)."""
    then = doc.get("haystack", _haystack(run.registered) if spec.needles else None)
    return then not in (None, _haystack(run.sizes))


def _device(run: FigureRun) -> str:
    """Where the model ran: ``cpu``, or the accelerator's name (``cuda: NVIDIA H100 ...``)."""
    import torch

    device = run.handle.device
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return device.type


def _command(model: str, out: Path, quick: bool) -> str:
    return f"interp-seal figures --model {model} --out {out}" + (" --quick" if quick else "")
