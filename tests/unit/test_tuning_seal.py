"""SEAL-H / SEAL-C: identity at init, gradients through the hook, scale files."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch
from conftest import build_checkpoint
from safetensors.torch import save_file

from interp_seal.engine import pad_id_of
from interp_seal.interventions.hf import hf_logits
from interp_seal.models import ContextExtension, extend_context, load_model
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.data import answer_loss, collate, encode_examples
from interp_seal.tuning.loop import TrainConfig, train
from interp_seal.tuning.merge import merged_model
from interp_seal.tuning.scales import FORMAT, ScaleFile, load_scales, save_scales
from interp_seal.tuning.seal import SealTuner


def _examples(handle, n=4, num_lines=4, seed=0):
    samples = generate(LineRetrievalConfig(num_lines=num_lines), n, seed=seed)
    return encode_examples(samples, handle.tokenizer)


@pytest.mark.parametrize("granularity", ["head", "channel"])
def test_untrained_tuner_is_identity(family_checkpoint, granularity):
    handle = load_model(family_checkpoint)
    ids = _examples(handle, n=1)[0].encoded.input_ids[None]
    base = hf_logits(handle, ids)
    tuner = SealTuner(handle, granularity)
    assert tuner.scales.shape[-1] == (1 if granularity == "head" else handle.spec.d_head)
    assert torch.equal(tuner.scales, torch.ones_like(tuner.scales))
    with torch.no_grad(), tuner.step_context():
        scaled = handle.model(ids).logits
    assert torch.equal(scaled, base)
    assert [n for n, p in tuner.named_parameters() if p.requires_grad] == ["scales"]


@pytest.mark.parametrize("granularity", ["head", "channel"])
def test_scales_at_one_get_a_gradient_in_every_layer(llama_checkpoint, granularity):
    """At init every scale is 1; the hooks must still be installed for the gradient to flow."""
    handle = load_model(llama_checkpoint)
    tuner = SealTuner(handle, granularity)
    assert tuner.intervention().active_layers() == [0, 1]
    batch = collate(_examples(handle, n=1), pad_id_of(handle.tokenizer))
    with tuner.step_context():
        tuner(batch)["loss"].backward()
    assert (tuner.scales.grad != 0).flatten(1).any(-1).all()


def test_forward_outside_step_context_is_refused(llama_checkpoint):
    handle = load_model(llama_checkpoint)
    tuner = SealTuner(handle, "head")
    batch = collate(_examples(handle, n=1), pad_id_of(handle.tokenizer))
    with pytest.raises(RuntimeError, match="step_context"):
        tuner(batch)


@pytest.mark.parametrize("granularity", ["head", "channel"])
def test_scale_gradient_matches_the_merged_weight_gradient(llama_checkpoint, granularity):
    """Autograd through the hook == the chain rule through merged weights.

    With the scales folded into ``o_proj`` (``W' = W diag(s)``), ``dL/ds_j = sum_i dL/dW'_ij W_ij``:
    a gradient computed with no hook at all.
    """
    handle = load_model(llama_checkpoint)
    tuner = SealTuner(handle, granularity)
    batch = collate(_examples(handle, n=2), pad_id_of(handle.tokenizer))
    with torch.no_grad():  # away from 1, so the check is not only at the identity
        gen = torch.Generator().manual_seed(0)
        tuner.scales.copy_(1 + 0.2 * torch.randn(tuner.scales.shape, generator=gen))
    with tuner.step_context():
        tuner(batch)["loss"].backward()
    assert (tuner.scales.grad != 0).flatten(1).any(-1).all(), "every layer's scales get a gradient"

    merged = merged_model(handle, tuner.scales)
    weights = [merged.proj(layer, "o_proj").weight for layer in range(handle.spec.n_layers)]
    for w in weights:
        w.requires_grad_(True)
    answer_loss(merged.model, batch).backward()
    L, H, D = handle.spec.shape
    original = [handle.proj(layer, "o_proj").weight for layer in range(L)]
    expected = torch.stack(
        [(w.grad * w0).sum(0).view(H, D) for w, w0 in zip(weights, original, strict=True)]
    )
    if granularity == "head":
        expected = expected.sum(-1, keepdim=True)
    torch.testing.assert_close(tuner.scales.grad, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "extension", [None, ContextExtension(group_size=2, window=8, block_size=4)], ids=str
)
def test_gradient_checkpointing_gives_the_same_gradient(llama_checkpoint, extension):
    """Layer recompute (and, under Self-Extend, its per-block recompute inside) leaves the
    scales' gradient unchanged."""
    handle = load_model(llama_checkpoint)
    tuner = SealTuner(handle, "channel")
    n = 1 if extension else 2  # Self-Extend takes no padding mask
    batch = collate(_examples(handle, n=n), pad_id_of(handle.tokenizer))
    grads = []
    with extend_context(handle, extension) if extension else nullcontext():
        for checkpointing in (False, True):
            if checkpointing:
                tuner.enable_gradient_checkpointing()
            tuner.train()
            tuner.scales.grad = None
            with tuner.step_context():
                tuner(batch)["loss"].backward()
            grads.append(tuner.scales.grad.clone())
    assert grads[0].abs().max() > 1e-4
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-8)


