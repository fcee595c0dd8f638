"""The head-edit primitive on every backend, each checked against an independent computation.

- Backends agree: HF hooks, nnsight and the TransformerLens bridge give the same logits
  (max abs diff <= 1e-5 in fp32) for random per-channel scales, batched scales, zero, mean
  and uniform ablation, on a random checkpoint of every supported family.
- The HF path is exact against weight surgery: scaling head ``h``'s channel ``c`` equals
  scaling column ``h*D + c`` of ``o_proj.weight``; a mean offset equals adding
  ``W_O[:, head] @ mean`` to ``o_proj``'s bias. A batched scale equals one run per row.
- Uniform attention (running mean of values) equals an eager attention whose chosen heads'
  pre-softmax scores are set to 0, what the Retrieval Head and MuDAF code do.
- Nothing survives a block: after an exception inside ``intervene`` the model is clean.
- Bad input (wrong shapes, NaN, another model's geometry, missing heads) fails loudly.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from torch import nn
from transformers.pytorch_utils import Conv1D

from interp_seal.interventions import (
    HeadIntervention,
    ablate,
    capture_head_outputs,
    intervene,
    logits,
    nnsight_logits,
    scale_table,
)
from interp_seal.models import BACKENDS, ModelSpec, load_model, soft_cap

TOL = 1e-5
OTHER_BACKENDS = ("nnsight", "transformer_lens")
KINDS = ("scale", "batched", "zero", "mean", "uniform")
# heads ablated in the zero/mean/uniform cases: both layers, several heads of one KV group
HEADS = [(0, 1), (1, 0), (1, 3)]


@pytest.fixture(scope="module")
def handle(family_checkpoint):
    return load_model(family_checkpoint)


def token_ids(handle, batch: int = 3, pos: int = 12, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, handle.spec.vocab_size, (batch, pos), generator=generator)


def mean_head_outputs(handle, input_ids) -> torch.Tensor:
    """``(L, H, D)`` mean of each head's output over a reference batch."""
    return torch.stack([z.mean(dim=(0, 1)) for z in capture_head_outputs(handle, input_ids)])


def make_intervention(kind: str, handle, batch: int = 3) -> HeadIntervention:
    generator = torch.Generator().manual_seed(1)
    spec = handle.spec
    if kind == "scale":
        return HeadIntervention(spec=spec, scale=2 * torch.rand(spec.shape, generator=generator))
    if kind == "batched":
        scale = 2 * torch.rand((batch, *spec.shape), generator=generator)
        return HeadIntervention(spec=spec, scale=scale)
    if kind == "mean":
        reference = token_ids(handle, batch=4, pos=10, seed=7)
        return ablate(spec, HEADS, "mean", mean_z=mean_head_outputs(handle, reference))
    return ablate(spec, HEADS, kind)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# -- the three backends agree ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_backends_agree(handle, kind, backend):
    ids = token_ids(handle)
    iv = make_intervention(kind, handle)
    reference = logits(handle, ids, iv, backend="hf")
    assert max_diff(reference, logits(handle, ids, backend="hf")) > 0.1  # the edit does something
    assert max_diff(logits(handle, ids, iv, backend=backend), reference) <= TOL


def test_backends_agree_without_intervention(handle):
    ids = token_ids(handle)
    reference = handle.model(ids).logits
    for backend in BACKENDS:
        assert max_diff(logits(handle, ids, backend=backend), reference) <= TOL


def test_nnsight_remote_local_runs_the_serialised_trace(handle):
    ids = token_ids(handle)
    iv = make_intervention("uniform", handle)
    served = nnsight_logits(handle, ids, iv, remote="local")
    assert max_diff(served, logits(handle, ids, iv, backend="hf")) == 0.0


# -- independent references ----------------------------------------------------------------
def attn_of(handle, model: nn.Module, layer: int) -> nn.Module:
    """``layer``'s attention module in ``model`` (a copy of ``handle.model``), by the family's
    module map (``model.layers.L.self_attn``, GPT-NeoX's ``gpt_neox.layers.L.attention``)."""
    return model.get_submodule(f"{handle.family.layers}.{layer}.{handle.family.attn}")


