"""``FigureRun``: the model, the sizes and the resumable work shared by the figures.

Several figures need the same expensive steps (SEAL-H / SEAL-C scales, LoRA / DoRA and MuDAF /
SFT models, the head sweep, the base model's retrieval scores). Each step runs once per output
directory and is kept under ``<out>/work/``:

- trainings go through ``interp_seal.tuning.loop.train`` with an ``out_dir``, so a killed run
  resumes from its last checkpoint; the result (a scale file or a checkpoint) is written last;
  a tuned model's digest (``weights.json``) is kept beside it, so that a model retrained on
  another machine is refused unless it has the weights the stored rows were computed with
  (``same_weights``);
- per-point evaluations go through ``FigureRun.rows``: one keyed record per finished point
  (the run store, ``interp_seal.records``, fingerprinted by the model and the sizes) is
  appended to a ``records.jsonl`` and reused on restart, with the CPU and wall time it took,
  so a figure's compute time counts the interrupted runs too (``FigureRun.earlier``);
- sweeps, score logs and trainings use their own resumable stores, each in a folder that
  ``FigureRun.timed`` hands out: the time spent building it is booked beside it
  (``compute.jsonl``), so a figure that reuses a sweep or a tuned model an earlier run made
  counts that run's time as well.

**Needle rows.** The sizes a row is fingerprinted by are the registered ones (``plan.json``,
``run.json``), except for the rows of a store declared ``needles=True``, which are fingerprinted
by the run's sizes: the registered ones with the plan amendments' changes (``figures.plan``,
amendment 4: the needles' haystack). A figure's needle samples may feed only such rows:
``samples("needle")`` inside the rows of an undeclared store, and the rows of an undeclared
store after the figure made needle samples, are refused. So an amendment that moves the
needles to another haystack recomputes exactly the rows that read them; the stores of
content-fingerprinted records (score logs, masking conditions) recompute the records whose
samples or head sets changed (``records.recompute_changed``), and nothing else is touched.

The task format lives here, in one place: ``FigureRun.samples`` makes every prompt of the run
(line records, needles, passage questions; evaluation, sweeps, DLA, retrieval scores and
tuning data alike) in the sizes' format, ``FigureSizes.index_style`` line indices, wrapped in
``FigureSizes.chat_template``. The figures ask it for samples and never build a task config
themselves, so a model evaluated in its chat template is also swept, attributed and tuned in it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from interp_seal.figures.heldout import Ledger
from interp_seal.figures.inputs import row_digest
from interp_seal.figures.sizes import FigureSizes
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ContextExtension, ModelHandle, extend_context, load_model
from interp_seal.outputs import write_text
from interp_seal.records import RecordStore, fingerprint, recompute_changed
from interp_seal.tasks import (
    LineRetrievalConfig,
    NeedleConfig,
    PassagesConfig,
    line_retrieval,
    needle,
    passages,
)
from interp_seal.tasks.chat import force_prefix, wrap_samples
from interp_seal.tasks.sample import Sample
from interp_seal.tuning.methods import METHODS

WEIGHTS = "weights.json"  # a tuned model's weight digest, kept (and committed) with its stores
DATA_SEED = 1000  # tuning data; evaluation records and questions use seed 0 (as `interp-seal tune`)
TASKS = ("line_retrieval", "needle", "passages")


@dataclass
class RunTime:
    """Seconds of CPU and wall time."""

    cpu: float = 0.0
    wall: float = 0.0


class Stopwatch:
    """CPU and wall seconds since it started, less those of the stopwatches nested in it (a
    row that tunes scales, a sweep that ranks heads): each stored result books only its own
    work, and what an inner store booked is not booked again by the outer one."""

    def __init__(self):
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        self.inner = RunTime()
        self.stores: list[str] = []  # the timed stores entered inside it
        self.row: str | None = None  # the rows store it computes a row of, if any
        self.needles = False  # that store is declared to read needle samples

    def gross(self) -> RunTime:
        return RunTime(time.process_time() - self.cpu, time.perf_counter() - self.wall)

    def own(self) -> dict[str, float]:
        g = self.gross()
        return {"cpu_seconds": g.cpu - self.inner.cpu, "wall_seconds": g.wall - self.inner.wall}


LEDGER = "compute.jsonl"  # a timed store's build time, one key per block that worked on it
BOOK_EVERY = 60.0  # seconds between bookings of a running block's time
# tuning samples longer than this (tokens) recompute each layer in backward: SEAL-C through
# Self-Extend on SmolLM2 at 9K tokens peaked at 21.2 GB RSS without it, 7.7 GB with it
RECOMPUTE_ABOVE = 4096


@contextmanager
def declared_window(handle: ModelHandle, positions: int):
    """The model config's ``max_position_embeddings`` raised to ``positions`` inside the block
    (training's window check reads it; RoPE computes any position), restored after."""
    config = handle.model.config
    old = config.max_position_embeddings
    config.max_position_embeddings = max(old, positions)
    try:
        yield
    finally:
        config.max_position_embeddings = old


class RetrainedModelError(RuntimeError):
    """A tuned model was retrained and its weights differ from those earlier rows used."""


def same_weights(folder: Path, tag: str, device: str) -> None:
    """Check the checkpoint in ``folder / "model"`` against the weight digest the first
    training recorded (``WEIGHTS``); record it if there is none.

    Tuned models are not kept between machines (0.5 GB each), so a resumed gallery retrains
    them from their stored settings, and rows computed before and after would mix two models
    if the retraining did not give the same weights (another CPU's kernels, a GPU, a library
    release): their numbers would look like one model's. The digest is of the saved weight
    files, so it does not depend on the dtype or device a run loads them in.
    """
    digest = hashlib.sha256()
    for path in sorted((folder / "model").glob("*.safetensors")):
        with path.open("rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
    now = {"sha256": digest.hexdigest(), "trained_on": _machine(device)}
    record = folder / WEIGHTS
    if not record.exists():
        write_text(record, json.dumps(now) + "\n")
        return
    then = json.loads(record.read_text())
    if then["sha256"] != now["sha256"]:
        raise RetrainedModelError(
            f"the tuned model {tag!r} in {folder} was retrained and its weights differ from "
            f"those of the run that first trained it (sha256 {now['sha256'][:12]} on "
            f"{now['trained_on']} vs {then['sha256'][:12]} on {then.get('trained_on', '?')}): "
            "rows computed with the two models would be mixed. Either retrain it where it "
            "was first trained, or recompute the figures that use it (those whose data/*.json "
            f"name {tag!r} among the tuning sets they met, under 'heldout'; delete those files "
            f"and their row stores under work/), then delete {record}"
        )


def warn_other_machine(folder: Path, tag: str, device: str) -> None:
    """Before a retraining: warn when the recorded weights came from another device, CPU or
    library version, where ``same_weights`` may refuse the result after the training."""
    record = folder / WEIGHTS
    if not record.exists():
        return
    then, now = json.loads(record.read_text()).get("trained_on", "?"), _machine(device)
    if then != now:
        warnings.warn(
            f"retraining {tag!r} on {now}; its recorded weights were trained on {then}. "
            "If this machine's kernels give other weights, the model will be refused after "
            "the training (RetrainedModelError), to keep its figures' rows from one model",
            stacklevel=3,
        )


def _machine(device: str) -> str:
    """The device (with the CPU) and library versions a model trains on: what can change its
    weights."""
    import platform

    import transformers

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            x.split(":", 1)[1].strip()
            for x in cpuinfo.read_text().splitlines()
            if x.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    device = "" if device == "cpu" else f"{device} with "
    return f"{device}{cpu}, torch {torch.__version__}, transformers {transformers.__version__}"


class FigureRun:
    """One regeneration: ``model`` loaded once, ``sizes``, work files under ``out / "work"``.

    ``sizes`` are what the run computes with; ``registered`` (default ``sizes``) those its plan
    registered, before the amendments' changes, which fingerprint every row but needle rows
    (module docstring). ``earlier`` adds up the time that earlier runs spent on the records
    this run reuses (the driver resets it per figure).
    """

    def __init__(
        self,
        model: str,
        sizes: FigureSizes,
        out: str | Path,
        *,
        registered: FigureSizes | None = None,
        progress: bool = True,
        load_options: dict | None = None,
    ):
        self.model = model
        self.sizes = sizes
        self.registered = registered or sizes
        self.out = Path(out)
        self.progress = progress
        self.run_id = uuid.uuid4().hex
        self._counted: set[tuple[str, str]] = set()
        self._clocks: list[Stopwatch] = []  # the rows and timed blocks being computed
        self.load_options = load_options or {}
        self.handle = load_model(model, **self.load_options)
        self._memo: dict[str, object] = {}
        self.ledger = Ledger(self.out / "work" / "heldout")
        self.start_figure()

    def start_figure(self) -> None:
        """Forget what the previous figure read: the earlier runs' time it reused, the stores
        (``figures.inputs``), whether it made needle samples (module docstring) and whether it
        read rows of a store declared to read them; the driver calls it before each figure."""
        self.earlier = RunTime()
        self.read_rows: dict[str, dict[str, str]] = {}
        self.read_folders: set[str] = set()
        self.made_needles = False
        self.needle_rows = False  # a figure drawn again from stored needle rows makes none

    def work(self, *parts: str) -> Path:
        path = self.out.joinpath("work", *parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # -- records ---------------------------------------------------------------------------
    def rows(
        self,
        name: str,
        keys: Iterable[Mapping],
        compute: Callable[[Mapping], Mapping],
        *,
        needles: bool = False,
    ) -> pd.DataFrame:
        """One row per key: stored rows are reused, missing ones computed and appended at once.

        ``compute(key)`` returns the row's values; the table has the key's columns first.
        ``needles``: the rows read needle samples, so they are fingerprinted by the run's
        sizes, amendments included, instead of the registered ones (module docstring). A
        stored row whose fingerprint changed is computed again (``recompute_changed``).
        """
        if self.made_needles and not needles:
            raise RuntimeError(
                f"the rows of {name!r} come after this figure's needle samples but are not "
                "declared needles=True: a plan amendment that changes the haystack would keep "
                "them (FigureRun.rows)"
            )
        self.needle_rows = self.needle_rows or needles
        store = RecordStore(self.work(name, "records.jsonl"))
        setting = [self.model, (self.sizes if needles else self.registered).as_dict()]
        rows = []
        keys = [dict(k) for k in keys]
        for key in tqdm(keys, desc=name, leave=False, disable=not self.progress):
            tag = json.dumps(key, sort_keys=True)
            print_ = fingerprint(setting, key)
            with recompute_changed():
                record = store.get(tag, print_)
            if record is not None:
                self._count_earlier(name, tag, record)
                for used in record.get("stores", ()):  # what it tuned or swept on the way
                    self._count_ledger(used)
            else:
                with self._stopwatch() as clock:
                    clock.row, clock.needles = name, needles
                    values = dict(compute(key))
                record = {"key": tag, "fingerprint": print_, "values": values}
                record |= clock.own() | {"run": self.run_id, "stores": clock.stores}
                store.add(record)
            self.read_rows.setdefault(name, {})[tag] = row_digest(record)
            rows.append({**key, **record["values"]})
        return pd.DataFrame(rows)

    @contextmanager
    def timed(self, name: str) -> Iterator[Path]:
        """The folder ``work/name`` for a resumable store that is not a ``rows`` table (a
        sweep, a score log, a training), with its build time booked in ``compute.jsonl``.

        The entries of earlier runs count into ``earlier`` (once per run, like reused rows).
        This process's CPU and wall seconds inside the block (less those of rows and blocks
        nested in it, ``Stopwatch``) are booked every ``BOOK_EVERY`` seconds and when it ends,
        normally or by an error, under one key (the last entry of a key counts), so a
        ``kill -9`` loses at most a minute of the count and none of the work. Inside the block a
        stored record whose inputs changed is computed again (``recompute_changed``).
        """
        ledger = self._count_ledger(name)
        folder = ledger.path.parent
        for outer in self._clocks:  # a stored row reused later counts this store too
            outer.stores.append(name)
        key, stop = uuid.uuid4().hex, threading.Event()
        with self._stopwatch() as clock:

            def book():
                ledger.add({"key": key, "fingerprint": "", "run": self.run_id} | clock.own())

            def keep_booking():
                while not stop.wait(BOOK_EVERY):
                    book()

            booker = threading.Thread(target=keep_booking, daemon=True)
            booker.start()
            try:
                with recompute_changed():
                    yield folder
            finally:
                stop.set()
                booker.join()
                book()

    @contextmanager
    def _stopwatch(self) -> Iterator[Stopwatch]:
        """A ``Stopwatch`` for a row or timed block; its gross time is excluded from the one it
        is nested in."""
        clock = Stopwatch()
        self._clocks.append(clock)
        try:
            yield clock
        finally:
            self._clocks.pop()
            if self._clocks:
                g, outer = clock.gross(), self._clocks[-1].inner
                outer.cpu, outer.wall = outer.cpu + g.cpu, outer.wall + g.wall

    def _count_ledger(self, name: str) -> RecordStore:
        """Count the bookings of ``work/name``'s earlier runs (the last entry of each key)."""
        self.read_folders.add(name)
        ledger = RecordStore(self.work(name, LEDGER))
        for entry in {e["key"]: e for e in ledger.load()}.values():
            self._count_earlier(name, entry["key"], entry)
        return ledger

    def _count_earlier(self, name: str, tag: str, record: Mapping) -> None:
        """Add the time of a record an earlier run computed, once per run (records computed by
        this run are in the driver's own clock; figures sharing a record count it once)."""
        if record.get("run") == self.run_id or (name, tag) in self._counted:
            return
        self._counted.add((name, tag))
        self.earlier.cpu += record.get("cpu_seconds", 0.0)
        self.earlier.wall += record.get("wall_seconds", 0.0)

    # -- tuned variants --------------------------------------------------------------------
    def fresh_handle(self) -> ModelHandle:
        """A new copy of the model (tuners that edit weights in place get their own)."""
        return load_model(self.model, **self.load_options)

    # -- the task format -------------------------------------------------------------------
    def _haystack(self) -> dict:
        """The needle grid's haystack options from the sizes (``haystack``, ``haystack_repeat``)."""
        return {
            "haystack": needle.read_haystack(self.sizes.haystack),
            "repeat": self.sizes.haystack_repeat,
        }

    def check_haystack(self) -> None:
        """Refuse, before any figure, sizes whose longest needle context (the grid's, and SEAL
        Table 2's with ``extension_task="needle"``) needs more haystack than there is
        (``tasks.needle``: a haystack is not repeated unless the sizes say so). Fig. 6's
        lengths after a line-retrieval Table 2 are its records' token counts, known only from
        the records, and are checked as that figure makes its needles."""
        s = self.sizes
        table2 = s.extension_lengths if s.extension_task == "needle" else ()
        longest = max(s.needle_lengths + table2)
        cfg = NeedleConfig(context_lengths=(longest,), depths=(100,), **self._haystack())
        try:
            needle.generate(cfg, self.handle.tokenizer)
        except ValueError as err:
            raise ValueError(f"the needle figures' haystack {s.haystack!r}: {err}") from None

    def samples(
        self,
        task: str,
        n: int,
        *,
        seed: int,
        size: int | None = None,
        depths: tuple[float, ...] | None = None,
    ) -> list[Sample]:
        """``n`` evaluation samples of ``task`` in this run's format, from ``seed``, recorded
        in the run's ``Ledger`` as scored by the current figure (so no tuning set may share
        their content, ``figures.heldout``).

        ``"line_retrieval"``: ``n`` LongEval records of ``size`` lines with the sizes'
        ``index_style``; ``"passages"``: ``n`` 1-hop questions over ``size`` passages (one
        golden); ``"needle"``: the needle grid over SEAL's needles in the sizes' ``haystack``,
        context lengths ``(size,)`` (default the sizes' ``needle_lengths``) x ``depths``
        (default ``needle_depths``), ``n`` seeded needles per cell.
        """
        s = self.sizes
        if task == "needle":
            undeclared = [c.row for c in self._clocks if c.row and not c.needles]
            if undeclared:
                raise RuntimeError(
                    f"needle samples made inside a row of {undeclared[-1]!r}, whose store is not "
                    "declared needles=True: a plan amendment that changes the haystack would "
                    "keep its rows (FigureRun.rows)"
                )
            self.made_needles = True
            cfg = NeedleConfig(
                context_lengths=(size,) if size else s.needle_lengths,
                depths=s.needle_depths if depths is None else depths,
                answer=s.needle_answer,
                **self._haystack(),
            )
            raw = needle.generate(cfg, self.handle.tokenizer, n, seed)
        else:
            raw = self._generate(task, n, seed, size)
        out = self._format(task, raw)
        self.ledger.evaluated(self.ledger.figure, out)
        return out

    def _generate(self, task: str, n: int, seed: int, size: int | None) -> list[Sample]:
        """Line records or passage questions (``samples``), before the run's format."""
        if task == "line_retrieval":
            cfg = LineRetrievalConfig(num_lines=size, index_style=self.sizes.index_style)
            return line_retrieval.generate(cfg, n, seed)
        if task == "passages":
            return passages.generate(PassagesConfig(num_passages=size), n, seed)
        raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")

    def _format(self, task: str, raw: list[Sample]) -> list[Sample]:
        """Needles and questions get their answer's lead-in forced when the sizes say
        ``lead_in``; every sample is wrapped in ``chat_template``."""
        s = self.sizes
        if s.lead_in and task != "line_retrieval":  # LongEval records force SEAL's prefix
            lead = needle.lead_in if task == "needle" else passages.lead_in
            raw = [force_prefix(x, lead(x)) for x in raw]
        return wrap_samples(raw, s.chat_template, self.handle.tokenizer)

    def line_records(self, lengths: Iterable[int], n: int, *, seed: int = 0) -> dict[int, list]:
        """``samples("line_retrieval", n, seed=seed, size=L)`` for each ``L`` in ``lengths``."""
        return {L: self.samples("line_retrieval", n, seed=seed, size=L) for L in lengths}

    def tuning_samples(
        self,
        name: str,
        task: str = "line_retrieval",
        *,
        n: int | None = None,
        lines: int | None = None,
        tokens: int | None = None,
        seed: int = 0,
    ) -> list[Sample]:
        """``n`` (default ``tune_n``) tuning samples in ``task``'s format, from data seed
        ``DATA_SEED + seed`` (``seed``: the tuning run, SEAL's results are one run each; the
        gallery tunes ``tuning_seeds`` of them), recorded in the ``Ledger`` as ``name``'s
        tuning set: a sample that shares content with any evaluation stops the run.

        ``"line_retrieval"``: SEAL's records of ``lines`` (default ``tune_lines``) lines;
        ``"passages"``: MuDAF's multi-document QA (Sec. 4.1 trains on HotpotQA), the 1-hop
        synthetic questions of the evaluation with ``retrieval_passages`` passages;
        ``"needle"``: SEAL's needle-format data (App. B.2), one needle at each of ``n`` depths
        evenly spread over a ``tokens``-token context. SEAL tunes on its ten needles in the
        haystack it evaluates; here each tuning needle is generated in SEAL's style and hidden
        in its own generated haystack with distractors (``tasks.training_needles``), so the
        evaluation's needles and essays stay unseen.
        """
        n = n or self.sizes.tune_n
        data_seed = DATA_SEED + seed
        if task == "line_retrieval":
            raw = self._generate(task, n, data_seed, lines or self.sizes.tune_lines)
        elif task == "passages":
            raw = self._generate(task, n, data_seed, self.sizes.retrieval_passages)
        elif task == "needle":
            if tokens is None:
                raise ValueError("needle tuning samples need tokens, the context length")
            raw = self._training_needles(n, tokens, data_seed)
        else:
            raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
        out = self._format(task, raw)
        self.ledger.tuned(name, out)
        return out

    def _training_needles(self, n: int, tokens: int, seed: int) -> list[Sample]:
        """One generated needle per depth of ``linear_grid(0, 100, n)`` in a ``tokens``-token
        context of generated filler (``training_needles``), answered as ``needle_answer``."""
        import random

        from interp_seal.tasks import training_needles as tn

        rng = random.Random(f"training-needles/{seed}")
        out = []
        for depth in needle.linear_grid(0, 100, n):
            made = tn.make_needle(rng)
            cfg = NeedleConfig(
                context_lengths=(tokens,),
                depths=(depth,),
                needles=(made,),
                haystack=tn.make_haystack(rng, n_words=tokens, avoid=made),
                answer=self.sizes.needle_answer,
            )
            out += needle.generate(cfg, self.handle.tokenizer, 1, seed)
        return out

    def _train(
        self, tuner, samples, folder: Path, *, lr: float, epochs: int = 1, seed: int = 0, ctx=None
    ) -> None:
        from interp_seal.engine import pad_id_of
        from interp_seal.tuning.data import encode_examples
        from interp_seal.tuning.loop import TrainConfig, train

        examples = encode_examples(samples, self.handle.tokenizer)
        long = max(len(x.encoded) for x in examples) > RECOMPUTE_ABOVE
        cfg = TrainConfig(
            lr=lr,
            epochs=epochs,
            seed=seed,
            checkpoint_every=1 if long else 10,  # a long step costs minutes: keep every one
            gradient_checkpointing=long,
        )
        with ctx or nullcontext():
            train(
                tuner,
                examples,
                cfg,
                pad_id=pad_id_of(self.handle.tokenizer),
                out_dir=folder / "train",
            )

    def seal_scales(
        self,
        granularity: str,
        *,
        lr: float | None = None,
        n: int | None = None,
        epochs: int = 1,
        lines: int | None = None,
        needle_tokens: int | None = None,
        extension: ContextExtension | None = None,
        task: str = "line_retrieval",
        seed: int = 0,
    ) -> HeadIntervention:
        """SEAL-H (``"head"``) or SEAL-C (``"channel"``) scales tuned on this run's data: line
        records of ``lines`` lines (default ``tune_lines``), or, with ``needle_tokens``,
        needle-format samples of that many tokens, or, with ``task="passages"``, the passage
        questions of ``tuning_samples("passages")`` (SEAL Table 3's in-domain scales).
        ``seed``: the tuning run (its samples and their order, ``tuning_samples``)."""
        from interp_seal.tuning.scales import ScaleFile, load_scales, save_scales
        from interp_seal.tuning.seal import SEAL_METHODS, SealTuner

        method = SEAL_METHODS[granularity]
        lr = lr or METHODS[method].lr
        n = n or self.sizes.tune_n
        lines = lines or self.sizes.tune_lines
        ext = extension.label.replace(" ", "") if extension else "none"
        if task not in ("line_retrieval", "passages") or (
            needle_tokens and task != "line_retrieval"
        ):
            raise ValueError(
                "seal_scales tunes on line records, on passage questions (task='passages') or, "
                f"with needle_tokens alone, on needles; got task={task!r}, "
                f"needle_tokens={needle_tokens}"
            )
        if needle_tokens:
            task, data, what = "needle", f"needle{needle_tokens}", {"tokens": needle_tokens}
        elif task == "passages":
            count = self.sizes.retrieval_passages
            data, what = f"passages{count}", {"num_passages": count}
        else:
            data, what = f"lines{lines}", {"num_lines": lines}
        name = f"{method}_lr{lr:g}_n{n}_e{epochs}_{data}_ext{ext}_seed{seed}"
        samples = self.tuning_samples(name, task, n=n, lines=lines, tokens=needle_tokens, seed=seed)
        with self.timed(name) as folder:
            path = folder / "scales.safetensors"
            if not path.exists():
                tuner = SealTuner(self.handle, granularity)
                ctx = ExitStack()
                if extension:  # SEAL Table 2 tunes past the trained window on purpose
                    ctx.enter_context(extend_context(self.handle, extension))
                    longest = max(len(x.encode(self.handle.tokenizer)) for x in samples)
                    ctx.enter_context(declared_window(self.handle, longest))
                self._train(tuner, samples, folder, lr=lr, epochs=epochs, seed=seed, ctx=ctx)
                hyper = {"lr": lr, "samples": n, "epochs": epochs, "ext": ext, "seed": seed}
                hyper |= what
                save_scales(
                    path,
                    ScaleFile(
                        scales=tuner.scales.detach().cpu(),
                        spec=self.handle.spec,
                        model=self.handle.identity,
                        granularity=granularity,
                        task=task,
                        hyperparameters=hyper,
                    ),
                )
        scales = load_scales(path, self.handle.spec).scales
        return HeadIntervention.from_scales(self.handle.spec, scales)

    def tuned_model(
        self,
        method: str,
        *,
        heads: tuple = (),
        alpha: float = 0.5,
        needle_tokens: int | None = None,
        n: int | None = None,
        seed: int = 0,
    ) -> ModelHandle:
        """A fine-tuned copy: ``"seal-l"`` / ``"seal-d"`` (LoRA / DoRA, merged; on the line
        records, or with ``needle_tokens`` on ``n`` needle-format samples of that many tokens),
        ``"mudaf"`` on ``heads`` or ``"sft"`` (MuDAF with alpha 0), saved once under ``work/``.
        ``seed``: the tuning run (samples, their order and the adapters' initialisation)."""
        from interp_seal.tuning.merge import save_checkpoint

        if needle_tokens and method not in ("seal-l", "seal-d"):
            raise ValueError(f"needle tuning applies to seal-l / seal-d, not {method!r}")
        tag = method + ("_" + "-".join(f"{a}.{b}" for a, b in heads) if heads else "")
        if needle_tokens:
            tag += f"_needle{needle_tokens}_n{n or self.sizes.tune_n}"
        tag += f"_seed{seed}"
        if tag in self._memo:
            self.ledger.used(tag)
            self.read_folders.add(tag)
            return self._memo[tag]
        if method in ("seal-l", "seal-d"):
            task = "needle" if needle_tokens else "line_retrieval"
            samples = self.tuning_samples(tag, task, n=n, tokens=needle_tokens, seed=seed)
        else:
            samples = self.tuning_samples(tag, "passages", seed=seed)
        device = str(self.load_options.get("device") or "cpu")
        with self.timed(tag) as folder:
            ckpt = folder / "model"
            if not (ckpt / "config.json").exists():
                warn_other_machine(folder, tag, device)
                handle = self.fresh_handle()
                torch.manual_seed(seed)  # the adapters' initialisation
                if method in ("seal-l", "seal-d"):
                    from interp_seal.tuning.peft_baselines import PeftBaselineConfig, PeftTuner

                    tuner = PeftTuner(handle, PeftBaselineConfig(dora=method == "seal-d"))
                    self._train(tuner, samples, folder, lr=METHODS[method].lr, seed=seed)
                    model = tuner.merge_and_unload()
                else:
                    from interp_seal.tuning.mudaf import MudafConfig, MudafTuner

                    cfg = MudafConfig(heads=heads, alpha=alpha if heads else 0.0)
                    tuner = MudafTuner(handle, cfg)
                    self._train(tuner, samples, folder, lr=METHODS[tuner.method].lr, seed=seed)
                    model = tuner.model
                save_checkpoint(model, handle.tokenizer, ckpt)
            same_weights(folder, tag, device)
        self._memo[tag] = load_model(ckpt, **self.load_options)
        return self._memo[tag]
