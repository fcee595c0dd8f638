"""MuDAF: the contrastive loss by hand, post-RoPE capture, head selection, training."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import transformers
from transformers.pytorch_utils import Conv1D

from interp_seal.engine import pad_id_of
from interp_seal.models import load_model, soft_cap
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.tuning.data import (
    answer_loss,
    collate,
    encode_examples,
    format_samples,
    with_line_passages,
)
from interp_seal.tuning.loop import TrainConfig, train
from interp_seal.tuning.mudaf import (
    MudafConfig,
    MudafTuner,
    contrastive_loss,
    rotary_qk_hooks,
    sample_heads,
    score_matrix,
    top_k_heads,
)


def test_contrastive_loss_single_head_by_hand():
    q = torch.tensor([[1.0, 0.0]])  # (heads=1, D=2)
    keys = torch.tensor([[[2.0, 0.0]], [[0.0, 3.0]], [[-1.0, 0.0]]])  # cos 1, 0, -1
    loss = contrastive_loss(q, keys, [0], tau=0.5)  # logits 2, 0, -2
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-2) + math.exp(-4)), rel=1e-6)


def test_contrastive_loss_concatenated_vs_per_head_by_hand():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # two heads
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, -1.0]]])  # 2 passages
    # concatenated: q = (1,0,0,1); P0 = (1,0,0,1): cos 1; P1 = (1,0,0,-1): cos 0
    concat = contrastive_loss(q, keys, [0], tau=1.0, concat=True)
    assert float(concat) == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-6)
    # per head: head 0 sees cos (1, 1) -> log 2; head 1 sees cos (1, -1) -> log(1 + e^-2)
    per_head = contrastive_loss(q, keys, [0], tau=1.0, concat=False)
    assert float(per_head) == pytest.approx(math.log(2) + math.log(1 + math.exp(-2)), rel=1e-6)


def test_contrastive_loss_with_two_golden_passages_by_hand():
    q = torch.tensor([[1.0, 0.0]])
    keys = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[-1.0, 0.0]]])  # cos 1, 0, -1
    loss = contrastive_loss(q, keys, [0, 1], tau=1.0)
    # each golden against the distractor only: -log(e^1/(e^1+e^-1)), -log(e^0/(e^0+e^-1))
    expected = (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(-1))) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_contrastive_loss_rejects_bad_golden_ids():
    q, keys = torch.ones(1, 2), torch.ones(2, 1, 2)
    with pytest.raises(ValueError, match="non-empty subset"):
        contrastive_loss(q, keys, [2])
    with pytest.raises(ValueError, match="needs a distractor"):
        contrastive_loss(q, keys, [0, 1])


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _manual_qk(handle, ids, layer):
    """Post-RoPE q (T, H, D) and k (T, KV, D) of ``layer`` from the layer's input, by hand."""
    with torch.no_grad():
        hidden = handle.model(ids, output_hidden_states=True).hidden_states[layer]
        x = handle.model.model.layers[layer].input_layernorm(hidden)
        spec = handle.spec
        q = handle.proj(layer, "q_proj")(x)[0].view(-1, spec.n_heads, spec.d_head)
        k = handle.proj(layer, "k_proj")(x)[0].view(-1, spec.n_kv_heads, spec.d_head)
        positions = torch.arange(ids.shape[1])[None]
        cos, sin = handle.model.model.rotary_emb(x, positions)
        cos, sin = cos[0, :, None], sin[0, :, None]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _line_batch(handle, n=1, seed=0):
    samples = [
        with_line_passages(s) for s in generate(LineRetrievalConfig(num_lines=5), n, seed=seed)
    ]
    return samples, collate(encode_examples(samples, handle.tokenizer), pad_id_of(handle.tokenizer))


def test_captured_queries_and_keys_give_the_models_attention(family_checkpoint):
    """softmax(q k^T / sqrt D) of the captured post-RoPE q, k == eager attention rows (GQA;
    Gemma 2's scale and soft-cap on the scores)."""
    handle = load_model(family_checkpoint)
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        family_checkpoint, attn_implementation="eager"
    )
    _, batch = _line_batch(handle)
    ids = batch.input_ids
    with torch.no_grad():
        expected = eager(ids, output_attentions=True).attentions  # per layer (1, H, T, T)
        with rotary_qk_hooks(handle, range(handle.spec.n_layers)) as captured:
            handle.model(ids)
    g, D, config = handle.spec.group_size, handle.spec.d_head, handle.model.config
    # Gemma 2 scales by query_pre_attn_scalar ** -0.5 and soft-caps the scores; GPT-2 may
    # scale layer l by a further 1 / (l + 1)
    scalar = getattr(config, "query_pre_attn_scalar", D)
    cap = getattr(config, "attn_logit_softcapping", None)
    for layer, (q, k) in captured.items():
        k = k.repeat_interleave(g, dim=1)  # query head h reads KV head h // g
        by_layer = layer + 1 if getattr(config, "scale_attn_by_inverse_layer_idx", False) else 1
        scale = 1 / (math.sqrt(scalar) * by_layer)
        scores = soft_cap(q[0, :, -1:] @ k[0].transpose(-1, -2) * scale, cap)
        rows = torch.softmax(scores, dim=-1)
        torch.testing.assert_close(rows[:, 0], expected[layer][0, :, -1], rtol=0, atol=1e-6)


