"""Direct logit attribution: sums to the logit, agrees with the TransformerLens bridge."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import QWEN3_MOE_LAYOUTS, rms_norm_terms

from interp_seal.analysis.logit_attribution import (
    logit_attribution,
    logit_diff_attribution,
    strongest_wrong_token,
)
from interp_seal.models import load_model
from interp_seal.testing import save_random_checkpoint

TARGETS = [10, 11, 25]


def prompt_ids(handle, seed: int = 0, length: int = 12) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, handle.spec.vocab_size, (length,), generator=gen)


@pytest.fixture(scope="module")
def handles():
    """One handle per family checkpoint, loaded lazily."""
    return {}


def handle_for(handles, path):
    if path not in handles:
        handles[path] = load_model(path)
    return handles[path]


@pytest.mark.parametrize("position", [-1, 5])
def test_frozen_norm_components_sum_to_the_model_logit(family_checkpoint, handles, position):
    handle = handle_for(handles, family_checkpoint)
    ids = prompt_ids(handle)
    result = logit_attribution(handle, ids, TARGETS, position=position)
    with torch.no_grad():  # the logit before a final soft-cap (Gemma 2): W_U final_norm(x)
        hidden = handle.model.base_model(ids[None]).last_hidden_state[0, position]
        logits = handle.unembed()(hidden).double()
        returned = handle.model(ids[None]).logits[0, position].double()
    cap = getattr(handle.model.config, "final_logit_softcapping", None)
    capped = logits if cap is None else cap * torch.tanh(logits / cap)
    torch.testing.assert_close(returned, capped, atol=1e-5, rtol=0)  # what the model returns
    expected = {handle.tokenizer.convert_ids_to_tokens(t): float(logits[t]) for t in TARGETS}
    assert result.logits == pytest.approx(expected, abs=1e-6)
    totals = result.totals()
    for name, logit in expected.items():
        assert totals[name] == pytest.approx(logit, abs=1e-4)
    n = handle.spec.n_layers
    counts = result.table.groupby("target")["component"].value_counts().unstack()
    assert (counts["head"] == n * handle.spec.n_heads).all() and (counts["mlp"] == n).all()
    assert (counts["embed"] == 1).all()
    final = handle.final_norm()
    if isinstance(final, torch.nn.LayerNorm):  # GPT-NeoX: its bias is a component of its own
        bias = result.table.query("component == 'final_norm_bias'").value.to_numpy()
        w_u = handle.unembed().weight.detach().double()[TARGETS]
        assert bias == pytest.approx((w_u @ final.bias.detach().double()).numpy(), abs=1e-9)
        assert (counts["final_norm_bias"] == 1).all()
    wpe = getattr(handle.model.base_model, "wpe", None)  # GPT-2's learned absolute positions
    if wpe is not None:  # their own part: W_U[t] . (w * centre(wpe[p])) / std(x), by hand
        row = wpe.weight.detach().double()[position % len(ids)]
        w_u = handle.unembed().weight.detach().double()[TARGETS]
        by_hand = w_u @ (final.weight.detach().double() * (row - row.mean())) / result.rms
        got = result.table.query("component == 'pos_embed'").value.to_numpy()
        assert got == pytest.approx(by_hand.numpy(), abs=1e-9)
        assert (counts["pos_embed"] == 1).all() and float(by_hand.abs().max()) > 1e-2


@pytest.mark.parametrize("layout", QWEN3_MOE_LAYOUTS.values(), ids=QWEN3_MOE_LAYOUTS)
def test_qwen3_moe_layouts_sum_to_the_model_logit(tmp_path, handles, layout):
    """On the other Qwen3-MoE layouts (``QWEN3_MOE_LAYOUTS``) each layer's MLP, mixture or
    dense, is one ``mlp`` part, and the parts sum to the logit."""
    path = save_random_checkpoint(tmp_path, "qwen3_moe", n_layers=4, seed=3, config=layout)
    handle = handle_for(handles, path)
    moe = [type(handle.mlp(i)).__name__.endswith("SparseMoeBlock") for i in range(4)]
    assert moe == ([True] * 4 if "decoder_sparse_step" not in layout else [False, True] * 2)
    test_frozen_norm_components_sum_to_the_model_logit(path, handles, -1)


def test_logit_difference_sums_to_the_difference(family_checkpoint, handles):
    handle = handle_for(handles, family_checkpoint)
    ids = prompt_ids(handle, seed=1)
    diff = logit_diff_attribution(handle, ids, 10, 11)
    single = logit_attribution(handle, ids, [10, 11])
    (name,) = diff.logits
    assert diff.totals()[name] == pytest.approx(diff.logits[name], abs=1e-4)
    a, b = (single.table[single.table.target == t].value.to_numpy() for t in single.logits)
    assert diff.table.value.to_numpy() == pytest.approx(a - b, abs=1e-9)


def test_seal_variant_drops_only_the_rms_factor(llama_checkpoint, handles):
    """SEAL's direct effect: same components times rms(x); they sum to rms(x) * logit."""
    handle = handle_for(handles, llama_checkpoint)
    ids = prompt_ids(handle, seed=2)
    frozen = logit_attribution(handle, ids, TARGETS)
    seal = logit_attribution(handle, ids, TARGETS, variant="seal")
    assert seal.rms == pytest.approx(frozen.rms) and seal.rms != pytest.approx(1.0, abs=1e-3)
    assert seal.table.value.to_numpy() == pytest.approx(
        frozen.table.value.to_numpy() * frozen.rms, rel=1e-9, abs=1e-12
    )
    # hand computation of rms from the residual stream the model feeds its final norm
    x = {}
    hook = handle.final_norm().register_forward_pre_hook(lambda _m, a: x.update(x=a[0][0, -1]))
    with torch.no_grad():
        handle.model(ids[None])
    hook.remove()
    _, eps = rms_norm_terms(handle.final_norm())
    rms = float(torch.sqrt(x["x"].double().pow(2).mean() + eps))
    assert seal.rms == pytest.approx(rms, rel=1e-7)
    for name, total in seal.totals().items():
        assert total == pytest.approx(seal.logits[name] * rms, abs=1e-4)


