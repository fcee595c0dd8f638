"""DuoAttention's gates: which KV heads need the whole context, learned instead of scored.

**The method** (Xiao et al., 2024, "DuoAttention: Efficient Long-Context LLM Inference with
Retrieval and Streaming Heads", Sec. 3.1). Every KV head ``(l, j)`` gets a gate
``alpha[l, j]`` in ``[0, 1]``, and its query heads attend with

    attn = alpha * full_attn + (1 - alpha) * streaming_attn,

``full_attn`` being ordinary causal attention and ``streaming_attn`` attention to the first
``sink`` keys and the ``window`` most recent ones (the mode of
``interp_seal.models.streaming_heads``). All weights stay frozen; only the gates train, from 1
(every head full, the model unchanged), against

    loss = distill + penalty * mean(|alpha|),

where ``distill`` is the mean over answer tokens of the mean squared difference between the
final hidden states (after the last norm) of the full model and of the gated model: the paper's
distillation loss on the passkey's tokens, with its L1 penalty towards streaming (the paper's
weight is 0.05; here the penalty averages the gates, so that its weight does not grow with the
number of KV heads). Gates are clamped to ``[0, 1]`` before every step, as in the paper's
training. A head whose output the answer does not need drifts to 0 (streaming); a head the
answer needs keeps its gate: the gates rank KV heads, a fifth definition of a retrieval head
(``analysis.head_definitions``), and choose which heads keep a full KV cache
(``analysis.kv_compression``).

**What differs from the paper.** The paper trains on synthetic multi-passkey prompts of up to
32K tokens for 2,000 steps with a warm-up schedule; here the samples are whatever format samples
the caller passes (SEAL's line records or needles, ``tuning.data.format_samples``), one epoch
at a constant rate, through the one training loop (``tuning.loop.train``: resumable,
multi-process). The gated attention is computed in blocks of query rows (``block_size``): no
``T x T`` scores at once, but training's backward keeps every block's ``block x T`` weights,
as any attention backward without a fused kernel does.

**Exactness.** With every gate at 1 the gated model is the model (the distillation loss is 0 at
the start); a gate at exactly 0 is a streaming head of ``streaming_heads.compress_kv`` with the
same sink and window (both are tested against each other and against a masked-eager formula).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformers import AttentionInterface

from interp_seal.analysis.retrieval_scores import rank_heads
from interp_seal.engine import pad_id_of
from interp_seal.models.handle import ModelHandle
from interp_seal.models.streaming_heads import StreamingHeads, check_supported
from interp_seal.tasks.sample import Sample
from interp_seal.tuning.data import TrainingBatch, encode_examples
from interp_seal.tuning.loop import StepInfo, TrainConfig, TrainResult, Tuner, train

ATTENTION_NAME = "interp_seal_duo_gates"
_GATE_ATTR = "_interp_seal_duo_gate"
PAPER_PENALTY = 0.05  # DuoAttention's weight of the L1 term
DEFAULT_LR = 0.02  # the paper's learning rate for the gates


@dataclass(frozen=True, kw_only=True)
class DuoConfig:
    """The gated attention's streaming side and the loss.

    Attributes:
        sink: first positions a streaming head sees (``StreamingHeads.sink``).
        window: recent positions a streaming head sees, itself included.
        penalty: weight of the L1 term (paper: 0.05).
        block_size: query rows per block of the gated attention (results do not depend on it).
    """

    sink: int = 4
    window: int = 256
    penalty: float = PAPER_PENALTY
    block_size: int = 256

    def __post_init__(self):
        self.streaming()  # raises on bad sizes
        if not self.penalty >= 0:
            raise ValueError(f"the L1 penalty must be >= 0, got {self.penalty}")

    def streaming(self) -> StreamingHeads:
        """The streaming side's sizes as ``streaming_heads`` takes them (no head streams)."""
        return StreamingHeads(
            heads=frozenset(), sink=self.sink, window=self.window, block_size=self.block_size
        )


