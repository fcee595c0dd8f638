"""SEAL-H and SEAL-C: learn a scale for every attention head or head channel (SEAL, Sec. 4).

SEAL's observation (Sec. 3) is that pruning or down-weighting some heads *improves* long-context
retrieval while others are essential, and that inside a head some channels help and others hurt.
Rather than sweeping heads one by one, SEAL learns the scales by gradient descent on ~50 samples
that follow the task's format with random content: all base weights stay frozen and only the
scales ``s`` of the head outputs train (``z' = s * z`` at the input of ``o_proj``):

- SEAL-H: ``s`` of shape ``(L, H, 1)``, one strength per head (1,024 values on a 7B Llama);
- SEAL-C: ``s`` of shape ``(L, H, D)``, one per head output channel (131K on a 7B Llama).

Scales start at 1, so the untrained tuner is the base model. They act through the one primitive
(``HeadIntervention.from_scales`` installed by ``handle.edit``): the same code path as pruning,
ablation sweeps and the dashboard, and the learned scales fold into ``o_proj`` afterwards
(``interp_seal.tuning.merge``) for zero inference overhead.
"""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn

from interp_seal.interventions.head_edit import HeadIntervention
from interp_seal.models.handle import ModelHandle
from interp_seal.tuning.data import TrainingBatch, answer_loss
from interp_seal.tuning.loop import Tuner
from interp_seal.tuning.scales import init_scales

SEAL_METHODS = {"head": "seal-h", "channel": "seal-c"}


class SealTuner(Tuner):
    """Learnable head (``"head"``) or channel (``"channel"``) scales on a frozen model.

    Attributes:
        scales: the ``(L, H, 1)`` or ``(L, H, D)`` parameter, initialised at 1.
        granularity: ``"head"`` (SEAL-H) or ``"channel"`` (SEAL-C).
    """

    def __init__(self, handle: ModelHandle, granularity: str = "head"):
        super().__init__(handle.model)
        self.handle = handle
        self.granularity = granularity
        self.method = SEAL_METHODS.get(granularity, "")
        self.model.requires_grad_(False)
        self.scales = nn.Parameter(init_scales(handle.spec, granularity).to(handle.device))
        self._hooked = False

    def intervention(self) -> HeadIntervention:
        """The current scales as a ``HeadIntervention`` (differentiable in ``scales``)."""
        return HeadIntervention.from_scales(self.handle.spec, self.scales)

    @contextmanager
    def step_context(self):
        """The scale hooks, installed for one step's forward and backward."""
        with self.handle.edit(self.intervention()):
            self._hooked = True
            try:
                yield
            finally:
                self._hooked = False

    def forward(self, batch: TrainingBatch) -> dict:
        """The answer loss of the scaled model (call inside ``step_context``)."""
        if not self._hooked:
            raise RuntimeError("SealTuner.forward runs inside `with tuner.step_context():`")
        return {"loss": answer_loss(self.model, batch)}
