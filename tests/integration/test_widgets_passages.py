"""The passage attention explorer: heatmaps, per-head MuDAF scores at the slider's threshold and
the clicked passage's most-attended tokens equal the library's (and a hand loop's) numbers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from plotly.callbacks import InputDeviceState, Points

from interp_seal.analysis.attention_rows import capture_attention_rows
from interp_seal.analysis.retrieval_scores import passage_attention
from interp_seal.evaluation import encode_samples
from interp_seal.models import load_model
from interp_seal.tasks import passages
from interp_seal.tuning.merge import merged_model
from interp_seal.widgets.passages import PassageExplorer


@pytest.fixture(scope="module")
def setup():
    base = load_model("organism")
    scales = torch.ones(base.spec.n_layers, base.spec.n_heads, 1)
    scales[1, 2] = 2.0
    tuned = merged_model(base, scales)
    sample = passages.generate(passages.PassagesConfig(num_passages=4), 1, seed=0)[0]
    return base, tuned, sample


def hand_f1_em(att: np.ndarray, golden, eps: float) -> tuple[float, float]:
    """MuDAF App. A.2 for one head, written as a loop."""
    attended = {p for p, a in enumerate(att) if a > eps}
    hits = len(attended & set(golden))
    f1 = 0.0 if hits == 0 else 2 * hits / (len(attended) + len(golden))
    ranked = sorted(range(len(att)), key=lambda p: (-att[p], p))[: len(golden)]
    return f1, float(set(ranked) == set(golden))


def test_two_models_heatmaps_scores_and_tokens(setup):
    base, tuned, sample = setup
    ex = PassageExplorer({"base": base, "tuned": tuned}, sample, eps=0.3)
    for name, handle in (("base", base), ("tuned", tuned)):
        ref = passage_attention(handle, sample)
        layer = ex.layer.value
        z = np.array(ex.figures[name].data[0].z, dtype=float)
        expected = np.concatenate([ref.prefix[layer][:, None], ref.attention[layer]], 1)
        np.testing.assert_allclose(z, expected)
    assert not np.allclose(ex.attention["base"].attention, ex.attention["tuned"].attention)

    ex.eps.value = 0.1  # the slider recomputes every head's F1 / EM
    for name in ("base", "tuned"):
        att = ex.attention[name]
        grid = np.array(ex.score_figures[name].data[0].z, dtype=float)
        for layer in range(att.attention.shape[0]):
            for head in range(att.attention.shape[1]):
                f1, em = hand_f1_em(att.attention[layer, head], att.golden, 0.1)
                assert grid[layer, head] == pytest.approx(f1)
                row = ex.scores[name].query("layer == @layer and head == @head").iloc[0]
                assert row.em == em

    golden = ex.attention["base"].golden[0]
    points = Points(point_inds=[[1, golden + 1]], xs=[f"#{golden + 1}"], ys=["head 1"])
    ex.figures["base"].data[0]._dispatch_on_click(points, InputDeviceState())
    assert f"head 1, passage #{golden + 1} (golden)" in ex.text.value
    enc = encode_samples(base, [sample])[0]
    start, end = enc.passages[golden]
    rows = capture_attention_rows(base, enc.prompt_ids, (-1,))  # (L, 1, H, 1, T)
    row = rows[ex.layer.value, 0, 1, 0, start:end].double()
    assert float(row.sum()) == pytest.approx(
        ex.attention["base"].attention[ex.layer.value, 1, golden]
    )
    top = ex.show_passage("base", 1, golden)
    assert sorted(top) == sorted((torch.topk(row, ex.top_tokens).indices + start).tolist())
    assert ex.text.value.count("<mark>") == ex.top_tokens


def test_sample_without_passages_gives_a_message(setup):
    base, _, sample = setup
    bare = dataclasses.replace(sample, passages=(), golden=())
    ex = PassageExplorer({"base": base}, bare)
    assert "no passages" in ex.message.value and ex.panels.children == ()
