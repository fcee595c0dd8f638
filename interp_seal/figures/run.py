"""``FigureRun``: the model, the sizes and the resumable work shared by the figures.

Several figures need the same expensive steps (SEAL-H / SEAL-C scales, LoRA / DoRA and MuDAF /
SFT models, the head sweep, the base model's retrieval scores). Each step runs once per output
directory and is kept under ``<out>/work/``:

- trainings go through ``interp_seal.tuning.loop.train`` with an ``out_dir``, so a killed run
  resumes from its last checkpoint; the result (a scale file or a checkpoint) is written last;
- per-point evaluations go through ``FigureRun.rows``: one keyed record per finished point
  (the run store, ``interp_seal.records``: a point computed for another model or other sizes
  is refused, not reused) is appended to a ``records.jsonl`` and reused on restart, with the
  CPU and wall time it took, so a figure's compute time counts the interrupted runs too
  (``FigureRun.earlier``);
- sweeps use the sweep engine's own store (``SweepOptions(out=..., resume=True)``).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from interp_seal.figures.sizes import FigureSizes
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ContextExtension, ModelHandle, extend_context, load_model
from interp_seal.records import RecordStore, fingerprint
from interp_seal.tasks.sample import Sample
from interp_seal.tuning.methods import METHODS

DATA_SEED = 1000  # tuning data; evaluation records and questions use seed 0 (as `interp-seal tune`)


@dataclass
class RunTime:
    """Seconds of CPU and wall time."""

    cpu: float = 0.0
    wall: float = 0.0


class FigureRun:
    """One regeneration: ``model`` loaded once, ``sizes``, work files under ``out / "work"``.

    ``earlier`` adds up the time that earlier runs spent on the records this run reuses (the
    driver resets it per figure).
    """

    def __init__(
        self,
        model: str,
        sizes: FigureSizes,
        out: str | Path,
        *,
        progress: bool = True,
        load_options: dict | None = None,
    ):
        self.model = model
        self.sizes = sizes
        self.out = Path(out)
        self.progress = progress
        self.earlier = RunTime()
        self.run_id = uuid.uuid4().hex
        self._counted: set[tuple[str, str]] = set()
        self.load_options = load_options or {}
        self.handle = load_model(model, **self.load_options)
        self._memo: dict[str, object] = {}

    def work(self, *parts: str) -> Path:
        path = self.out.joinpath("work", *parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # -- records ---------------------------------------------------------------------------
    def rows(
        self, name: str, keys: Iterable[Mapping], compute: Callable[[Mapping], Mapping]
    ) -> pd.DataFrame:
        """One row per key: stored rows are reused, missing ones computed and appended at once.

        ``compute(key)`` returns the row's values; the table has the key's columns first.
        """
        store = RecordStore(self.work(name, "records.jsonl"))
        setting = [self.model, dataclasses.asdict(self.sizes)]
        rows = []
        keys = [dict(k) for k in keys]
        for key in tqdm(keys, desc=name, leave=False, disable=not self.progress):
            tag = json.dumps(key, sort_keys=True)
            print_ = fingerprint(setting, key)
            record = store.get(tag, print_)
            if record is not None:
                self._count_earlier(name, tag, record)
            else:
                cpu, wall = time.process_time(), time.perf_counter()
                values = dict(compute(key))
                record = {
                    "key": tag,
                    "fingerprint": print_,
                    "values": values,
                    "cpu_seconds": time.process_time() - cpu,
                    "wall_seconds": time.perf_counter() - wall,
                    "run": self.run_id,
                }
                store.add(record)
            rows.append({**key, **record["values"]})
        return pd.DataFrame(rows)

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

    def tuning_samples(
        self, task: str = "line_retrieval", *, n: int | None = None, lines: int | None = None
    ) -> list[Sample]:
        """``n`` (default ``tune_n``) tuning samples in ``task``'s format, seed ``DATA_SEED``.

        ``"line_retrieval"``: SEAL's records of ``lines`` (default ``tune_lines``) lines;
        ``"passages"``: MuDAF's multi-document QA (Sec. 4.1 trains on HotpotQA), the 1-hop
        synthetic questions of the evaluation with ``retrieval_passages`` passages and golden
        ids (``tuning.data.format_samples``).
        """
        from interp_seal.tuning.data import format_samples

        size = (
            {"num_passages": self.sizes.retrieval_passages}
            if task == "passages"
            else {"num_lines": lines or self.sizes.tune_lines}
        )
        n = n or self.sizes.tune_n
        return format_samples(task, self.handle.tokenizer, n, seed=DATA_SEED, **size)

    def _train(self, tuner, samples, name: str, *, lr: float, epochs: int = 1, ctx=None) -> None:
        from interp_seal.engine import pad_id_of
        from interp_seal.tuning.data import encode_examples
        from interp_seal.tuning.loop import TrainConfig, train

        cfg = TrainConfig(lr=lr, epochs=epochs, checkpoint_every=10, cpu=True)
        examples = encode_examples(samples, self.handle.tokenizer)
        with ctx or nullcontext():
            train(
                tuner,
                examples,
                cfg,
                pad_id=pad_id_of(self.handle.tokenizer),
                out_dir=self.work(name, "train"),
            )

    def seal_scales(
        self,
        granularity: str,
        *,
        lr: float | None = None,
        n: int | None = None,
        epochs: int = 1,
        lines: int | None = None,
        extension: ContextExtension | None = None,
    ) -> HeadIntervention:
        """SEAL-H (``"head"``) or SEAL-C (``"channel"``) scales tuned on this run's data."""
        from interp_seal.tuning.scales import ScaleFile, load_scales, save_scales
        from interp_seal.tuning.seal import SEAL_METHODS, SealTuner

        method = SEAL_METHODS[granularity]
        lr = lr or METHODS[method].lr
        n = n or self.sizes.tune_n
        lines = lines or self.sizes.tune_lines
        ext = extension.label.replace(" ", "") if extension else "none"
        name = f"{method}_lr{lr:g}_n{n}_e{epochs}_lines{lines}_ext{ext}"
        path = self.work(name, "scales.safetensors")
        if not path.exists():
            tuner = SealTuner(self.handle, granularity)
            ctx = extend_context(self.handle, extension) if extension else None
            self._train(
                tuner, self.tuning_samples(n=n, lines=lines), name, lr=lr, epochs=epochs, ctx=ctx
            )
            hyper = {"lr": lr, "samples": n, "epochs": epochs, "num_lines": lines, "ext": ext}
            save_scales(
                path,
                ScaleFile(
                    scales=tuner.scales.detach().cpu(),
                    spec=self.handle.spec,
                    model=self.handle.name_or_path,
                    granularity=granularity,
                    task="line_retrieval",
                    hyperparameters=hyper,
                ),
            )
        scales = load_scales(path, self.handle.spec).scales
        return HeadIntervention.from_scales(self.handle.spec, scales)

    def tuned_model(self, method: str, *, heads: tuple = (), alpha: float = 0.5) -> ModelHandle:
        """A fine-tuned copy: ``"seal-l"`` / ``"seal-d"`` (LoRA / DoRA, merged), ``"mudaf"`` on
        ``heads`` or ``"sft"`` (MuDAF with alpha 0), saved once under ``work/``."""
        from interp_seal.tuning.merge import save_checkpoint

        tag = method + ("_" + "-".join(f"{a}.{b}" for a, b in heads) if heads else "")
        if tag in self._memo:
            return self._memo[tag]
        ckpt = self.work(tag, "model")
        if not (ckpt / "config.json").exists():
            handle = self.fresh_handle()
            if method in ("seal-l", "seal-d"):
                from interp_seal.tuning.peft_baselines import PeftBaselineConfig, PeftTuner

                tuner = PeftTuner(handle, PeftBaselineConfig(dora=method == "seal-d"))
                self._train(tuner, self.tuning_samples(), tag, lr=METHODS[method].lr)
                model = tuner.merge_and_unload()
            else:
                from interp_seal.tuning.mudaf import MudafConfig, MudafTuner

                cfg = MudafConfig(heads=heads, alpha=alpha if heads else 0.0)
                tuner = MudafTuner(handle, cfg)
                samples = self.tuning_samples("passages")
                self._train(tuner, samples, tag, lr=self.sizes.mudaf_lr)
                model = tuner.model
            save_checkpoint(model, handle.tokenizer, ckpt)
        self._memo[tag] = load_model(ckpt, **self.load_options)
        return self._memo[tag]