def merged_model(handle, iv: HeadIntervention) -> nn.Module:
    """A copy of the model with ``iv`` (no uniform heads, one table) folded into ``o_proj``.

    ``o_proj(s * z + m) = (W diag(s)) z + (b + W m)``: scale the columns, move the offset to the
    bias. GPT-2's ``Conv1D`` stores ``W`` transposed, ``(in, out)``, so there the columns are
    its weight's rows (told by the module's class here, not by the family's row).
    """
    model = copy.deepcopy(handle.model)
    for layer in range(handle.spec.n_layers):
        o_proj = attn_of(handle, model, layer).get_submodule(handle.family.o_proj)
        conv1d = isinstance(o_proj, Conv1D)
        weight = o_proj.weight.detach().clone()  # (out, in)
        weight = weight.T if conv1d else weight
        bias = torch.zeros(weight.shape[0]) if o_proj.bias is None else o_proj.bias.detach()
        if iv.offset is not None:
            bias = bias + weight @ iv.offset[layer].flatten()
        weight = weight * iv.scale[layer].flatten()
        o_proj.weight = nn.Parameter(weight.T.contiguous() if conv1d else weight)
        o_proj.bias = nn.Parameter(bias)
    return model


@pytest.mark.parametrize("kind", ["scale", "zero", "mean"])
def test_edit_equals_o_proj_weight_surgery(handle, kind):
    ids = token_ids(handle)
    iv = make_intervention(kind, handle)
    with torch.no_grad():
        expected = merged_model(handle, iv)(ids).logits
    assert max_diff(logits(handle, ids, iv, backend="hf"), expected) <= TOL


def test_zeroing_a_head_equals_zeroing_its_o_proj_columns(handle):
    layer, head, D = 1, 2, handle.spec.d_head
    model = copy.deepcopy(handle.model)
    with torch.no_grad():
        o_proj = attn_of(handle, model, layer).get_submodule(handle.family.o_proj)
        # (out, in): GPT-2's Conv1D stores (in, out)
        weight = o_proj.weight.T if isinstance(o_proj, Conv1D) else o_proj.weight
        weight[:, head * D : (head + 1) * D] = 0
        ids = token_ids(handle)
        expected = model(ids).logits
    for backend in BACKENDS:
        got = logits(handle, ids, ablate(handle.spec, [(layer, head)], "zero"), backend=backend)
        assert max_diff(got, expected) <= TOL


def test_batched_scale_equals_one_run_per_row(handle):
    ids = token_ids(handle)
    iv = make_intervention("batched", handle)
    batched = logits(handle, ids, iv, backend="hf")
    for row in range(ids.shape[0]):
        single = HeadIntervention(spec=handle.spec, scale=iv.scale[row])
        assert max_diff(batched[row], logits(handle, ids[row : row + 1], single)[0]) <= TOL


def test_mean_ablation_outputs_the_reference_mean(handle):
    iv = make_intervention("mean", handle)
    layer, head = HEADS[0]
    seen = {}
    o_proj = handle.proj(layer, "o_proj")
    with intervene(handle, iv, backend="hf"):  # a hook after the edit's: what o_proj receives
        with o_proj.register_forward_pre_hook(lambda _m, args: seen.update(x=args[0])):
            handle.model(token_ids(handle))
        raw = capture_head_outputs(handle, token_ids(handle))[layer]  # the heads' own outputs
    z = seen["x"].unflatten(-1, (handle.spec.n_heads, -1))
    assert torch.equal(z[:, :, head], iv.offset[layer, head].expand_as(z[:, :, head]))
    assert not torch.equal(raw[:, :, head], z[:, :, head])


def zeroed_scores_attention(module, query, key, value, attention_mask, scaling, **kwargs):
    """Eager causal attention (soft-capped where the family caps: Gemma 2); heads in
    ``module.uniform_heads`` get pre-softmax scores of 0."""
    group = query.shape[1] // key.shape[1]  # query (B, H, T, D), key/value (B, KV, T, D)
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = soft_cap(query @ key.transpose(-1, -2) * scaling, kwargs.get("softcap"))
    scores[:, getattr(module, "uniform_heads", [])] = 0.0
    T = scores.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    return (probs @ value).transpose(1, 2).contiguous(), probs


