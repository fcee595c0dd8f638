"""Activation patching and attribution patching, checked against naive loops, the
TransformerLens ``patching`` module on the bridge, exact identities and finite differences."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_checkpoint, float64
from transformer_lens import patching as tl_patching

from interp_seal.analysis.attribution_patching import (
    ablate_heads,
    attribution_ablate_heads,
    attribution_patch_heads,
    compare_with_exact,
    head_gradients,
)
from interp_seal.analysis.patching import (
    Patch,
    PatchingPair,
    line_retrieval_pair,
    patch,
    patch_heads,
    patch_residual,
    record_inputs,
    replace_inputs,
)
from interp_seal.engine import SharedPrefix
from interp_seal.interventions import ablate, capture_head_outputs, hf_logits
from interp_seal.models import load_model
from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
from interp_seal.viz.tokens import pair_labels

T = 10
DIFFERS = (3, 6)  # positions where the corrupted prompt differs


def synthetic_pair(handle, seed: int = 0, differs=DIFFERS) -> PatchingPair:
    """Random prompt; the corrupted one changes the tokens at ``differs``. Works with any
    tokenizer."""
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(4, handle.spec.vocab_size, (T,), generator=gen)
    corrupted = clean.clone()
    for pos in differs:
        corrupted[pos] = 4 + (clean[pos] - 4 + 7) % (handle.spec.vocab_size - 4)
    return PatchingPair(
        clean_ids=clean, corrupted_ids=corrupted, clean_token=10, corrupted_token=11
    )


@pytest.fixture(scope="module")
def loaded(family_checkpoint):
    return load_model(family_checkpoint)


@pytest.fixture(scope="module")
def loaded64(family_checkpoint):
    handle = load_model(family_checkpoint, dtype=torch.float64)
    float64(handle.model)
    return handle


@pytest.fixture(scope="module")
def llama(llama_checkpoint):
    return load_model(llama_checkpoint)


def logit_diff(handle, pair, ids) -> float:
    with torch.no_grad():
        logits = handle.model(ids[None]).logits[:, -1]
    return float(pair.logit_diff(logits)[0])


# -- prompt pairs ----------------------------------------------------------------------------
@pytest.mark.parametrize("corrupt", ["key", "value"])
def test_line_retrieval_pairs(llama, corrupt):
    sample = generate(LineRetrievalConfig(num_lines=6), 1, seed=3)[0]
    pair = line_retrieval_pair(sample, llama.tokenizer, corrupt=corrupt, seed=1)
    tok = llama.tokenizer
    clean = sample.encode(tok)
    assert torch.equal(pair.clean_ids, clean.prompt_ids)  # first digits differ: no shared prefix
    assert pair.clean_token == clean.answer_ids[0]
    assert tok.decode([pair.clean_token]) == f" {str(sample.meta['expected_number'])[0]}"
    changed = (pair.clean_ids != pair.corrupted_ids).nonzero().flatten().tolist()
    text = tok.decode(pair.corrupted_ids)
    key = sample.meta["random_idx"][0]
    if corrupt == "key":
        assert len(changed) == 2  # the key in the question and in the answer prefix
        assert all(pos > len(pair.clean_ids) - 30 for pos in changed)
        assert text.count(f"line {key}") == 1  # only in the record now
    else:
        assert len(changed) == 1  # the first digit of the queried line's number
        new_first = tok.decode([pair.corrupted_token]).strip()
        old = sample.meta["expected_number"]
        assert f"line {key}: REGISTER_CONTENT is <{new_first}{str(old)[1:]}>" in text


def test_pair_refuses_samples_it_cannot_pair(llama, unchecked):
    cfg = LineRetrievalConfig(num_lines=4, force_prefix=False)
    sample = generate(cfg, 1)[0]
    with pytest.raises(ValueError, match="force_prefix=True"):
        line_retrieval_pair(sample, llama.tokenizer)
    sample = generate(LineRetrievalConfig(num_lines=4), 1)[0]
    with pytest.raises(ValueError, match="unknown corruption"):
        line_retrieval_pair(sample, llama.tokenizer, corrupt="line")
    with pytest.raises(ValueError, match="equal length"):
        PatchingPair(
            clean_ids=torch.arange(5),
            corrupted_ids=torch.arange(6),
            clean_token=1,
            corrupted_token=2,
        )


# -- exact patching --------------------------------------------------------------------------
def naive_head_patch(handle, pair, layer, head, position) -> float:
    """One forward per patch with a hand-written o_proj pre-hook."""
    H, D = handle.spec.n_heads, handle.spec.d_head
    clean_z = capture_head_outputs(handle, pair.clean_ids[None])[layer][0]  # (T, H, D)

    def hook(_mod, args):
        z = args[0].view(1, T, H, D).clone()
        pos = slice(None) if position is None else position
        z[0, pos, head] = clean_z[pos, head]
        return (z.view(1, T, H * D),)

    remove = handle.proj(layer, "o_proj").register_forward_pre_hook(hook)
    try:
        return logit_diff(handle, pair, pair.corrupted_ids)
    finally:
        remove.remove()


def naive_resid_patch(handle, pair, layer, position) -> float:
    L = handle.spec.n_layers
    module = handle.final_norm() if layer == L else handle.layers()[layer]
    seen = {}
    remove = module.register_forward_pre_hook(lambda _m, a: seen.update(x=a[0][0].clone()))
    logit_diff(handle, pair, pair.clean_ids)
    remove.remove()

    def hook(_mod, args):
        x = args[0].clone()
        x[0, position] = seen["x"][position]
        return (x, *args[1:])

    remove = module.register_forward_pre_hook(hook)
    try:
        return logit_diff(handle, pair, pair.corrupted_ids)
    finally:
        remove.remove()


@pytest.mark.parametrize("differs", [DIFFERS, (0, 6)], ids=["shared-prefix", "no-prefix"])
def test_batched_patching_equals_a_naive_loop(loaded, differs):
    pair = synthetic_pair(loaded, differs=differs)
    L, H = loaded.spec.n_layers, loaded.spec.n_heads
    patches = [Patch(site="head", layer=layer, head=h) for layer in range(L) for h in range(H)]
    patches += [Patch(site="head", layer=1, head=h, position=t) for h in (0, H - 1) for t in (3, 9)]
    patches += [
        Patch(site="resid", layer=layer, position=t) for layer in range(L + 1) for t in (6, 9)
    ]
    table = patch(loaded, pair, patches, batch_size=3, progress=False)  # chunks with a remainder
    clean_ld = logit_diff(loaded, pair, pair.clean_ids)
    corrupted_ld = logit_diff(loaded, pair, pair.corrupted_ids)
    assert table.attrs["clean_logit_diff"] == pytest.approx(clean_ld, abs=1e-5)
    assert table.attrs["corrupted_logit_diff"] == pytest.approx(corrupted_ld, abs=1e-5)
    for p, row in zip(patches, table.itertuples(), strict=True):
        assert (row.site, row.layer) == (p.site, p.layer)
        if p.site == "head":
            naive = naive_head_patch(loaded, pair, p.layer, p.head, p.position)
        else:
            naive = naive_resid_patch(loaded, pair, p.layer, p.position)
        assert row.logit_diff == pytest.approx(naive, abs=1e-5)
        # the normalisation, with the table's own clean and corrupted LDs (checked above; a
        # random model's LD gap is small, so the naive ones would amplify rounding noise)
        ours_clean, ours_corrupted = (
            table.attrs["clean_logit_diff"],
            table.attrs["corrupted_logit_diff"],
        )
        assert row.value == pytest.approx(
            (row.logit_diff - ours_corrupted) / (ours_clean - ours_corrupted), rel=1e-9
        )


def test_shared_prefix_longer_than_a_sliding_window(tmp_path):
    """Mistral with a 4-token window; the prompts first differ at position 6, so the cached
    prefix is longer than the window and the suffix's first queries must not see its start."""
    path = build_checkpoint(tmp_path / "mistral", "mistral")
    config = json.loads((Path(path) / "config.json").read_text())
    (Path(path) / "config.json").write_text(json.dumps(config | {"sliding_window": 4}))
    handle = load_model(path)
    pair = synthetic_pair(handle, differs=(6, 8))
    L, H = handle.spec.n_layers, handle.spec.n_heads
    patches = [Patch(site="head", layer=layer, head=h) for layer in range(L) for h in range(H)]
    patches += [Patch(site="resid", layer=1, position=t) for t in (2, 7, 9)]
    table = patch(handle, pair, patches, batch_size=5, progress=False)
    assert table.attrs["corrupted_logit_diff"] == pytest.approx(
        logit_diff(handle, pair, pair.corrupted_ids), abs=1e-5
    )
    for p, row in zip(patches, table.itertuples(), strict=True):
        if p.site == "head":
            naive = naive_head_patch(handle, pair, p.layer, p.head, p.position)
        else:
            naive = naive_resid_patch(handle, pair, p.layer, p.position)
        assert row.logit_diff == pytest.approx(naive, abs=1e-5)


