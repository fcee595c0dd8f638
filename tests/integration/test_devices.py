"""Devices and precision: one code path for every device and dtype, checked where it can be.

No GPU is lent to this project's machines, so the GPU path is checked the way it can be on a
CPU: no ``.numpy()`` on a tensor that may live on a GPU (a lint over the package source), the
device options on every command that loads a model (a device this machine lacks is refused in
one line), accelerate's ``device_map="auto"`` placement, and bfloat16 (the dtype GPU users run)
on CPU, which must agree with float32 within the tolerances ``docs/design.md`` states (Sec.
"Precision") and rank the same top heads.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

import interp_seal
from interp_seal.analysis import (
    head_sweep,
    line_retrieval_pair,
    logit_attribution,
    passage_retrieval_scores,
    patch_heads,
)
from interp_seal.analysis.sweeps import SweepOptions
from interp_seal.cli import build_parser, main
from interp_seal.cli.common import options, sub_parsers
from interp_seal.engine.batch import pad_id_of
from interp_seal.evaluation import line_retrieval_samples, teacher_force
from interp_seal.models import load_model
from interp_seal.tasks import passages
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.data import collate, encode_examples
from interp_seal.tuning.seal import SealTuner

LINES, N = 40, 6


def test_no_numpy_on_a_tensor_that_may_live_on_a_gpu():
    """``.numpy()`` fails on a CUDA tensor (and on bfloat16): every one follows a ``.cpu()``."""
    offenders = []
    for path in sorted(Path(interp_seal.__file__).parent.rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for match in re.finditer(r"\.numpy\(\)", line):
                if ".cpu()" not in line[: match.start()]:
                    offenders.append(f"{path.name}:{lineno}: {line.strip()}")
    assert offenders == []


def test_every_command_that_loads_a_model_takes_device_options():
    commands = {" ".join(path): set(options(p)) for path, p in sub_parsers(build_parser())}
    loading = {name: opts for name, opts in commands.items() if "--model" in opts}
    assert len(loading) >= 20
    for name, found in loading.items():
        if "--cpu" in found:  # training: accelerate places the model (--cpu, or the GPUs)
            assert "--device" not in found, name
        elif name == "plan":  # reads the config only: a dtype, no device
            assert "--dtype" in found and "--device" not in found
        else:
            assert {"--device", "--dtype", "--device-map"} <= found, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_device_this_machine_lacks_is_one_line(capsys):
    """Refused when the arguments are parsed (argparse's usage, then one error line)."""
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "lines", "--lengths", "3", "--n", "1", "--device", "cuda:1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "interp-seal evaluate lines: error: argument --device: device cuda:1 asked for, but no "
        "CUDA GPU is available here; use --device cpu"
    )


def test_device_map_auto_and_auto_device_load_the_same_model():
    plain = load_model("organism")
    placed = load_model("organism", device_map="auto")
    auto = load_model("organism", device="auto")
    ids = torch.arange(4, 40)[None]
    with torch.no_grad():
        expected = plain.model(ids).logits
        torch.testing.assert_close(placed.model(ids.to(placed.device)).logits.cpu(), expected)
        torch.testing.assert_close(auto.model(ids.to(auto.device)).logits.cpu(), expected)


def test_bfloat16_from_the_command_line(tmp_path):
    """``--dtype bfloat16`` reaches the model: its table differs from float32's in the last
    digits only (the teacher-forcing tolerance)."""
    args = ["evaluate", "lines", "--lengths", "10", "40", "--n", "4"]
    tables = {}
    for dtype in ("float32", "bfloat16"):
        assert main([*args, "--dtype", dtype, "--out", str(tmp_path / dtype)]) == 0
        tables[dtype] = pd.read_csv(tmp_path / dtype / "accuracy.csv")
    f32, b16 = tables["float32"], tables["bfloat16"]
    assert f32.exact_match.tolist() == b16.exact_match.tolist()
    gap = (f32.answer_logprob - b16.answer_logprob).abs()
    assert 0 < gap.max() < 0.1