def test_uniform_attention_equals_zeroed_pre_softmax_scores(handle):
    transformers.AttentionInterface.register("interp_seal_zeroed_scores", zeroed_scores_attention)
    model = copy.deepcopy(handle.model)
    model.set_attn_implementation("interp_seal_zeroed_scores")
    for layer, head in HEADS:
        attn = attn_of(handle, model, layer)
        attn.uniform_heads = [*getattr(attn, "uniform_heads", []), head]
    ids = token_ids(handle)
    with torch.no_grad():
        expected = model(ids).logits
    assert max_diff(logits(handle, ids, make_intervention("uniform", handle)), expected) <= TOL


def windowed_zeroed_scores_attention(module, query, key, value, attention_mask, scaling, **kw):
    """``zeroed_scores_attention`` in a layer that attends within ``module.window`` positions."""
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = soft_cap(query @ key.transpose(-1, -2) * scaling, kw.get("softcap"))
    scores[:, getattr(module, "uniform_heads", [])] = 0.0
    t = torch.arange(scores.shape[-1])
    visible = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - module.window)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return (probs @ value).transpose(1, 2).contiguous(), probs


# the layers' windows once the config's sliding_window is 5: every layer (Mistral), or every
# other one, alternating with full attention (Gemma 2's layer_types)
WINDOWS = {"mistral": [5, 5], "gemma2": [5, None]}


