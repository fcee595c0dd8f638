"""SEAL-L / SEAL-D: parameter counts (Table 1), identity at init, training and unloading."""

from __future__ import annotations

import pytest
import torch
import transformers

from interp_seal.engine import pad_id_of
from interp_seal.interventions.hf import hf_logits
from interp_seal.models import load_model
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.counts import ParameterCount, parameter_count
from interp_seal.tuning.data import encode_examples
from interp_seal.tuning.loop import TrainConfig, train
from interp_seal.tuning.peft_baselines import PeftBaselineConfig, PeftTuner
from interp_seal.tuning.seal import SealTuner

# the tiny llama fixture: L=2, H=4, KV=2, D=16, d_model=64, d_mlp=128, vocab V
L, H, KV, D, DM, DMLP = 2, 4, 2, 16, 64, 128


def _base_parameters(vocab: int) -> int:
    per_layer = DM * H * D * 2 + DM * KV * D * 2 + 3 * DM * DMLP + 2 * DM  # q,o k,v mlp norms
    return 2 * vocab * DM + DM + L * per_layer  # embed, lm_head, final norm


def test_parameter_counts_match_a_hand_computation(llama_checkpoint):
    vocab = load_model(llama_checkpoint).spec.vocab_size
    base = _base_parameters(vocab)
    # LoRA rank r on W (out x in): r * (in + out); q, o: 64 <-> 64, k, v: 64 -> 32
    lora = L * 4 * ((DM + H * D) * 2 + (DM + KV * D) * 2)
    dora = lora + L * (H * D + KV * D + KV * D + DM)  # one magnitude per output row
    expected = {"seal-h": L * H, "seal-c": L * H * D, "seal-l": lora, "seal-d": dora}
    tuners = {
        "seal-h": lambda h: SealTuner(h, "head"),
        "seal-c": lambda h: SealTuner(h, "channel"),
        "seal-l": lambda h: PeftTuner(h),
        "seal-d": lambda h: PeftTuner(h, PeftBaselineConfig(dora=True)),
    }
    for method, make in tuners.items():
        count = parameter_count(make(load_model(llama_checkpoint)))
        assert (count.trainable, count.base) == (expected[method], base), method
    assert (lora, dora) == (3584, 3968)


def test_table_cells_read_like_seal_table_1():
    """LongChat-7B-v1.5-32K (6,738,415,616 parameters), Table 1's first block."""
    base = 6_738_415_616
    lora = 32 * 4 * 4 * (4096 + 4096)
    cells = [
        ParameterCount(trainable=n, base=base).table_cell
        for n in (32 * 32, 32 * 32 * 128, lora, lora + 32 * 4 * 4096)
    ]
    assert cells == ["1.0K, 1.5e-5%", "131.1K, 1.9e-3%", "4.2M, 6.2e-2%", "4.7M, 7.0e-2%"]


@pytest.mark.parametrize("dora", [False, True])
def test_peft_tuner_starts_as_identity_trains_and_unloads(llama_checkpoint, tmp_path, dora):
    handle = load_model(llama_checkpoint)
    samples = generate(LineRetrievalConfig(num_lines=4), 6, seed=2)
    ids = samples[0].encode(handle.tokenizer).input_ids[None]
    base = hf_logits(handle, ids)
    tuner = PeftTuner(handle, PeftBaselineConfig(dora=dora))
    assert tuner.method == ("seal-d" if dora else "seal-l")
    with torch.no_grad():
        torch.testing.assert_close(tuner.model(ids).logits, base, rtol=0, atol=1e-6)

    examples = encode_examples(samples, handle.tokenizer)
    result = train(
        tuner, examples, TrainConfig(lr=1e-2, cpu=True), pad_id=pad_id_of(handle.tokenizer)
    )
    assert result.steps == 6
    tuner.eval()
    with torch.no_grad():
        tuned = tuner.model(ids).logits
    assert (tuned - base).abs().max() > 1e-3, "training changed the model"

    plain = tuner.merge_and_unload()
    plain.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is transformers.LlamaForCausalLM
    assert list(reloaded.state_dict()) == list(load_model(llama_checkpoint).model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, tuned, rtol=1e-4, atol=1e-5)


def test_adapters_go_on_each_familys_projections(family_checkpoint):
    """LoRA's targets are the family's modules: a fused ``qkv_proj`` (Phi-3) stands for q, k and
    v together, so it takes all three or none; an adapter starts as the identity either way."""
    handle = load_model(family_checkpoint)
    family, ids = handle.family, torch.tensor([[3, 9, 14, 5, 7]])
    before = hf_logits(handle, ids)
    tuner = PeftTuner(handle, PeftBaselineConfig(rank=2))
    adapted = {n.split(".lora_A.")[0] for n in tuner.trainable_state() if ".lora_A." in n}
    names = {n.rsplit(".", 1)[-1] for n in adapted}
    expected = {family.o_proj, *(family.projection(w, handle.spec)[0] for w in "qkv")}
    assert names == expected and len(adapted) == handle.spec.n_layers * len(expected)
    with torch.no_grad():
        torch.testing.assert_close(tuner.model(ids).logits, before, atol=1e-6, rtol=0)
    if family.qkv_proj is not None:
        with pytest.raises(ValueError, match="target all of q_proj, k_proj and v_proj or none"):
            PeftTuner(load_model(family_checkpoint), PeftBaselineConfig(targets=("v_proj",)))