def gated_attention(
    module: nn.Module,
    query: Float[Tensor, "batch head q d"],
    key: Float[Tensor, "batch kv_head k d"],
    value: Float[Tensor, "batch kv_head k d"],
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Float[Tensor, "batch q head d"], None]:
    """``alpha * full + (1 - alpha) * streaming`` attention per KV head (module docstring);
    ``module`` carries ``(gates_now, layer, config)``, ``gates_now()`` giving the gates or
    ``None`` (full attention)."""
    gates_now, layer, cfg = getattr(module, _GATE_ATTR)
    gates = gates_now()
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise ValueError("DuoAttention gates do not support sliding windows or soft-capping")
    B, H, Tq, D = query.shape
    KV, Tk = key.shape[1], key.shape[2]
    group = H // KV
    scaling = D**-0.5 if scaling is None else scaling
    k = key.repeat_interleave(group, 1)
    v = value.repeat_interleave(group, 1)
    q_pos = torch.arange(Tk - Tq, Tk, device=query.device)
    k_pos = torch.arange(Tk, device=query.device)
    alpha = None
    if gates is not None:
        alpha = gates[layer].repeat_interleave(group)[None, :, None, None].to(query.dtype)
    acc = torch.promote_types(query.dtype, torch.float32)
    outs = []
    for s in range(0, Tq, cfg.block_size):
        e = min(s + cfg.block_size, Tq)
        scores = (query[:, :, s:e] @ k.transpose(-1, -2)).to(acc) * scaling
        dist = q_pos[s:e, None] - k_pos[None, :]
        keep = (dist >= 0)[None, None]
        if attention_mask is not None:  # a padding mask: boolean (keep) or additive
            pad = attention_mask[..., s:e, :Tk]
            keep = keep & (pad if pad.dtype == torch.bool else pad == 0)
        full = scores.masked_fill(~keep, float("-inf")).softmax(-1).to(v.dtype) @ v
        if alpha is None:
            outs.append(full)
            continue
        window = (k_pos[None, :] < cfg.sink) | (dist < cfg.window)
        stream = scores.masked_fill(~(keep & window), float("-inf")).softmax(-1).to(v.dtype) @ v
        outs.append(alpha * full + (1 - alpha) * stream)
    return torch.cat(outs, 2).transpose(1, 2), None


@contextmanager
def gated(handle: ModelHandle, gates: Tensor | None, config: DuoConfig = DuoConfig()):
    """Run ``handle.model`` with gated attention inside the block (``gates`` of shape
    ``(L, KV)``, each in ``[0, 1]``; ``None``: full attention through the same function)."""
    with ExitStack() as restore:
        _install(handle, lambda: gates, config, restore)
        yield handle.model


def _install(handle: ModelHandle, gates_now, config: DuoConfig, restore: ExitStack) -> None:
    """Point every attention module of ``handle`` at ``gates_now()``, read at each forward (so
    that the tuner's teacher pass can switch the gates off)."""
    check_supported(handle, config.streaming())  # the streaming side's limits are the gates'
    for layer in range(handle.spec.n_layers):
        attn = handle.attn(layer)
        setattr(attn, _GATE_ATTR, (gates_now, layer, config))
        restore.callback(delattr, attn, _GATE_ATTR)
    old = handle.model.config._attn_implementation
    AttentionInterface.register(ATTENTION_NAME, gated_attention)
    handle.model.set_attn_implementation(ATTENTION_NAME)
    restore.callback(handle.model.set_attn_implementation, old)