@pytest.mark.parametrize("family", sorted(WINDOWS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_uniform_attention_keeps_to_a_sliding_window(tmp_path, backend, family):
    """A model whose 5-position window is shorter than the 12-token input (in every layer, or
    alternating with full attention): uniform attention averages the values the head can see,
    as zeroed pre-softmax scores under the model's own window mask do; the running mean over
    every earlier position would be 0.1-1 logits off."""
    import json

    from conftest import build_checkpoint

    from interp_seal.evaluation import teacher_force
    from interp_seal.tasks.sample import Encoded

    path = build_checkpoint(tmp_path / family, family, seed=5)
    config = json.loads((tmp_path / family / "config.json").read_text())
    (tmp_path / family / "config.json").write_text(json.dumps(config | {"sliding_window": 5}))
    handle = load_model(path)
    assert [handle.sliding_window(layer) for layer in range(2)] == WINDOWS[family]
    name = "interp_seal_windowed_zeroed_scores"
    transformers.AttentionInterface.register(name, windowed_zeroed_scores_attention)
    model = copy.deepcopy(handle.model)
    model.set_attn_implementation(name)
    for layer in range(2):
        model.model.layers[layer].self_attn.window = WINDOWS[family][layer] or 10**6
    for layer, head in HEADS:
        attn = model.model.layers[layer].self_attn
        attn.uniform_heads = [*getattr(attn, "uniform_heads", []), head]
    ids = token_ids(handle, batch=1)
    with torch.no_grad():
        expected = model(ids).logits
    iv = make_intervention("uniform", handle)
    assert max_diff(logits(handle, ids, iv, backend=backend), expected) <= TOL
    everything = ablate(handle.spec, HEADS, "uniform")  # unwindowed: what the edit did before
    with torch.no_grad():
        for m in (model.model.layers[layer].self_attn for layer in range(2)):
            m.window = 10**6
        unwindowed = model(ids).logits
    assert max_diff(unwindowed, expected) > 0.05
    # the engine's restart of the last layer at the answer rows keeps to the window too
    enc = Encoded(input_ids=ids[0], answer_start=9)
    score = teacher_force(handle, [enc], intervention=everything)[0]
    logprobs = expected[0, 8:11].log_softmax(-1)
    reference = float(logprobs.gather(-1, ids[0, 9:12, None]).sum())
    assert score.answer_logprob == pytest.approx(reference, abs=1e-4)


# -- context managers --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_intervene_is_seen_by_logits_and_nests(handle, backend):
    ids = token_ids(handle)
    zero = ablate(handle.spec, [(0, 1)], "zero")
    double = ablate(handle.spec, [(1, 2)], "scale", factor=2.0)
    both = scale_table(handle.spec, {(0, 1): 0.0, (1, 2): 2.0})
    expected_zero, expected_both = logits(handle, ids, zero), logits(handle, ids, both)
    with intervene(handle, zero, backend=backend):
        assert max_diff(logits(handle, ids, backend=backend), expected_zero) <= TOL
        with intervene(handle, double, backend=backend):
            assert max_diff(logits(handle, ids, backend=backend), expected_both) <= TOL
        assert max_diff(logits(handle, ids, backend=backend), expected_zero) <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_nothing_survives_an_exception(handle, backend):
    ids = token_ids(handle)
    clean = logits(handle, ids, backend=backend)
    with pytest.raises(RuntimeError, match="inside the block"):
        with intervene(handle, make_intervention("uniform", handle), backend=backend):
            raise RuntimeError("inside the block")
    assert torch.equal(logits(handle, ids, backend=backend), clean)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in handle.model.modules())


def test_nnsight_edit_applies_to_traces_not_to_the_torch_module(handle):
    ids = token_ids(handle)
    iv = make_intervention("zero", handle)
    with intervene(handle, iv, backend="nnsight"):
        assert max_diff(logits(handle, ids, backend="nnsight"), logits(handle, ids, iv)) <= TOL
        assert torch.equal(logits(handle, ids, backend="hf"), handle.model(ids).logits)


def test_backend_defaults_to_the_handle_backend(family_checkpoint):
    handle = load_model(family_checkpoint, backend="transformer_lens")
    ids = token_ids(handle)
    with intervene(handle, make_intervention("zero", handle)) as model:
        assert model is handle.bridge()
    assert torch.equal(logits(handle, ids), logits(handle, ids, backend="transformer_lens"))


# -- bad input ---------------------------------------------------------------------------------
def test_bad_scales_are_refused(handle, unchecked):
    L, H, D = handle.spec.shape
    with pytest.raises(ValueError, match=r"this model needs \(L, H, D\)"):
        HeadIntervention(spec=handle.spec, scale=torch.ones(L, H + 1, D))
    with pytest.raises(ValueError, match=r"this model needs \(L, H, D\)"):
        HeadIntervention(spec=handle.spec, scale=torch.ones(H, D))
    with pytest.raises(ValueError, match="NaN or inf"):
        HeadIntervention(spec=handle.spec, scale=torch.full((L, H, D), float("nan")))
    with pytest.raises(ValueError, match="NaN or inf"):
        ablate(handle.spec, HEADS, "mean", mean_z=torch.full((L, H, D), float("inf")))


def test_missing_heads_and_channels_are_refused(handle):
    L, H, D = handle.spec.shape
    for entry in [(L, 0), (0, H), (-1, 0)]:
        with pytest.raises(ValueError, match="does not exist"):
            ablate(handle.spec, [entry], "zero")
    with pytest.raises(ValueError, match="channel"):
        ablate(handle.spec, [(0, 0, D)], "zero")
    with pytest.raises(ValueError, match="does not exist"):
        scale_table(handle.spec, {(0, H): 0.5})


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_models_intervention_is_refused(handle, backend):
    other = ModelSpec(**{**handle.spec.as_dict(), "vocab_size": handle.spec.vocab_size + 1})
    iv = HeadIntervention(spec=other, scale=torch.zeros(other.shape))
    with pytest.raises(ValueError, match="cannot be applied to"):
        logits(handle, token_ids(handle), iv, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_scale_needs_a_matching_batch(handle, backend):
    iv = make_intervention("batched", handle, batch=3)
    with pytest.raises(ValueError, match="3 scale tables .* batch has 2 rows"):
        logits(handle, token_ids(handle, batch=2), iv, backend=backend)


def test_bad_input_ids_and_backend_are_refused(handle, unchecked):
    ids = token_ids(handle)
    with pytest.raises(ValueError, match=r"expected \(batch, pos\)"):
        logits(handle, ids[0])
    with pytest.raises(ValueError, match="integer token ids"):
        logits(handle, ids.float())
    with pytest.raises(ValueError, match="must lie in"):
        logits(handle, ids + handle.spec.vocab_size)
    with pytest.raises(ValueError, match="unknown backend"):
        logits(handle, ids, backend="vllm")