def test_patched_runs_cover_only_the_positions_after_the_shared_prefix(llama):
    """The prefix runs once; the baselines and every patched run continue from its cache."""
    pair = synthetic_pair(llama)
    prefix = SharedPrefix.of(llama, pair.clean_ids, pair.corrupted_ids)
    assert prefix.start == DIFFERS[0] and prefix.cache.get_seq_length() == DIFFERS[0]
    no_prefix = synthetic_pair(llama, differs=(0,))
    assert SharedPrefix.of(llama, no_prefix.clean_ids, no_prefix.corrupted_ids).cache is None
    same = PatchingPair(
        clean_ids=pair.clean_ids, corrupted_ids=pair.clean_ids, clean_token=10, corrupted_token=11
    )
    start = SharedPrefix.of(llama, same.clean_ids, same.corrupted_ids).start
    assert start == T - 1  # the last position is always run
    seen = []  # (layer, rows, positions) of every decoder-layer call
    hooks = [
        module.register_forward_pre_hook(
            lambda _m, a, layer=layer: seen.append((layer, *a[0].shape[:2]))
        )
        for layer, module in enumerate(llama.layers())
    ]
    try:
        patch_heads(llama, pair, batch_size=32, progress=False)
    finally:
        for hook in hooks:
            hook.remove()
    L, H = llama.spec.n_layers, llama.spec.n_heads
    suffix = T - DIFFERS[0]
    runs = [(layer, 1, n) for n in (DIFFERS[0], suffix, suffix) for layer in range(L)]
    # then the heads of each layer in one batch, from that layer's o_proj up
    runs += [(above, H, suffix) for layer in range(L) for above in range(layer + 1, L)]
    assert seen == runs