class DuoGateTuner(Tuner):
    """DuoAttention's gates on a frozen model (module docstring).

    Attributes:
        gates: the ``(L, KV)`` parameter, initialised at 1 (every head full).
        config: sink, window, penalty.
    """

    method = "duo-gates"

    def __init__(self, handle: ModelHandle, config: DuoConfig = DuoConfig()):
        super().__init__(handle.model)
        self.handle, self.config = handle, config
        self.model.requires_grad_(False)
        spec = handle.spec
        self.gates = nn.Parameter(torch.ones(spec.n_layers, spec.n_kv_heads, device=handle.device))
        self._teacher = False
        self._hooked = False

    @contextmanager
    def step_context(self):
        """The gated attention, installed for one step's forward and backward."""
        with ExitStack() as restore:
            _install(
                self.handle, lambda: None if self._teacher else self.gates, self.config, restore
            )
            self._hooked = True
            restore.callback(setattr, self, "_hooked", False)
            yield

    def _hidden(self, batch: TrainingBatch) -> Tensor:
        return self.model.base_model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).last_hidden_state

    def forward(self, batch: TrainingBatch) -> dict:
        """Distillation + penalty (call inside ``step_context``); the gates are clamped to
        ``[0, 1]`` first, as the paper does before each step."""
        if not self._hooked:
            raise RuntimeError("DuoGateTuner.forward runs inside `with tuner.step_context():`")
        with torch.no_grad():
            self.gates.clamp_(0, 1)
            self._teacher = True
            try:
                teacher = self._hidden(batch)
            finally:
                self._teacher = False
        student = self._hidden(batch)
        mask = batch.answer_mask()
        squared = (teacher.float() - student.float()).pow(2).mean(-1)  # (B, T)
        distill = ((squared * mask).sum(1) / mask.sum(1)).mean()  # each sample weighs the same
        reg = self.gates.abs().mean()
        return {"loss": distill + self.config.penalty * reg, "distill": distill, "reg": reg}

    def describe(self) -> dict:
        return super().describe() | {"duo": vars(self.config)}


def train_gates(
    handle: ModelHandle,
    samples: Sequence[Sample],
    config: DuoConfig = DuoConfig(),
    train_config: TrainConfig | None = None,
    *,
    out: str | Path | None = None,
    callbacks: Sequence[Callable[[StepInfo], None]] = (),
) -> tuple[Tensor, TrainResult]:
    """Learn DuoAttention's gates of ``handle`` on ``samples`` (their answer tokens are
    distilled); ``(gates (L, KV) in [0, 1], the training record)``. ``out`` makes it
    resumable, ``callbacks`` see each step (``loop.train``)."""
    tuner = DuoGateTuner(handle, config)
    cfg = train_config or TrainConfig(lr=DEFAULT_LR)
    examples = encode_examples(samples, handle.tokenizer)
    pad = pad_id_of(handle.tokenizer)
    run = train(tuner, examples, cfg, pad_id=pad, out_dir=out, callbacks=callbacks)
    return tuner.gates.detach().clamp(0, 1).cpu(), run


def gate_table(gates: Tensor) -> pd.DataFrame:
    """One row per KV head: ``layer``, ``kv_head``, ``gate``."""
    L, KV = gates.shape
    return pd.DataFrame(
        {
            "layer": [a for a in range(L) for _ in range(KV)],
            "kv_head": [b for _ in range(L) for b in range(KV)],
            "gate": gates.reshape(-1).tolist(),
        }
    )


def gate_ranking(gates: Tensor, n_heads: int) -> pd.DataFrame:
    """The gates as a ranked head table (``layer``, ``head``, ``gate``, ``rank``, as every
    retrieval score of the toolkit writes): each query head carries its KV head's gate, so the
    query heads of one KV head tie and stay in index order."""
    L, KV = gates.shape
    group = n_heads // KV
    table = pd.DataFrame(
        {
            "layer": [a for a in range(L) for _ in range(n_heads)],
            "head": [h for _ in range(L) for h in range(n_heads)],
            "gate": [float(gates[a, h // group]) for a in range(L) for h in range(n_heads)],
        }
    )
    return rank_heads(table, ["gate"])
