"""One training loop for every tuner (SEAL-H/C, SEAL-L/D, MuDAF, Vanilla SFT).

The recipe is SEAL's (Sec. 6, "Settings"): AdamW with a constant learning rate (no decay), one
epoch over the ~50 format samples by default. The loop is built on ``accelerate`` so the same
code runs on one process or several: under ``torchrun --nproc_per_node N`` or
``accelerate launch --multi_gpu --num_processes N`` each process takes its own slice of every
global batch and DDP averages the gradients (on CPU pass ``cpu=True``: gloo backend). Because
the loss weighs each sample equally (see ``interp_seal.tuning.data``), N processes with batch
``b`` each follow exactly the trajectory of one process with batch ``N * b``.

Determinism and resume. The samples of global step ``s`` are a fixed slice of a permutation
drawn from ``seed`` and the epoch, so a run is a pure function of (weights, data, config).
Every ``checkpoint_every`` steps the trainable parameters (safetensors), the optimizer state and
the loss history are written to ``out_dir/checkpoints/step-XXXXXXX`` and ``out_dir/latest``
names the newest complete one; a restarted run with the same config picks up from there and
ends with the same parameters as an uninterrupted run.

A tuner is an ``nn.Module`` (``Tuner``) whose ``forward(batch)`` returns a dict with the total
``"loss"`` and its named parts; its trainable parameters are those with ``requires_grad``.
``step_context()`` wraps each forward *and* backward (SEAL installs its scale hooks there, so
that gradient checkpointing, which re-runs layers during backward, sees them too).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from interp_seal.checkpoints import load_optimizer, save_optimizer
from interp_seal.inputs import RESTART, read_json
from interp_seal.outputs import atomic_dir
from interp_seal.records import fingerprint
from interp_seal.tuning.data import Example, TrainingBatch, check_window, collate


class Tuner(nn.Module):
    """Base class of the tuners: ``model`` is the HF causal LM being tuned (or wrapped).

    Subclasses set ``method`` and implement ``forward(batch) -> {"loss": ..., <part>: ...}``.
    """

    method: str = ""

    def __init__(self, model: nn.Module, *, base_parameters: int | None = None):
        super().__init__()
        self.model = model
        # the size of the model before any adapter was added (SEAL Table 1's denominator)
        self.base_parameters = base_parameters or sum(p.numel() for p in model.parameters())

    def step_context(self):
        """Context around one step's forward and backward (nothing by default)."""
        return nullcontext()

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each decoder layer during backward instead of storing its activations.

        Non-reentrant checkpointing: gradients reach parameters even when the layer inputs do
        not require grad (frozen base, trained scales), and the recomputation runs the hooks
        that ``step_context`` keeps installed through the backward.
        """
        self.model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )

    def trainable_state(self) -> dict[str, Tensor]:
        """The trainable parameters by name (what a checkpoint stores)."""
        return {n: p for n, p in self.named_parameters() if p.requires_grad}

    def describe(self) -> dict:
        """JSON-able identity of the tuner; a checkpoint only resumes a tuner that matches."""
        return {
            "method": self.method,
            "model": str(getattr(self.model, "name_or_path", "")),
            "trainable": {n: list(p.shape) for n, p in self.trainable_state().items()},
        }


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train.

    Attributes:
        lr: AdamW learning rate, constant (SEAL line retrieval on 7B: 1e-2 SEAL-H, 2e-2
            SEAL-C; LoRA/DoRA 2e-4; MuDAF 5e-6 in its paper, 1e-4 here: ``methods.py``).
        epochs: passes over the samples (SEAL: 1).
        batch_size: samples per process per step.
        seed: fixes the sample order (and nothing else: tuners seed their own initialisation).
        betas, eps, weight_decay: AdamW settings (no weight decay: it would pull scales to 0).
        gradient_checkpointing: recompute layers in backward (long samples).
        checkpoint_every: steps between checkpoints (0: only the final one); needs ``out_dir``.
        cpu: True runs on CPU even where an accelerator exists (two CPU processes talk over
            gloo), False on the accelerator; None (default) where the model's weights are
            (``train_on_cpu``): a handle loaded on a GPU tunes there, one on the CPU stays.
    """

    lr: float
    epochs: int = 1
    batch_size: int = 1
    seed: int = 0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    gradient_checkpointing: bool = False
    checkpoint_every: int = 0
    cpu: bool | None = None

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(
                f"epochs and batch_size must be >= 1, got {self.epochs}, {self.batch_size}"
            )
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")


