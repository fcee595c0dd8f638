"""One entry point per tuning job: ``tune(handle, method, samples) -> TuneResult``.

Every method of ``methods.METHODS`` (SEAL-H / SEAL-C scales, SEAL Sec. 4; the SEAL-L / SEAL-D
LoRA / DoRA baselines; MuDAF's contrastive attention focusing and its Vanilla SFT baseline,
MuDAF Sec. 3) runs through the same steps: build the method's tuner, encode and right-pad the
samples, run the one training loop (``loop.train``: accelerate, resumable from ``out``), and
hand back what was learned. A notebook needs nothing else::

    seal_h = tune(handle, "seal-h", train_samples, out="runs/seal-h")
    table = evaluate_line_retrieval(handle, [40, 80], intervention=seal_h.intervention)
    merged = seal_h.merge("runs/seal-h-merged")  # a plain HF checkpoint, zero overhead

SEAL methods leave ``handle`` untouched (the scales live outside the model); the others train
weights, so they train a copy of the model and ``handle`` stays the base model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from interp_seal.engine import pad_id_of
from interp_seal.interventions import HeadIntervention
from interp_seal.models import ModelHandle
from interp_seal.tasks.sample import Sample
from interp_seal.tuning.data import encode_examples
from interp_seal.tuning.loop import TrainConfig, TrainResult, train
from interp_seal.tuning.merge import copy_handle, merged_model, save_checkpoint
from interp_seal.tuning.methods import METHODS
from interp_seal.tuning.mudaf import MudafConfig, MudafTuner
from interp_seal.tuning.peft_baselines import PeftBaselineConfig, PeftTuner
from interp_seal.tuning.scales import ScaleFile, save_scales
from interp_seal.tuning.seal import SealTuner

GRANULARITY = {"seal-h": "head", "seal-c": "channel"}


@dataclass(frozen=True, kw_only=True, eq=False)
class TuneResult:
    """What ``tune`` learned.

    Attributes:
        method: the method's name (``methods.METHODS``).
        handle: the base model it was tuned from (unchanged).
        tuner: the trained tuner.
        run: the training loop's record (steps, per-step losses, processes, seconds).
        config: the training settings used.
    """

    method: str
    handle: ModelHandle
    tuner: object
    run: TrainResult
    config: TrainConfig

    @property
    def losses(self) -> list[float]:
        return self.run.losses

    @property
    def scales(self) -> Tensor | None:
        """SEAL-H ``(L, H, 1)`` / SEAL-C ``(L, H, D)`` scales (None for the other methods)."""
        if self.method not in GRANULARITY:
            return None
        return self.tuner.scales.detach().cpu()

    @property
    def intervention(self) -> HeadIntervention | None:
        """The learned scales as an edit of ``handle`` (``intervention=`` / ``handle.edit``)."""
        scales = self.scales
        return None if scales is None else HeadIntervention.from_scales(self.handle.spec, scales)

    @property
    def model(self) -> ModelHandle | None:
        """The tuned model of a weight-training method (adapters merged); None for SEAL, whose
        model is ``merge()``."""
        if self.method in GRANULARITY:
            return None
        if isinstance(self.tuner, PeftTuner):
            return copy_handle(self.handle, self.tuner.merge_and_unload())
        return copy_handle(self.handle, self.tuner.model)

    def merge(self, out_dir: str | Path | None = None) -> ModelHandle:
        """The tuned model as a plain model (SEAL: scales folded into ``o_proj``, exact), saved
        as an HF checkpoint in ``out_dir`` if given."""
        tuned = merged_model(self.handle, self.scales) if self.method in GRANULARITY else self.model
        if out_dir is not None:
            save_checkpoint(tuned.model, tuned.tokenizer, out_dir)
        return tuned

    def save(self, path: str | Path) -> Path:
        """SEAL: the scale file (safetensors, with its geometry and settings); the others: the
        tuned checkpoint directory."""
        if self.method not in GRANULARITY:
            return save_checkpoint(self.model.model, self.handle.tokenizer, path)
        file = ScaleFile(
            scales=self.scales,
            spec=self.handle.spec,
            model=self.handle.identity,
            granularity=GRANULARITY[self.method],
            task="",
            hyperparameters={"lr": self.config.lr, "epochs": self.config.epochs},
        )
        return save_scales(path, file)


def tune(
    handle: ModelHandle,
    method: str,
    samples: Sequence[Sample],
    *,
    train_config: TrainConfig | None = None,
    method_config: PeftBaselineConfig | MudafConfig | None = None,
    out: str | Path | None = None,
) -> TuneResult:
    """Tune ``handle`` with ``method`` on ``samples`` (SEAL: ~50 synthetic samples).

    Args:
        handle: the base model; left unchanged.
        method: ``"seal-h"``, ``"seal-c"``, ``"seal-l"``, ``"seal-d"``, ``"mudaf"`` or ``"sft"``.
        samples: training samples with answers (``format_samples``); MuDAF's need passages
            and golden ids.
        train_config: optimiser and schedule; default ``TrainConfig(lr=<the method's lr>)``
            (one default per method, ``methods.METHODS``).
        method_config: LoRA / DoRA settings (``PeftBaselineConfig``; ``dora`` follows the
            method) or ``MudafConfig`` (its target heads); SEAL methods take none.
        out: checkpoints go here; a run restarted on the same ``out`` resumes.
    """
    if method not in METHODS:
        raise ValueError(f"unknown tuning method {method!r}; choose one of {', '.join(METHODS)}")
    if not samples:
        raise ValueError("tune needs training samples (e.g. format_samples(...))")
    config = TrainConfig(lr=METHODS[method].lr) if train_config is None else train_config
    tuner = _tuner(handle, method, method_config)
    examples = encode_examples(samples, handle.tokenizer)
    run = train(tuner, examples, config, pad_id=pad_id_of(handle.tokenizer), out_dir=out)
    return TuneResult(method=method, handle=handle, tuner=tuner, run=run, config=config)


def _tuner(handle: ModelHandle, method: str, config):
    """The method's tuner; weight-training methods get a copy of the model."""
    if method in GRANULARITY:
        if config is not None:
            raise ValueError(f"{method} takes no method_config (its only setting is the method)")
        return SealTuner(handle, GRANULARITY[method])
    copy = copy_handle(handle, None)
    if method in ("seal-l", "seal-d"):
        config = PeftBaselineConfig() if config is None else config
        if not isinstance(config, PeftBaselineConfig):
            raise ValueError(f"{method} takes a PeftBaselineConfig, got {type(config).__name__}")
        return PeftTuner(copy, PeftBaselineConfig(**{**vars(config), "dora": method == "seal-d"}))
    if not isinstance(config, MudafConfig):
        raise ValueError(f"{method} needs a MudafConfig (its target heads), got {config!r}")
    if (method == "sft") != (config.alpha == 0):
        raise ValueError(f"{method} needs MudafConfig(alpha={'0' if method == 'sft' else '> 0'})")
    return MudafTuner(copy, config)
