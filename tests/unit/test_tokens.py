"""Token-level views: the numbers they show are the model's, checked through other routes.

- the attention explorer's row for a locked query equals ``capture_attention_rows`` and the
  full ``T x T`` eager attention of the same model (and the skipped spans' totals its sums);
- one head's DLA split by source token sums to the head's ``logit_attribution`` value and
  equals a loop over source tokens written from the model's modules;
- windows keep the question and the answer's source line and count what they skip;
- token labels are the tokenizer's decoding; the patching figure's position axes carry them;
- in chromium, the widget's script colours the tokens by the hovered / locked row.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import byte_level_tokenizer, rms_norm_terms
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from interp_seal.analysis import capture_attention_rows, logit_attribution, logit_diff_attribution
from interp_seal.analysis.token_views import line_retrieval_focus, source_token_attribution
from interp_seal.evaluation import line_retrieval_samples
from interp_seal.models import FAMILIES, load_model
from interp_seal.tasks import line_retrieval
from interp_seal.viz.attribution import patching_figure
from interp_seal.viz.tokens import (
    Segment,
    effect_html,
    pair_labels,
    position_effects,
    signed_colour,
    skipped_count,
    token_labels,
    token_windows,
)
from interp_seal.widgets.tokens import ESM, AttentionExplorer

HEADS = [(0, 1), (2, 0), (3, 5)]
ALPHA = 1.5 / 255  # the browser keeps colour opacity in 8 bits


@pytest.fixture(scope="module")
def organism():
    return load_model("organism")


@pytest.fixture(scope="module")
def record(organism):
    """A 12-line record: short enough for eager attention, long enough to be windowed."""
    return line_retrieval_samples(organism.tokenizer, [12], n=1, seed=3)[12][0]


@pytest.fixture(scope="module")
def eager(organism):
    return AutoModelForCausalLM.from_pretrained(organism.name_or_path, attn_implementation="eager")


def unvisible(label: str) -> str:
    return label.replace("·", " ").replace("↵", "\n").replace("→", "\t")


# -- labels and windows ------------------------------------------------------------------------
def test_labels_are_the_tokenizers_decoding(organism, record):
    tok = organism.tokenizer
    ids = record.encode(tok).input_ids.tolist()
    labels = token_labels(tok, ids)
    assert [unvisible(x) for x in labels] == [tok.decode([i]) for i in ids]
    assert "".join(unvisible(x) for x in labels) == tok.decode(ids)  # word-level: they concatenate
    assert labels[1:3] == ["Below", "·is"] and "↵" in labels
    byte_level = byte_level_tokenizer()  # GPT-2 style, as SmolLM2's
    ids = byte_level(record.prompt)["input_ids"]
    labels = token_labels(byte_level, ids)
    assert "".join(unvisible(x) for x in labels) == byte_level.decode(ids) == record.prompt
    assert not any(" " in x or "\n" in x for x in labels)


def test_windows_by_hand():
    segments = token_windows(100, [(80, 81), (10, 12), (14, 20)], margin=2)
    assert segments == [
        Segment(0, 8, False),
        Segment(8, 22, True),
        Segment(22, 78, False),
        Segment(78, 83, True),
        Segment(83, 100, False),
    ]
    assert skipped_count(segments) == 8 + 56 + 17
    assert token_windows(100, [(0, 3), (97, 100)], margin=5) == [
        Segment(0, 8, True),
        Segment(8, 92, False),
        Segment(92, 100, True),
    ]
    assert token_windows(50, [(10, 12)], max_tokens=50) == [Segment(0, 50, True)]
    with pytest.raises(ValueError, match="outside"):
        token_windows(10, [(8, 12)])


def test_windows_keep_the_question_and_the_answer_source(organism):
    tok = organism.tokenizer
    sample = line_retrieval_samples(tok, [60], n=1, seed=1)[60][0]
    ids = sample.encode(tok).prompt_ids
    focus = line_retrieval_focus(sample, tok)
    source, question = (tok.decode(ids[a:b]) for a, b in (focus["source"], focus["question"]))
    assert source == sample.meta["correct_line"]
    index = sample.meta["random_idx"][0]
    assert question == (
        line_retrieval.FOOTER.format(idx=index) + line_retrieval.ANSWER_PREFIX.format(idx=index)
    )
    assert question.endswith(f"in line {index} is") and focus["question"][1] == len(ids)

    explorer = AttentionExplorer.from_sample(organism, sample, layer=3, head=5, margin=3)
    shown = set(explorer.view.positions)
    for a, b in focus.values():
        assert set(range(a - 3, b + 3)) & set(range(len(ids))) <= shown
    assert 0 in shown and len(ids) - 1 in shown
    hidden = [p for p in range(len(ids)) if p not in shown]
    assert skipped_count(explorer.segments) == len(hidden) == len(ids) - len(shown) > 500
    html = explorer.html()
    counts = [int(n) for n in re.findall(r"\[… (\d+) tokens skipped", html)]
    gaps = [s for s in explorer.segments if not s.shown]
    assert counts == [s.size for s in gaps] and sum(counts) == len(hidden)
    assert f"{len(shown)} tokens shown, {len(hidden)} skipped" in html


# -- attention rows ----------------------------------------------------------------------------
def full_attention(eager, ids) -> list[torch.Tensor]:
    """Every layer's ``(head, query, key)`` attention, ``T x T`` (short prompts only)."""
    with torch.no_grad():
        out = eager(ids[None], output_attentions=True)
    return [a[0].double() for a in out.attentions]


