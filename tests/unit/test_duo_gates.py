"""DuoAttention's gates against independent computations.

- the gated attention function against a masked-eager formula written here (``T x T``, every
  head by hand) at fractional gates, with GQA and several query blocks;
- gates all at 1 give the model's own logits; a gate at exactly 0 gives the streaming head of
  ``streaming_heads.compress_kv`` (a second implementation of sink + window);
- the loss: 0 distillation at the start, and the gates' gradient equals a finite difference;
- training: gates stay in [0, 1], the L1 term pulls unneeded gates down, the run resumes.
"""

from __future__ import annotations

import pytest
import torch
from conftest import build_checkpoint

from interp_seal.models import load_model
from interp_seal.models import streaming_heads as sh
from interp_seal.tasks import line_retrieval
from interp_seal.tuning import TrainConfig, encode_examples
from interp_seal.tuning import duo_gates as duo
from interp_seal.tuning.data import collate

CFG = duo.DuoConfig(sink=2, window=5, block_size=4)


@pytest.fixture(scope="module")
def handle(llama_checkpoint):
    return load_model(llama_checkpoint)  # 2 layers, 4 query heads, 2 KV heads


def ids(handle, n=19, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, handle.spec.vocab_size, (1, n), generator=gen)


def eager_mix(q, k, v, alpha, sink, window, scaling):
    """alpha * causal softmax + (1 - alpha) * sink/window softmax, per query head, T x T."""
    B, H, T, D = q.shape
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    pos = torch.arange(T)
    causal = pos[:, None] >= pos[None]
    stream = sh.allowed(pos, pos, sink, window)
    out = torch.empty_like(q)
    for h in range(H):
        s = (q[:, h] @ k[:, h].transpose(-1, -2)) * scaling
        full = s.masked_fill(~causal, float("-inf")).softmax(-1) @ v[:, h]
        part = s.masked_fill(~stream, float("-inf")).softmax(-1) @ v[:, h]
        a = float(alpha[h // group])
        out[:, h] = a * full + (1 - a) * part
    return out


def test_gated_attention_equals_the_masked_eager_mix():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 11, 8), torch.randn(2, 2, 11, 8), torch.randn(2, 2, 11, 8)
    gates = torch.tensor([[0.3, 0.8]])
    module = torch.nn.Module()
    setattr(module, duo._GATE_ATTR, (lambda: gates, 0, CFG))
    out, _ = duo.gated_attention(module, q, k, v, None, scaling=0.35)
    expected = eager_mix(q, k, v, gates[0], CFG.sink, CFG.window, 0.35)
    torch.testing.assert_close(out.transpose(1, 2), expected, atol=1e-6, rtol=1e-5)
    # the mix matters: each side alone is far from it
    setattr(module, duo._GATE_ATTR, (lambda: None, 0, CFG))
    full, _ = duo.gated_attention(module, q, k, v, None, scaling=0.35)
    assert (full - out).abs().max() > 0.05


def test_gates_at_one_are_the_model(handle):
    x = ids(handle)
    with torch.no_grad():
        plain = handle.model(x).logits
        with duo.gated(handle, torch.ones(2, 2), CFG):
            gated = handle.model(x).logits
    torch.testing.assert_close(gated, plain, atol=1e-5, rtol=1e-5)


def test_a_gate_at_zero_is_a_streaming_head(handle):
    x = ids(handle)
    gates = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    streaming = sh.StreamingHeads(heads={(0, 1), (1, 0)}, sink=CFG.sink, window=CFG.window)
    with torch.no_grad():
        with duo.gated(handle, gates, CFG):
            gated = handle.model(x, use_cache=False).logits
        with sh.compress_kv(handle, streaming):
            compressed = handle.model(x, use_cache=False).logits
        plain = handle.model(x).logits
    torch.testing.assert_close(gated, compressed, atol=1e-5, rtol=1e-5)
    assert (gated - plain).abs().max() > 1e-2  # the window (5) is shorter than the prompt (19)
    assert handle.model.config._attn_implementation != duo.ATTENTION_NAME  # restored


def line_samples(n=4, lines=6, seed=5):
    return line_retrieval.generate(
        line_retrieval.LineRetrievalConfig(num_lines=lines), n, seed=seed
    )


def test_loss_starts_at_the_penalty_and_its_gradient_is_the_finite_difference(handle):
    tuner = duo.DuoGateTuner(handle, CFG)
    batch = collate(encode_examples(line_samples(2), handle.tokenizer), 0)
    with tuner.step_context():
        out = tuner(batch)
    assert out["distill"].item() == pytest.approx(0.0, abs=1e-10)
    assert out["loss"].item() == pytest.approx(CFG.penalty * 1.0)
    with torch.no_grad():
        tuner.gates.copy_(torch.tensor([[0.6, 0.4], [0.7, 0.5]]))
    with tuner.step_context():
        loss = tuner(batch)["loss"]
        loss.backward()
    grad = tuner.gates.grad[1, 0].item()
    eps = 1e-3

    def loss_at(value):
        with torch.no_grad():
            tuner.gates[1, 0] = value
            with tuner.step_context():
                return float(tuner(batch)["loss"])

    numeric = (loss_at(0.7 + eps) - loss_at(0.7 - eps)) / (2 * eps)
    assert grad == pytest.approx(numeric, rel=2e-2, abs=1e-5)
    assert abs(grad) > 1e-6


def test_training_keeps_gates_in_range_and_resumes(handle, tmp_path):
    samples = line_samples(6)
    cfg = duo.DuoConfig(sink=1, window=3, penalty=0.5)
    run_cfg = TrainConfig(lr=0.2, checkpoint_every=2)
    gates, run = duo.train_gates(handle, samples, cfg, run_cfg, out=tmp_path / "a")
    assert run.steps == 6 and len(run.losses) == 6
    assert ((gates >= 0) & (gates <= 1)).all()
    assert gates.min() < 1  # the penalty moved some gate
    # killed after step 4 (its checkpoint written), then resumed: the uninterrupted run's gates

    def stop(info):
        if info.step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        duo.train_gates(handle, samples, cfg, run_cfg, out=tmp_path / "b", callbacks=[stop])
    resumed, rerun = duo.train_gates(handle, samples, cfg, run_cfg, out=tmp_path / "b")
    assert rerun.resumed_from == 4
    torch.testing.assert_close(resumed, gates, atol=0, rtol=0)


def test_ranking_gives_each_query_head_its_kv_heads_gate():
    gates = torch.tensor([[0.2, 0.9], [1.0, 0.0]])
    table = duo.gate_ranking(gates, n_heads=4)
    assert list(zip(table["layer"], table["head"], strict=True))[:4] == [
        (1, 0),
        (1, 1),
        (0, 2),
        (0, 3),
    ]
    assert table.loc[table["rank"] == 1, "gate"].item() == 1.0
    assert duo.gate_table(gates)["gate"].tolist() == pytest.approx([0.2, 0.9, 1.0, 0.0])


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="window >= 1"):
        duo.DuoConfig(window=0)
    with pytest.raises(ValueError, match="sink >= 0"):
        duo.DuoConfig(sink=-1)
    with pytest.raises(ValueError, match="penalty"):
        duo.DuoConfig(penalty=-1)


