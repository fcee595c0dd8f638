"""KV compression chosen by a head ranking: the KV-head order, the curve's numbers against
direct streaming runs, the budgets against counting."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from interp_seal.analysis.kv_compression import (
    compression_curve,
    kv_head_order,
    kv_tie_at_cut,
    random_order,
    streaming_config,
)
from interp_seal.evaluation import line_retrieval_samples, teacher_force
from interp_seal.models import StreamingHeads, compress_kv, load_model


@pytest.fixture(scope="module")
def handle(llama_checkpoint):
    return load_model(llama_checkpoint)  # 2 layers x 4 query heads, 2 KV heads (group 2)


def ranking(order):
    return pd.DataFrame({"layer": [h[0] for h in order], "head": [h[1] for h in order]}).assign(
        rank=range(1, len(order) + 1)
    )


def test_a_kv_head_ranks_by_its_best_reader(handle):
    spec = handle.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads) == (2, 4, 2)
    # query heads best first; KV head = head // 2
    order = [(1, 3), (0, 0), (1, 2), (0, 3), (1, 0), (0, 1), (0, 2), (1, 1)]
    assert kv_head_order(ranking(order), spec) == [(1, 1), (0, 0), (0, 1), (1, 0)]
    # a ranking of some heads only: the unranked KV heads come last, in layer order
    assert kv_head_order(ranking([(1, 0)]), spec) == [(1, 0), (0, 0), (0, 1), (1, 1)]
    assert sorted(random_order(spec, 3)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert random_order(spec, 3) == random_order(spec, 3)
    with pytest.raises(ValueError, match="outside the model"):
        kv_head_order(ranking([(2, 0)]), spec)


def test_a_full_kv_set_is_fixed_only_where_the_budget_cuts_no_tie():
    # 2 layers x 4 query heads, 2 per KV head: KV heads score 0.9, 0.5, 0.5, 0.1 (best reader)
    score = {(0, 0): 0.9, (0, 1): 0.2, (0, 2): 0.5, (0, 3): 0.4}
    score |= {(1, 0): 0.1, (1, 1): 0.5, (1, 2): 0.1, (1, 3): 0.0}
    table = pd.DataFrame([{"layer": a, "head": b, "score": v} for (a, b), v in score.items()])
    table = table.sort_values("score", ascending=False).assign(rank=range(1, 9))
    assert kv_tie_at_cut(table, 2, 1) == (1, 1)  # (0, 0) alone
    assert kv_tie_at_cut(table, 2, 2) == (1, 2)  # one of (0, 1) and (1, 0), equal at 0.5
    assert kv_tie_at_cut(table, 2, 3) == (2, 2)
    assert kv_tie_at_cut(table, 2, 4) == (0, 0)  # every KV head: nothing is cut
    assert kv_tie_at_cut(table.drop(columns="score"), 2, 2) == (0, 0)  # a rank alone


def test_curve_equals_direct_streaming_runs(handle, tmp_path):
    samples = line_retrieval_samples(handle.tokenizer, (6, 12), n=3, seed=1)
    order = [(1, 3), (0, 0), (1, 2), (0, 3), (1, 0), (0, 1), (0, 2), (1, 1)]
    kwargs = dict(full_counts=(1, 2), sink=2, window=5, random_seeds=(0,), progress=False)
    curve = compression_curve(
        handle, samples, {"qr": ranking(order)}, results=tmp_path / "kv.jsonl", **kwargs
    )
    assert sorted(set(curve.definition)) == ["all full", "all streaming", "qr", "random"]
    kv_order = kv_head_order(ranking(order), handle.spec)
    itemsize = 4  # float32 parameters
    for row in curve.itertuples():
        if row.definition == "all full":
            config = None
        elif row.definition == "all streaming":
            config = StreamingHeads.all_heads(handle.spec, sink=2, window=5)
        else:
            source = (
                kv_order if row.definition == "qr" else random_order(handle.spec, row.random_seed)
            )
            config = streaming_config(source, row.full_kv_heads, sink=2, window=5)
            assert len(config.heads) == 4 - row.full_kv_heads
        batch = samples[row.length]
        if config is None:
            direct = teacher_force(handle, batch)
        else:
            with compress_kv(handle, config):
                direct = teacher_force(handle, batch)
        assert row.correct == [int(s.exact_match) for s in direct]
        # bytes: 2 (K, V) x d_head x 4 bytes per kept position, full heads keep the prompt
        tokens = [len(s.encode(handle.tokenizer).prompt_ids) for s in batch]
        streaming = 0 if config is None else len(config.heads)
        kept = [(4 - streaming) * t + streaming * min(t, 2 + 5 - 1) for t in tokens]
        d = handle.spec.d_head
        assert row.kv_bytes == pytest.approx(np.mean([2 * d * itemsize * k for k in kept]))
        assert row.kv_share == pytest.approx(np.mean(kept) / (4 * np.mean(tokens)))
    # the records are longer than the window, so streaming changes something
    streamed = teacher_force(handle, samples[12])
    with compress_kv(handle, StreamingHeads.all_heads(handle.spec, sink=2, window=5)):
        assert [s.answer_logprob for s in teacher_force(handle, samples[12])] != [
            s.answer_logprob for s in streamed
        ]
    # resuming reads every condition back
    again = compression_curve(
        handle, samples, {"qr": ranking(order)}, results=tmp_path / "kv.jsonl", **kwargs
    )
    pd.testing.assert_frame_equal(again, curve)


def test_curve_refuses_bad_counts_and_names(handle):
    samples = line_retrieval_samples(handle.tokenizer, (6,), n=1, seed=1)
    with pytest.raises(ValueError, match="outside 0..4"):
        compression_curve(handle, samples, {}, full_counts=(5,), progress=False)
    with pytest.raises(ValueError, match="baselines'"):
        compression_curve(handle, samples, {"random": ranking([])}, full_counts=(1,))


def test_compression_figure_draws_the_curve_values():
    from interp_seal.viz.passages import compression_curves

    rows = [
        ("all streaming", -1, 0, 6, 0.2, 0.1),
        ("all full", -1, 4, 6, 0.8, 1.0),
        ("qr", -1, 2, 6, 0.6, 0.55),
        ("random", 0, 2, 6, 0.4, 0.55),
        ("random", 1, 2, 6, 0.2, 0.55),
    ]
    curve = pd.DataFrame(
        rows,
        columns=["definition", "random_seed", "full_kv_heads", "length", "exact_match", "kv_share"],
    ).assign(n=10)
    fig = compression_curves(curve)
    by = {t.name: t for t in fig.data}
    assert list(by["qr"].x) == [0.1, 0.55, 1.0] and list(by["qr"].y) == [0.2, 0.6, 0.8]
    assert list(by["random"].y) == pytest.approx([0.2, 0.3, 0.8])  # draws averaged


def test_compress_command_writes_the_library_numbers(handle, llama_checkpoint, tmp_path, capsys):
    from interp_seal.cli import main

    order = [(1, 3), (0, 0), (1, 2), (0, 3), (1, 0), (0, 1), (0, 2), (1, 1)]
    ranking(order).to_csv(tmp_path / "qr.csv", index=False)
    out = tmp_path / "out"
    argv = ["retrieval", "compress", "--model", llama_checkpoint, "--rankings"]
    argv += [f"qr={tmp_path / 'qr.csv'}", "--lengths", "6", "12", "--n", "2", "--seed", "4"]
    argv += ["--sink", "2", "--window", "5", "--random-seeds", "0"]
    assert main([*argv, "--full-counts", "1", "3", "--out", str(out)]) == 0
    samples = line_retrieval_samples(handle.tokenizer, (6, 12), n=2, seed=4)
    expected = compression_curve(
        handle,
        samples,
        {"qr": ranking(order)},
        full_counts=(1, 3),
        sink=2,
        window=5,
        random_seeds=(0,),
        progress=False,
    )
    written = pd.read_csv(out / "compression.csv")
    assert len(written) == len(expected) == (2 + 2 * 2) * 2
    np.testing.assert_allclose(written["exact_match"], expected["exact_match"])
    np.testing.assert_allclose(written["kv_bytes"], expected["kv_bytes"])
    assert (written["n"] == 2).all() and (written["model"] == llama_checkpoint).all()
    assert (out / "compression.html").exists()
    # more full heads than the model has KV heads: one line, nothing computed
    assert main([*argv, "--full-counts", "9", "--out", str(tmp_path / "bad")]) == 2
    assert "has 4 KV heads" in capsys.readouterr().err
