"""``tune()``: the one entry point of every tuning method, against the parts it assembles.

The reference for each method is the same job written out by hand (tuner, encoding, padding,
the training loop), which ``tune`` must reproduce exactly; the result's views (intervention,
merged model, saved files) must agree with each other, and the base handle must be unchanged.
"""

from __future__ import annotations

import pytest
import torch
from conftest import build_checkpoint

from interp_seal.engine import pad_id_of
from interp_seal.interventions import hf_logits
from interp_seal.models import load_model
from interp_seal.tuning import (
    PeftBaselineConfig,
    SealTuner,
    TrainConfig,
    encode_examples,
    format_samples,
    load_scales,
    train,
    tune,
)


@pytest.fixture
def handle(tmp_path):
    return load_model(build_checkpoint(tmp_path / "m", "llama", n_layers=2))


@pytest.fixture
def samples(handle):
    return format_samples("line_retrieval", handle.tokenizer, 4, num_lines=3, seed=5)


def test_seal_h_equals_the_job_written_out(handle, samples, tmp_path):
    result = tune(handle, "seal-h", samples, out=tmp_path / "run")
    by_hand = SealTuner(handle, "head")
    run = train(
        by_hand,
        encode_examples(samples, handle.tokenizer),
        TrainConfig(lr=1e-2),  # the method's one default (methods.METHODS)
        pad_id=pad_id_of(handle.tokenizer),
    )
    assert result.config.lr == 1e-2 and len(result.losses) == 4
    torch.testing.assert_close(result.scales, by_hand.scales.detach().cpu(), atol=0, rtol=0)
    assert result.losses == pytest.approx(run.losses)
    assert float((result.scales - 1).abs().max()) > 1e-4  # it learned something
    assert result.model is None


def test_seal_c_views_agree_and_leave_the_base_alone(handle, samples, tmp_path):
    before = {k: v.clone() for k, v in handle.model.state_dict().items()}
    result = tune(handle, "seal-c", samples)
    ids = samples[0].encode(handle.tokenizer).input_ids[None]
    hooked = hf_logits(handle, ids, result.intervention)
    merged = result.merge(tmp_path / "merged")
    torch.testing.assert_close(hf_logits(merged, ids), hooked, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        hf_logits(load_model(str(tmp_path / "merged")), ids), hooked, atol=1e-5, rtol=0
    )
    saved = load_scales(result.save(tmp_path / "c.safetensors"), handle.spec)
    assert saved.granularity == "channel"
    torch.testing.assert_close(saved.scales, result.scales)
    after = handle.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and not handle._edits


def test_lora_trains_a_copy(handle, samples, tmp_path):
    before = {k: v.clone() for k, v in handle.model.state_dict().items()}
    result = tune(handle, "seal-l", samples, train_config=TrainConfig(lr=5e-2))
    ids = samples[0].encode(handle.tokenizer).input_ids[None]
    tuned = result.model
    assert result.scales is None and result.intervention is None
    assert float((hf_logits(tuned, ids) - hf_logits(handle, ids)).abs().max()) > 1e-4
    after = handle.model.state_dict()
    assert set(after) == set(before) and all(torch.equal(before[k], after[k]) for k in before)
    saved = load_model(str(result.save(tmp_path / "lora")))
    torch.testing.assert_close(hf_logits(saved, ids), hf_logits(tuned, ids), atol=1e-5, rtol=0)


def test_bad_methods_and_configs_are_refused(handle, samples):
    with pytest.raises(ValueError, match="unknown tuning method"):
        tune(handle, "seal-x", samples)
    with pytest.raises(ValueError, match="needs a MudafConfig"):
        tune(handle, "mudaf", samples)
    with pytest.raises(ValueError, match="takes no method_config"):
        tune(handle, "seal-h", samples, method_config=PeftBaselineConfig())
    with pytest.raises(ValueError, match="needs training samples"):
        tune(handle, "seal-h", [])