def rms(x: torch.Tensor, norm) -> torch.Tensor:
    return torch.sqrt(x.double().pow(2).mean(-1) + rms_norm_terms(norm)[1])


def test_head_effect_is_its_o_proj_block_through_the_frozen_norms(family_checkpoint, handles):
    """Hand computation: run ``o_proj`` itself on the captured ``z`` with every other head
    zeroed, push that vector through the family's post-attention norm with the RMS of the
    whole attention output (OLMo 2), then ``w / rms`` of the final norm and ``W_U``."""
    from interp_seal.interventions import capture_head_outputs

    handle = handle_for(handles, family_checkpoint)
    ids = prompt_ids(handle, seed=3)
    target = 25
    result = logit_attribution(handle, ids, [target])
    zs = capture_head_outputs(handle, ids[None])
    final = handle.final_norm()
    layer_norm = isinstance(final, torch.nn.LayerNorm)  # GPT-NeoX: centres, then w (and b)
    w = final.weight.double() if layer_norm else rms_norm_terms(final)[0]
    w_u = handle.unembed().weight.double()[target]
    for layer, head in [(0, 1), (handle.spec.n_layers - 1, 2)]:
        only = torch.zeros_like(zs[layer][0, -1])
        only[head] = zs[layer][0, -1, head]
        o_proj, post = handle.proj(layer, "o_proj"), handle.norm(layer, "post_attn")
        with torch.no_grad():
            bias = 0 if o_proj.bias is None else o_proj.bias.double()
            vector = o_proj(only.flatten()).double() - bias
            if post is not None:  # the norm's own output, rescaled to the whole output's RMS
                whole = o_proj(zs[layer][0, -1].flatten()).double()
                vector = post(vector.float()).double() * rms(vector, post) / rms(whole, post)
        if layer_norm:  # the head's part of x - mean(x); the norm's bias is no head's
            vector = vector - vector.mean()
        expected = float(w_u @ (w * vector)) / result.rms
        row = result.table.query("component == 'head' and layer == @layer and head == @head")
        assert float(row.value.iloc[0]) == pytest.approx(expected, abs=1e-5)