def test_identities_of_the_normalised_metric(llama):
    """Nothing to patch -> 0; the whole clean input or the clean final residual -> 1."""
    pair = synthetic_pair(llama)
    L, H = llama.spec.n_layers, llama.spec.n_heads
    before = DIFFERS[0] - 1  # causal: every activation here is the same in both runs
    table = patch(
        llama,
        pair,
        [
            Patch(site="head", layer=L - 1, head=H - 1, position=before),
            Patch(site="resid", layer=L, position=before),
            Patch(site="resid", layer=0, position=None),  # the clean prompt's embeddings
            Patch(site="resid", layer=0, position=DIFFERS[0]),  # not enough: one of two tokens
            Patch(site="resid", layer=L, position=T - 1),  # the stream the unembedding reads
        ],
        progress=False,
    )
    assert table.value.tolist()[:3] == pytest.approx([0.0, 0.0, 1.0], abs=1e-5)
    assert table.value[3] != pytest.approx(1.0, abs=1e-3)
    assert table.value[4] == pytest.approx(1.0, abs=1e-5)
    assert table.logit_diff[4] == pytest.approx(table.attrs["clean_logit_diff"], abs=1e-5)
    # residual patching at the final layer: only the last position matters
    resid = patch_residual(llama, pair, progress=False)
    final = resid[resid.layer == L].value.to_numpy()
    assert final[:-1] == pytest.approx(0.0, abs=1e-6) and final[-1] == pytest.approx(1.0, abs=1e-5)


