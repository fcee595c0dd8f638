"""Tuning figures carry exactly the numbers of the tables and tensors they draw."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from interp_seal.viz import loss_curves, method_accuracy, scale_heatmap, target_head_scores


def test_method_accuracy_one_line_per_method_sorted_by_length():
    table = pd.DataFrame(
        {
            "method": ["base", "base", "seal-h", "seal-h"],
            "length": [40, 20, 40, 20],
            "exact_match": [0.5, 1.0, 0.75, 1.0],
        }
    )
    fig = method_accuracy(table)
    base, seal = (next(t for t in fig.data if t.name == m) for m in ("base", "seal-h"))
    assert list(base.x) == [20, 40] and list(base.y) == [1.0, 0.5]
    assert list(seal.y) == [1.0, 0.75]
    assert base.line.dash == "dash"
    assert base.error_y.array is None  # no record counts, no intervals
    with pytest.raises(ValueError, match="accuracy_by_method"):
        method_accuracy(table.drop(columns="method"))


def test_method_accuracy_base_is_drawn_on_top_and_listed_first():
    # SEAL Table 2 on SmolLM2: SEAL-C scores the base's very numbers, and drawn after the base
    # its line covered the base's, which showed only in the legend
    table = pd.DataFrame(
        {
            "method": ["base", "base", "ntk", "ntk", "seal-c", "seal-c"],
            "length": [9, 12, 9, 12, 9, 12],
            "exact_match": [0.2, 0.0, 0.4, 0.1, 0.2, 0.0],
        }
    )
    fig = method_accuracy(table)
    assert [t.name for t in fig.data] == ["ntk", "seal-c", "base"]  # later traces draw on top
    ranks = {t.name: t.legendrank for t in fig.data}
    assert ranks["base"] < ranks["ntk"] < ranks["seal-c"]  # the legend keeps the table's order
    assert len({t.marker.symbol for t in fig.data}) == 3


def test_method_accuracy_wilson_intervals_from_the_record_counts():
    table = pd.DataFrame(
        {"method": ["base", "base"], "length": [40, 20], "exact_match": [0.5, 1.0], "n": [4, 4]}
    )
    bars = method_accuracy(table).data[0].error_y
    # 4 / 4: the interval is (0.51010, 1] by hand (Wilson: z^2 / (n + z^2) = 0.48990 below 1)
    np.testing.assert_allclose(bars.arrayminus, [0.48990, 0.34996], atol=1e-5)
    np.testing.assert_allclose(bars.array, [0.0, 0.34996], atol=1e-5)
    assert method_accuracy(table, metric="n").data[0].error_y.array is None


def test_loss_curves_steps_from_one():
    fig = loss_curves({"seal-h": [0.7, 0.5, 0.25], "seal-c": [0.6]})
    assert list(fig.data[0].x) == [1, 2, 3] and list(fig.data[0].y) == [0.7, 0.5, 0.25]
    assert list(fig.data[1].x) == [1] and fig.data[1].name == "seal-c"
    with pytest.raises(ValueError, match="at least one step"):
        loss_curves({"seal-h": []})


def test_scale_heatmap_head_and_channel_layouts():
    scales = torch.arange(2 * 3, dtype=torch.float32).reshape(2, 3, 1) / 10 + 0.8
    fig = scale_heatmap(scales)
    np.testing.assert_allclose(np.asarray(fig.data[0].z), scales[..., 0].numpy())
    # the edit scale, 1 (unchanged) at its white middle
    assert (fig.data[0].zmin, fig.data[0].zmax) == (0.0, 2.0) and list(fig.data[0].x) == [
        "0",
        "1",
        "2",
    ]

    channels = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(0))
    fig = scale_heatmap(channels)
    z = np.asarray(fig.data[0].z)
    assert z.shape == (6, 4) and fig.data[0].y[4] == "L1H1"
    np.testing.assert_allclose(z[4], channels[1, 1].numpy())  # row of layer 1, head 1
    with pytest.raises(ValueError, match=r"\(L, H, 1\)"):
        scale_heatmap(torch.ones(2, 3))


def test_target_head_scores_bars_and_ranks():
    table = pd.DataFrame(
        {
            "method": ["base", "base", "base", "mudaf", "mudaf", "mudaf"],
            "layer": [3, 2, 0, 2, 3, 0],
            "head": [4, 6, 1, 6, 4, 1],
            "f1": [0.8, 0.1, 0.0, 0.3, 0.82, 0.0],
            "em": [0.8, 0.1, 0.0, 0.3, 0.8, 0.0],
            "rank": [1, 5, 32, 4, 1, 32],
            "target": [True, True, False, True, True, False],
        }
    )
    fig = target_head_scores(table)
    assert [t.name for t in fig.data] == ["base", "mudaf"]
    assert list(fig.data[0].x) == ["L3H4", "L2H6"] == list(fig.data[1].x)
    assert list(fig.data[0].y) == [0.8, 0.1] and list(fig.data[1].y) == [0.82, 0.3]
    assert list(fig.data[1].text) == ["#1", "#4"]
    with pytest.raises(ValueError, match="no target heads"):
        target_head_scores(table.assign(target=False))


def test_table4_and_head_count_curves_carry_wilson_intervals():
    """SEAL Table 4's curves and MuDAF Fig. 7's exact match: 95 % Wilson bars from each row's
    ``n`` (3 of 10 right: Wilson (0.1078, 0.6032) by hand, z = 1.96); the F1 lines, means over
    heads, carry none."""
    from interp_seal.viz import paper_figures as pv

    curves = pd.DataFrame(
        {"samples": 50, "epochs": 1, "length": [3, 7], "n": 10, "exact_match": [0.3, 0.3]}
    )
    grid = pd.DataFrame({"lr": [0.01], "samples": [50], "exact_match": [0.3]})
    heads = pd.DataFrame(
        {"k": [0, 1], "n": 10, "exact_match": [0.3, 0.3], "target_f1": [0.5, 0.6], "mean_f1": 0.1}
    )
    figs = {
        "table4": pv.lr_samples(grid, curves).data[1],
        "fig7": pv.head_count_curves(heads).data[0],
    }
    for trace in figs.values():
        bars = trace.error_y
        assert 0.3 - bars.arrayminus[0] == pytest.approx(0.10779, abs=1e-4)
        assert 0.3 + bars.array[0] == pytest.approx(0.60322, abs=1e-4)
    assert pv.head_count_curves(heads).data[1].error_y.array is None
