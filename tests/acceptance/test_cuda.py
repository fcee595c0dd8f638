"""The GPU path against the CPU: every analysis on the organism, in float32 on a CUDA GPU,
equals the CPU's within float32 rounding, and bfloat16 on the GPU keeps ``docs/design.md``'s
tolerances (Sec. "Precision").

CI has no GPU, so this module is skipped there; on a GPU machine run ``pytest
tests/acceptance/test_cuda.py``. ``INTERP_SEAL_TEST_DEVICE`` names another device to compare (e.g.
``cuda:1``, or ``cpu`` for a dry run of the comparisons themselves). The CPU side runs the same
code (the CPU tests check it against independent references); a CUDA-only fault such as a kernel
returning a tensor in another memory order (the one an H100 found, ``test_devices.py``) or a
tensor left on the wrong device fails here.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from interp_seal.analysis import (
    head_sweep,
    line_retrieval_pair,
    logit_attribution,
    needle_retrieval_scores,
    passage_retrieval_scores,
    patch_heads,
)
from interp_seal.analysis.sweeps import SweepOptions
from interp_seal.engine import greedy_decode
from interp_seal.engine.batch import pad_id_of
from interp_seal.evaluation import line_retrieval_samples, teacher_force
from interp_seal.interventions import ablate
from interp_seal.models import ContextExtension, extend_context, load_model
from interp_seal.tasks import needle, passages
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.data import collate, encode_examples
from interp_seal.tuning.seal import SealTuner

DEVICE = os.environ.get("INTERP_SEAL_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA GPU"
)
LINES, N = 40, 6
TOL = 1e-4  # float32 on two devices: different kernels, summation orders


@pytest.fixture(scope="module")
def handles():
    cpu = load_model("organism")
    gpu = load_model("organism", device=DEVICE)
    assert gpu.model.device.type == torch.device(DEVICE).type
    return cpu, gpu


@pytest.fixture(scope="module")
def records(handles):
    return line_retrieval_samples(handles[0].tokenizer, [LINES], n=N, seed=0)


def logprob_gap(a, b) -> float:
    """The largest difference of two score lists' answer log-probabilities."""
    return max(abs(x.answer_logprob - y.answer_logprob) for x, y in zip(a, b, strict=True))


def test_teacher_forcing(handles, records):
    cpu, gpu = (teacher_force(h, records[LINES], batch_size=3) for h in handles)
    assert [a.token_correct for a in cpu] == [b.token_correct for b in gpu]
    assert logprob_gap(cpu, gpu) < TOL


def test_teacher_forcing_with_heads_masked(handles, records):
    """Zeroed and uniform heads: the masking experiment's conditions (MuDAF Fig. 4)."""
    for mode in ("zero", "uniform"):
        iv = ablate(handles[0].spec, [(0, 1), (1, 3)], mode)
        cpu, gpu = (teacher_force(h, records[LINES], intervention=iv) for h in handles)
        assert [a.token_correct for a in cpu] == [b.token_correct for b in gpu]
        assert logprob_gap(cpu, gpu) < TOL


def test_head_sweep(handles, records):
    cpu, gpu = (
        head_sweep(h, records, options=SweepOptions(progress=False))
        .set_index(["length", "layer", "head", "metric"])
        .sort_index()["delta"]
        for h in handles
    )
    assert cpu.index.equals(gpu.index)
    assert (cpu - gpu).abs().max() < TOL


def test_logit_attribution(handles, records):
    sample = records[LINES][0]
    tok = handles[0].tokenizer
    ids = tok(sample.prompt, return_tensors="pt").input_ids[0]
    answer = tok(sample.answer, add_special_tokens=False).input_ids[0]
    cpu, gpu = (logit_attribution(h, ids, [answer]).table.value.to_numpy(float) for h in handles)
    assert np.abs(cpu - gpu).max() <= TOL * np.abs(cpu).max()


def test_activation_patching(handles, records):
    pair = line_retrieval_pair(records[LINES][0], handles[0].tokenizer, corrupt="key", seed=1)
    cpu, gpu = (patch_heads(h, pair, progress=False)["value"].to_numpy(float) for h in handles)
    assert np.abs(cpu - gpu).max() < TOL