def test_matches_transformer_lens_bridge(family_checkpoint):
    """Heads via ``cache.stack_head_results``, embedding + MLPs via ``decompose_resid``, both
    through ``cache.logit_attrs`` on the bridge in compatibility mode (final norm folded into
    W_U; no centering and no value-bias folding, which would move per-head or per-token mass)."""
    handle = load_model(family_checkpoint)
    if handle.family.post_attn_norm is not None:
        pytest.skip(
            "the bridge's head results and attn_out are taken before the post-attention norm "
            "(OLMo 2's, Gemma's sandwich norms), so its components do not sum to the logit "
            "(-0.21 against 0.18 on the OLMo 2 checkpoint); test_head_effect_is_its_o_proj_block_through_the_frozen_norms and the "
            "sum to the logit are the references there"
        )
    ids = prompt_ids(handle, seed=4)
    ours = logit_attribution(handle, ids, [10])
    ours_diff = logit_diff_attribution(handle, ids, 10, 11)
    bridge = handle.bridge()
    bridge.enable_compatibility_mode(
        disable_warnings=True,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
    )
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids[None])
        heads = cache.stack_head_results(layer=-1, pos_slice=-1)
        rest = cache.decompose_resid(mode="mlp", pos_slice=-1, incl_embeds=True)
        # embed (and GPT-2's pos_embed: TransformerLens's name, ours), heads, MLPs
        embeds = 2 if handle.family.pos_embed is not None else 1
        stack = torch.cat([rest[:embeds], heads, rest[embeds:]])
        tl = cache.logit_attrs(stack, tokens=torch.tensor([10]), pos_slice=-1)[:, 0]
        tl_diff = cache.logit_attrs(
            stack, tokens=torch.tensor([10]), incorrect_tokens=torch.tensor([11]), pos_slice=-1
        )[:, 0]
    for result, reference in ((ours, tl), (ours_diff, tl_diff)):
        table = result.table
        order = [
            table[table.component == "embed"],
            table[table.component == "pos_embed"],
            table[table.component == "head"],
            table[table.component == "mlp"],
        ]
        values = torch.tensor([v for part in order for v in part.value], dtype=torch.float64)
        assert values.shape == reference.shape
        assert torch.allclose(values, reference.double(), atol=1e-4, rtol=0)


def test_bad_inputs_are_refused(llama_checkpoint, handles, unchecked):
    handle = handle_for(handles, llama_checkpoint)
    ids = prompt_ids(handle)
    with pytest.raises(ValueError, match="single token"):
        logit_attribution(handle, ids, [" happy tiger"])
    with pytest.raises(ValueError, match="variant"):
        logit_attribution(handle, ids, [10], variant="lieberum")
    with pytest.raises(ValueError, match="outside the prompt"):
        logit_attribution(handle, ids, [10], position=12)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        logit_attribution(handle, ids, [10**7])
    with pytest.raises(ValueError, match="one prompt"):
        logit_attribution(handle, ids[None], [10])


