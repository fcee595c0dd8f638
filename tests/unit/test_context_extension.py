"""NTK-aware RoPE scaling and Self-Extend against direct computations.

- NTK: the scaled inverse frequencies by the formula (and its two fixed points: the highest
  frequency unchanged, the lowest divided by the factor), and the whole model equal to the same
  checkpoint saved with the raised RoPE base.
- Self-Extend: the blocked attention function, forward and backward, with the CPU's fused
  kernel and with the plain-algebra kernel other devices run, against an eager T x T reference
  that rotates the pre-RoPE queries and keys at their grouped positions directly, at several
  lengths; its parts cover every causal (query, key) pair once, in the right regime; the model
  with a window covering the sequence equals the plain model; cached decoding equals the full
  forward; no kernel call sees more than a block of queries or a mask beyond block x (block +
  window).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from interp_seal.interventions import ablate
from interp_seal.models import ContextExtension, extend_context, load_model
from interp_seal.models import rope_extension as rx
from interp_seal.models.kv_cache import cache_arg, returned_cache


@pytest.fixture(scope="module")
def handle(llama_checkpoint):
    return load_model(llama_checkpoint)


def test_ntk_inv_freq_formula():
    base, dim, alpha = 10000.0, 16, 4.0
    got = rx.ntk_inv_freq(base, dim, alpha)
    new_base = base * alpha ** (16 / 14)
    for i in range(8):
        assert got[i].item() == pytest.approx(new_base ** (-2 * i / 16), rel=1e-12)
    plain = rx.ntk_inv_freq(base, dim, 1.0)
    assert got[0].item() == pytest.approx(1.0)  # highest frequency kept
    assert (plain[-1] / got[-1]).item() == pytest.approx(alpha, rel=1e-12)  # lowest / alpha


def test_ntk_model_equals_checkpoint_with_raised_base(handle, llama_checkpoint, tmp_path):
    alpha = 8.0
    raised = Path(tmp_path) / "raised"
    shutil.copytree(llama_checkpoint, raised)
    config = json.loads((raised / "config.json").read_text())
    d = config["head_dim"]
    config["rope_parameters"]["rope_theta"] *= alpha ** (d / (d - 2))
    (raised / "config.json").write_text(json.dumps(config))
    direct = load_model(raised)
    ids = torch.randint(5, len(handle.tokenizer), (2, 90))
    with torch.no_grad():
        plain = handle.model(ids).logits
        with extend_context(handle, ContextExtension(ntk_factor=alpha)):
            ntk = handle.model(ids).logits
        restored = handle.model(ids).logits
        expected = direct.model(ids).logits
    torch.testing.assert_close(ntk, expected, atol=1e-5, rtol=1e-5)
    assert (ntk - plain).abs().max() > 1e-2  # the option really changes the model
    torch.testing.assert_close(restored, plain, atol=0, rtol=0)
    from_load = load_model(llama_checkpoint, context_extension=ContextExtension(ntk_factor=alpha))
    with torch.no_grad():
        torch.testing.assert_close(from_load.model(ids).logits, expected, atol=1e-5, rtol=1e-5)


def eager_self_extend(q, k, v, group, window, base):
    """T x T reference: pre-RoPE q / k rotated at grouped positions, regimes picked per entry."""
    T, D = q.shape[-2], q.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)

    def cos_sin(pos):
        freqs = pos.double()[:, None] * inv
        emb = torch.cat([freqs, freqs], -1)
        return emb.cos().float(), emb.sin().float()

    pos = torch.arange(T)
    qn, kn = apply_rotary_pos_emb(q, k, *cos_sin(pos), unsqueeze_dim=0)
    gq = pos // group + window - window // group
    gk = pos // group
    qg, _ = apply_rotary_pos_emb(q, q, *cos_sin(gq), unsqueeze_dim=0)
    kg, _ = apply_rotary_pos_emb(k, k, *cos_sin(gk), unsqueeze_dim=0)
    scores = torch.empty(q.shape[0], q.shape[1], T, T)
    for i in range(T):  # the definition, entry by entry in rows
        for j in range(i + 1):
            near = i - j < window
            a, b = (qn, kn) if near else (qg, kg)
            scores[:, :, i, j] = (a[:, :, i] * b[:, :, j]).sum(-1) / D**0.5
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def self_extend_inputs(T, block, requires_grad=False):
    """Random pre-RoPE q / k / v (GQA, 2 query heads per KV head) and the blocked function's
    rotated inputs; returns ``(pre-RoPE tensors, rotated tensors, module)``."""
    torch.manual_seed(T)
    B, H, KV, D, G, W, base = 2, 4, 2, 8, 3, 6, 10000.0
    q = torch.randn(B, H, T, D, requires_grad=requires_grad)
    k = torch.randn(B, KV, T, D, requires_grad=requires_grad)
    v = torch.randn(B, KV, T, D, requires_grad=requires_grad)
    cfg = ContextExtension(group_size=G, window=W, block_size=block)
    inv = rx.ntk_inv_freq(base, D, 1.0).float()
    module = SimpleNamespace(**{rx._CONFIG_ATTR: (cfg, inv)})
    pos = torch.arange(T).double()[:, None] * inv.double()
    return (q, k, v), (rx.rotate(q, pos.float()), rx.rotate(k, pos.float()), v), module


@pytest.fixture(params=["fused", "algebra"])
def kernel(request, monkeypatch):
    """Both kernels on this CPU: the fused flash kernel, and the tensor algebra other devices
    run (``rx.fused`` says which a tensor gets)."""
    if request.param == "algebra":
        monkeypatch.setattr(rx, "fused", lambda t: False)
    return request.param


@pytest.mark.parametrize("T", [5, 23, 61])
def test_self_extend_attention_matches_eager_reference(T, kernel):
    (q, k, v), rotated, module = self_extend_inputs(T, block=7)
    expected = eager_self_extend(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), 3, 6, 1e4)
    got, _ = rx.self_extend_attention(module, *rotated, None, scaling=8**-0.5)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def test_self_extend_gradients_match_eager_reference_without_keeping_scores(kernel):
    """The backward pass runs each part's attention backward with the merged output and
    log-sum-exp: the gradients of q, k and v equal the T x T reference's, and autograd keeps
    only tensors with a head axis (inputs, output) and one log-sum-exp per query: no scores."""
    T, D = 40, 8
    (q, k, v), rotated, module = self_extend_inputs(T, block=7, requires_grad=True)
    weights = torch.randn(2, T, 4, D)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        got, _ = rx.self_extend_attention(module, *rotated, None, scaling=D**-0.5)
    got_grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    expected = eager_self_extend(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), 3, 6, 1e4)
    want_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for g, w in zip(got_grads, want_grads, strict=True):
        assert w.abs().max() > 1e-2
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)
    assert (2, 4, T) in saved
    assert all(shape[-1] <= D or shape == (2, 4, T) for shape in saved), sorted(set(saved))


@pytest.mark.parametrize(
    ("Tq", "Tk", "block", "window"),
    [(40, 40, 7, 6), (13, 40, 4, 9), (1, 30, 8, 5), (25, 25, 5, 30)],
)
def test_parts_cover_each_causal_pair_once_in_its_regime(Tq, Tk, block, window):
    """Counted pair by pair: every key at or before a query's position is in exactly one part,
    grouped exactly when it is ``window`` or more before the query; no later key is in any."""
    offset = Tk - Tq
    count = torch.zeros(Tq, Tk, dtype=torch.int64)
    grouped = torch.zeros(Tq, Tk, dtype=torch.bool)
    for s in range(0, Tq, block):
        for part in rx.block_parts(s, min(s + block, Tq), offset, window):
            for r in range(part.rows.start, part.rows.stop):
                for j in range(part.keys.start, part.keys.stop):
                    i = offset + r
                    visible = {"all": True, "causal": j - part.keys.start <= r - part.rows.start}
                    visible["band"] = 0 <= i - j < window
                    if visible[part.mask]:
                        count[r, j] += 1
                        grouped[r, j] = part.grouped
    pos = torch.arange(Tq)[:, None] + offset
    keys = torch.arange(Tk)[None, :]
    assert torch.equal(count, (keys <= pos).long())
    assert torch.equal(grouped, (pos - keys >= window) & (keys <= pos))


def test_grouped_rotation_is_the_familys_rope_at_grouped_positions(family_checkpoint):
    """Self-Extend turns keys rotated at their positions into keys at grouped positions by a
    further rotation: equal to the family's own RoPE (partial in Phi-3) at those positions."""
    handle = load_model(family_checkpoint)
    if handle.family.name == "gemma3_text":  # local and global RoPE tables: refused, said why
        with pytest.raises(ValueError, match="one table for every layer.*Gemma 3"):
            rx.rotary_modules(handle)
        return
    if handle.family.name == "gpt2":  # learned absolute positions, no RoPE: both refused
        assert not any(hasattr(m, "inv_freq") for m in handle.model.modules())
        extensions = (ContextExtension(ntk_factor=2.0), ContextExtension(group_size=3, window=6))
        for extension in extensions:
            with pytest.raises(ValueError, match=r"^gpt2 has learned absolute position.*no RoPE"):
                with rx.extend_context(handle, extension):
                    pass
            with pytest.raises(ValueError, match="NTK scaling and Self-Extend") as refused:
                load_model(family_checkpoint, context_extension=extension)
            assert "\n" not in str(refused.value)  # one line
        return
    T = 20
    x = torch.randn(1, T, handle.spec.d_model, generator=torch.Generator().manual_seed(0))
    rope, (rotary,) = handle.rope(0), rx.rotary_modules(handle)
    positions = torch.arange(T)[None]
    grouped = positions // 3 + 4  # Self-Extend's query positions for G = 3, W = 6
    with torch.no_grad():
        k = handle.split_heads(0, "k", *handle.project(0, x, "k"))  # (1, KV, T, D), pre-RoPE
        at_true = rope(k, k[:, :0], *rotary(x, positions))[0]
        expected = rope(k, k[:, :0], *rotary(x, grouped))[0]
    angles = (grouped - positions)[0, :, None] * rotary.inv_freq.double()
    torch.testing.assert_close(rx.rotate(at_true, angles.float()), expected, atol=1e-5, rtol=0)


