"""``run_with_cache``: every name equals the TransformerLens 4 bridge's cache of the same model.

The bridge computes eager attention with its own hook points, an independent route to the same
activations. Checked on the organism (GQA, trained weights) and on a random checkpoint of each
other family (Qwen2: multi-head, q / k / v biases; Qwen3: q / k norms; OLMo 2: norms on the
sublayer outputs), at all positions, at a few positions (rows, no ``T x T``) and under an edit
applied on both sides.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DISTINCT_FAMILIES, build_checkpoint

from interp_seal.analysis import run_with_cache
from interp_seal.analysis.activation_cache import NAMES, ActivationCache
from interp_seal.interventions import ablate
from interp_seal.interventions.tl_backend import tl_hooks
from interp_seal.models import load_model

TOL = 1e-5  # of each tensor's largest magnitude: the bridge runs eager attention and its own
# norms, so float32 summation orders differ (2.9e-5 absolute in the organism's layer-1 z, whose
# entries reach 6.3; float64 does not help: HF's RMSNorm computes in float32 either way)


@pytest.fixture(
    scope="module", params=["organism", *(f for f in DISTINCT_FAMILIES if f != "llama")]
)
def handle(request, tmp_path_factory):
    if request.param == "organism":  # the llama family, trained
        return load_model("organism")
    path = build_checkpoint(tmp_path_factory.mktemp("cache"), request.param, n_layers=2)
    return load_model(path)


def ids_for(handle, T: int = 12) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(4, handle.spec.vocab_size, (2, T), generator=gen)


def bridge_cache(handle, ids, iv=None):
    bridge = handle.bridge()
    with torch.no_grad():
        if iv is None:
            return bridge.run_with_cache(ids)
        with tl_hooks(handle, iv):
            return bridge.run_with_cache(ids)


def assert_matches(handle, ours: ActivationCache, logits, theirs, tl_logits, keep=None):
    keys = ours.keys()
    per_layer = len(NAMES) - 1 - handle.parallel_residual()  # GPT-NeoX: no resid_mid
    assert len(keys) == per_layer * handle.spec.n_layers + 1
    for key in keys:
        name = ActivationCache.tl_name(key)
        if key[0] in ("q", "k") and name not in theirs.keys():
            # the bridge of some families (Phi-3) keeps no rotated q / k; they reach the
            # comparison through "pattern", and test_attention_rows checks them per family
            continue
        expected = theirs[name]
        if keep is not None:
            expected = expected[:, :, keep] if key[0] == "pattern" else expected[:, keep]
        torch.testing.assert_close(
            ours[key],
            expected.to(ours[key].dtype),
            atol=TOL * max(1.0, float(expected.abs().max())),
            rtol=0,
            msg=lambda m, key=key: f"{key}: {m}",
        )
    expected_logits = tl_logits if keep is None else tl_logits[:, keep]
    scale = max(1.0, float(expected_logits.abs().max()))
    torch.testing.assert_close(logits, expected_logits, atol=TOL * scale, rtol=0)


def test_cache_equals_transformer_lens(handle):
    ids = ids_for(handle)
    logits, cache = run_with_cache(handle, ids)
    tl_logits, theirs = bridge_cache(handle, ids)
    assert_matches(handle, cache, logits, theirs, tl_logits)
    assert cache["z", 1].shape == (2, 12, handle.spec.n_heads, handle.spec.d_head)
    assert cache["k", 1].shape == (2, 12, handle.spec.n_kv_heads, handle.spec.d_head)


def test_selected_positions_are_rows_of_the_full_cache(handle):
    ids = ids_for(handle)
    logits, cache = run_with_cache(handle, ids, positions=[3, -1])
    tl_logits, theirs = bridge_cache(handle, ids)
    assert cache.positions.tolist() == [3, 11]
    assert cache["pattern", 0].shape == (2, handle.spec.n_heads, 2, 12)  # rows, not T x T
    assert_matches(handle, cache, logits, theirs, tl_logits, keep=[3, 11])


def test_cache_under_an_edit_equals_the_bridge_under_the_same_edit(handle):
    ids = ids_for(handle)
    iv = ablate(handle.spec, [(0, 1), (1, 0)], "scale", factor=0.25)
    with handle.edit(iv):
        logits, cache = run_with_cache(handle, ids)
    given = run_with_cache(handle, ids, intervention=iv, names=["z"], layers=[0])
    tl_logits, theirs = bridge_cache(handle, ids, iv)
    assert_matches(handle, cache, logits, theirs, tl_logits)
    torch.testing.assert_close(given[1]["z", 0], cache["z", 0])
    assert float(cache["z", 0][:, :, 1].abs().max()) > 0
    plain = run_with_cache(handle, ids, names=["z"], layers=[0])[1]
    torch.testing.assert_close(cache["z", 0][:, :, 1], 0.25 * plain["z", 0][:, :, 1])


def test_names_and_layers_restrict_the_cache_and_bad_ones_are_refused(handle):
    ids = ids_for(handle)
    _, cache = run_with_cache(handle, ids, names=["z", "scale"], layers=[1])
    assert set(cache.keys()) == {("z", 1), ("scale", None)}
    with pytest.raises(KeyError, match="not in this cache"):
        cache["z", 0]
    with pytest.raises(ValueError, match="unknown cache names"):
        run_with_cache(handle, ids, names=["hook_z"])
    with pytest.raises(ValueError, match="positions"):
        run_with_cache(handle, ids, positions=[12])


def test_parallel_residual_has_no_resid_mid(tmp_path):
    """GPT-NeoX computes ``x + attn(ln1(x)) + mlp(ln2(x))``: no stream lies between attention
    and MLP, so the default cache leaves ``resid_mid`` out and asking for it fails in one line;
    the layer's output is still ``resid_pre + attn_out + mlp_out``."""
    handle = load_model(build_checkpoint(tmp_path / "neox", "gpt_neox"))
    assert handle.parallel_residual()
    ids = ids_for(handle)
    _, cache = run_with_cache(handle, ids)
    assert "resid_mid" not in {name for name, _ in cache.keys()}
    with pytest.raises(ValueError, match="no resid_mid"):
        run_with_cache(handle, ids, names=["resid_mid"])
    parts = cache["resid_pre", 1] + cache["attn_out", 1] + cache["mlp_out", 1]
    torch.testing.assert_close(parts, cache["resid_post", 1], atol=1e-5, rtol=0)