def test_locked_query_shows_the_captured_and_the_full_row(organism, record, eager):
    ids = record.encode(organism.tokenizer).prompt_ids
    explorer = AttentionExplorer.from_sample(
        organism, record, layer=HEADS[0][0], head=HEADS[0][1], margin=2, max_tokens=None
    )
    full = full_attention(eager, ids)
    focus = explorer.focus
    gaps = [s for s in explorer.segments if not s.shown]
    assert len(gaps) >= 2
    queries = [len(ids) - 1, focus["question"][0] + 2, focus["source"][1] - 2]
    for layer, head in HEADS:
        explorer.layer.value, explorer.head.value = layer, head  # the dropdowns recompute
        assert explorer.view.title.startswith(f"L{layer}H{head} ")
        captured = capture_attention_rows(organism, ids, queries)[:, 0]  # (layer, head, q, key)
        for k, query in enumerate(queries):
            explorer.tokens.locked = query
            assert explorer.query() == query
            shown = explorer.shown_row()
            keys = list(shown)
            assert keys == explorer.view.positions
            values = np.array(list(shown.values()))
            np.testing.assert_allclose(values, captured[layer, head, k, keys].numpy(), atol=1e-6)
            np.testing.assert_allclose(values, full[layer][head, query, keys].numpy(), atol=2e-6)
            assert values[np.array(keys) > query].sum() == 0  # causal
            # the ellipses carry the weight of what they hide
            i = explorer.view.positions.index(query)
            totals = [float(full[layer][head, query, s.start : s.end].sum()) for s in gaps]
            np.testing.assert_allclose(explorer.tokens.view["skipped"][i], totals, atol=1e-5)
            np.testing.assert_allclose(values.sum() + sum(totals), 1.0, atol=1e-5)
    explorer.tokens.locked = -1  # unlocked: the answer position's row
    assert explorer.query() == len(ids) - 1
    last = full[3][5, -1, explorer.view.positions].numpy()
    np.testing.assert_allclose(list(explorer.shown_row().values()), last, atol=2e-6)
    # the static fallback draws the same row: its tooltips carry the weights
    weights = [float(x) for x in re.findall(r": weight (\d\.\d+)", explorer.html())]
    np.testing.assert_allclose(weights, np.round(last, 4), atol=1e-4)