def test_matches_transformer_lens_patching_on_the_bridge(loaded):
    """``transformer_lens.patching`` runs on the TL 4 bridge (hook_z / hook_resid_pre)."""
    pair = synthetic_pair(loaded, seed=1)
    L, H = loaded.spec.n_layers, loaded.spec.n_heads
    bridge = loaded.bridge()

    def metric(logits):
        return pair.logit_diff(logits[:, -1])[0]

    with torch.no_grad():
        _, cache = bridge.run_with_cache(pair.clean_ids[None])
        corrupted = pair.corrupted_ids[None]
        tl_all = tl_patching.get_act_patch_attn_head_out_all_pos(bridge, corrupted, cache, metric)
        tl_pos = tl_patching.get_act_patch_attn_head_out_by_pos(bridge, corrupted, cache, metric)
        tl_resid = tl_patching.get_act_patch_resid_pre(bridge, corrupted, cache, metric)
    ours_all = patch_heads(loaded, pair, progress=False).logit_diff.to_numpy()
    ours_pos = patch_heads(loaded, pair, by_position=True, batch_size=64, progress=False)
    ours_resid = patch_residual(loaded, pair, batch_size=64, progress=False)
    ours_resid = ours_resid[ours_resid.layer < L].logit_diff.to_numpy()
    assert ours_all == pytest.approx(tl_all.flatten().double().numpy(), abs=1e-4)
    assert ours_pos.logit_diff.to_numpy() == pytest.approx(
        tl_pos.flatten().double().numpy(), abs=1e-4
    )  # TL's (layer, pos, head) order is ours
    assert ours_resid == pytest.approx(tl_resid.flatten().double().numpy(), abs=1e-4)
    assert len(ours_pos) == L * T * H


def test_patching_refuses_bad_patches(llama):
    pair = synthetic_pair(llama)
    L = llama.spec.n_layers
    for fields, message in [
        ({"site": "mlp", "layer": 0}, "unknown patch site"),
        ({"site": "resid", "layer": 0, "head": 1}, "'head' patches need a head"),
        ({"site": "head", "layer": 0}, "'head' patches need a head"),
    ]:
        with pytest.raises(ValueError, match=message):
            Patch(**fields)
    for bad, message in [
        (Patch(site="head", layer=L, head=0), "layer must be in"),
        (Patch(site="resid", layer=L + 1), "layer must be in"),
        (Patch(site="head", layer=0, head=llama.spec.n_heads), "head must be in"),
        (Patch(site="head", layer=0, head=0, position=T), "position must be in"),
    ]:
        with pytest.raises(ValueError, match=message):
            patch(llama, pair, [bad], progress=False)
    same = PatchingPair(
        clean_ids=pair.clean_ids, corrupted_ids=pair.clean_ids, clean_token=10, corrupted_token=11
    )
    with pytest.raises(ValueError, match="same logit difference"):
        patch(llama, same, [Patch(site="resid", layer=0)], progress=False)


# -- attribution patching --------------------------------------------------------------------
def directional_derivative(handle, pair, ids, layer, direction, eps=0.05) -> float:
    """d LD / d e of ``z[layer] + e * direction`` at 0: central differences at ``eps`` and
    ``eps / 2`` combined by Richardson extrapolation (truncation error O(eps^4)). The models'
    RMSNorms compute in fp32 even in an fp64 model, which leaves ~1e-5 of rounding noise in the
    quotient: hence the 1e-3 relative tolerance below (a missing gradient path is far larger)."""

    def at(e):
        with torch.no_grad(), replace_inputs(handle, "head", {layer: lambda z: z + e * direction}):
            return logit_diff(handle, pair, ids)

    def central(e):
        return (at(e) - at(-e)) / (2 * e)

    return (4 * central(eps / 2) - central(eps)) / 3