def test_contrastive_term_trains_the_heads_queries_and_keys(family_checkpoint):
    """The contrastive loss of a layer-1 head reaches that layer's q and k (projections, and
    the family's q/k norms where it has them) and everything below, and nothing else: not the
    layer's values and output, not its MLP, not the layers above."""
    handle = load_model(family_checkpoint)
    _, batch = _line_batch(handle)
    tuner = MudafTuner(handle, MudafConfig(heads=((1, 0),), alpha=1.0))
    with tuner.step_context():
        tuner(batch)["loss"].backward()
    family = handle.family
    layer, attn = f"{family.layers}.1", f"{family.layers}.1.{family.attn}"
    q_k = {family.projection(w, handle.spec)[0] for w in "qk"}  # q_proj, k_proj or qkv_proj
    q_k |= set(filter(None, (family.q_norm, family.k_norm)))
    below = [f"{family.layers}.0.", f"{family.embed}."]  # layer 1's input
    if family.pos_embed is not None:  # GPT-2's learned positions
        below.append(f"{family.pos_embed}.")
    if family.pre_attn_norm is not None:
        below.append(f"{layer}.{family.pre_attn_norm}.")
    reached = (*below, *(f"{attn}.{name}." for name in q_k))
    for name, param in handle.model.named_parameters():
        moved = param.grad is not None and bool(param.grad.abs().max() > 0)
        assert moved == name.startswith(reached), name
    # inside a fused projection, only the query and key rows train
    _, v_rows = family.projection("v", handle.spec)
    if v_rows is not None:
        fused = handle.attn(1).get_submodule(family.qkv_proj)
        # (out, in): GPT-2's Conv1D c_attn stores (in, out), its output rows are columns
        grad = fused.weight.grad.T if isinstance(fused, Conv1D) else fused.weight.grad
        assert float(grad[v_rows].abs().max()) == 0
        q_rows, k_rows = (family.projection(w, handle.spec)[1] for w in "qk")
        if isinstance(fused, Conv1D):  # GPT-2's own split of c_attn: [q | k | v] blocks
            split = handle.attn(1).split_size
            for part, found in enumerate((q_rows, k_rows, v_rows)):
                assert torch.equal(
                    torch.arange(3 * split)[found], torch.arange(split) + part * split
                )
        assert float(grad[q_rows].abs().max()) > 0
        assert float(grad[k_rows].abs().max()) > 0
        # and only head 0's query rows and its KV head's key rows, wherever the layout puts
        # them (Phi-3's and GPT-2's [q | k | v] blocks, GPT-NeoX's [q_h | k_h | v_h] per head),
        # biases included where the projection has them
        D, rows = handle.spec.d_head, torch.arange(grad.shape[0])
        bias = None if fused.bias is None else fused.bias.grad
        for which_rows in (q_rows, k_rows):
            per_head = grad[rows[which_rows]].reshape(-1, D, grad.shape[1])
            assert float(per_head[0].abs().max()) > 0
            assert float(per_head[1:].abs().max()) == 0
            if bias is not None:
                per_head = bias[rows[which_rows]].view(-1, D)
                assert float(per_head[0].abs().max()) > 0
                assert float(per_head[1:].abs().max()) == 0
        if bias is not None:
            assert float(bias[rows[v_rows]].abs().max()) == 0


