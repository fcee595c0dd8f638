"""Merge contract (PEFT style): scaled model == merged model, merged == base architecture."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import DISTINCT_FAMILIES, build_checkpoint, float64
from transformers.pytorch_utils import Conv1D

from interp_seal.interventions.head_edit import HeadIntervention
from interp_seal.interventions.hf import hf_logits
from interp_seal.models import load_model
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.merge import merge_into, merged_model, save_merged
from interp_seal.tuning.scales import scale_shape


@pytest.fixture(scope="module", params=DISTINCT_FAMILIES)
def checkpoint(request, tmp_path_factory):
    """One per family: GQA (2 query heads per KV head) but qwen2, multi-head with biases."""
    return build_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


def _ids(handle):
    sample = generate(LineRetrievalConfig(num_lines=6), 1, seed=3)[0]
    return sample.encode(handle.tokenizer).input_ids[None]


def _scales(handle, granularity, *, grouped=False, seed=0):
    """Random scales; ``grouped``: equal within each KV group (mergeable into v_proj)."""
    L, H, D = scale_shape(handle.spec, granularity)
    gen = torch.Generator().manual_seed(seed)
    if grouped:
        per_group = 1 + 0.5 * torch.randn(L, handle.spec.n_kv_heads, D, generator=gen)
        return per_group.repeat_interleave(handle.spec.group_size, dim=1)
    return 1 + 0.5 * torch.randn(L, H, D, generator=gen)


@pytest.mark.parametrize("granularity", ["head", "channel"])
@pytest.mark.parametrize("into", ["o_proj", "v_proj"])
def test_merged_checkpoint_equals_the_scaled_model(checkpoint, tmp_path, granularity, into):
    """In float64: merging is exact, so the only difference left is rounding (~1e-16 relative);
    float32 rounding (~1e-5 on these logits) depends on the day's kernels."""
    handle = load_model(checkpoint)
    float64(handle.model)
    grouped = into == "v_proj"  # v_proj folding needs equal scales per KV group under GQA
    scales = _scales(handle, granularity, grouped=grouped)
    ids = _ids(handle)
    scaled = hf_logits(handle, ids, HeadIntervention.from_scales(handle.spec, scales))
    assert (scaled - hf_logits(handle, ids)).abs().max() > 1e-2, "the scales change the model"

    out = save_merged(handle, scales, tmp_path / "merged", into=into)
    # the attention the handle runs (Gemma 2: capped attention, whose float64 softmax stays in
    # float64; transformers' eager attention takes it in float32, ~1e-6 on these logits)
    impl = handle.family.attn_implementation
    plain = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation=impl)
    plain = float64(plain).eval()
    with torch.no_grad():
        merged = plain(ids).logits
    assert merged.dtype == torch.float64
    torch.testing.assert_close(merged, scaled, rtol=0, atol=1e-10)

    # exactly the base architecture: same config class, same keys, same shapes
    assert type(plain.config) is type(handle.model.config)
    assert type(plain) is type(handle.model)
    base_state, merged_state = handle.model.state_dict(), plain.state_dict()
    assert list(merged_state) == list(base_state)
    assert all(merged_state[k].shape == base_state[k].shape for k in base_state)
    changed = {k for k in base_state if not torch.equal(base_state[k], merged_state[k])}
    family = handle.family
    attn = [f"{family.layers}.{i}.{family.attn}" for i in range(2)]  # the module map's names
    if into == "o_proj":  # its columns only: o_proj's (GPT-NeoX dense's) bias stays
        assert changed == {f"{a}.{family.o_proj}.weight" for a in attn}
        # column h*D + c of the (out, in) weight times s[l, h, c]: a Conv1D (GPT-2's c_proj)
        # stores (in, out), so there it is row h*D + c
        conv1d = isinstance(handle.attn(0).get_submodule(family.o_proj), Conv1D)
        full = scales.expand(*scales.shape[:2], handle.spec.d_head).double()
        for layer, a in enumerate(attn):
            key = f"{a}.{family.o_proj}.weight"
            base, merged_w = (st[key].T if conv1d else st[key] for st in (base_state, merged_state))
            expected = base * full[layer].reshape(-1)[None, :]
            torch.testing.assert_close(merged_w, expected, rtol=1e-12, atol=0)
    else:
        path, rows = handle.family.projection("v", handle.spec)  # v_proj, or a fused qkv_proj
        biased = handle.projection_weights(0, "v")[1] is not None
        assert changed == {
            f"{a}.{path}.{p}" for a in attn for p in (("weight", "bias") if biased else ("weight",))
        }
        conv1d = isinstance(handle.attn(0).get_submodule(path), Conv1D)
        for key in changed if rows is not None else ():  # fused: only the value rows move
            # output rows: a Conv1D weight's (GPT-2's c_attn) are its columns
            base, merged_w = (
                st[key].T if conv1d and st[key].ndim == 2 else st[key]
                for st in (base_state, merged_state)
            )
            others = torch.ones(len(base), dtype=torch.bool)
            others[rows] = False
            assert torch.equal(base[others], merged_w[others])
            assert not torch.equal(base[rows], merged_w[rows])
    assert (tmp_path / "merged" / "tokenizer.json").exists()


def test_v_proj_merge_refuses_unequal_scales_in_a_gqa_group(tmp_path):
    handle = load_model(build_checkpoint(tmp_path / "llama", "llama"))
    scales = torch.ones(scale_shape(handle.spec, "head"))
    scales[1, 3] = 0.5  # head 3 shares KV head 1 with head 2
    with pytest.raises(ValueError, match=r"layer 1, heads \[2, 3\].*o_proj instead"):
        merged_model(handle, scales, into="v_proj")
    merged_model(handle, scales, into="o_proj")  # always exact


def test_merge_into_rejects_bad_scales(tmp_path):
    handle = load_model(build_checkpoint(tmp_path / "qwen2", "qwen2"))
    scales = torch.ones(scale_shape(handle.spec, "channel"))
    scales[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        merge_into(handle, scales)
    with pytest.raises(ValueError, match="do not fit this model"):
        merge_into(handle, torch.ones(3, 4, 1))
    with pytest.raises(ValueError, match="unknown merge target"):
        merge_into(handle, torch.ones(scale_shape(handle.spec, "head")), into="q_proj")


def test_merged_model_leaves_the_original_untouched(tmp_path):
    handle = load_model(build_checkpoint(tmp_path / "llama", "llama"))
    before = {k: v.clone() for k, v in handle.model.state_dict().items()}
    merged_model(handle, _scales(handle, "channel"))
    assert all(torch.equal(before[k], v) for k, v in handle.model.state_dict().items())