def test_attribution_patching_is_the_first_order_term(loaded64):
    """Each head's estimate is the directional derivative along (z_clean - z_corrupted)."""
    loaded = loaded64
    pair = synthetic_pair(loaded, seed=2)
    L, H = loaded.spec.n_layers, loaded.spec.n_heads
    atp = attribution_patch_heads(loaded, pair)
    clean_z = record_inputs(loaded, pair.clean_ids, {"head": range(L)})[0]["head"]
    corrupted_z = record_inputs(loaded, pair.corrupted_ids, {"head": range(L)})[0]["head"]
    scale = atp.attrs["clean_logit_diff"] - atp.attrs["corrupted_logit_diff"]
    for layer, head in [(0, 0), (0, H - 1), (L - 1, 1)]:
        direction = torch.zeros_like(clean_z[layer])
        direction[:, head] = clean_z[layer][:, head] - corrupted_z[layer][:, head]
        fd = directional_derivative(loaded, pair, pair.corrupted_ids, layer, direction)
        row = atp[(atp.layer == layer) & (atp["head"] == head)]
        assert float(row.value.iloc[0]) * scale == pytest.approx(fd, rel=1e-3, abs=1e-5)
    by_pos = attribution_patch_heads(loaded, pair, by_position=True)
    summed = by_pos.groupby(["layer", "head"])["value"].sum().to_numpy()
    assert summed == pytest.approx(atp.value.to_numpy(), abs=1e-6)
    assert by_pos[by_pos.position < DIFFERS[0]].value.abs().max() == 0.0


def test_attribution_ablation_is_the_first_order_term(loaded64):
    llama = loaded64
    pair = synthetic_pair(llama, seed=3)
    atp = attribution_ablate_heads(llama, pair)
    run = head_gradients(llama, pair.clean_ids, pair)
    for layer, head in [(0, 2), (1, 0)]:
        direction = torch.zeros_like(run.z[layer])
        direction[:, head] = -run.z[layer][:, head]
        fd = directional_derivative(llama, pair, pair.clean_ids, layer, direction)
        row = atp[(atp.layer == layer) & (atp["head"] == head)]
        assert float(row.delta.iloc[0]) == pytest.approx(fd, rel=1e-3, abs=1e-5)


def test_exact_ablation_equals_one_forward_per_head(llama):
    pair = synthetic_pair(llama, seed=4)
    table = ablate_heads(llama, pair, batch_size=3, progress=False)
    clean_ld = logit_diff(llama, pair, pair.clean_ids)
    for row in table.itertuples():
        logits = hf_logits(llama, pair.clean_ids[None], ablate(llama.spec, [(row.layer, row.head)]))
        naive = float(pair.logit_diff(logits[:, -1])[0])
        assert row.logit_diff == pytest.approx(naive, abs=1e-5)
        assert row.delta == pytest.approx(naive - clean_ld, abs=1e-5)


def _rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho by its definition (no ties): Pearson's r of the ranks."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def test_comparison_reports_both_methods_with_spearman(llama):
    """Each column against an independent computation: exact ablation against one forward per
    head, the attribution estimate against the first-order formula with autograd on the plain
    model, rho against its definition."""
    pair = synthetic_pair(llama, seed=5)
    result = compare_with_exact(llama, pair, progress=False)
    L, H = llama.spec.n_layers, llama.spec.n_heads
    ablation = result.table[result.table.method == "ablate"]
    assert list(zip(ablation["layer"], ablation["head"], strict=True)) == [
        (layer, h) for layer in range(L) for h in range(H)
    ]
    clean_ld = logit_diff(llama, pair, pair.clean_ids)
    zs = []  # every head output in one graph that starts at the embeddings

    def keep(_mod, args):
        zs.append(args[0])  # (batch, pos, head * d_head)

    def start_graph(_mod, _args, out):
        return out.detach().requires_grad_(True)

    hooks = [llama.embed().register_forward_hook(start_graph)]
    hooks += [llama.proj(layer, "o_proj").register_forward_pre_hook(keep) for layer in range(L)]
    try:
        with torch.enable_grad():
            logits = llama.model(pair.clean_ids[None]).logits[:, -1]
            grads = torch.autograd.grad(pair.logit_diff(logits)[0], zs)
    finally:
        for h in hooks:
            h.remove()
    zs = [z.detach().view(*z.shape[:2], H, -1) for z in zs]
    grads = [g.view(*g.shape[:2], H, -1) for g in grads]
    for layer, head, exact, atp in ablation[["layer", "head", "exact", "atp"]].itertuples(
        index=False
    ):
        iv = ablate(llama.spec, [(layer, head)])
        naive = float(pair.logit_diff(hf_logits(llama, pair.clean_ids[None], iv)[:, -1])[0])
        assert exact == pytest.approx(naive - clean_ld, abs=1e-5)
        first_order = -(zs[layer][0, :, head] * grads[layer][0, :, head]).sum()
        assert atp == pytest.approx(float(first_order), abs=1e-5)
    for method, group in result.table.groupby("method"):
        rho = _rank_correlation(group.exact.to_numpy(), group.atp.to_numpy())
        assert result.spearman[method] == pytest.approx(rho, abs=1e-9)
    assert result.spearman["ablate"] > 0.5  # the estimate ranks heads (measured 0.9+ here)


