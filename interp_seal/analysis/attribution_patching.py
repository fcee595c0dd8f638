"""Attribution patching: every head's patching (or ablation) effect from one backward pass.

Exact activation patching (``interp_seal.analysis.patching``) costs one forward pass per patched
activation (over the positions after the prompts' shared prefix). Attribution patching (Nanda 2023; Syed et al. 2023; Kramar et al. 2024, "AtP")
replaces each of those runs by a first-order Taylor expansion of the metric ``M`` (here the
logit difference ``LD = logit[a] - logit[b]``) around one run, so one forward and one backward
pass price every head at once (over the same positions: the prefix runs once, and the
difference ``z_clean - z_corr`` is zero inside it):

- patching head ``(l, h)`` from clean into corrupted, expanded at the corrupted run::

      M(z_corr with z_{l,h} <- z_clean) - M(z_corr)
          ~ sum_{t, d} (z_clean - z_corr)[l, t, h, d] * dM/dz[l, t, h, d] |_corr

  (summed over positions ``t`` for whole-head patching, or kept per position);
- zero-ablating head ``(l, h)`` in the clean run (SEAL's pruning), expanded at the clean run::

      M(z_clean with z_{l,h} <- 0) - M(z_clean) ~ sum_{t, d} (0 - z_clean) * dM/dz |_clean

``dM/dz`` is the total derivative: it includes every path from ``z`` to the logits, through
later heads and MLPs. The approximation is exact for a metric linear in ``z`` and degrades where
attention patterns or norms react strongly to the patch, so ``compare_with_exact`` reports it
next to the exact result with their Spearman rank correlation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float, Int
from scipy.stats import spearmanr
from torch import Tensor
from tqdm.auto import tqdm

from interp_seal.analysis.patching import (
    PatchingPair,
    head_patches,
    normalisation,
    patch_heads,
    patch_table,
    record_inputs,
    replace_inputs,
)
from interp_seal.engine import WHOLE_PROMPT, AnswerBatch, SharedPrefix, clean_run, run_from_layer
from interp_seal.interventions import HeadEdit
from interp_seal.interventions.head_edit import ablate
from interp_seal.models.handle import ModelHandle

METHODS = ("patch", "ablate")


@dataclass(frozen=True, kw_only=True)
class HeadGradients:
    """Head outputs of one run and the metric's gradient with respect to them.

    Attributes:
        z: head outputs ``(layer, pos, head, d_head)`` at the positions the run covered (from
            its ``SharedPrefix``'s ``start`` on).
        grad: ``dM/dz``, same shape.
        logits: the run's logits at the last position.
        metric: ``M`` of the run.
    """

    z: Float[Tensor, "layer pos head d_head"]
    grad: Float[Tensor, "layer pos head d_head"]
    logits: Float[Tensor, " vocab"]
    metric: float


@contextmanager
def tracked_head_outputs(handle: ModelHandle) -> Iterator[dict[int, Tensor]]:
    """Inside the block, forwards record every layer's head outputs ``z`` (the ``o_proj``
    inputs, ``(batch, pos, head, d_head)``) in the yielded dict, inside an autograd graph that
    starts at the embeddings (the weights are frozen), so ``torch.autograd.grad(metric, z)``
    gives ``dM/dz`` for every head with one backward pass. One forward per block: a layer's
    first ``z`` is kept, so a backward pass that recomputes the layer (``screening.
    recomputed_layers``) neither replaces it nor keeps the recomputed graph alive."""
    zs: dict[int, Tensor] = {}

    def keep(layer):
        def edit(z):
            zs.setdefault(layer, z)
            return z

        return edit

    def track(_mod, _args, out):
        return out.detach().requires_grad_(True)

    layers = range(handle.spec.n_layers)
    with (
        handle.embed().register_forward_hook(track),
        torch.enable_grad(),
        replace_inputs(handle, "head", {layer: keep(layer) for layer in layers}),
    ):
        yield zs


def head_gradients(
    handle: ModelHandle,
    ids: Int[Tensor, " pos"],
    pair: PatchingPair,
    *,
    prefix: SharedPrefix = WHOLE_PROMPT,
) -> HeadGradients:
    """One forward and one backward pass: ``z`` and ``d LD / d z`` for every head of ``ids``.

    With a ``prefix``, both passes cover ``ids[prefix.start:]`` only; the prefix's cached keys
    and values are constants, which is exact for the positions covered: a ``z`` there reaches
    the logits only through later positions.
    """
    layers = range(handle.spec.n_layers)
    with tracked_head_outputs(handle) as zs:
        logits = prefix.last_logits(handle, prefix.suffix(ids)[None])
        metric = pair.logit_diff(logits)[0]
        grads = torch.autograd.grad(metric, [zs[layer] for layer in layers])
    z = torch.stack([zs[layer][0].detach() for layer in layers])
    grad = torch.stack([g[0] for g in grads])
    return HeadGradients(z=z, grad=grad, logits=logits[0].detach(), metric=float(metric.detach()))


def attribution_patch_heads(
    handle: ModelHandle,
    pair: PatchingPair,
    *,
    by_position: bool = False,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """Approximate ``patch_heads``: the normalised effect of patching each head clean -> corrupted.

    Returns the table of ``interp_seal.analysis.patching.patch_heads`` (same rows, same order)
    with first-order estimates in place of exact patched runs. The shared prefix runs once
    (``SharedPrefix``); the clean and corrupted runs and the backward pass cover the positions
    after it, the only ones where ``z_clean - z_corr`` is not zero. ``intervention`` edits the
    model analysed (composed with ``handle.edit``'s); ``z`` and its gradient are taken before
    the edits, which leaves each estimate of a scaling edit unchanged (the scale cancels).
    """
    with handle.edit(intervention):
        return _attribution_patch_heads(handle, pair, by_position)


def _attribution_patch_heads(
    handle: ModelHandle, pair: PatchingPair, by_position: bool
) -> pd.DataFrame:
    L = handle.spec.n_layers
    prefix = SharedPrefix.of(handle, pair.clean_ids, pair.corrupted_ids)
    clean, clean_logits = record_inputs(handle, pair.clean_ids, {"head": range(L)}, prefix=prefix)
    run = head_gradients(handle, pair.corrupted_ids, pair, prefix=prefix)
    clean_ld, _ = normalisation(pair, clean_logits, run.logits)
    delta = torch.stack([clean["head"][layer] for layer in range(L)]) - run.z
    effect = (delta * run.grad).sum(-1)  # (L, T - start, H)
    if by_position:  # nothing differs inside the shared prefix: no effect there
        effect = torch.nn.functional.pad(effect, (0, 0, prefix.start, 0))
    else:
        effect = effect.sum(1)  # (L, H)
    patches = head_patches(handle, pair.clean_ids.shape[0], by_position=by_position)
    return patch_table(patches, run.metric + effect.flatten(), clean_ld, run.metric)


def attribution_ablate_heads(
    handle: ModelHandle, pair: PatchingPair, *, intervention: HeadEdit | None = None
) -> pd.DataFrame:
    """Approximate ``ablate_heads``: change of the clean run's logit difference per zeroed head
    (of the model under ``intervention`` and ``handle.edit``'s edits)."""
    with handle.edit(intervention):
        run = head_gradients(handle, pair.clean_ids, pair)
    effect = (-run.z * run.grad).sum((1, 3))  # (L, H)
    return _ablation_table(handle, run.metric + effect.flatten(), run.metric)


def ablate_heads(
    handle: ModelHandle,
    pair: PatchingPair,
    *,
    batch_size: int = 16,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """Exact zero-ablation (SEAL pruning) of each head in the clean run.

    Runs on the forward engine (``interp_seal.engine``), like the ablation sweeps: one clean
    forward caches the residual stream, each head's run starts at its layer, up to
    ``batch_size`` heads of a layer share a forward and the last layer runs at the last position
    only. Returns ``layer, head, logit_diff, delta`` (``delta`` = ablated minus clean logit
    difference).
    ``intervention`` edits the model analysed (composed with ``handle.edit``'s).
    """
    with handle.edit(intervention):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        spec = handle.spec
        T = pair.clean_ids.shape[0]
        last = torch.tensor([[T - 1]])
        batch = AnswerBatch(
            ids=pair.clean_ids[None],
            query=last,
            target=torch.tensor([[pair.clean_token]]),
            valid=torch.ones_like(last, dtype=torch.bool),
        )
        clean = clean_run(handle, batch, range(spec.n_layers))
        clean_ld = float(pair.logit_diff(clean.logits[:, 0])[0])
        H = spec.n_heads
        groups = [
            (layer, range(lo, min(lo + batch_size, H)))
            for layer in range(spec.n_layers)
            for lo in range(0, H, batch_size)
        ]
        out = []
        for layer, heads in tqdm(groups, desc="ablation", disable=not progress):
            ivs = [ablate(spec, [(layer, h)]) for h in heads]
            out.append(pair.logit_diff(run_from_layer(handle, clean, layer, ivs)[:, 0]))
        return _ablation_table(handle, torch.cat(out), clean_ld)


def _ablation_table(handle: ModelHandle, logit_diff: Tensor, clean_ld: float) -> pd.DataFrame:
    L, H = handle.spec.n_layers, handle.spec.n_heads
    table = pd.DataFrame(
        [(layer, h) for layer in range(L) for h in range(H)], columns=["layer", "head"]
    )
    table["logit_diff"] = logit_diff.detach().double().cpu().numpy()
    table["delta"] = table["logit_diff"] - clean_ld
    table.attrs.update(clean_logit_diff=clean_ld)
    return table


@dataclass(frozen=True, kw_only=True)
class AttributionComparison:
    """Attribution patching next to the exact result, per head.

    Attributes:
        table: ``method, layer, head, exact, atp``; ``method`` is ``"patch"`` (normalised
            logit difference, whole-head clean -> corrupted patching) or ``"ablate"`` (change
            of the clean logit difference when the head is zeroed).
        spearman: Spearman rank correlation of ``exact`` and ``atp`` per method.
    """

    table: pd.DataFrame
    spearman: dict[str, float]


def compare_with_exact(
    handle: ModelHandle,
    pair: PatchingPair,
    *,
    batch_size: int = 16,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> AttributionComparison:
    """Exact and attribution-patching effects of every head, for patching and for ablation."""
    with handle.edit(intervention):
        exact_patch = patch_heads(handle, pair, batch_size=batch_size, progress=progress)
        atp_patch = attribution_patch_heads(handle, pair)
        exact_ablate = ablate_heads(handle, pair, batch_size=batch_size, progress=progress)
        atp_ablate = attribution_ablate_heads(handle, pair)
        frames = []
        for method, exact, atp in (
            ("patch", exact_patch["value"], atp_patch["value"]),
            ("ablate", exact_ablate["delta"], atp_ablate["delta"]),
        ):
            frame = exact_ablate[["layer", "head"]].copy()
            frame.insert(0, "method", method)
            frame["exact"], frame["atp"] = exact.to_numpy(), atp.to_numpy()
            frames.append(frame)
        table = pd.concat(frames, ignore_index=True)
        spearman = {
            method: float(spearmanr(group["exact"], group["atp"]).statistic)
            for method, group in table.groupby("method", sort=False)
        }
        return AttributionComparison(table=table, spearman=spearman)