@pytest.fixture(scope="module")
def handles():
    return load_model("organism"), load_model("organism", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def records(handles):
    return line_retrieval_samples(handles[0].tokenizer, [LINES], n=N, seed=0)


def test_bfloat16_teacher_forcing_agrees(handles, records):
    """Tolerance: the same exact-match verdict per record, log-probability within 0.1 nats
    (measured: identical verdicts, 0.022 nats at most)."""
    f32, b16 = (teacher_force(h, records[LINES]) for h in handles)
    assert [all(a.token_correct) for a in f32] == [all(b.token_correct) for b in b16]
    assert (
        max(abs(a.answer_logprob - b.answer_logprob) for a, b in zip(f32, b16, strict=True)) < 0.1
    )
    assert b16[0].answer_logprob != f32[0].answer_logprob  # it really ran in bfloat16


def test_attention_kernels_may_return_strided_outputs(handles, records, monkeypatch):
    """On an H100 the last layer's attention crashed: CUDA's SDPA returned the GQA query rows
    in another memory order, and ``view`` refused them. A kernel that returns the same values
    in that order (query rows outermost) must change no teacher-forced number."""
    handle = handles[0]
    assert handle.spec.n_kv_heads > 1  # else any memory order views alike
    exact = teacher_force(handle, records[LINES])
    kernel, calls = torch.nn.functional.scaled_dot_product_attention, []

    def strided(*args, **kwargs):
        out = kernel(*args, **kwargs)
        calls.append(out.shape)
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", strided)
    again = teacher_force(handle, records[LINES])
    assert calls and not strided(*[torch.ones(1, 2, 3, 4)] * 3).is_contiguous()
    assert [a.answer_logprob for a in again] == [a.answer_logprob for a in exact]
    assert [a.token_correct for a in again] == [a.token_correct for a in exact]


def test_bfloat16_head_sweep_ranks_the_same_heads(handles, records):
    """Tolerance: the same three most harmful heads; Spearman >= 0.9 over all heads' changes of
    the answer log-probability (measured: the same top 3, 0.965)."""
    deltas = []
    for handle in handles:
        table = head_sweep(handle, records, options=SweepOptions(progress=False))
        table = table[table.metric == "answer_logprob"].set_index(["layer", "head"])
        deltas.append(table["delta"].sort_index())
    f32, b16 = deltas
    assert list(f32.nsmallest(3).index) == list(b16.nsmallest(3).index)
    assert spearmanr(f32, b16)[0] >= 0.9


def test_bfloat16_logit_attribution_agrees(handles, records):
    """Tolerance: every component within 1% of the largest one; the same five largest
    (measured: 0.08%)."""
    sample = records[LINES][0]
    tok = handles[0].tokenizer
    ids = tok(sample.prompt, return_tensors="pt").input_ids[0]
    answer = tok(sample.answer, add_special_tokens=False).input_ids[0]
    f32, b16 = (logit_attribution(h, ids, [answer]).table.value.to_numpy(float) for h in handles)
    assert np.abs(f32 - b16).max() <= 0.01 * np.abs(f32).max()
    top = [set(np.argsort(-np.abs(v))[:5]) for v in (f32, b16)]
    assert top[0] == top[1]


def test_bfloat16_activation_patching_agrees(handles, records):
    """Tolerance: patched fractions within 0.05, Spearman >= 0.9, the same top three heads
    (measured: 0.007, 0.946)."""
    pair = line_retrieval_pair(records[LINES][0], handles[0].tokenizer, corrupt="key", seed=1)
    f32, b16 = (patch_heads(h, pair, progress=False)["value"].to_numpy(float) for h in handles)
    assert np.abs(f32 - b16).max() <= 0.05
    assert spearmanr(f32, b16)[0] >= 0.9
    assert list(np.argsort(-f32)[:3]) == list(np.argsort(-b16)[:3])


def test_bfloat16_passage_scores_agree(handles):
    """Tolerance: every head's MuDAF F1 within 0.05, the same three best heads (measured: equal)."""
    questions = passages.generate(passages.PassagesConfig(num_passages=5), 6, 0)
    f32, b16 = (
        passage_retrieval_scores(h, questions, progress=False).heads.set_index(["layer", "head"])
        for h in handles
    )
    f32, b16 = f32.sort_index()["f1"], b16.sort_index()["f1"]
    assert (f32 - b16).abs().max() <= 0.05
    assert list(f32.nlargest(3).index) == list(b16.nlargest(3).index)


def test_bfloat16_seal_h_step_agrees(handles):
    """Tolerance: the answer loss within 0.01 nats and the scales' gradient at cosine >= 0.98 of
    float32's (measured: 0.0004 nats, 0.999)."""
    steps = []
    for handle in handles:
        tuner = SealTuner(handle, "head")
        samples = generate(LineRetrievalConfig(num_lines=LINES), 4, 0)
        batch = collate(encode_examples(samples, handle.tokenizer), pad_id_of(handle.tokenizer))
        with tuner.step_context():
            loss = tuner(batch)["loss"]
            loss.backward()
        steps.append((loss.item(), tuner.scales.grad.float().flatten().cpu().numpy()))
    (loss32, grad32), (loss16, grad16) = steps
    assert abs(loss32 - loss16) <= 0.01
    cosine = grad32 @ grad16 / np.linalg.norm(grad32) / np.linalg.norm(grad16)
    assert cosine >= 0.98
