"""AtP*'s two fixes (``interp_seal.analysis.atp_star``) against brute-force computations.

- GradDrop: each per-layer estimate equals an explicit autograd computation on the model with
  that layer's attention and MLP outputs detached (values unchanged, gradient dropped), and the
  derivative is taken with respect to a per-head interpolation weight (``z' = z - a z``), not
  the head outputs the library tracks.
- QK fix: on a 2-layer Llama, the correction equals a hand computation written out here
  (RMSNorm, projections, RoPE, causal softmax and its linearisation, dM/dA = dM/dz . v).
- The fix matters: with saturated attention in the later layer, the QK-fixed estimates are
  closer to the exact ablation sweep than plain AtP's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import build_checkpoint

from interp_seal.analysis import screening
from interp_seal.analysis.atp_star import grad_drop_magnitude
from interp_seal.analysis.screening import Fixes, attribution_estimates, screened_head_sweep
from interp_seal.analysis.sweeps import SweepOptions, head_sweep
from interp_seal.cli import main
from interp_seal.models import load_model
from interp_seal.tasks import line_retrieval

QUIET = SweepOptions(progress=False)


@pytest.fixture(scope="module")
def samples():
    cfg = line_retrieval.LineRetrievalConfig
    return {n: line_retrieval.generate(cfg(num_lines=n), 2, seed=1) for n in (3,)}


@pytest.fixture(scope="module")
def handle3(tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("atp3"), "llama", n_layers=3, seed=4)
    return load_model(path)


@pytest.fixture(scope="module")
def handle2(tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("atp2"), "llama", n_layers=2, seed=3)
    return load_model(path)


def zero_ablation_slope(handle):
    L, H, D = handle.spec.shape
    return -torch.ones(L, H, D), torch.zeros(L, H, D)


def answer_logprob(handle, enc, logits):
    logprobs = logits.log_softmax(-1)
    return sum(logprobs[t - 1, enc.input_ids[t]] for t in range(enc.answer_start, len(enc)))


def dropped_estimates(handle, enc, dropped: int | None) -> np.ndarray:
    """``d M / d a`` at ``a = 0`` for ``z' = z - a[l, h] z`` (zero ablation's AtP), with
    ``dropped``'s attention and MLP outputs detached from the graph."""
    L, H, D = handle.spec.shape
    a = torch.zeros(L, H, requires_grad=True)
    layers = handle.model.model.layers

    def pre(layer):
        def hook(_mod, args):
            z = args[0].view(*args[0].shape[:2], H, D)
            return ((z - a[layer][None, None, :, None] * z).reshape(args[0].shape),)

        return hook

    def detach(_mod, _args, out):
        return (out[0].detach(), *out[1:]) if isinstance(out, tuple) else out.detach()

    hooks = [m.self_attn.o_proj.register_forward_pre_hook(pre(i)) for i, m in enumerate(layers)]
    if dropped is not None:
        hooks += [layers[dropped].self_attn.register_forward_hook(detach)]
        hooks += [layers[dropped].mlp.register_forward_hook(detach)]
    try:
        metric = answer_logprob(handle, enc, handle.model(enc.input_ids[None]).logits[0])
    finally:
        for h in hooks:
            h.remove()
    (grad,) = torch.autograd.grad(metric, [a], allow_unused=True)
    return np.zeros((L, H)) if grad is None else grad.numpy()


def test_grad_drop_equals_detached_backward_per_layer(handle3, samples, monkeypatch):
    L = handle3.spec.n_layers
    enc = samples[3][0].encode(handle3.tokenizer)
    slope, offset = zero_ablation_slope(handle3)
    per_layer = []
    original = screening.grad_drop_magnitude

    def keep(found):  # the per-layer estimates behind the score
        per_layer.append(found.clone())
        return original(found)

    monkeypatch.setattr(screening, "grad_drop_magnitude", keep)
    record = screening.screen_record(handle3, enc, slope, offset, Fixes(grad_drop=True))
    found = per_layer[0].double().numpy()  # (dropped, L, H)
    plain = dropped_estimates(handle3, enc, None)
    np.testing.assert_allclose(record["atp"], plain, atol=2e-4)
    for dropped in range(L):
        expected = dropped_estimates(handle3, enc, dropped)
        assert np.abs(expected[dropped]).max() == 0  # the node's own layer: no path left
        np.testing.assert_allclose(found[dropped], expected, atol=2e-4)
    score = np.abs(found).sum(0) / (L - 1)
    np.testing.assert_allclose(record["grad_drop"], score, atol=1e-9)
    assert np.allclose(grad_drop_magnitude(torch.tensor(found)).numpy(), score)