def test_self_extend_refuses_soft_capped_attention(tmp_path):
    """Gemma 2 soft-caps attention logits; Self-Extend's kernel does not, so it is refused."""
    from conftest import build_checkpoint

    handle = load_model(build_checkpoint(tmp_path / "gemma2", "gemma2"))
    with pytest.raises(ValueError, match="does not soft-cap.*gemma2"):
        with extend_context(handle, ContextExtension(group_size=4, window=9)):
            pass


def test_self_extend_model_wide_window_is_plain_and_decoding_matches(handle):
    ids = torch.randint(5, len(handle.tokenizer), (1, 70))
    with torch.no_grad():
        plain = handle.model(ids).logits
        with extend_context(handle, ContextExtension(group_size=4, window=70)):
            wide = handle.model(ids).logits
        se = ContextExtension(group_size=4, window=9, block_size=16)
        with extend_context(handle, se):
            full = handle.model(ids).logits
            out = handle.model(ids[:, :-1], use_cache=True)
            step = handle.model(ids[:, -1:], **cache_arg(returned_cache(out))).logits
    torch.testing.assert_close(wide, plain, atol=1e-4, rtol=1e-4)
    assert (full - plain).abs().max() > 1e-2
    torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-4, rtol=1e-4)
    assert handle.model.config._attn_implementation == "sdpa"  # restored