@dataclass(frozen=True, kw_only=True)
class StepInfo:
    """Passed to callbacks after each optimizer step (1-based ``step``)."""

    step: int
    total_steps: int
    loss: float
    parts: dict[str, float]


@dataclass(kw_only=True)
class TrainResult:
    """What a run did: per-step global mean losses (and parts) over the whole run, the number
    of processes, and whether this process is the main one (the one that writes results)."""

    steps: int
    processes: int = 1
    is_main_process: bool = True
    losses: list[float] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int = 0
    seconds: float = 0.0


def _order(n: int, seed: int, epoch: int) -> list[int]:
    """The sample order of ``epoch``: a permutation fixed by ``seed``."""
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=gen).tolist()


def _batches(
    examples: Sequence[Example], cfg: TrainConfig, rank: int, world: int, start: int, pad_id: int
) -> Iterator[tuple[int, TrainingBatch]]:
    """``(step, this process's batch)`` from global step ``start`` to the end of the run."""
    per_step = cfg.batch_size * world
    steps_per_epoch = len(examples) // per_step
    for step in range(start, steps_per_epoch * cfg.epochs):
        epoch, within = divmod(step, steps_per_epoch)
        order = _order(len(examples), cfg.seed, epoch)
        first = within * per_step + rank * cfg.batch_size
        picked = [examples[i] for i in order[first : first + cfg.batch_size]]
        yield step, collate(picked, pad_id)