def test_screen_ranks_candidates_by_grad_drop(handle3, samples):
    screen = screened_head_sweep(
        handle3, samples, top_k=2, candidates=3, options=QUIET, grad_drop=True
    )
    est = screen.estimates
    assert {"grad_drop", "grad_drop_se"} <= set(est.columns)
    bound = est.grad_drop + 2 * est.grad_drop_se  # one length: the per-head bound
    chosen = est.assign(bound=bound).sort_values(["bound", "layer", "head"], ascending=False)
    expected = sorted(zip(chosen.layer[:3], chosen["head"][:3], strict=True))
    confirmed = est[est.confirmed]
    assert sorted(zip(confirmed.layer, confirmed["head"], strict=True)) == expected
    plain = attribution_estimates(handle3, samples, progress=False)
    np.testing.assert_allclose(est.estimate, plain.estimate, atol=1e-6)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def two_layer_run(handle, enc, o_proj0, o_proj1, layer1):
    """One forward of a 2-layer model: layer 0's head outputs ``z0`` (T, H, D), the stream
    entering layer 1 ``x1`` (T, d, float64) and ``dM / dz1`` of layer 1's head outputs (T, H, D,
    float64), read at the o-projections' inputs."""
    H, D = handle.spec.n_heads, handle.spec.d_head
    T = enc.input_ids.shape[0]
    kept = {}

    def keep_z0(_mod, args):
        kept["z0"] = args[0][0].detach().view(T, H, D)

    def track_z1(_mod, args):  # layer 1's head outputs as a leaf: dM/dz1
        z = args[0].detach().view(1, T, H, D).requires_grad_(True)
        kept["z1"] = z
        return (z.reshape(args[0].shape),)

    def keep_x1(_mod, args, kwargs):
        kept["x1"] = (args[0] if args else kwargs["hidden_states"])[0].detach().double()

    hooks = [
        o_proj0.register_forward_pre_hook(keep_z0),
        o_proj1.register_forward_pre_hook(track_z1),
        layer1.register_forward_pre_hook(keep_x1, with_kwargs=True),
    ]
    try:
        logits = handle.model(enc.input_ids[None]).logits[0]
    finally:
        for h in hooks:
            h.remove()
    metric = answer_logprob(handle, enc, logits)
    (g1,) = torch.autograd.grad(metric, [kept["z1"]])
    return kept["z0"], kept["x1"], g1[0].double()


def hand_qk_correction(handle, enc) -> np.ndarray:
    """The QK fix's correction for zero-ablating each layer-0 head of a 2-layer Llama, by hand."""
    model = handle.model.model
    H, D = handle.spec.n_heads, handle.spec.d_head
    KV = handle.spec.n_kv_heads
    layer0, layer1 = model.layers
    ids = enc.input_ids[None]
    T = ids.shape[1]
    z0, x, g1 = two_layer_run(handle, enc, layer0.self_attn.o_proj, layer1.self_attn.o_proj, layer1)
    w = layer1.input_layernorm.weight.double()
    eps = layer1.input_layernorm.variance_epsilon
    WQ = layer1.self_attn.q_proj.weight.double()
    WK = layer1.self_attn.k_proj.weight.double()
    WV = layer1.self_attn.v_proj.weight.double()
    WO = layer0.self_attn.o_proj.weight.double()
    theta = handle.model.config.rope_parameters["rope_theta"]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # (T, D)

    rms = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    normed = w * x / rms

    def d_norm(dx):  # RMSNorm's first-order change
        return w * (dx / rms - x * (x * dx).mean(-1, keepdim=True) / rms**3)

    def heads(y, n):
        return y.view(T, n, D).transpose(0, 1)  # (n, T, D)

    q = rope(heads(normed @ WQ.T, H), cos, sin)
    k = rope(heads(normed @ WK.T, KV), cos, sin)
    v = heads(normed @ WV.T, KV)
    rows = torch.arange(enc.answer_start - 1, T - 1)
    mask = torch.arange(T)[None, :] <= rows[:, None]  # (R, T)
    scale = D**-0.5
    out = np.zeros(H)
    for source in range(H):
        dr = -z0[:, source].double() @ WO[:, source * D : (source + 1) * D].T  # (T, d)
        dn = d_norm(dr)
        dq = rope(heads(dn @ WQ.T, H), cos, sin)
        dk = rope(heads(dn @ WK.T, KV), cos, sin)
        total = 0.0
        for h in range(H):
            kv = h // (H // KV)
            s = (q[h, rows] @ k[kv].T) * scale
            ds = (dq[h, rows] @ k[kv].T + q[h, rows] @ dk[kv].T) * scale
            s2 = ((q[h, rows] + dq[h, rows]) @ (k[kv] + dk[kv]).T) * scale
            A = s.masked_fill(~mask, -torch.inf).softmax(-1)
            A2 = s2.masked_fill(~mask, -torch.inf).softmax(-1)
            ds = ds.masked_fill(~mask, 0)
            dA = A * (ds - (A * ds).sum(-1, keepdim=True))
            gA = g1[rows, h] @ v[kv].T  # (R, T): dM/dA = dM/dz . v
            total += float((gA * (A2 - A - dA)).sum())
        out[source] = total
    return out