def test_self_extend_never_builds_t_by_t(handle, monkeypatch, kernel):
    """Each kernel call gets one block of queries; the only mask is a band's, block x (block +
    window - 1), and the plain-algebra kernel's scores are at most block x T."""
    calls = []
    attend = rx._attend

    def recording(q, k, v, causal, mask, scale):
        calls.append((q.shape[-2], k.shape[-2], None if mask is None else tuple(mask.shape)))
        return attend(q, k, v, causal, mask, scale)

    monkeypatch.setattr(rx, "_attend", recording)
    T, block, window = 200, 16, 8
    ids = torch.randint(5, len(handle.tokenizer), (1, T))
    with (
        torch.no_grad(),
        extend_context(handle, ContextExtension(group_size=4, window=window, block_size=block)),
    ):
        handle.model(ids)
    blocks = -(-T // block)  # the first has no keys W before it, only its triangle
    assert len(calls) == handle.spec.n_layers * (3 * blocks - 1)  # band, far, triangle
    assert all(rows <= block for rows, _, _ in calls)
    masks = [m for _, _, m in calls if m is not None]
    assert len(masks) == handle.spec.n_layers * blocks
    assert max(m[0] for m in masks) == block and max(m[1] for m in masks) == block + window - 1


def test_combines_with_head_intervention(handle):
    """Self-Extend + NTK + a pruned head == the same edit applied by hand on the extended model."""
    ids = torch.randint(5, len(handle.tokenizer), (1, 50))
    iv = ablate(handle.spec, [(1, 2)], mode="zero")
    ext = ContextExtension(ntk_factor=2.0, group_size=2, window=10)
    with torch.no_grad(), extend_context(handle, ext):
        edited = None
        with handle.edit(iv):
            edited = handle.model(ids).logits
        captured = {}
        o_proj = handle.proj(1, "o_proj")

        def zero_head(_mod, args):
            x = args[0].clone()
            d = handle.spec.d_head
            x[..., 2 * d : 3 * d] = 0
            captured["done"] = True
            return (x,)

        hook = o_proj.register_forward_pre_hook(zero_head)
        try:
            by_hand = handle.model(ids).logits
        finally:
            hook.remove()
    assert captured["done"]
    torch.testing.assert_close(edited, by_hand, atol=1e-6, rtol=1e-6)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="neighbour window"):
        ContextExtension(group_size=4)
    with pytest.raises(ValueError, match="ntk_factor"):
        ContextExtension(ntk_factor=0.5)


@pytest.mark.parametrize("backend", ["hf", "nnsight"])
def test_attention_rows_are_refused_under_modes_they_do_not_follow(handle, backend):
    """Row capture computes plain causal rows: under Self-Extend or streaming heads those are
    not the rows the model attends with, so it refuses instead of returning them."""
    from interp_seal.analysis.attention_rows import capture_attention_rows
    from interp_seal.models import StreamingHeads, compress_kv

    ids = torch.arange(3, 43)
    plain = capture_attention_rows(handle, ids, backend=backend)
    assert torch.isfinite(plain).all()
    with extend_context(handle, ContextExtension(group_size=4, window=8)):
        with pytest.raises(ValueError, match="under Self-Extend are not computed"):
            capture_attention_rows(handle, ids, backend=backend)
    with compress_kv(handle, StreamingHeads(heads={(0, 1)}, sink=2, window=5)):
        with pytest.raises(ValueError, match="under streaming heads are not computed"):
            capture_attention_rows(handle, ids, backend=backend)
    torch.testing.assert_close(capture_attention_rows(handle, ids, backend=backend), plain)