# -- DLA by source token -----------------------------------------------------------------------
def by_hand(model, ids, layer, head, a, b, post_attn=None, family=None) -> tuple[np.ndarray, float]:
    """Per-source-token direct effect on ``logit[a] - logit[b]`` at the last position from the
    model's modules and its full eager attention, one source token at a time; ``post_attn``
    names the layer's norm on the attention output (OLMo 2), whose RMS is frozen. ``family``
    (default: Llama's names) gives the module names; GPT-NeoX's fused projection is read in its
    own per-head layout ``[q_h | k_h | v_h]`` and its final LayerNorm centres what it reads;
    GPT-2's ``Conv1D`` output projection is read as the ``(in, out)`` weight it stores."""
    family = family or FAMILIES["llama"]
    cfg = model.config
    H = cfg.num_attention_heads
    KV = getattr(cfg, "num_key_value_heads", None) or H
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    block = model.get_submodule(f"{family.layers}.{layer}")
    attn = block.get_submodule(family.attn)
    final = model.get_submodule(family.final_norm)
    o_proj = attn.get_submodule(family.o_proj)
    kept = {}

    def keep_v(_m, _a, out):
        if family.qkv_interleaved:  # (T, H, [q | k | v]) per head
            kept.update(v=out[0].view(len(out[0]), H, 3 * D)[..., 2 * D :].flatten(1))
        else:  # v_proj, or the last KV*D rows of a fused [q | k | v]
            kept.update(v=out[0, :, -KV * D :])

    fused = family.qkv_proj is not None
    v_proj = attn.get_submodule(family.qkv_proj if fused else family.v_proj)
    hooks = [
        v_proj.register_forward_hook(keep_v),
        o_proj.register_forward_hook(lambda _m, _a, out: kept.update(o=out[0, -1])),
        final.register_forward_pre_hook(lambda _m, a: kept.update(x=a[0][0, -1])),
    ]
    try:
        with torch.no_grad():
            out = model(ids[None], output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    pattern = out.attentions[layer][0, head, -1].double()  # (key,)
    v = kept["v"].double().reshape(len(ids), KV, D)[:, head // (H // KV)]
    w_o = o_proj.weight.detach().double()  # (out, in); GPT-2's Conv1D stores (in, out)
    w_o = (w_o.T if isinstance(o_proj, Conv1D) else w_o)[:, head * D : (head + 1) * D]
    x = kept["x"].double()
    layer_norm = isinstance(final, torch.nn.LayerNorm)

    def center(t):  # a LayerNorm reads x - mean(x)
        return t - t.mean() if layer_norm else t

    if layer_norm:
        w, eps = final.weight.detach().double(), final.eps
    else:
        w, eps = rms_norm_terms(final)
    rms = torch.sqrt(center(x).pow(2).mean() + eps)
    w_u = model.get_output_embeddings().weight.detach().double()
    direction = w_u[a] - w_u[b]
    post = None if post_attn is None else block.get_submodule(post_attn)
    values = []
    for j in range(len(ids)):
        written = w_o @ (pattern[j] * v[j])  # what token j sends through this head
        if post is not None:  # w * written / rms(o), o the whole attention output
            o, (w_post, eps_post) = kept["o"].double(), rms_norm_terms(post)
            written = w_post * written / o.pow(2).mean().add(eps_post).sqrt()
        values.append(float(direction @ (w * center(written)) / rms))
    return np.array(values), float(rms)


def head_value(table: pd.DataFrame, layer: int, head: int) -> float:
    rows = table[(table.component == "head") & (table.layer == layer) & (table["head"] == head)]
    return float(rows.value.item())


def test_source_token_dla_sums_to_the_head_and_matches_a_loop(organism, record, eager):
    tok = organism.tokenizer
    enc = record.encode(tok)
    ids, answer = enc.prompt_ids, int(enc.answer_ids[0])
    wrong = tok.convert_tokens_to_ids(" 7") if int(answer) != tok.convert_tokens_to_ids(" 7") else 5
    dla = logit_diff_attribution(organism, ids, answer, wrong)
    for layer, head in HEADS:
        split = source_token_attribution(organism, ids, layer, head, answer, wrong)
        assert split.total == pytest.approx(head_value(dla.table, layer, head), abs=1e-9)
        assert float(split.values.sum()) == pytest.approx(split.total, abs=1e-5)
        expected, rms = by_hand(eager, ids, layer, head, answer, wrong)
        np.testing.assert_allclose(split.values.numpy(), expected, atol=1e-5)
        assert np.abs(expected).max() > 1e-3  # not a trivially zero comparison
        seal = source_token_attribution(organism, ids, layer, head, answer, wrong, variant="seal")
        np.testing.assert_allclose(seal.values.numpy(), expected * rms, atol=1e-4)
    # the retrieval head L3H5 carries most of its effect from the queried line
    split = source_token_attribution(organism, ids, 3, 5, answer, wrong)
    a, b = line_retrieval_focus(record, tok)["source"]
    assert abs(float(split.values[a:b].sum())) > 0.5 * float(split.values.abs().sum())


def test_source_token_dla_on_every_family(family_checkpoint):
    """GQA (llama, mistral's sliding window) and multi-head with biases (qwen2)."""
    handle = load_model(family_checkpoint)
    ids = torch.randint(
        4, handle.spec.vocab_size, (24,), generator=torch.Generator().manual_seed(0)
    )
    table = logit_attribution(handle, ids, [10], position=17).table
    model = AutoModelForCausalLM.from_pretrained(family_checkpoint, attn_implementation="eager")
    for layer in range(handle.spec.n_layers):
        for head in range(handle.spec.n_heads):
            split = source_token_attribution(handle, ids, layer, head, 10, position=17)
            assert split.position == 17 and split.values[18:].abs().max() == 0
            assert float(split.values.sum()) == pytest.approx(
                head_value(table, layer, head), abs=1e-5
            )
    post_attn = handle.family.post_attn_norm
    # one loop: a logit difference
    expected, _ = by_hand(model, ids[:18], 1, 2, 10, 11, post_attn, handle.family)
    split = source_token_attribution(handle, ids[:18], 1, 2, 10, 11)
    np.testing.assert_allclose(split.values.numpy(), expected, atol=1e-5)


# -- effect colouring and the patching figure's token axes --------------------------------------
def tooltips(html: str) -> dict[int, tuple[str, str]]:
    """``{position: (tooltip value, background)}`` of the tokens an effect view shows."""
    found = re.findall(
        r'title="position (\d+) [^:]*: ([^"]+)" style="[^"]*?background:([^;]+);', html
    )
    return {int(p): (value, colour) for p, value, colour in found}


def test_effect_colours_and_patching_labels(organism, record):
    tok = organism.tokenizer
    ids = record.encode(tok).prompt_ids
    n = len(ids)
    other = ids.clone()
    other[n - 3] = tok.convert_tokens_to_ids(" 7")
    labels = pair_labels(tok, ids.tolist(), other.tolist())
    assert labels[n - 3] == f"{token_labels(tok, [int(ids[n - 3])])[0]}/·7"
    assert labels[:5] == token_labels(tok, ids[:5].tolist())

    rows = []
    for layer in range(2):
        for pos in (n - 3, n - 1):
            rows += [
                ("head", layer, h, pos, 0.0, 0.1 * h - 0.2 + layer + pos / n) for h in range(3)
            ]
            rows.append(("resid", layer, None, pos, 0.0, -0.5 * layer + pos / n))
    rows.append(("head", 1, 0, None, 0.0, 0.7))
    table = pd.DataFrame(rows, columns=["site", "layer", "head", "position", "logit_diff", "value"])
    table = table.astype({"head": "Int64", "position": "Int64"})

    effects = position_effects(table, n, site="head", layer=1)
    expected = {p: sum(0.1 * h - 0.2 + 1 + p / n for h in range(3)) for p in (n - 3, n - 1)}
    assert np.isnan(effects[: n - 3]).all() and np.isnan(effects[n - 2])
    for p, value in expected.items():
        assert effects[p] == pytest.approx(value)

    segments = token_windows(n, [(n - 5, n)], margin=0)
    html = effect_html(labels, effects, segments, title="t", value_title="effect", vmax=5.0)
    shown = tooltips(html)
    vmax = 5.0
    for p, value in expected.items():
        assert float(shown[p][0]) == pytest.approx(value, abs=1e-3)
        assert shown[p][1] == signed_colour(value, vmax)
    assert "not computed" in html and f"[… {n - 5} tokens skipped" in html
    assert signed_colour(vmax, vmax) != signed_colour(-vmax, vmax)
    assert signed_colour(0.0, vmax) == signed_colour(0.0, 1.0)

    fig = patching_figure(table, tokens=labels)
    position_axes = [ax for name, ax in fig.layout.to_plotly_json().items() if "xaxis" in name]
    ticked = [ax for ax in position_axes if ax.get("ticktext")]
    assert len(ticked) == 2  # heads by position, residual stream; not the layer x head panel
    for ax in ticked:
        assert ax["tickvals"] == [str(n - 3), str(n - 1)]
        assert ax["ticktext"] == [f"{n - 3} {labels[n - 3]}", f"{n - 1} {labels[n - 1]}"]
    by_position = [
        position_effects(table, n, site=site, layer=layer)
        for site in ("head", "resid")
        for layer in range(2)
    ]
    largest = max(0.7, *(float(np.nanmax(np.abs(v))) for v in by_position))
    assert [trace.zmax for trace in fig.data] == pytest.approx([largest] * 3)  # one range


# -- the browser side --------------------------------------------------------------------------
PAGE = """<!doctype html><meta charset="utf-8"><body><div id="el"></div>
<script type="module">
const state = %s, handlers = {};
const model = {
  get: (k) => state[k],
  set: (k, v) => { state[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); },
  on: (e, f) => (handlers[e] ||= []).push(f),
  save_changes: () => { window.saved = (window.saved || 0) + 1; },
};
window.model = model;
const url = URL.createObjectURL(new Blob([%s], { type: "text/javascript" }));
const widget = await import(url);
widget.default.render({ model, el: document.getElementById("el") });
window.ready = true;
</script>"""


@pytest.fixture
def _no_network():
    """The page loads from a local file (conftest blocks sockets elsewhere)."""


@pytest.fixture(scope="module")
def chromium():
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    args += ["--disable-component-update", "--no-first-run", "--disable-dev-shm-usage"]
    try:
        from playwright.sync_api import sync_playwright

        playwright = sync_playwright().start()
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=args)
    except Exception as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI: browser tests must run, chromium did not start: {err}")
        pytest.skip(f"cannot start chromium through Playwright: {err}")
    yield browser
    browser.close()
    playwright.stop()


def alphas(page) -> list[float]:
    """Each token's background opacity as the browser holds it (in steps of 1/255)."""
    colours = page.eval_on_selector_all(".isv-token", "els => els.map(e => e.style.background)")
    out = []
    for colour in colours:
        parts = re.findall(r"[\d.]+", colour)
        out.append(float(parts[3]) if len(parts) == 4 else 1.0)
    return out


def test_widget_script_hover_and_lock_in_chromium(chromium, organism, record, tmp_path):
    explorer = AttentionExplorer.from_sample(organism, record, layer=3, head=5, margin=2)
    state = {"view": explorer.tokens.view, "locked": -1}
    path = tmp_path / "tokens.html"
    path.write_text(PAGE % (json.dumps(state), json.dumps(ESM)))
    page = chromium.new_page(viewport={"width": 900, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_function("window.ready === true")
    view = explorer.view

    def expected(position):
        row = view.weights[view.positions.index(position)]
        return np.minimum(row / view.vmax, 1.0)

    tokens = page.locator(".isv-token")
    assert tokens.count() == len(view.positions)
    assert tokens.all_inner_texts() == view.labels
    np.testing.assert_allclose(alphas(page), expected(view.positions[-1]), atol=ALPHA)
    question = explorer.focus["question"][0] + 3
    tokens.nth(view.positions.index(question)).hover()
    np.testing.assert_allclose(alphas(page), expected(question), atol=ALPHA)
    assert "hovered" in page.locator(".isv-status").inner_text()
    tokens.nth(view.positions.index(question)).click()
    assert page.evaluate("window.model.get('locked')") == question
    tokens.nth(3).hover()  # locked: hovering elsewhere changes nothing
    np.testing.assert_allclose(alphas(page), expected(question), atol=ALPHA)
    gaps = page.locator(".isv-gap").all_inner_texts()
    i = view.positions.index(question)
    for text, segment, weight in zip(
        gaps, [s for s in view.segments if not s.shown], view.skipped[i], strict=True
    ):
        assert f"{segment.size} tokens skipped" in text and f"{weight:.3f} in total" in text
    tokens.nth(view.positions.index(question)).click()  # unlock
    assert page.evaluate("window.model.get('locked')") == -1
    assert page.evaluate("window.saved") == 2
    page.close()