def test_patching_figure_and_cli(llama, llama_checkpoint, tmp_path):
    import pandas as pd

    from interp_seal.cli import main
    from interp_seal.viz.attribution import attribution_scatter, patching_figure

    pair = synthetic_pair(llama)
    heads = patch_heads(llama, pair, progress=False)
    resid = patch_residual(llama, pair, positions=[8, 9], progress=False)
    fig = patching_figure(pd.concat([heads, resid], ignore_index=True))
    head_panel, resid_panel = fig.data
    L = llama.spec.n_layers
    assert head_panel.z[0] == pytest.approx(heads[heads.layer == L - 1].value.to_numpy())
    assert resid_panel.z[0] == pytest.approx(resid[resid.layer == L].value.to_numpy())
    assert list(resid_panel.x) == ["8", "9"]

    out = tmp_path / "patch"
    argv = ["attribution", "patch", "--model", llama_checkpoint, "--num-lines", "4"]
    assert main([*argv, "--last", "2", "--atp", "--threads", "1", "--out", str(out)]) == 0
    table = pd.read_csv(out / "patching.csv")
    sample = generate(LineRetrievalConfig(num_lines=4), 1, seed=0)[0]
    cli_pair = line_retrieval_pair(sample, llama.tokenizer, corrupt="key", seed=0)
    whole = table[(table.site == "head") & table.position.isna()]
    expected = patch_heads(llama, cli_pair, progress=False)
    assert whole.value.to_numpy() == pytest.approx(expected.value.to_numpy(), abs=1e-6)
    T = cli_pair.clean_ids.shape[0]
    final = table[(table.site == "resid") & (table.layer == L) & (table.position == T - 1)]
    assert final.value.iloc[0] == pytest.approx(1.0, abs=1e-6)
    atp = pd.read_csv(out / "atp.csv")
    assert atp[atp.method == "patch"].exact.to_numpy() == pytest.approx(
        expected.value.to_numpy(), abs=1e-6
    )
    scatter = attribution_scatter(atp, {"patch": 0.5, "ablate": 0.5})
    assert list(scatter.data[0].x) == pytest.approx(atp[atp.method == "patch"].exact.to_numpy())
    for name in ("patching.html", "atp.html"):
        assert (out / name).stat().st_size > 0
    # the page's position axes name the tokens (clean/corrupted where the prompts differ)
    labels = pair_labels(
        llama.tokenizer, cli_pair.clean_ids.tolist(), cli_pair.corrupted_ids.tolist()
    )
    page = (out / "patching.html").read_text().replace("\\u002f", "/")  # plotly escapes "/"
    differ = (cli_pair.clean_ids != cli_pair.corrupted_ids).nonzero().flatten().tolist()
    for p in [*differ, T - 1]:  # plotly writes the labels as JSON, non-ASCII kept or escaped
        assert any(json.dumps(labels[p], ensure_ascii=a)[1:-1] in page for a in (True, False)), p