def test_tuner_contrastive_term_matches_a_manual_computation(llama_checkpoint):
    handle = load_model(llama_checkpoint)
    samples, batch = _line_batch(handle, n=2, seed=3)
    heads = ((0, 1), (1, 2), (1, 3))  # heads 2 and 3 share KV head 1
    tuner = MudafTuner(handle, MudafConfig(heads=heads, alpha=0.3, tau=0.05))
    with tuner.step_context():
        out = tuner(batch)
    expected_con = []
    for sample in samples:
        enc = sample.encode(handle.tokenizer)
        ids = enc.input_ids[None]
        qs, ks = [], []
        for layer, head in heads:
            q, k = _manual_qk(handle, ids, layer)
            qs.append(q[enc.answer_start - 1, head])
            kv = head // handle.spec.group_size
            ks.append(torch.stack([k[s:e, kv].mean(0) for s, e in enc.passages]))
        q_cat = torch.cat(qs)  # concatenated heads
        k_cat = torch.cat(ks, dim=-1)  # (P, 3 * D)
        sims = torch.nn.functional.cosine_similarity(q_cat[None], k_cat, dim=-1) / 0.05
        expected_con.append(-torch.log_softmax(sims, 0)[sample.golden[0]])
    expected_con = torch.stack(expected_con).mean()
    assert len(samples[0].passages) == 5
    torch.testing.assert_close(out["contrastive"], expected_con, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        lm = answer_loss(handle.model, batch)
    torch.testing.assert_close(out["lm"], lm, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["loss"], 0.3 * expected_con + 0.7 * lm, rtol=1e-5, atol=1e-5)


def test_top_k_and_score_matrix(llama_checkpoint):
    spec = load_model(llama_checkpoint).spec
    table = pd.DataFrame(
        [{"layer": i, "head": h, "f1": 0.1 * (i * 4 + h)} for i in range(2) for h in range(4)]
    )
    scores = score_matrix(table, spec)
    assert scores[1, 3] == pytest.approx(0.7) and scores.shape == (2, 4)
    assert top_k_heads(scores, 3) == ((1, 3), (1, 2), (1, 1))
    with pytest.raises(ValueError, match="does not cover"):
        score_matrix(table.iloc[:5], spec)
    with pytest.raises(ValueError, match="more than once"):
        score_matrix(pd.concat([table, table]), spec)


def test_sampled_heads_follow_softmax_of_scores_over_tau():
    tau = 0.05
    scores = torch.tensor([[0.0, tau * math.log(3)]])  # P = 1/4, 3/4
    draws = [sample_heads(scores, 1, tau=tau, seed=s)[0] for s in range(4000)]
    assert draws.count((0, 1)) / 4000 == pytest.approx(0.75, abs=0.03)
    picked = sample_heads(torch.rand(4, 8, generator=torch.Generator().manual_seed(0)), 8, seed=1)
    assert len(set(picked)) == 8, "without replacement"
    assert picked == sample_heads(
        torch.rand(4, 8, generator=torch.Generator().manual_seed(0)), 8, seed=1
    )


def test_attention_only_training_touches_only_the_chosen_layers(llama_checkpoint):
    handle = load_model(llama_checkpoint)
    tuner = MudafTuner(handle, MudafConfig(heads=((1, 0),), trainable="attention"))
    trainable = set(tuner.trainable_state())
    assert trainable == {f"model.model.layers.1.self_attn.{p}_proj.weight" for p in "qkvo"}


def test_mudaf_training_raises_the_golden_similarity_and_sft_ignores_heads(llama_checkpoint):
    handle = load_model(llama_checkpoint)
    samples = [with_line_passages(s) for s in generate(LineRetrievalConfig(num_lines=5), 8, seed=5)]
    examples = encode_examples(samples, handle.tokenizer)
    batch = collate(examples, pad_id_of(handle.tokenizer))
    cfg = MudafConfig(heads=((1, 0), (1, 1)), alpha=0.9, trainable="attention")
    tuner = MudafTuner(handle, cfg)
    with torch.no_grad(), tuner.step_context():
        before = float(tuner(batch)["contrastive"])
    train(
        tuner,
        examples,
        TrainConfig(lr=3e-3, epochs=3, cpu=True),
        pad_id=pad_id_of(handle.tokenizer),
    )
    with torch.no_grad(), tuner.step_context():
        after = float(tuner(batch)["contrastive"])
    assert after < before - 0.1

    sft = MudafTuner(load_model(llama_checkpoint), MudafConfig(alpha=0.0))
    assert sft.method == "sft"
    with sft.step_context():
        assert set(sft(batch)) == {"loss"}
    with pytest.raises(RuntimeError, match="step_context"):
        tuner(batch)


def test_passages_samples_feed_the_contrastive_loss(llama_checkpoint):
    handle = load_model(llama_checkpoint)
    samples = format_samples("passages", handle.tokenizer, 2, num_passages=4, seed=0)
    batch = collate(encode_examples(samples, handle.tokenizer), pad_id_of(handle.tokenizer))
    tuner = MudafTuner(handle, MudafConfig(heads=((0, 0),)))
    with tuner.step_context():
        out = tuner(batch)
    assert torch.isfinite(out["loss"]) and float(out["contrastive"]) > 0
    assert all(len(p) == 4 for p in batch.passages)


def test_gradient_checkpointing_gives_the_same_mudaf_gradient(llama_checkpoint):
    handle = load_model(llama_checkpoint)
    _, batch = _line_batch(handle, n=2)
    tuner = MudafTuner(handle, MudafConfig(heads=((0, 1), (1, 2)), trainable="attention"))
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            tuner.enable_gradient_checkpointing()
        tuner.train()
        tuner.zero_grad(set_to_none=True)
        with tuner.step_context():
            tuner(batch)["loss"].backward()
        grads.append({n: p.grad.clone() for n, p in tuner.trainable_state().items()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7)