def test_cli_duo_gates_writes_the_library_gates(llama_checkpoint, handle, tmp_path):
    import pandas as pd

    from interp_seal.cli import main
    from interp_seal.tasks import jsonl

    samples = line_samples(4)
    path = tmp_path / "train.jsonl"
    jsonl.write_samples(path, samples)
    out = tmp_path / "duo"
    args = ["retrieval", "duo-gates", "--model", llama_checkpoint, "--samples", str(path)]
    args += ["--sink", "1", "--window", "3", "--penalty", "0.5", "--lr", "0.2", "--threads", "1"]
    assert main([*args, "--out", str(out)]) == 0
    cfg = duo.DuoConfig(sink=1, window=3, penalty=0.5)
    gates, _ = duo.train_gates(handle, samples, cfg, TrainConfig(lr=0.2))
    written = pd.read_csv(out / "gates.csv")
    assert written["gate"].tolist() == pytest.approx(gates.reshape(-1).tolist(), abs=1e-6)
    heads = pd.read_csv(out / "head_scores.csv")
    expected = duo.gate_ranking(gates, handle.spec.n_heads)
    assert heads[["layer", "head", "rank"]].values.tolist() == (
        expected[["layer", "head", "rank"]].values.tolist()
    )
    assert (heads["n"] == 4).all()
    assert main([*args, "--out", str(out), "--resume"]) == 0  # finished: resumes at the end
    assert main([*args, "--penalty", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_soft_capped_or_windowed_models_are_refused(tmp_path):
    gemma = load_model(build_checkpoint(tmp_path / "gemma2", "gemma2"))
    with pytest.raises(ValueError, match="sliding-window layers|soft-cap"):
        with duo.gated(gemma, torch.ones(gemma.spec.n_layers, gemma.spec.n_kv_heads)):
            pass
    assert gemma.model.config._attn_implementation != duo.ATTENTION_NAME
