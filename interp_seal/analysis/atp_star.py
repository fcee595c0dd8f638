"""AtP*: the two corrections of attribution patching (Kramar et al. 2024), for head ablation.

Attribution patching (AtP, ``interp_seal.analysis.screening``) prices the ablation of head
``(l, h)`` by the first-order change of the metric ``M`` (the answer's log-probability)::

    AtP(l, h) = sum_{t, d} dz[l, t, h, d] * dM/dz[l, t, h, d]      (dz = edited z - z)

Kramar, Lieberum, Shah and Nanda (2024), "AtP*: An efficient and scalable method for localizing
LLM behaviour to components" (arXiv 2403.00745), find two ways this first-order estimate misses
large effects (false negatives) and fix each while keeping the cost far below one forward per
component.

**The QK fix (their Sec. 3.1.1, "attention saturation").** The softmax of a later head's
attention is where a linear expansion fails worst: a saturated row (one key near weight 1) has
a near-zero gradient, so a shift of its logits that moves the weight to another key is priced at
almost nothing. AtP* keeps the linear expansion *after* the attention pattern but computes the
pattern change exactly: for a patched query or key, the softmax is recomputed with the patched
logits, and the change of the pattern ``A`` is multiplied by ``dM/dA``::

    I_fix = sum_{t, s} (softmax(x_t + dx_t)_s - A_ts) * dM/dA_ts

Our nodes are head *outputs*: zeroing ``z[l, :, h]`` does not touch head ``(l, h)``'s own
softmax (``z`` comes after it), it shifts the residual stream read by every later head's queries
and keys. The adaptation prices, for each later head ``(l', h')``, the *direct* path
``z[l, h] -> o_proj (-> post-attention norm) -> residual -> layer l''s norm -> q, k (-> q/k norm)
-> RoPE``: its first-order change of the queries and keys (a forward-mode derivative through the
model's own modules, ``torch.func.jvp``) gives patched logits, whose softmax is recomputed
exactly, and the linearised softmax term that AtP already contains for this path is replaced::

    QK(l, h) = AtP(l, h) + sum_{l' > l, h'} sum_{t in R, s}
               dM/dA[l', h', t, s] * (A'[t, s] - A[t, s] - dA_lin[t, s])

``A'`` is the softmax of the patched logits ``(q + dq) . (k + dk)``, ``dA_lin`` the softmax's
first-order response to ``dq, dk`` (the term AtP used), and ``dM/dA[t, s] = dM/dz[l', t, h'] .
v[l', s, kv(h')]`` (``z_t = sum_s A_ts v_s``), so no pattern gradient is ever stored. Only the
query rows ``R`` whose logits are the metric (the positions predicting the answer) are
recomputed, as row-wise attention (``analysis.attention_rows``: ``|R| x T`` per head, never
``T x T``); other rows keep AtP's linear term. Paths through intermediate layers stay linear.

**GradDrop (their Sec. 3.1.2, "cancellation").** A head's direct and indirect effects can
cancel in the gradient (a large effect estimated near zero, or with the wrong sign). AtP*
computes ``L`` further estimates, the ``l``-th with the gradient through layer ``l``'s
contributions to the residual stream (its attention and MLP outputs) set to zero in the backward
pass, and scores a node by their mean magnitude (their Eq. 11)::

    c_GD(n) = 1 / (L - 1) * sum_{l=1..L} |AtP_l(n)|

(dropping a layer below the node's own changes nothing: ``AtP_l = AtP``; dropping the node's
own layer leaves it no path to the metric: ``AtP_l = 0``, hence ``L - 1``). One backward pass gives the full gradient and, at every
layer input ``r_l``, the gradient ``dM/dr_l``; dropping layer ``l`` removes exactly its block's
share ``delta_l = dM/dr_l - dM/dr_{l+1}`` of the gradient at ``r_l``, and the backward is linear,
so ``dM/dz^(l) = dM/dz - J^T delta_l`` for heads below ``l``: ``L - 1`` partial backward passes
from each ``r_l`` down (about ``L / 2`` full ones), not ``L`` full ones. ``c_GD`` is a magnitude:
the screen uses it to choose which heads to confirm exactly (the paper's use: a prefilter for
verification), not as a signed estimate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp_seal.analysis.attention_rows import layer_rows, post_rope_qk_hooks
from interp_seal.models import ModelHandle


@dataclass(frozen=True, kw_only=True)
class Captured:
    """What one forward of the screen keeps for the fixes (first forward only: a backward that
    recomputes a layer does not replace it).

    Attributes:
        slots: each layer's input residual stream ``r_l`` (key ``l``) and the final norm's
            input ``r_L`` (key ``L``), in the autograd graph, ``(1, T, d_model)`` each.
        values: per layer, the value vectors ``(KV, T, D)`` (QK fix only).
        rope: per layer, the ``(cos, sin)`` its attention received (QK fix only; None in a
            family without RoPE, GPT-2).
    """

    slots: dict[int, Tensor]
    values: dict[int, Tensor]
    rope: dict[int, tuple[Tensor, Tensor] | None]

    def resid(self) -> list[Tensor]:
        """``[r_0, ..., r_L]``."""
        return [self.slots[i] for i in sorted(self.slots)]


@contextmanager
def captured_stream(handle: ModelHandle, *, values: bool) -> Iterator[Captured]:
    """Inside the block, a forward keeps the residual stream at each layer input (and, with
    ``values``, each layer's values and RoPE tables) in the yielded ``Captured``."""
    L, KV, D = handle.spec.n_layers, handle.spec.n_kv_heads, handle.spec.d_head
    kept = Captured(slots={}, values={}, rope={})

    def keep_resid(index):
        def hook(_mod, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            kept.slots.setdefault(index, x)

        return hook

    def keep_v(layer):
        def hook(out):
            kept.values.setdefault(layer, out[0].detach().float().view(-1, KV, D).transpose(0, 1))

        return hook

    def keep_rope(layer, _mod, kwargs, _q, _k):
        tables = handle.rope_tables(kwargs)  # None without RoPE (GPT-2)
        kept.rope.setdefault(layer, tables and tuple(t.detach() for t in tables))

    with ExitStack() as hooks:
        for index, module in enumerate([*handle.layers(), handle.final_norm()]):
            hooks.enter_context(
                module.register_forward_pre_hook(keep_resid(index), with_kwargs=True)
            )
        if values:
            for layer in range(L):
                hooks.enter_context(handle.on_projection(layer, "v", keep_v(layer)))
            hooks.enter_context(post_rope_qk_hooks(handle, range(L), keep_rope))
        yield kept


def grad_drop_scores(
    handle: ModelHandle,
    metric: Tensor,
    zs: dict[int, Tensor],
    resid: list[Tensor],
    change: Float[Tensor, "layer pos head d_head"],
) -> tuple[Float[Tensor, "layer pos head d_head"], Float[Tensor, "dropped layer head"]]:
    """The full gradient ``dM/dz`` and GradDrop's per-layer estimates ``AtP_l``.

    ``AtP_l[l, m, h] = sum_{t,d} change[m, t, h, d] * dM/dz^(l)[m, t, h, d]`` with layer
    ``l``'s residual contributions dropped from the backward pass. Leaves the graph alive
    (every call uses ``retain_graph``); the caller frees it.
    """
    L = handle.spec.n_layers
    layers = [zs[m] for m in range(L)]
    grads = torch.autograd.grad(metric, [*layers, *resid], retain_graph=True)
    grad_z = torch.stack([g[0].float() for g in grads[:L]])  # (L, T, H, D)
    grad_r = grads[L:]
    device_change = change.to(grad_z.device)
    full = (device_change * grad_z).sum((1, 3))  # (L, H): plain AtP
    per_layer = full[None].repeat(L, 1, 1)  # (dropped, L, H)
    for dropped in range(L):
        per_layer[dropped, dropped] = 0  # the node's own layer: no path left
        if dropped == 0:
            continue
        delta = grad_r[dropped] - grad_r[dropped + 1]  # the block's share of dM/dr_l
        below = torch.autograd.grad(
            resid[dropped], layers[:dropped], grad_outputs=delta, retain_graph=True
        )
        for m, g in enumerate(below):
            per_layer[dropped, m] -= (device_change[m] * g[0].float()).sum((0, 2))
    return grad_z, per_layer


def grad_drop_magnitude(per_layer: Float[Tensor, "dropped layer head"]) -> Tensor:
    """AtP*'s GradDrop score (Kramar et al. 2024, Eq. 11): ``sum_l |AtP_l| / (L - 1)``."""
    L = per_layer.shape[0]
    return per_layer.abs().sum(0) / max(L - 1, 1)


def qk_fix_corrections(
    handle: ModelHandle,
    captured: Captured,
    grad: Float[Tensor, "layer pos head d_head"],
    change: Float[Tensor, "layer pos head d_head"],
    rows: Tensor,
) -> Float[Tensor, "layer head"]:
    """``QK(l, h) - AtP(l, h)``: for every later head, the exact softmax of the query rows
    ``rows`` under the direct path's first-order change of its queries and keys, minus the
    linearised softmax term AtP contains (module docstring)."""
    L, H = handle.spec.n_layers, handle.spec.n_heads
    KV = handle.spec.n_kv_heads
    resid = captured.resid()
    device = resid[0].device
    rows = rows.to(device)
    T, d_model = resid[0].shape[1:]
    out = torch.zeros(L, H, dtype=torch.float64)
    # sources per batch of tangents: one layer's heads, or more up to 2**22 floats (cache-sized)
    per_batch = max(1, (1 << 22) // (H * T * d_model))
    with torch.no_grad():
        for later in range(1, L):
            x = resid[later][0].detach()
            tables = captured.rope[later]
            q0, k0 = _project_qk(handle, later, x[None], tables, rows)
            g = grad[later, rows.cpu()].to(device).transpose(0, 1)  # (H', R, D)
            g = g.reshape(KV, H // KV, *g.shape[1:])  # query head h' = kv * group + g
            v = captured.values[later]  # (KV, T, D)
            grad_a = torch.einsum("kgrd,ktd->kgrt", g, v).reshape(H, len(rows), -1)

            def pattern(q, k, later=later):
                return layer_rows(handle, later, q, k, rows)

            base = pattern(q0, k0)  # (1, H', R, T)
            for first in range(0, later, per_batch):
                sources = range(first, min(later, first + per_batch))
                dresid = torch.cat(
                    [_residual_change(handle, s, change[s].to(device)) for s in sources]
                )  # (N = sources x H, T, d)
                dq, dk = _qk_change(handle, later, x, dresid, tables, rows)
                patched = pattern(q0 + dq, k0 + dk)  # (N, H', R, T)
                _, linear = torch.func.jvp(
                    pattern,
                    (q0.expand_as(dq).contiguous(), k0.expand_as(dk).contiguous()),
                    (dq, dk),
                )
                residual = (patched - base - linear) * grad_a[None]
                found = residual.sum((1, 2, 3)).double().cpu().view(len(sources), H)
                out[first : first + len(sources)] += found
    return out


def _residual_change(handle: ModelHandle, layer: int, dz: Tensor) -> Tensor:
    """``(H, T, d_model)``: the change of ``layer``'s attention write to the residual stream
    (``o_proj``'s columns of head ``h`` times ``dz[:, h]``) when head ``h``'s output alone
    changes by ``dz[:, h]`` ``(T, H, D)``."""
    if handle.norm(layer, "post_attn") is not None:
        raise NotImplementedError(
            f"the QK fix's direct path through {handle.family.name}'s post-attention norm is "
            "not supported yet: screen without qk_fix"
        )
    T, H, D = dz.shape
    weight = handle.linear_weight(handle.proj(layer, "o_proj"))  # (d_model, H * D)
    per_head = weight.float().reshape(-1, H, D)  # (d_model, H, D)
    return torch.einsum("thd,mhd->htm", dz.float(), per_head)


def _project_qk(handle, layer, x, tables, rows):
    """Post-RoPE queries of ``rows`` ``(N, H, R, D)`` and keys of every position
    ``(N, KV, T, D)`` that ``layer`` computes from its input ``x`` ``(N, T, d)``, by the model's
    own modules (pre-attention norm, projections, q / k norms, RoPE with the ``(cos, sin)``
    ``tables``, None without RoPE), in float32."""
    normed = handle.apply_norm(layer, "pre_attn", x)
    (k,) = handle.project(layer, normed, "k")
    (q,) = handle.project(layer, normed[:, rows], "q")
    q = handle.split_heads(layer, "q", q)
    k = handle.split_heads(layer, "k", k)
    q = handle.rotate(layer, q, tables, rows[None])  # tables at (1, R)
    k = handle.rotate(layer, k, tables)
    return q.float(), k.float()


def _qk_change(handle, layer, x, dresid, tables, rows):
    """First-order changes ``dq (N, H, R, D), dk (N, KV, T, D)`` of ``_project_qk`` at ``x``
    ``(T, d)`` for each residual change ``dresid`` ``(N, T, d)`` (forward mode, vectorised over
    the ``N`` changes: the clean projection runs once)."""

    def tangent(t):
        _, (dq, dk) = torch.func.jvp(
            lambda x: _project_qk(handle, layer, x, tables, rows), (x[None],), (t[None],)
        )
        return dq[0], dk[0]

    return torch.func.vmap(tangent)(dresid.to(x.dtype))