def total_steps(n_examples: int, cfg: TrainConfig, world: int = 1) -> int:
    """Optimizer steps of a run (an incomplete last global batch of each epoch is dropped)."""
    per_step = cfg.batch_size * world
    if n_examples < per_step:
        raise ValueError(
            f"{n_examples} samples cannot fill one global batch of {per_step} "
            f"({cfg.batch_size} per process x {world} processes); generate more samples"
        )
    return (n_examples // per_step) * cfg.epochs


# -- checkpoints -----------------------------------------------------------------------------
def _identity(tuner: Tuner, cfg: TrainConfig, examples: Sequence[Example], world: int) -> dict:
    """What must match for a checkpoint to resume this run: tuner, settings, data, processes."""
    run = asdict(cfg)
    run.pop("checkpoint_every")  # how often we save does not change the result
    data = fingerprint(
        [
            [e.encoded.input_ids, e.encoded.answer_start, e.encoded.passages, e.golden]
            for e in examples
        ]
    )
    identity = {
        "tuner": tuner.describe(),
        "config": run,
        "examples": [len(examples), data],
        "world": world,
    }
    return json.loads(json.dumps(identity))  # as it reads back from state.json


def _save_checkpoint(
    out_dir: Path, step: int, tuner: Tuner, optimizer, result: TrainResult, identity: dict
):
    final = out_dir / "checkpoints" / f"step-{step:07d}"
    with atomic_dir(final, mode="replace") as tmp:
        state = {n: p.detach().to("cpu").contiguous() for n, p in tuner.trainable_state().items()}
        save_file(state, str(tmp / "trainable.safetensors"))
        save_optimizer(optimizer, tmp / "optimizer.safetensors")
        info = {"step": step, "losses": result.losses, "parts": result.parts, "identity": identity}
        (tmp / "state.json").write_text(json.dumps(info))
    latest = out_dir / "latest.tmp"
    latest.write_text(final.name)
    os.replace(latest, out_dir / "latest")
    for old in (out_dir / "checkpoints").iterdir():
        if old != final:
            shutil.rmtree(old)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory under ``out_dir``, if any."""
    pointer = Path(out_dir) / "latest"
    if not pointer.is_file():
        return None
    return Path(out_dir) / "checkpoints" / pointer.read_text().strip()


def _load_checkpoint(path: Path, tuner: Tuner, identity: dict) -> dict:
    info = read_json(path / "state.json", "checkpoint state", fix=RESTART)
    if info["identity"] != identity:
        raise ValueError(
            f"the checkpoint in {path} was written by a different run (tuner, training config, "
            "training samples or number of processes differ); resume with the same settings or "
            "choose another output directory"
        )
    state = load_file(str(path / "trainable.safetensors"))
    params = tuner.trainable_state()
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)
    return info


@contextmanager
def _training_mode(module: nn.Module):
    was = module.training
    module.train()
    try:
        yield
    finally:
        module.train(was)


def train_on_cpu(cfg: TrainConfig, model: torch.nn.Module) -> bool:
    """Whether training runs on the CPU: ``cfg.cpu`` if set, else where ``model``'s weights are
    (accelerate would otherwise move a CPU model to an available GPU, or the reverse)."""
    if cfg.cpu is not None:
        return cfg.cpu
    return next(model.parameters()).device.type == "cpu"


def train(
    tuner: Tuner,
    examples: Sequence[Example],
    cfg: TrainConfig,
    *,
    pad_id: int,
    out_dir: str | Path | None = None,
    callbacks: Sequence[Callable[[StepInfo], None]] = (),
) -> TrainResult:
    """Train ``tuner`` on ``examples``; resume from ``out_dir`` if it holds a checkpoint.

    Args:
        tuner: the module to train (its ``requires_grad`` parameters are optimised).
        examples: encoded samples (``interp_seal.tuning.data.encode_examples``).
        cfg: optimiser, schedule and checkpoint settings.
        pad_id: token id used for right padding.
        out_dir: where checkpoints go; a run restarted with the same ``out_dir`` and settings
            resumes from the newest checkpoint.
        callbacks: called with a ``StepInfo`` after each step (and after its checkpoint).
    """
    from accelerate import Accelerator

    if cfg.checkpoint_every and out_dir is None:
        raise ValueError("checkpoint_every needs an out_dir to write checkpoints to")
    config = getattr(tuner.model, "config", None)
    check_window(examples, getattr(config, "max_position_embeddings", None))
    accelerator = Accelerator(cpu=train_on_cpu(cfg, tuner.model))
    world, rank = accelerator.num_processes, accelerator.process_index
    steps = total_steps(len(examples), cfg, world)
    trainable = list(tuner.trainable_state().values())
    if not trainable:
        raise ValueError(f"tuner {tuner.method!r} has no trainable parameters")
    if cfg.gradient_checkpointing:
        tuner.enable_gradient_checkpointing()
    optimizer = torch.optim.AdamW(
        trainable, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    identity = _identity(tuner, cfg, examples, world)
    result = TrainResult(steps=steps, processes=world, is_main_process=accelerator.is_main_process)
    checkpoint = latest_checkpoint(out_dir) if out_dir is not None else None
    info = _load_checkpoint(checkpoint, tuner, identity) if checkpoint else None
    model, optimizer = accelerator.prepare(tuner, optimizer)
    if info is not None:
        load_optimizer(optimizer, checkpoint / "optimizer.safetensors")
        result.resumed_from = info["step"]
        result.losses, result.parts = info["losses"], info["parts"]
    out = Path(out_dir) if out_dir is not None else None
    start_time = time.perf_counter()
    bar = tqdm(
        total=steps,
        initial=result.resumed_from,
        desc=f"tune {tuner.method}",
        disable=not accelerator.is_main_process,
    )
    with _training_mode(tuner), bar:
        for step, batch in _batches(examples, cfg, rank, world, result.resumed_from, pad_id):
            with tuner.step_context():
                output = model(batch.to(accelerator.device))
                accelerator.backward(output["loss"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            logged = {k: accelerator.reduce(v.detach(), "mean").item() for k, v in output.items()}
            result.losses.append(logged.pop("loss"))
            result.parts.append(logged)
            bar.update(1)
            bar.set_postfix(loss=f"{result.losses[-1]:.4f}")
            done = step + 1
            if out is not None and (
                done == steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)
            ):
                if accelerator.is_main_process:
                    _save_checkpoint(out, done, tuner, optimizer, result, identity)
                accelerator.wait_for_everyone()
            for callback in callbacks:
                callback(
                    StepInfo(step=done, total_steps=steps, loss=result.losses[-1], parts=logged)
                )
    result.seconds = time.perf_counter() - start_time
    return result