def test_passage_and_needle_retrieval_scores(handles):
    questions = passages.generate(passages.PassagesConfig(num_passages=5), 6, 0)
    cpu, gpu = (
        passage_retrieval_scores(h, questions, progress=False).heads.set_index(["layer", "head"])
        for h in handles
    )
    assert (cpu.sort_index()["f1"] - gpu.sort_index()["f1"]).abs().max() < TOL
    cfg = needle.NeedleConfig(context_lengths=(400,), depths=(0, 50), answer="key_phrase")
    hay = needle.generate(cfg, handles[0].tokenizer)
    cpu, gpu = (
        needle_retrieval_scores(h, hay, progress=False).heads.set_index(["layer", "head"])
        for h in handles
    )
    assert (cpu.sort_index()["score"] - gpu.sort_index()["score"]).abs().max() < TOL


def test_greedy_decoding_with_a_kv_cache(handles, records):
    prompt = records[LINES][0].encode(handles[0].tokenizer).prompt_ids
    iv = ablate(handles[0].spec, [(1, 2)], "zero")
    assert greedy_decode(handles[0], prompt, 8, intervention=iv) == greedy_decode(
        handles[1], prompt, 8, intervention=iv
    )


def test_self_extend_attention(handles):
    """The GPU runs Self-Extend's parts as tensor algebra, the CPU on the fused flash kernel."""
    ids = torch.randint(
        5, len(handles[0].tokenizer), (1, 300), generator=torch.Generator().manual_seed(0)
    )
    ext = ContextExtension(ntk_factor=2.0, group_size=2, window=64, block_size=128)
    logits = []
    for h in handles:
        with torch.no_grad(), extend_context(h, ext):
            logits.append(h.model(ids.to(h.device)).logits.cpu())
    # measured on an H100: 2.9e-4 at logits up to 24.6, as without the extension (3.2e-4)
    torch.testing.assert_close(logits[1], logits[0], atol=TOL * logits[0].abs().max(), rtol=0)


def test_seal_h_step(handles):
    """A SEAL-H training step, against float64 on the CPU: the GPU's answer loss and head-scale
    gradient in float32 are at most twice as far from it as the CPU's float32 are (measured on
    an H100: loss 2.0e-7 vs the CPU's 1.8e-5, gradient 4.3e-7 vs 2.6e-5, at |grad| <= 0.019;
    the organism's residual stream reaches ~200, so float32 rounding shows at ~1e-5)."""
    steps = {}
    exact = load_model("organism", dtype=torch.float64)
    for name, handle in (("cpu", handles[0]), ("gpu", handles[1]), ("float64", exact)):
        tuner = SealTuner(handle, "head")
        samples = generate(LineRetrievalConfig(num_lines=LINES), 4, 0)
        batch = collate(encode_examples(samples, handle.tokenizer), pad_id_of(handle.tokenizer))
        with tuner.step_context():
            loss = tuner(batch.to(handle.device))["loss"]  # as the training loop moves it
            loss.backward()
        steps[name] = (loss.item(), tuner.scales.grad.flatten().double().cpu())
    loss64, grad64 = steps["float64"]
    (loss_cpu, grad_cpu), (loss_gpu, grad_gpu) = steps["cpu"], steps["gpu"]
    assert abs(loss_gpu - loss64) <= 2 * abs(loss_cpu - loss64) + 1e-7
    assert (grad_gpu - grad64).abs().max() <= 2 * (grad_cpu - grad64).abs().max() + 1e-7


def test_bfloat16_on_the_gpu_keeps_the_stated_tolerance(handles, records):
    """docs/design.md: the same exact-match verdict, answer log-probability within 0.1 nats."""
    b16 = load_model("organism", device=DEVICE, dtype=torch.bfloat16)
    f32, low = teacher_force(handles[0], records[LINES]), teacher_force(b16, records[LINES])
    assert [all(a.token_correct) for a in f32] == [all(b.token_correct) for b in low]
    assert logprob_gap(f32, low) < 0.1
