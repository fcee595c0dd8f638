"""Edits compose: every analysis under an outer edit equals the same analysis on merged weights.

The independent reference for a scaling edit is the model with that edit merged into its
``o_proj`` weights (``interp_seal.tuning.merge.merged_model``): no hook, no engine restart
involved. Each analysis run inside ``with handle.edit(outer):`` (or given
``intervention=outer``) must return what it returns on the merged model. Before the handle
owned its edits, a head sweep inside ``hf_hooks(handle, outer)`` applied ``outer`` twice at
each restarted layer (L2H1 x 0.5 measured as x 0.25 on the organism).

Edits that cannot be merged (uniform attention, mean ablation) are checked against the plain
forward with every edit hooked in (``hf_logits`` inside nested ``handle.edit`` blocks).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import build_checkpoint

from interp_seal.analysis import (
    MaskingConfig,
    attribution_ablate_heads,
    attribution_patch_heads,
    channel_sweep,
    head_sweep,
    logit_diff_attribution,
    masking_experiment,
    needle_retrieval_scores,
    passage_retrieval_scores,
    patch_heads,
    patch_residual,
    scale_table_sweep,
)
from interp_seal.analysis.attribution_patching import ablate_heads
from interp_seal.analysis.patching import PatchingPair
from interp_seal.analysis.sweeps import SweepOptions, mean_head_outputs
from interp_seal.engine import greedy_decode
from interp_seal.evaluation import teacher_force
from interp_seal.interventions import HeadIntervention, ablate, hf_logits
from interp_seal.models import load_model
from interp_seal.tasks import line_retrieval as lr
from interp_seal.tasks import needle, passages
from interp_seal.tuning.merge import merged_model

QUIET = SweepOptions(progress=False, batch_rows=6, batch_samples=2)
ATOL = 1e-5


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    """3 layers, GQA: restarts cross a middle layer and the answer-rows-only last layer."""
    return load_model(build_checkpoint(tmp_path_factory.mktemp("compose"), "llama", n_layers=3))


@pytest.fixture(scope="module")
def scales(handle) -> torch.Tensor:
    """An outer SEAL-C-like edit: every head and channel scaled by its own factor in 0.5..1.5."""
    gen = torch.Generator().manual_seed(3)
    return 0.5 + torch.rand(handle.spec.shape, generator=gen)


@pytest.fixture(scope="module")
def outer(handle, scales) -> HeadIntervention:
    return HeadIntervention.from_scales(handle.spec, scales)


@pytest.fixture(scope="module")
def merged(handle, scales):
    return merged_model(handle, scales)


@pytest.fixture(scope="module")
def samples():
    return {n: lr.generate(lr.LineRetrievalConfig(num_lines=n), 3, seed=n) for n in (3, 5)}


def pair_of(handle) -> PatchingPair:
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(4, handle.spec.vocab_size, (10,), generator=gen)
    corrupted = clean.clone()
    corrupted[6] = 4 + (clean[6] - 4 + 7) % (handle.spec.vocab_size - 4)
    return PatchingPair(
        clean_ids=clean, corrupted_ids=corrupted, clean_token=10, corrupted_token=11
    )


def assert_tables_equal(edited: pd.DataFrame, reference: pd.DataFrame, columns) -> None:
    assert len(edited) == len(reference) > 0
    for column in columns:
        np.testing.assert_allclose(
            edited[column].to_numpy(float), reference[column].to_numpy(float), atol=ATOL, rtol=0
        )


# -- the merged-weights reference, analysis by analysis ---------------------------------------
def test_teacher_forcing_under_an_edit_equals_merged_weights(handle, merged, outer, samples):
    records = samples[5]
    with handle.edit(outer):
        edited = teacher_force(handle, records)
    reference = teacher_force(merged, records)
    given = teacher_force(handle, records, intervention=outer)
    plain = teacher_force(handle, records)
    for e, r, g, p in zip(edited, reference, given, plain, strict=True):
        assert e.answer_logprob == pytest.approx(r.answer_logprob, abs=ATOL)
        assert g.answer_logprob == pytest.approx(r.answer_logprob, abs=ATOL)
        assert abs(p.answer_logprob - r.answer_logprob) > 1e-3  # the edit matters


@pytest.mark.parametrize("mode", ["zero", "scale"])
def test_head_sweep_under_an_edit_equals_merged_weights(handle, merged, outer, samples, mode):
    factor = 1.7 if mode == "scale" else None
    with handle.edit(outer):
        edited = head_sweep(handle, samples, mode=mode, factor=factor, options=QUIET)
    reference = head_sweep(merged, samples, mode=mode, factor=factor, options=QUIET)
    given = head_sweep(handle, samples, mode=mode, factor=factor, options=QUIET, intervention=outer)
    plain = head_sweep(handle, samples, mode=mode, factor=factor, options=QUIET)
    assert_tables_equal(edited, reference, ["value", "baseline", "delta"])
    assert_tables_equal(given, reference, ["value", "baseline", "delta"])
    assert (plain["value"] - reference["value"]).abs().max() > 1e-3


def test_channel_and_table_sweeps_under_an_edit_equal_merged_weights(
    handle, merged, outer, samples
):
    heads = [(0, 1), (1, 2), (2, 3)]
    with handle.edit(outer):
        channels = channel_sweep(handle, samples, heads=heads, channels=[0, 5], options=QUIET)
        tables = scale_table_sweep(
            handle, samples, {"a": {(1, 0): 0.0, (2, 2): 1.5}}, options=QUIET
        )
    assert_tables_equal(
        channels,
        channel_sweep(merged, samples, heads=heads, channels=[0, 5], options=QUIET),
        ["value", "delta"],
    )
    assert_tables_equal(
        tables,
        scale_table_sweep(merged, samples, {"a": {(1, 0): 0.0, (2, 2): 1.5}}, options=QUIET),
        ["value", "delta"],
    )


def test_mean_ablation_under_an_edit_equals_merged_weights(handle, merged, outer, samples):
    """The mean is of the heads' own outputs (the merged model's ``o_proj`` inputs); the outer
    edit then scales it, as the merged weights do."""
    with handle.edit(outer):
        mean_z = mean_head_outputs(handle, samples[3])
        edited = head_sweep(handle, samples, mode="mean", mean_z=mean_z, options=QUIET)
    reference_mean = mean_head_outputs(merged, samples[3])
    torch.testing.assert_close(mean_z, reference_mean, atol=1e-6, rtol=0)
    reference = head_sweep(merged, samples, mode="mean", mean_z=reference_mean, options=QUIET)
    assert_tables_equal(edited, reference, ["value", "delta"])


def test_logit_attribution_under_an_edit_equals_merged_weights(handle, merged, outer):
    ids = pair_of(handle).clean_ids
    with handle.edit(outer):
        edited = logit_diff_attribution(handle, ids, 10, 11)
    reference = logit_diff_attribution(merged, ids, 10, 11)
    given = logit_diff_attribution(handle, ids, 10, 11, intervention=outer)
    assert_tables_equal(edited.table, reference.table, ["value"])
    assert_tables_equal(given.table, reference.table, ["value"])
    assert list(edited.logits.values()) == pytest.approx(list(reference.logits.values()), abs=ATOL)


def test_patching_under_an_edit_equals_merged_weights(handle, merged, outer):
    pair = pair_of(handle)
    with handle.edit(outer):
        heads = patch_heads(handle, pair, progress=False)
        by_position = patch_heads(handle, pair, by_position=True, positions=[6, 9], progress=False)
        resid = patch_residual(handle, pair, positions=[6, 9], progress=False)
        atp = attribution_patch_heads(handle, pair)
        exact_ablation = ablate_heads(handle, pair, progress=False)
        atp_ablation = attribution_ablate_heads(handle, pair)
    assert_tables_equal(heads, patch_heads(merged, pair, progress=False), ["logit_diff", "value"])
    assert_tables_equal(
        by_position,
        patch_heads(merged, pair, by_position=True, positions=[6, 9], progress=False),
        ["logit_diff", "value"],
    )
    assert_tables_equal(
        resid, patch_residual(merged, pair, positions=[6, 9], progress=False), ["logit_diff"]
    )
    assert_tables_equal(atp, attribution_patch_heads(merged, pair), ["logit_diff", "value"])
    assert_tables_equal(exact_ablation, ablate_heads(merged, pair, progress=False), ["delta"])
    assert_tables_equal(atp_ablation, attribution_ablate_heads(merged, pair), ["delta"])


def test_retrieval_scores_and_masking_under_an_edit_equal_merged_weights(
    handle, merged, outer, tmp_path
):
    mdqa = passages.generate(passages.PassagesConfig(num_passages=4, filler_sentences=0), 3, 0)
    cfg = needle.NeedleConfig(context_lengths=(150,), depths=(0, 100), buffer=40)
    niah = needle.generate(cfg, handle.tokenizer)
    with handle.edit(outer):
        passage = passage_retrieval_scores(handle, mdqa, progress=False)
        copies = needle_retrieval_scores(handle, niah, progress=False)
    reference = passage_retrieval_scores(merged, mdqa, progress=False)
    np.testing.assert_allclose(
        np.stack([a.attention for a in passage.attention]),
        np.stack([a.attention for a in reference.attention]),
        atol=ATOL,
    )
    copy_reference = needle_retrieval_scores(merged, niah, progress=False)
    assert_tables_equal(copies.per_sample, copy_reference.per_sample, ["score"])
    ranked = pd.DataFrame({"layer": [2, 1, 0, 2], "head": [1, 3, 0, 0], "rank": range(1, 5)})
    config = MaskingConfig(ks=(2,), seeds=(0,), modes=("zero",), qa_f1=True, max_new_tokens=3)
    masked = masking_experiment(
        handle, mdqa, ranked, config=config, progress=False, intervention=outer
    )
    masked_reference = masking_experiment(merged, mdqa, ranked, config=config, progress=False)
    assert_tables_equal(masked, masked_reference, ["answer_logprob", "exact_match", "qa_f1"])


def test_decoding_under_an_edit_equals_merged_weights(handle, merged, outer, samples):
    ids = samples[3][0].encode(handle.tokenizer).prompt_ids
    with handle.edit(outer):
        edited = greedy_decode(handle, ids, 6)
    assert edited == greedy_decode(merged, ids, 6)


# -- edits that cannot be merged: the plain hooked forward is the reference --------------------
@pytest.mark.parametrize("outer_mode", ["uniform", "mean"])
def test_sweep_under_an_unmergeable_edit_equals_the_hooked_forward(handle, samples, outer_mode):
    """An outer uniform-attention / mean edit of (1, 2); the sweep's restarts against one
    plain forward per head with both edits hooked in (the sweep's edit innermost)."""
    spec = handle.spec
    mean_z = torch.randn(spec.shape, generator=torch.Generator().manual_seed(1))
    outer = ablate(spec, [(1, 2)], outer_mode, mean_z=mean_z)
    heads = [(0, 0), (1, 2), (1, 3), (2, 1)]
    with handle.edit(outer):
        table = head_sweep(
            handle, {5: samples[5]}, heads=heads, mode="scale", factor=0.3, options=QUIET
        )
    rows = table[table.metric == "answer_logprob"].set_index(["layer", "head"])["value"]
    for head in heads:
        total = 0.0
        for sample in samples[5]:
            enc = sample.encode(handle.tokenizer)
            with handle.edit(outer):
                logits = hf_logits(
                    handle, enc.input_ids[None], ablate(spec, [head], "scale", factor=0.3)
                )
            logprobs = logits[0, enc.answer_start - 1 : -1].log_softmax(-1)
            total += float(logprobs.gather(-1, enc.answer_ids[:, None]).sum())
        assert rows[head] == pytest.approx(total / len(samples[5]), abs=ATOL)


def test_patching_under_a_uniform_edit_equals_the_hooked_forward(handle):
    """No shared prefix under uniform attention (its running mean needs every position): a
    patched run equals a hooked forward that replaces the head's own output, at the uniform
    head's layer (the restart needs the layer's values) and above it."""
    pair = pair_of(handle)
    H = handle.spec.n_heads
    outer = ablate(handle.spec, [(1, 2)], "uniform")
    with handle.edit(outer):
        table = patch_heads(handle, pair, progress=False).set_index(["layer", "head"])
        for layer, head in [(1, 3), (2, 1), (1, 2)]:
            o_proj = handle.proj(layer, "o_proj")
            kept = {}

            def keep(_mod, args, kept=kept):
                kept["z"] = args[0].clone()

            def replace(_mod, args, kept=kept, head=head):
                z = args[0].clone().unflatten(-1, (H, -1))
                z[:, :, head] = kept["z"].unflatten(-1, (H, -1))[:, :, head]
                return (z.flatten(-2),)

            with o_proj.register_forward_pre_hook(keep, prepend=True):
                hf_logits(handle, pair.clean_ids[None])
            with o_proj.register_forward_pre_hook(replace, prepend=True):
                logits = hf_logits(handle, pair.corrupted_ids[None])[:, -1]
            expected = float(pair.logit_diff(logits)[0])
            assert table.loc[(layer, head), "logit_diff"] == pytest.approx(expected, abs=ATOL)
    # the uniform head's own output is not used: the patched run equals the corrupted one up to
    # float rounding (the restart sums in another order; 1.3e-7 on an AVX-512 CPU, 0 elsewhere)
    assert table.loc[(1, 2), "value"] == pytest.approx(0, abs=ATOL)
    assert table["value"].abs().max() > 100 * ATOL  # other heads' patches do move it


# -- the edit stack itself ------------------------------------------------------------------------
def test_nested_edits_compose_and_unwind(handle, samples):
    spec = handle.spec
    a = ablate(spec, [(1, 2)], "scale", factor=0.5)
    b = ablate(spec, [(1, 2), (2, 0)], "scale", factor=3.0)
    both = HeadIntervention(spec=spec, scale=a.scale * b.scale)
    ids = samples[3][0].encode(handle.tokenizer).input_ids[None]
    plain = hf_logits(handle, ids)
    with handle.edit(a):
        with handle.edit(b):
            nested = hf_logits(handle, ids)
            assert len(handle._edits) == 2
        only_a = hf_logits(handle, ids)
    torch.testing.assert_close(nested, hf_logits(handle, ids, both))
    torch.testing.assert_close(only_a, hf_logits(handle, ids, a))
    torch.testing.assert_close(hf_logits(handle, ids), plain)
    o_proj = handle.proj(1, "o_proj")
    assert not handle._edits and not o_proj._forward_pre_hooks and not handle._hook_ids
    with pytest.raises(RuntimeError, match="boom"), handle.edit(a):
        raise RuntimeError("boom")
    assert not o_proj._forward_pre_hooks and not handle._edits


def test_outer_edit_acts_last_as_if_merged(handle, samples):
    """Outer scale x inner uniform: the merged model's uniform head is still scaled."""
    spec = handle.spec
    outer = ablate(spec, [(1, 2)], "scale", factor=0.5)
    inner = ablate(spec, [(1, 2)], "uniform")
    ids = samples[3][0].encode(handle.tokenizer).input_ids[None]
    with handle.edit(outer), handle.edit(inner):
        nested = hf_logits(handle, ids)
    merged = merged_model(handle, outer.scale)
    torch.testing.assert_close(nested, hf_logits(merged, ids, inner), atol=ATOL, rtol=0)


def test_foreign_hooks_are_refused_by_restarted_runs(handle, samples):
    o_proj = handle.proj(1, "o_proj")
    with o_proj.register_forward_pre_hook(lambda _m, args: (args[0] * 0.5,)):
        with pytest.raises(RuntimeError, match="did not install"):
            head_sweep(handle, {3: samples[3][:1]}, heads=[(1, 0)], options=QUIET)


def test_an_edit_of_another_model_is_refused(handle, tmp_path):
    other = load_model(build_checkpoint(tmp_path / "other", "llama", n_layers=2))
    with (
        pytest.raises(ValueError, match="cannot be applied"),
        handle.edit(ablate(other.spec, [(0, 0)])),
    ):
        pass
    assert not handle._edits


def test_sweep_manifests_record_the_active_edit(handle, outer, samples, tmp_path):
    """A sweep under an edit never resumes one without it (or the reverse)."""
    opts = SweepOptions(out=tmp_path / "sweep", progress=False)
    head_sweep(handle, {3: samples[3][:1]}, heads=[(1, 0)], options=opts)
    with pytest.raises(ValueError, match="edits"), handle.edit(outer):
        head_sweep(
            handle,
            {3: samples[3][:1]},
            heads=[(1, 0)],
            options=SweepOptions(out=tmp_path / "sweep", resume=True, progress=False),
        )


def test_reprs_are_one_line_and_say_what_matters(handle):
    iv = ablate(handle.spec, [(1, 2), (2, 0, 3)], "zero")
    assert repr(iv) == "HeadIntervention(zero, layers [1, 2], 2 heads, 17 channels changed)"
    with handle.edit(iv):
        text = repr(handle)
    assert "\n" not in text and len(text) < 300
    assert "llama: 3 layers x 4 heads (2 KV), d_head 16" in text and "1 active edit(s)" in text
    assert "active edit" not in repr(handle)