def test_training_lowers_the_answer_loss(llama_checkpoint):
    handle = load_model(llama_checkpoint)
    examples = _examples(handle, n=8)
    batch = collate(examples, pad_id_of(handle.tokenizer))
    tuner = SealTuner(handle, "channel")
    with torch.no_grad(), tuner.step_context():
        before = float(answer_loss(handle.model, batch))
    result = train(
        tuner,
        examples,
        TrainConfig(lr=5e-2, epochs=3, cpu=True),
        pad_id=pad_id_of(handle.tokenizer),
    )
    assert result.steps == 24 and len(result.losses) == 24
    with torch.no_grad(), tuner.step_context():
        after = float(answer_loss(handle.model, batch))
    assert after < before - 0.05
    assert not torch.equal(tuner.scales, torch.ones_like(tuner.scales))
    assert all(not p.requires_grad for p in handle.model.parameters())


# -- scale files --------------------------------------------------------------------------------
def _scale_file(handle, granularity="channel"):
    tuner = SealTuner(handle, granularity)
    scales = 1 + 0.1 * torch.randn(tuner.scales.shape, generator=torch.Generator().manual_seed(1))
    return ScaleFile(
        scales=scales,
        spec=handle.spec,
        model=handle.name_or_path,
        granularity=granularity,
        task="line_retrieval",
        hyperparameters={"lr": 0.02, "epochs": 1, "samples": 50},
    )


@pytest.mark.parametrize("granularity", ["head", "channel"])
def test_scale_file_round_trip_keeps_values_and_metadata(llama_checkpoint, tmp_path, granularity):
    handle = load_model(llama_checkpoint)
    original = _scale_file(handle, granularity)
    path = save_scales(tmp_path / "s.safetensors", original)
    loaded = load_scales(path, handle.spec)
    assert torch.equal(loaded.scales, original.scales)
    assert loaded.spec == handle.spec
    assert (loaded.model, loaded.granularity, loaded.task) == (
        handle.name_or_path,
        granularity,
        "line_retrieval",
    )
    assert loaded.hyperparameters == {"lr": 0.02, "epochs": 1, "samples": 50}


def test_scale_file_refuses_another_geometry(llama_checkpoint, tmp_path):
    handle = load_model(llama_checkpoint)
    path = save_scales(tmp_path / "s.safetensors", _scale_file(handle))
    other = load_model(build_checkpoint(tmp_path / "other", "llama", n_layers=3))
    with pytest.raises(ValueError, match="n_layers: file 2 vs model 3"):
        load_scales(path, other.spec)


def test_non_finite_scales_are_refused(llama_checkpoint, tmp_path):
    handle = load_model(llama_checkpoint)
    good = _scale_file(handle)
    bad = good.scales.clone()
    bad[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        ScaleFile(**{**good.__dict__, "scales": bad})
    # a file written by other means is checked on load too
    metadata = {
        "format": FORMAT,
        "model": "x",
        "geometry": json.dumps(handle.spec.as_dict()),
        "granularity": "channel",
        "task": "line_retrieval",
        "hyperparameters": "{}",
    }
    save_file({"scales": bad}, str(tmp_path / "bad.safetensors"), metadata=metadata)
    with pytest.raises(ValueError, match="1 NaN or inf"):
        load_scales(tmp_path / "bad.safetensors", handle.spec)


def test_scale_file_rejects_foreign_files(tmp_path):
    save_file({"w": torch.ones(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="not an interp-seal scale file"):
        load_scales(tmp_path / "x.safetensors")
