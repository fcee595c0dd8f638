"""The organism's optimisation loop, shared by v1 (``train.py``) and v2 (``mixture.py``).

One step is AdamW on a batch's answer tokens (``train_step``: the LM head is applied only at
the supervised positions); the schedule is linear warm-up, constant, cosine decay
(``learning_rate``); ``run_loop`` draws the batch of step ``s`` from
``random.Random(f"{desc}/{seed}/{s}")`` and writes a resumable state (safetensors for weights
and optimizer moments, JSON for the rest) every ``checkpoint_every`` steps, so an interrupted
run resumed with the same config reaches the same model.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from interp_seal.checkpoints import load_optimizer, save_optimizer
from interp_seal.inputs import RESTART, read_json
from interp_seal.outputs import atomic_dir, recover_dir


def learning_rate(cfg, step: int) -> float:
    """Linear warm-up, constant, cosine decay to 0 over the last ``decay_frac`` of steps."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    decay_start = cfg.steps * (1 - cfg.decay_frac)
    if step < decay_start:
        return cfg.lr
    progress = (step - decay_start) / max(cfg.steps - decay_start, 1)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))


def train_step(model, optimizer, cfg, batch, lr: float):
    """One AdamW step on ``batch``; returns (loss, first-token accuracy, exact match)."""
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
        hidden = model.model(input_ids=batch.input_ids).last_hidden_state  # (B, T, D)
        logits = model.lm_head(hidden[batch.rows, batch.cols]).float()  # (N, V)
    targets = batch.input_ids[batch.rows, batch.cols + 1]
    losses = F.cross_entropy(logits, targets, reduction="none")
    loss = (losses * batch.weights).sum() / batch.weights.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    correct = (logits.argmax(-1) == targets).float()
    n_answers = int(batch.answer_id.max()) + 1
    wrong = torch.zeros(n_answers).index_add_(0, batch.answer_id, 1 - correct)
    return loss.item(), correct[batch.first].mean().item(), (wrong == 0).float().mean().item()


def make_optimizer(model, cfg) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not norms)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=cfg.betas,
    )


# ------------------------------------------------------------------------------- checkpoints


def save_state(out: Path, model, optimizer, cfg, step: int, cur, seconds: float):
    """A resumable checkpoint in ``out/state``: safetensors for tensors, JSON for the rest.

    Written whole or not at all: a kill while writing leaves the previous checkpoint."""
    meta = {"step": step, "seconds": seconds, "config": asdict(cfg), "curriculum": asdict(cur)}
    with atomic_dir(out / "state", mode="replace") as state:
        save_file(
            {k: v.contiguous() for k, v in model.state_dict().items()}, state / "model.safetensors"
        )
        save_optimizer(optimizer, state / "optimizer.safetensors")
        (state / "trainer.json").write_text(json.dumps(meta, indent=1))


def load_state(out: Path, model, optimizer, cfg) -> tuple[int, dict, float]:
    """Restore ``save_state``'s checkpoint; returns (step, curriculum fields, seconds so far)."""
    state = out / "state"
    meta = read_json(state / "trainer.json", "training state", fix=RESTART)
    if meta["config"] != json.loads(json.dumps(asdict(cfg))):
        raise ValueError(
            f"{state} was written with a different config; resume with the same options"
        )
    model.load_state_dict(load_file(state / "model.safetensors"))
    load_optimizer(optimizer, state / "optimizer.safetensors")
    return meta["step"], meta["curriculum"], meta["seconds"]


def run_loop(
    cfg,
    out: Path,
    model,
    tokenizer,
    cur,
    draw,
    *,
    resume: bool,
    stop_at: int | None,
    max_minutes: float | None,
    progress: bool,
    desc: str = "organism",
) -> Path:
    """The training loop shared by v1 (``train``) and the v2 mixture (``organism.mixture``).

    Step ``s`` draws ``draw(cur, cfg, tokenizer, random.Random(f"{desc}/{cfg.seed}/{s}"))``,
    takes one ``train_step`` and folds its accuracies into ``cur``; resumable state goes to
    ``out/state`` (see ``train``), the final model and tokenizer to ``out``.
    """
    optimizer = make_optimizer(model, cfg)
    step, seconds = 0, 0.0
    if resume and recover_dir(out / "state") is not None:
        step, fields, seconds = load_state(out, model, optimizer, cfg)
        cur = type(cur)(**fields)
    end = min(cfg.steps, stop_at or cfg.steps)
    start_time = time.monotonic() - seconds
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc=desc)
    while step < end:
        rng = random.Random(f"{desc}/{cfg.seed}/{step}")
        batch = draw(cur, cfg, tokenizer, rng)
        loss, first_acc, exact = train_step(model, optimizer, cfg, batch, learning_rate(cfg, step))
        cur.update(cfg, batch.kind, first_acc, exact)
        step += 1
        bar.update(1)
        bar.set_postfix(
            loss=f"{loss:.3f}",
            **{k: f"{v:.2f}" for k, v in sorted(cur.exact.items()) if k.isalpha()},
            **({"level": cur.level} if desc == "organism" else {}),
        )
        elapsed = time.monotonic() - start_time
        timed_out = max_minutes is not None and elapsed - seconds > 60 * max_minutes
        if step % cfg.checkpoint_every == 0 or step == end or timed_out:
            save_state(out, model, optimizer, cfg, step, cur, elapsed)
        if timed_out:
            break
    bar.close()
    if step == cfg.steps:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out