def test_qk_fix_equals_hand_computation(handle2, samples):
    enc = samples[3][0].encode(handle2.tokenizer)
    slope, offset = zero_ablation_slope(handle2)
    record = screening.screen_record(handle2, enc, slope, offset, Fixes(qk_fix=True))
    correction = record["qk"] - record["atp"]
    np.testing.assert_allclose(correction[1], 0, atol=0)  # no later layer
    expected = hand_qk_correction(handle2, enc)
    assert np.abs(expected).max() > 1e-4  # a real correction, not zero on both sides
    np.testing.assert_allclose(correction[0], expected, rtol=2e-3, atol=2e-5)


def hand_qk_correction_gpt2(handle, enc) -> np.ndarray:
    """The QK fix's correction for zero-ablating each layer-0 head of a 2-layer GPT-2, by hand:
    a LayerNorm (mean and bias) before layer 1, ``Conv1D`` weights stored ``(in, out)`` with
    biases, q / k / v the blocks of ``c_attn``'s columns, no RoPE, and layer 1 scaled by
    ``1 / (sqrt(D) * 2)`` (``scale_attn_by_inverse_layer_idx``)."""
    model = handle.model.transformer
    H, D = handle.spec.n_heads, handle.spec.d_head
    E = H * D
    layer0, layer1 = model.h
    ids = enc.input_ids[None]
    T = ids.shape[1]
    z0, x, g1 = two_layer_run(handle, enc, layer0.attn.c_proj, layer1.attn.c_proj, layer1)
    ln = layer1.ln_1
    w, b, eps = ln.weight.double(), ln.bias.double(), ln.eps
    W = layer1.attn.c_attn.weight.double()  # (d, 3E): y = x @ W + bias
    bias = layer1.attn.c_attn.bias.double()
    WQ, WK, WV = W[:, :E], W[:, E : 2 * E], W[:, 2 * E :]
    bQ, bK, bV = bias[:E], bias[E : 2 * E], bias[2 * E :]
    WO = layer0.attn.c_proj.weight.double()  # (E, d)
    assert handle.model.config.scale_attn_by_inverse_layer_idx
    scale = D**-0.5 / 2  # layer 1

    xc = x - x.mean(-1, keepdim=True)
    std = (xc.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    normed = w * xc / std + b

    def d_norm(dx):  # LayerNorm's first-order change
        dc = dx - dx.mean(-1, keepdim=True)
        return w * (dc / std - xc * (xc * dc).mean(-1, keepdim=True) / std**3)

    def heads(y):
        return y.view(T, H, D).transpose(0, 1)  # (H, T, D)

    q, k, v = heads(normed @ WQ + bQ), heads(normed @ WK + bK), heads(normed @ WV + bV)
    rows = torch.arange(enc.answer_start - 1, T - 1)
    mask = torch.arange(T)[None, :] <= rows[:, None]  # (R, T)
    out = np.zeros(H)
    for source in range(H):
        dr = -z0[:, source].double() @ WO[source * D : (source + 1) * D]  # (T, d)
        dn = d_norm(dr)
        dq, dk = heads(dn @ WQ), heads(dn @ WK)
        total = 0.0
        for h in range(H):
            s = (q[h, rows] @ k[h].T) * scale
            ds = (dq[h, rows] @ k[h].T + q[h, rows] @ dk[h].T) * scale
            s2 = ((q[h, rows] + dq[h, rows]) @ (k[h] + dk[h]).T) * scale
            A = s.masked_fill(~mask, -torch.inf).softmax(-1)
            A2 = s2.masked_fill(~mask, -torch.inf).softmax(-1)
            ds = ds.masked_fill(~mask, 0)
            dA = A * (ds - (A * ds).sum(-1, keepdim=True))
            gA = g1[rows, h] @ v[h].T  # (R, T): dM/dA = dM/dz . v
            total += float((gA * (A2 - A - dA)).sum())
        out[source] = total
    return out


def test_qk_fix_on_gpt2_equals_hand_computation(tmp_path, samples):
    """GPT-2: no RoPE (the QK fix's queries and keys are the projections), Conv1D weights, a
    LayerNorm before layer 1 and its 1 / (layer + 1) attention scale."""
    handle = load_model(build_checkpoint(tmp_path, "gpt2", n_layers=2, seed=3))
    enc = samples[3][0].encode(handle.tokenizer)
    slope, offset = zero_ablation_slope(handle)
    record = screening.screen_record(handle, enc, slope, offset, Fixes(qk_fix=True))
    correction = record["qk"] - record["atp"]
    np.testing.assert_allclose(correction[1], 0, atol=0)  # no later layer
    expected = hand_qk_correction_gpt2(handle, enc)
    assert np.abs(expected).max() > 1e-4  # a real correction, not zero on both sides
    np.testing.assert_allclose(correction[0], expected, rtol=2e-3, atol=2e-5)


def test_qk_fix_moves_estimates_towards_the_exact_sweep(tmp_path, samples):
    """Later-layer attention made saturated (queries and keys x 6) and the MLPs quiet (x 0.1),
    so the softmax is the main non-linearity: plain AtP misprices the layer-0 heads that steer
    it (summed error 10.0 nats over 4 heads), recomputing the softmax halves that (4.2)."""
    path = build_checkpoint(tmp_path, "llama", n_layers=2, seed=3)
    handle = load_model(path)
    with torch.no_grad():
        attn = handle.model.model.layers[1].self_attn
        attn.q_proj.weight *= 6
        attn.k_proj.weight *= 6
        for layer in handle.model.model.layers:
            layer.mlp.down_proj.weight *= 0.1
    est = attribution_estimates(handle, samples, progress=False, qk_fix=True)
    exact = head_sweep(handle, samples, heads=[(0, h) for h in range(4)], options=QUIET)
    exact = exact[exact.metric == "answer_logprob"].delta.to_numpy()
    first = est[est.layer == 0]
    atp_error = np.abs(first.atp.to_numpy() - exact)
    qk_error = np.abs(first.estimate.to_numpy() - exact)
    assert qk_error.sum() < 0.5 * atp_error.sum(), (exact, first)


def test_qk_fix_refuses_an_edited_model(handle2, samples):
    from interp_seal.interventions import ablate

    with (
        handle2.edit(ablate(handle2.spec, [(0, 0)], "zero")),
        pytest.raises(ValueError, match="merge the edit into the weights"),
    ):
        attribution_estimates(handle2, samples, progress=False, qk_fix=True)


def test_cli_screen_with_both_fixes(tmp_path, llama_checkpoint, capsys):
    argv = ["analysis", "head-sweep", "--model", llama_checkpoint, "--lengths", "2", "4"]
    argv += ["--n", "2", "--screen", "2", "--threads", "1", "--qk-fix", "--grad-drop"]
    assert main([*argv, "--out", str(tmp_path / "screen")]) == 0
    estimates = pd.read_csv(tmp_path / "screen" / "screen_estimates.csv")
    handle = load_model(llama_checkpoint)
    cfg = line_retrieval.LineRetrievalConfig
    samples = {n: line_retrieval.generate(cfg(num_lines=n), 2, seed=0) for n in (2, 4)}
    expected = screened_head_sweep(
        handle, samples, top_k=2, options=QUIET, qk_fix=True, grad_drop=True
    ).estimates
    for column in ("estimate", "atp", "grad_drop", "grad_drop_se"):
        np.testing.assert_allclose(estimates[column], expected[column], atol=1e-5)
    assert estimates.confirmed.tolist() == expected.confirmed.tolist()
    lone = ["analysis", "head-sweep", "--model", llama_checkpoint, "--qk-fix"]
    assert main([*lone, "--out", str(tmp_path / "lone")]) == 2
    assert "--qk-fix and --grad-drop tune --screen K" in capsys.readouterr().err