def test_dla_figure_and_cli(llama_checkpoint, handles, tmp_path, capsys):
    import pandas as pd

    from interp_seal.cli import main
    from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate
    from interp_seal.viz.attribution import dla_figure

    handle = handle_for(handles, llama_checkpoint)
    result = logit_attribution(handle, prompt_ids(handle), [10, 11])
    target = list(result.logits)[1]
    fig = dla_figure(result, target)
    heat, bars = fig.data
    rows = result.table[result.table.target == target]
    top = (rows.component == "head") & (rows.layer == handle.spec.n_layers - 1)  # first row
    expected = rows[top].value.to_numpy()
    assert heat.z[0] == pytest.approx(expected)
    assert list(bars.y) == pytest.approx(rows[rows.component != "head"].value.to_numpy())
    with pytest.raises(ValueError, match="unknown target"):
        dla_figure(result, "nope")

    out = tmp_path / "dla"
    argv = [
        "attribution",
        "dla",
        "--model",
        llama_checkpoint,
        "--num-lines",
        "4",
        "--out",
        str(out),
    ]
    assert main([*argv, "--threads", "1"]) == 0
    table = pd.read_csv(out / "dla.csv", keep_default_na=False, na_values=[""])
    assert list(table.columns)[-4:] == ["model", "seed", "n", "sample"]  # one record: n = 1
    assert (table[["seed", "n", "sample"]] == [0, 1, 0]).all().all()
    page = (out / "dla.html").read_text()  # three figures, plotly.js loaded once from beside it
    assert page.count("Plotly.newPlot") == 3 and page.count('src="plotly.min.js"') == 1
    assert len(page) < 100_000 and (out / "plotly.min.js").is_file()
    sample = generate(LineRetrievalConfig(num_lines=4), 1, seed=0)[0]
    encoded = sample.encode(handle.tokenizer)
    with torch.no_grad():
        logits = handle.model(encoded.prompt_ids[None]).logits[0, -1].double()
    correct = int(encoded.answer_ids[0])
    wrong = int(torch.cat([logits[:correct], logits[correct + 1 :]]).argmax())
    wrong += int(wrong >= correct)
    label = handle.tokenizer.convert_ids_to_tokens
    sums = table.groupby("target", sort=False)["value"].sum()
    assert sums[label(correct)] == pytest.approx(float(logits[correct]), abs=1e-4)
    assert sums[label(wrong)] == pytest.approx(float(logits[wrong]), abs=1e-4)
    diff = f"{label(correct)} - {label(wrong)}"
    assert sums[diff] == pytest.approx(float(logits[correct] - logits[wrong]), abs=1e-4)
    assert "sum of effects" in capsys.readouterr().out


def test_strongest_wrong_token_is_the_full_logits_runner_up(llama_checkpoint, handles):
    handle = handle_for(handles, llama_checkpoint)
    for seed in range(3):
        ids = prompt_ids(handle, seed)
        with torch.no_grad():
            logits = handle.model(ids[None]).logits[0, -1]  # every position, the naive way
        first, second = logits.topk(2).indices.tolist()
        assert strongest_wrong_token(handle, ids, first) == (first, second)
        assert strongest_wrong_token(handle, ids, second) == (first, first)


def test_seal_fig4_shows_learned_positions_beside_the_embedding():
    """SEAL Fig. 4's panel (b) draws GPT-2's ``pos_embed`` part as its own point, "pos", after
    "emb" and before the MLPs, each the component's effect less its mean over the digits."""
    import pandas as pd

    from interp_seal.viz.paper_figures import digit_effects

    gen = np.random.default_rng(0)
    parts = [("embed", None), ("pos_embed", None), ("mlp", 0), ("mlp", 1)]
    rows = [("m", c, layer, None, d, float(gen.normal())) for c, layer in parts for d in range(10)]
    rows += [
        ("m", "head", layer, h, d, 0.0) for layer in (0, 1) for h in range(2) for d in range(10)
    ]
    effects = pd.DataFrame(rows, columns=["method", "component", "layer", "head", "digit", "value"])
    logits = pd.DataFrame({"method": "m", "digit": range(10), "logit": 0.0, "correct": False})
    logits.loc[3, "correct"] = True
    records = pd.DataFrame({"record": [0], "method": ["m"], "logit_diff": [1.0]})
    fig = digit_effects(effects, logits, records)
    panel = [t for t in fig.data if t.x is not None and tuple(t.x[:1]) == ("emb",)]
    assert len(panel) == 10 and all(tuple(t.x) == ("emb", "pos", "L0", "L1") for t in panel)
    table = effects[effects.component != "head"]
    centred = table.value - table.groupby(["component", "layer"], dropna=False).value.transform(
        "mean"
    )
    for digit, trace in enumerate(panel):
        expected = centred[table.digit == digit].to_numpy()  # embed, pos_embed, mlp 0, mlp 1
        np.testing.assert_allclose(trace.y, expected, atol=1e-12)
