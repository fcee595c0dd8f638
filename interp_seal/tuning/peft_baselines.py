"""SEAL-L and SEAL-D: LoRA and DoRA baselines trained with SEAL's data and loop (SEAL, Sec. 4.3).

SEAL-L puts rank-``r`` LoRA adapters (``W + B A``, ``B`` initialised at 0 so the tuner starts
as the base model) on every linear layer of the attention (q, k, v and o projections), trained
on the same ~50 format samples with the same loop; SEAL-D swaps LoRA for DoRA (a learned
magnitude per output row on top of the LoRA direction update). The paper uses ``r = 4`` and lr
2e-4. With rank 1, LoRA on ``o_proj`` can rescale channels like SEAL-C, so SEAL-L is a superset
of SEAL-C: SEAL-H/C matching it with far fewer parameters says the head strengths are what
matters (SEAL, Table 1).

After training, ``merge_and_unload`` folds the adapters into the weights and returns a plain
model of the base architecture (``interp_seal.tuning.counts`` gives Table 1's parameter counts).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from interp_seal.models.handle import ModelHandle
from interp_seal.tuning.data import TrainingBatch, answer_loss
from interp_seal.tuning.loop import Tuner

PEFT_METHODS = {False: "seal-l", True: "seal-d"}


@dataclass(frozen=True, kw_only=True)
class PeftBaselineConfig:
    """LoRA / DoRA settings (SEAL: rank 4 on q, k, v, o).

    Attributes:
        dora: DoRA (SEAL-D) instead of LoRA (SEAL-L).
        rank: adapter rank ``r``.
        alpha: LoRA scaling numerator (the update is ``alpha / r * B A``).
        dropout: dropout on the adapter input (0 keeps training deterministic).
        targets: which attention projections get adapters.
        seed: seeds the random initialisation of ``A``.
    """

    dora: bool = False
    rank: int = 4
    alpha: float = 8.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    seed: int = 0

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        unknown = set(self.targets) - {"q_proj", "k_proj", "v_proj", "o_proj"}
        if unknown or not self.targets:
            raise ValueError(
                f"targets must be a non-empty subset of q/k/v/o_proj, got {self.targets}"
            )


def target_modules(handle: ModelHandle, targets: tuple[str, ...]) -> list[str]:
    """The module names of ``targets`` in ``handle``'s family, inside the attention module
    (``self_attn.q_proj``: GPT-2's MLP has a ``c_proj`` too, which peft would also match by its
    bare name): a fused ``qkv_proj`` stands for ``q_proj``, ``k_proj`` and ``v_proj`` together
    (an adapter on it adapts all three)."""
    family = handle.family
    qkv = {t for t in targets if t != "o_proj"}
    if family.qkv_proj is not None and qkv and qkv != {"q_proj", "k_proj", "v_proj"}:
        raise ValueError(
            f"{family.name} computes q, k and v in one fused {family.qkv_proj!r}: an adapter "
            f"there adapts all three, so target all of q_proj, k_proj and v_proj or none (got "
            f"{sorted(targets)})"
        )
    names = [
        family.o_proj if t == "o_proj" else family.projection(t[0], handle.spec)[0] for t in targets
    ]
    return [f"{family.attn}.{name}" for name in dict.fromkeys(names)]


class PeftTuner(Tuner):
    """LoRA (SEAL-L) or DoRA (SEAL-D) adapters on a frozen model, via ``peft``.

    The adapters are injected into ``handle.model`` in place; ``merge_and_unload`` returns the
    plain merged model.
    """

    def __init__(self, handle: ModelHandle, cfg: PeftBaselineConfig = PeftBaselineConfig()):
        from peft import LoraConfig, get_peft_model

        base_parameters = sum(p.numel() for p in handle.model.parameters())
        lora = LoraConfig(
            r=cfg.rank,
            lora_alpha=cfg.alpha,
            lora_dropout=cfg.dropout,
            target_modules=target_modules(handle, cfg.targets),
            use_dora=cfg.dora,
            bias="none",
            fan_in_fan_out=handle.family.conv1d,  # GPT-2's Conv1D weights are (in, out)
        )
        with torch.random.fork_rng(), warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated ``is_gradient_checkpointing`` (renamed
            # ``is_activation_checkpointing`` in transformers 5.x): a FutureWarning about peft's
            # code on every tuning run that nothing here can act on.
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
            torch.manual_seed(cfg.seed)
            model = get_peft_model(handle.model, lora)
        super().__init__(model, base_parameters=base_parameters)
        self.method = PEFT_METHODS[cfg.dora]
        self.cfg = cfg

    def forward(self, batch: TrainingBatch) -> dict:
        return {"loss": answer_loss(self.model, batch)}

    def merge_and_unload(self) -> nn.Module:
        """The base model with the trained adapters folded into its weights."""
        return self.model.merge_and_unload()
