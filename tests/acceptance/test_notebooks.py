"""Notebooks run headless on the organism, small, and show the same numbers as the package.

Each workflow notebook is executed with nbclient in a temporary directory with small sizes
(environment variables it reads). A last cell, appended here and never saved, writes the
kernel's results to files; the test then recomputes them through other routes of the library
(teacher forcing with hooks instead of the batched sweep engine, a fresh training run, full
attention matrices instead of row-wise capture, hand-made activation patches) and compares.
Nothing here hard-codes the organism's numbers: only the library's own.

The notebooks are also committed executed, at their default sizes, by
``scripts/execute_notebooks.py`` (outputs that render without a kernel). The fresh-notebook
tests fail when a committed notebook's code differs from the code its outputs came from, a
plotly figure has no PNG beside it, or progress bars were left in; the slow test executes each
one again and compares its text outputs with the committed ones.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch
from nbclient import NotebookClient
from transformers import AutoModelForCausalLM

from interp_seal.analysis import line_retrieval_pair
from interp_seal.engine import pad_id_of
from interp_seal.evaluation import evaluate_lengths, evaluate_line_retrieval, line_retrieval_samples
from interp_seal.interventions import HeadIntervention, ablate, hf_logits, scale_table
from interp_seal.models import load_model
from interp_seal.tasks import LineRetrievalConfig, PassagesConfig, passages
from interp_seal.tasks.line_retrieval import generate
from interp_seal.tuning import (
    MudafConfig,
    MudafTuner,
    SealTuner,
    TrainConfig,
    format_samples,
    load_scales,
    merged_model,
    train,
)
from interp_seal.tuning.data import encode_examples
from interp_seal.tuning.evaluate import accuracy_by_method
from interp_seal.tuning.mudaf import sample_heads, score_matrix

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CLOSE = {"rtol": 1e-4, "atol": 1e-4}  # float32 forwards through different code paths
DUMP_IMPORTS = "import json\nfrom pathlib import Path\n"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def run_notebook(name: str, cwd: Path, monkeypatch, env: dict[str, str], dump: str = ""):
    """Execute ``notebooks/<name>.ipynb`` in ``cwd`` with ``env``, then the cell ``dump`` (if
    any); returns the executed notebook."""
    monkeypatch.undo()  # the kernel connects over loopback sockets
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    monkeypatch.setattr(os, "environ", {**os.environ, "PYTHONPATH": path, **env})
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    if dump:
        nb.cells.append(nbformat.v4.new_code_cell(DUMP_IMPORTS + dump))
    client = NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=False)
    client.execute(cwd=str(cwd))
    return nb


def figure(nb, title: str) -> dict:
    """The plotly figure (JSON) the notebook displayed whose title starts with ``title``."""
    found = [
        out["data"][PLOTLY]
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if PLOTLY in out.get("data", {})
        and out["data"][PLOTLY]["layout"]["title"]["text"].startswith(title)
    ]
    assert len(found) == 1, f"{len(found)} figures titled {title!r}"
    return found[0]


def array(value) -> np.ndarray:
    """A plotly JSON array: a list, or a typed array ``{"dtype", "bdata"[, "shape"]}``."""
    if isinstance(value, dict):
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return flat.reshape([int(n) for n in str(shape).split(",")]) if shape else flat
    return np.asarray(value)


def test_quickstart_matches_package(tmp_path, monkeypatch):
    """On the organism, where accuracy and the pruning delta are non-zero."""
    env = {"INTERP_SEAL_MODEL": "organism", "NOTEBOOK_LENGTHS": "10 80", "NOTEBOOK_N": "12"}
    nb = run_notebook("quickstart", tmp_path, monkeypatch, env)
    last = [c for c in nb.cells if c.cell_type == "code"][-1].outputs[-1]["data"]["text/plain"]

    handle = load_model("organism")
    base = evaluate_line_retrieval(handle, [10, 80], n=12, seed=0, progress=False)
    pruned = evaluate_line_retrieval(
        handle,
        [10, 80],
        n=12,
        seed=0,
        progress=False,
        intervention=ablate(handle.spec, [(0, 1)], mode="zero"),
    )
    expected = pd.DataFrame(
        {"length": [10, 80], "exact_match": base["exact_match"], "pruned": pruned["exact_match"]}
    )
    expected["delta"] = expected["pruned"] - expected["exact_match"]
    assert last.strip() == expected.to_string().strip()
    assert expected["exact_match"].iloc[0] > 0.9 and expected["delta"].iloc[1] < 0


# -- SEAL: sweep -> quadrants -> channel map -> scaling -> SEAL-H/C -> merge --------------------
SEAL_ENV = {
    "INTERP_SEAL_MODEL": "organism",
    "NOTEBOOK_LENGTHS": "20 40",
    "NOTEBOOK_N": "4",
    "NOTEBOOK_METRIC": "answer_logprob",  # four records: exact match barely moves
    "NOTEBOOK_TRAIN_SAMPLES": "4",
    "NOTEBOOK_OUT": "out",
}
SEAL_DUMP = """
for _name in ("sweep", "channels", "scaled", "accuracy"):
    globals()[_name].to_csv(f"{_name}.csv", index=False)
Path("numbers.json").write_text(json.dumps({
    "head": HEAD,
    "table": [[*h, f] for h, f in tables[SCALING].items()],
    "losses": losses,
    "merge_gap": merge_gap,
}))
"""


def dumped(tmp_path, *tables: str) -> tuple[dict, list[pd.DataFrame]]:
    """What a notebook's dump cell wrote: ``numbers.json`` and the named CSV tables."""
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    return numbers, [pd.read_csv(tmp_path / f"{name}.csv") for name in tables]


def _rows(table: pd.DataFrame, **where) -> pd.Series:
    """The one row of ``table`` matching ``where``."""
    mask = np.logical_and.reduce([table[k] == v for k, v in where.items()])
    assert mask.sum() == 1, where
    return table[mask].iloc[0]


def test_seal_notebook_matches_package(tmp_path, monkeypatch):
    nb = run_notebook("seal", tmp_path, monkeypatch, SEAL_ENV, SEAL_DUMP)
    numbers, (sweep, channels, scaled, accuracy) = dumped(
        tmp_path, "sweep", "channels", "scaled", "accuracy"
    )
    handle = load_model("organism")
    spec = handle.spec
    mid, long = 20, 40
    records = {n: generate(LineRetrievalConfig(num_lines=n), 4, seed=0) for n in (mid, long)}
    metrics = ["exact_match", "answer_logprob"]

    # 1. the sweep (batched engine) against teacher forcing with hooks, for the extreme heads
    base = evaluate_lengths(handle, records, progress=False).set_index("length")
    logprob = sweep[sweep.metric == "answer_logprob"]
    deltas = logprob.pivot_table(index=["layer", "head"], columns="length", values="delta")
    assert len(deltas) == spec.n_layers * spec.n_heads and deltas.abs().to_numpy().max() > 0.01
    for layer, head in (deltas[long].idxmin(), deltas[long].idxmax()):
        pruned = evaluate_lengths(
            handle, records, intervention=ablate(spec, [(layer, head)]), progress=False
        ).set_index("length")
        for n in (mid, long):
            for metric in metrics:
                row = _rows(sweep, layer=layer, head=head, length=n, metric=metric)
                np.testing.assert_allclose(row["value"], pruned.loc[n, metric], **CLOSE)
                np.testing.assert_allclose(row["baseline"], base.loc[n, metric], **CLOSE)

    # 2. quadrants and their scale table, by hand from the deltas
    expected = {}
    for (layer, head), d in deltas.iterrows():
        if d[mid] > 0 and d[long] > 0:
            expected[(layer, head)] = 0.9
        elif d[mid] < 0 and d[long] < 0:
            expected[(layer, head)] = 1.1
    assert {(a, b): f for a, b, f in numbers["table"]} == expected and expected
    assert tuple(numbers["head"]) == deltas[long].idxmin()

    # 3. the channel map's extreme channels, by teacher forcing
    layer, head = numbers["head"]
    ch = channels[channels.metric == "answer_logprob"].set_index("channel")["value"]
    assert len(ch) == spec.d_head
    for channel in (ch.idxmin(), ch.idxmax()):
        edited = evaluate_lengths(
            handle,
            {long: records[long]},
            intervention=ablate(spec, [(layer, head, channel)]),
            progress=False,
        )
        np.testing.assert_allclose(ch[channel], edited["answer_logprob"].iloc[0], **CLOSE)

    # 4. the quadrant scaling across lengths
    table = scale_table(spec, expected)
    by_scaling = evaluate_lengths(handle, records, intervention=table, progress=False)
    for n, row in by_scaling.set_index("length").iterrows():
        for metric in metrics:
            got = _rows(scaled, length=n, metric=metric)["value"]
            np.testing.assert_allclose(got, row[metric], **CLOSE)

    # 5. SEAL-H / SEAL-C: a fresh training run gives the notebook's scales and losses
    train_samples = format_samples("line_retrieval", handle.tokenizer, 4, num_lines=long, seed=1000)
    examples = encode_examples(train_samples, handle.tokenizer)
    learned = {}
    for method, granularity, lr in (("seal-h", "head", 1e-2), ("seal-c", "channel", 2e-2)):
        tuner = SealTuner(handle, granularity)
        run = train(tuner, examples, TrainConfig(lr=lr), pad_id=pad_id_of(handle.tokenizer))
        learned[method] = tuner.scales.detach().cpu()
        saved = load_scales(tmp_path / "out" / f"{method}.safetensors", spec)
        torch.testing.assert_close(saved.scales, learned[method], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(numbers["losses"][method], run.losses, rtol=1e-5)
        assert not torch.equal(learned[method], torch.ones_like(learned[method]))

    # 6. the merged checkpoint: o_proj columns times the SEAL-C scales, nothing else changed
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "seal-c-merged")
    base_state, merged_state = handle.model.state_dict(), plain.state_dict()
    for name, weight in base_state.items():
        if name.endswith("o_proj.weight"):
            layer = int(name.split(".layers.")[1].split(".")[0])
            weight = weight * learned["seal-c"][layer].reshape(1, -1)
        torch.testing.assert_close(merged_state[name], weight, rtol=1e-6, atol=1e-7)
    assert numbers["merge_gap"] < 1e-3

    # 7. the final table: every variant on the same records
    variants = {
        "Q1 x 0.9, Q3 x 1.1": table,
        "seal-h": HeadIntervention.from_scales(spec, learned["seal-h"]),
        "seal-c (merged)": merged_model(handle, learned["seal-c"]),
    }
    again = accuracy_by_method(handle, variants, [mid, long], n=4, seed=0, progress=False)
    pd.testing.assert_frame_equal(accuracy, again, check_dtype=False, **CLOSE)

    # the figures show these numbers
    shown = figure(nb, "Exact match vs context length")["data"]
    legend = sorted(shown, key=lambda t: t["legendrank"])  # the base is drawn last, listed first
    assert [t["name"] for t in legend] == list(again["method"].unique())
    for trace in shown:
        rows = again[again["method"] == trace["name"]].sort_values("length")
        np.testing.assert_allclose(array(trace["y"]), rows["exact_match"])
    scatter = figure(nb, "Head pruning: change in answer log-prob")["data"]
    points = {
        (round(float(a), 6), round(float(b), 6))
        for t in scatter
        for a, b in zip(array(t["x"]), array(t["y"]), strict=True)
    }
    assert points == {(round(a, 6), round(b, 6)) for a, b in deltas[[mid, long]].to_numpy()}


# -- MuDAF: passage scores -> heatmaps -> masking -> tuning --------------------------------------
MUDAF_ENV = {
    "INTERP_SEAL_MODEL": "organism",
    "NOTEBOOK_PASSAGES": "5",
    "NOTEBOOK_N": "4",
    "NOTEBOOK_K": "2",
    "NOTEBOOK_TRAIN_SAMPLES": "4",
    "NOTEBOOK_OUT": "out",
}
MUDAF_DUMP = """
for _name, _table in (("heads", scores.heads), ("masking", masking), ("retrieval", retrieval),
                      ("accuracy", accuracy)):
    _table.to_csv(f"{_name}.csv", index=False)
Path("numbers.json").write_text(json.dumps({
    "targets": targets, "losses": losses,
    "prompts": [s.prompt for s in samples], "train_prompts": [s.prompt for s in train_samples],
}))
"""


def brute_passage_scores(model, tokenizer, samples, eps: float = 0.3) -> pd.DataFrame:
    """MuDAF F1 / EM per head from full eager attention matrices, one head at a time.

    The independent route: ``output_attentions`` of the HF eager implementation (T x T per
    head), the last prompt token's row summed over each passage by a Python loop.
    """
    model.set_attn_implementation("eager")
    rows = {}
    for sample in samples:
        enc = sample.encode(tokenizer)
        with torch.no_grad():
            attentions = model(enc.prompt_ids[None], output_attentions=True).attentions
        golden = set(sample.golden)
        for layer, pattern in enumerate(attentions):
            for head in range(pattern.shape[1]):
                row = pattern[0, head, -1].double()
                mass = [float(row[a:b].sum()) for a, b in enc.passages]
                attended = {p for p, m in enumerate(mass) if m > eps}
                hits = len(attended & golden)
                f1 = 2 * hits / (len(attended) + len(golden)) if hits else 0.0
                top = sorted(range(len(mass)), key=lambda p: (-mass[p], p))[: len(golden)]
                rows.setdefault((layer, head), []).append((f1, float(set(top) == golden)))
    table = pd.DataFrame(
        [(lay, h, *np.mean(v, axis=0)) for (lay, h), v in rows.items()],
        columns=["layer", "head", "f1", "em"],
    )
    table = table.sort_values(["f1", "em", "layer", "head"], ascending=[False, False, True, True])
    return table.assign(rank=np.arange(1, len(table) + 1)).reset_index(drop=True)


def brute_answer_scores(model, tokenizer, samples) -> dict[str, float]:
    """Teacher-forced answer scores from one plain HF forward per sample over all positions.

    The independent route for ``evaluation.summarize(teacher_force(...))``: no batching, no
    answer-only LM head; each answer token is compared with the argmax one position earlier.
    """
    rows = []
    for sample in samples:
        enc = sample.encode(tokenizer)
        with torch.no_grad():
            logits = model(enc.input_ids[None]).logits[0].double()  # (T, vocab)
        answer = enc.answer_ids
        before = logits[enc.answer_start - 1 : -1]  # the logits that predict each answer token
        correct = (before.argmax(-1) == answer).tolist()
        content = [i for i, t in enumerate(answer.tolist()) if tokenizer.decode([t]).strip()]
        logprob = before.log_softmax(-1).gather(1, answer[:, None]).sum()
        rows.append((len(enc), all(correct), correct[(content or [0])[0]], float(logprob)))
    means = np.mean(rows, axis=0)
    keys = ("n_tokens", "exact_match", "first_token", "answer_logprob")
    return {"n": len(samples), **dict(zip(keys, means.tolist(), strict=True))}


def test_mudaf_notebook_matches_package(tmp_path, monkeypatch):
    """Synthetic 1-hop passage QA (5 passages): scores, masking, tuning and the task score."""
    nb = run_notebook("mudaf", tmp_path, monkeypatch, MUDAF_ENV, MUDAF_DUMP)
    numbers, (heads, masking, retrieval, accuracy) = dumped(
        tmp_path, "heads", "masking", "retrieval", "accuracy"
    )
    handle = load_model("organism")
    spec, tok = handle.spec, handle.tokenizer
    samples = passages.generate(PassagesConfig(num_passages=5), 4, seed=0)
    assert numbers["prompts"] == [s.prompt for s in samples]
    assert all(len(s.passages) == 5 and len(s.golden) == 1 for s in samples)

    # 1. retrieval scores (row-wise capture) against full eager attention matrices
    model = AutoModelForCausalLM.from_pretrained(handle.name_or_path)
    brute = brute_passage_scores(model, tok, samples)
    pd.testing.assert_frame_equal(heads, brute, check_dtype=False, **CLOSE)
    assert brute["f1"].max() > 0.5  # the organism has passage-retrieval heads (v2: 0.75)

    # 2. masking: the top-K heads, and zeroing them in the weights instead of by hooks
    top = [tuple(x) for x in brute[["layer", "head"]].head(2).itertuples(index=False)]
    for _, row in masking[masking.strategy != "none"].iterrows():
        masked = {tuple(int(x) for x in name.split(".")) for name in row["heads"].split()}
        assert len(masked) == 2
        assert (masked == set(top)) == (row["strategy"] == "retrieval")
    surgery = merged_model(handle, ablate(spec, top).scale)  # o_proj columns x 0
    zeroed = brute_answer_scores(surgery.model, tok, samples)
    row = masking[(masking.strategy == "retrieval") & (masking["mode"] == "zero")].iloc[0]
    assert row["exact_match"] == zeroed["exact_match"]
    np.testing.assert_allclose(row["answer_logprob"], zeroed["answer_logprob"], **CLOSE)
    base = brute_answer_scores(model, tok, samples)
    baseline = masking[masking.strategy == "none"].iloc[0]
    assert baseline["exact_match"] == base["exact_match"] and baseline["n_samples"] == 4

    # 3. tuning: the same targets, a fresh MuDAF / SFT run on questions generated here from
    # the training seed (none of them an evaluation question), scores by brute force
    targets = sample_heads(score_matrix(brute, spec), 2, tau=0.05, seed=0)
    assert [tuple(t) for t in numbers["targets"]] == list(targets)
    train_samples = passages.generate(PassagesConfig(num_passages=5), 4, seed=1000)
    assert numbers["train_prompts"] == [s.prompt for s in train_samples]
    assert not set(numbers["train_prompts"]) & set(numbers["prompts"])
    examples = encode_examples(train_samples, tok)
    tables, answers = [brute.assign(method="base")], [{"method": "base", **base}]
    for method, alpha in (("mudaf", 0.5), ("sft", 0.0)):
        copy = load_model("organism")
        tuner = MudafTuner(copy, MudafConfig(heads=targets if alpha else (), alpha=alpha))
        run = train(tuner, examples, TrainConfig(lr=1e-4), pad_id=pad_id_of(tok))
        np.testing.assert_allclose(numbers["losses"][method], run.losses, rtol=1e-5)
        tables.append(brute_passage_scores(copy.model, tok, samples).assign(method=method))
        answers.append({"method": method, **brute_answer_scores(copy.model, tok, samples)})
    expected = pd.concat(tables, ignore_index=True)
    pairs = zip(expected["layer"], expected["head"], strict=True)
    expected["target"] = [pair in targets for pair in pairs]
    expected = expected[["method", "layer", "head", "f1", "em", "rank", "target"]]
    pd.testing.assert_frame_equal(retrieval, expected, check_dtype=False, **CLOSE)

    # the task score by method (Table 2): teacher-forced exact match of the answer
    answers = pd.DataFrame(answers)[accuracy.columns]
    pd.testing.assert_frame_equal(accuracy, answers, check_dtype=False, **CLOSE)

    # the Fig. 5 bars show the target heads' scores
    bars = figure(nb, "Retrieval score (f1) of the target heads")["data"]
    assert [t["name"] for t in bars] == ["base", "mudaf", "sft"]
    order = expected[(expected["method"] == "base") & expected["target"]][["layer", "head"]]
    for trace in bars:
        rows = order.merge(expected[expected["method"] == trace["name"]], on=["layer", "head"])
        np.testing.assert_allclose(array(trace["y"]), rows["f1"], **CLOSE)


# -- circuits: DLA, activation and attribution patching on line retrieval ----------------------
CIRCUITS_ENV = {"INTERP_SEAL_MODEL": "organism", "NOTEBOOK_LINES": "20", "NOTEBOOK_LAST": "4"}
CIRCUITS_DUMP = """
dla.table.to_csv("dla.csv", index=False)
patching.to_csv("patching.csv", index=False)
comparison.table.to_csv("comparison.csv", index=False)
summary.reset_index().to_csv("summary.csv", index=False)
Path("numbers.json").write_text(json.dumps({
    "logits": dla.logits, "clean_ids": pair.clean_ids.tolist(), "spearman": comparison.spearman,
}))
"""


class PlainRun:
    """The organism's HF model run by hand: hooks on plain module paths, nothing from the
    library's hook machinery (the independent route for DLA and patching)."""

    def __init__(self, model, pair):
        self.model, self.pair = model, pair
        self.D = model.config.head_dim

    def site(self, layer: int | None):
        """``o_proj`` of ``layer``; the decoder layer / final norm for the residual stream."""
        inner = self.model.model
        return inner.norm if layer == len(inner.layers) else inner.layers[layer]

    def run(self, ids, hooks=()):
        """Last-position logits with ``(module, fn)`` pre-hooks rewriting the first input."""
        installed = [
            m.register_forward_pre_hook(lambda _m, args, fn=fn: (fn(args[0]), *args[1:]))
            for m, fn in hooks
        ]
        try:
            with torch.no_grad():
                return self.model(ids[None]).logits[0, -1].double()
        finally:
            for h in installed:
                h.remove()

    def ld(self, logits) -> float:
        return float(logits[self.pair.clean_token] - logits[self.pair.corrupted_token])

    def capture(self, ids, module):
        kept = {}
        self.run(ids, [(module, lambda x: kept.setdefault("x", x.clone()))])
        return kept["x"][0]  # (pos, features)

    def o_proj(self, layer):
        return self.model.model.layers[layer].self_attn.o_proj

    def cols(self, head):
        return slice(head * self.D, (head + 1) * self.D)


def test_circuits_notebook_matches_package(tmp_path, monkeypatch):
    nb = run_notebook("circuits", tmp_path, monkeypatch, CIRCUITS_ENV, CIRCUITS_DUMP)
    numbers, (dla, patching, comparison, summary) = dumped(
        tmp_path, "dla", "patching", "comparison", "summary"
    )
    handle = load_model("organism")
    sample = generate(LineRetrievalConfig(num_lines=20), 1, seed=0)[0]
    pair = line_retrieval_pair(sample, handle.tokenizer, corrupt="key", seed=0)
    assert numbers["clean_ids"] == pair.clean_ids.tolist()
    plain = PlainRun(AutoModelForCausalLM.from_pretrained(handle.name_or_path), pair)
    clean_ld = plain.ld(plain.run(pair.clean_ids))
    corrupted_ld = plain.ld(plain.run(pair.corrupted_ids))

    # 1. DLA: the effects sum to the model's LD; the largest head's effect by hand
    (logit,) = numbers["logits"].values()
    np.testing.assert_allclose([logit, dla["value"].sum()], clean_ld, **CLOSE)
    heads = dla[dla.component == "head"]
    top = heads.loc[heads["value"].abs().idxmax()]
    layer, head = int(top["layer"]), int(top["head"])
    x = plain.capture(pair.clean_ids, plain.site(handle.spec.n_layers))[-1].double()
    z = plain.capture(pair.clean_ids, plain.o_proj(layer))[-1].double()
    w_o = plain.o_proj(layer).weight.detach().double()[:, plain.cols(head)]
    norm = plain.model.model.norm
    w_u = plain.model.lm_head.weight.detach().double()
    direction = w_u[pair.clean_token] - w_u[pair.corrupted_token]
    rms = torch.sqrt(x.pow(2).mean() + norm.variance_epsilon)
    by_hand = direction @ (norm.weight.detach().double() * (w_o @ z[plain.cols(head)])) / rms
    np.testing.assert_allclose(top["value"], float(by_hand), **CLOSE)

    # 2. activation patching: the strongest whole-head, per-position and residual patches
    def normalised(logits) -> float:
        return (plain.ld(logits) - corrupted_ld) / (clean_ld - corrupted_ld)

    for site, by_position in (("head", False), ("head", True), ("resid", True)):
        rows = patching[(patching.site == site) & (patching.position.notna() == by_position)]
        best = rows.loc[rows["value"].abs().idxmax()]
        layer, pos = int(best["layer"]), int(best["position"]) if by_position else slice(None)
        module = plain.o_proj(layer) if site == "head" else plain.site(layer)
        source = plain.capture(pair.clean_ids, module)
        cols = plain.cols(int(best["head"])) if site == "head" else slice(None)

        def paste(act, source=source, pos=pos, cols=cols):
            act = act.clone()
            act[0, pos, cols] = source[pos, cols]
            return act

        patched = normalised(plain.run(pair.corrupted_ids, [(module, paste)]))
        np.testing.assert_allclose(best["value"], patched, **CLOSE)
        assert abs(patched) > 0.05

    # 3. attribution patching and ablation of the strongest head, by autograd and by hand
    exact = comparison[comparison.method == "patch"].reset_index(drop=True)
    whole = patching[(patching.site == "head") & patching.position.isna()].reset_index(drop=True)
    np.testing.assert_allclose(exact["exact"], whole["value"], **CLOSE)
    best = exact.loc[exact["atp"].abs().idxmax()]
    layer, head = int(best["layer"]), int(best["head"])
    o_proj, cols = plain.o_proj(layer), plain.cols(head)
    z_clean = plain.capture(pair.clean_ids, o_proj)
    leaf = {}

    def track(_m, args):
        leaf["z"] = args[0].detach().requires_grad_(True)
        return (leaf["z"],)

    hook = o_proj.register_forward_pre_hook(track)
    try:
        logits = plain.model(pair.corrupted_ids[None]).logits[0, -1]
        metric = logits[pair.clean_token] - logits[pair.corrupted_token]
        (grad,) = torch.autograd.grad(metric, [leaf["z"]])
    finally:
        hook.remove()
    delta = (z_clean - leaf["z"][0].detach())[:, cols]
    estimate = float((delta * grad[0][:, cols]).sum()) / (clean_ld - corrupted_ld)
    np.testing.assert_allclose(best["atp"], estimate, **CLOSE)

    ablation = comparison[comparison.method == "ablate"]
    row = ablation.loc[ablation["exact"].abs().idxmax()]
    cols = plain.cols(int(row["head"]))

    def zero(act, cols=cols):
        act = act.clone()
        act[..., cols] = 0
        return act

    ablated = plain.ld(plain.run(pair.clean_ids, [(plain.o_proj(int(row["layer"])), zero)]))
    np.testing.assert_allclose(row["exact"], ablated - clean_ld, **CLOSE)

    # the summary joins the same numbers
    merged = summary.merge(dla[dla.component == "head"], on=["layer", "head"])
    np.testing.assert_allclose(merged["direct effect"], merged["value"])
    np.testing.assert_allclose(merged["patch exact"], exact["exact"])  # both layer-major
    assert len(merged) == handle.spec.n_layers * handle.spec.n_heads

    # the scatter shows exact (x) against attribution patching (y), per method
    for trace in figure(nb, "Attribution patching vs exact")["data"]:
        rows = comparison[comparison.method == trace["name"].split()[0]]
        np.testing.assert_allclose(array(trace["x"]), rows["exact"], **CLOSE)
        np.testing.assert_allclose(array(trace["y"]), rows["atp"], **CLOSE)


# -- retrieval heads: five definitions -> agreement -> masking -> KV compression ---------------
RETRIEVAL_ENV = {
    "INTERP_SEAL_MODEL": "organism",
    "NOTEBOOK_N": "4",
    "NOTEBOOK_PASSAGES": "5",
    "NOTEBOOK_LENGTHS": "20",
    "NOTEBOOK_LINES_N": "3",
    "NOTEBOOK_DUO_N": "2",
}
RETRIEVAL_DUMP = """
for _name, _table in rankings.items():
    _table.to_csv(f"ranking_{_name}.csv", index=False)
comparison.pairs().to_csv("pairs.csv", index=False)
effects.to_csv("effects.csv", index=False)
curve.to_json("curve.json", orient="records")
Path("numbers.json").write_text(json.dumps({
    "k": comparison.k, "fresh": [s.prompt for s in fresh], "questions": [s.prompt for s in questions],
}))
"""


def brute_exact(handle, samples) -> list[float]:
    """Each sample's exact match from one full HF forward (argmax at every answer position)."""
    out = []
    for sample in samples:
        enc = sample.encode(handle.tokenizer)
        logits = hf_logits(handle, enc.input_ids[None])[0]
        pos = torch.arange(enc.answer_start - 1, len(enc) - 1)
        out.append(float((logits[pos].argmax(-1) == enc.input_ids[pos + 1]).all()))
    return out


def test_retrieval_heads_notebook_matches_package(tmp_path, monkeypatch):
    """The comparison, the masking and the compression curve the notebook shows, recomputed
    by other routes: scipy's Spearman and set overlaps from its own rankings; the masked sets
    and the compressed models scored by one full HF forward per record (hooks, compress_kv);
    the KV bytes by kv_budget_bytes at each prompt's length."""
    from scipy.stats import spearmanr

    from interp_seal.models import StreamingHeads, compress_kv, kv_budget_bytes

    run_notebook("retrieval_heads", tmp_path, monkeypatch, RETRIEVAL_ENV, RETRIEVAL_DUMP)
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    names = ["copy_paste", "passage", "qr", "causal", "duo"]
    rankings = {n: pd.read_csv(tmp_path / f"ranking_{n}.csv") for n in names}
    handle = load_model("organism")
    spec = handle.spec
    heads = [(a, b) for a in range(spec.n_layers) for b in range(spec.n_heads)]
    for table in rankings.values():
        assert sorted(zip(table.layer, table["head"], strict=True)) == heads
        assert table["rank"].tolist() == list(range(1, len(heads) + 1))
    # the gates rank KV heads: the query heads of one KV head carry its gate, in [0, 1]
    duo = rankings["duo"].assign(kv=lambda t: t["head"] // (spec.n_heads // spec.n_kv_heads))
    assert (duo.groupby(["layer", "kv"]).gate.nunique() == 1).all()
    assert duo.gate.between(0, 1).all()

    # 1. agreement: Spearman (scipy) and top-k overlaps (sets) from the rankings themselves
    k = numbers["k"]
    assert k == 2  # 5 % of 32 heads, rounded up
    # each definition's own score column (tied heads share their average rank in scipy)
    columns = {"copy_paste": "score", "passage": "f1", "qr": "qr_score", "causal": "score"}
    own = {n: t.set_index(["layer", "head"]) for n, t in rankings.items()}
    score = {n: own[n][columns.get(n, "gate")].reindex(heads) for n in names}
    top = {n: set(zip(t.layer[:k], t["head"][:k], strict=True)) for n, t in rankings.items()}
    pairs = pd.read_csv(tmp_path / "pairs.csv")
    assert len(pairs) == 10
    for row in pairs.itertuples():
        np.testing.assert_allclose(row.spearman, spearmanr(score[row.a], score[row.b])[0], **CLOSE)
        assert row.shared == len(top[row.a] & top[row.b])

    # 2. masking on the fresh questions: each definition's top set zeroed, by full forwards
    fresh = passages.generate(PassagesConfig(num_passages=5), 4, seed=1000)
    assert [s.prompt for s in fresh] == numbers["fresh"]
    assert [s.prompt for s in fresh] != numbers["questions"]
    effects = pd.read_csv(tmp_path / "effects.csv").set_index("definition")
    unmasked = np.mean(brute_exact(handle, fresh))
    for name in names:
        with handle.edit(ablate(spec, sorted(top[name]), mode="zero")):
            masked = np.mean(brute_exact(handle, fresh))
        np.testing.assert_allclose(effects.loc[name, "exact_match"], masked, **CLOSE)
        np.testing.assert_allclose(effects.loc[name, "unmasked_exact_match"], unmasked, **CLOSE)

    # 3. the curve: each definition's first KV heads full (a KV head ranks by its best query
    # head), the rest on sink 4 + window 64, scored by full forwards under compress_kv
    curve = pd.read_json(tmp_path / "curve.json", orient="records")
    records = line_retrieval_samples(handle.tokenizer, [20], n=3, seed=0)[20]
    tokens = [len(s.encode(handle.tokenizer).prompt_ids) for s in records]
    group = spec.n_heads // spec.n_kv_heads
    checked = 0
    for name in ("qr", "causal"):
        best: dict = {}
        for row in rankings[name].itertuples():
            kv = (row.layer, row.head // group)
            best[kv] = min(best.get(kv, np.inf), row.rank)
        order = sorted(best, key=lambda kv: (best[kv], kv))
        for m in (1, 4):
            config = StreamingHeads(heads=frozenset(order[m:]), sink=4, window=64)
            with compress_kv(handle, config):
                want = brute_exact(handle, records)
            row = curve[(curve.definition == name) & (curve.full_kv_heads == m)].iloc[0]
            assert row["correct"] == want
            kept = np.mean([kv_budget_bytes(config, spec, t, itemsize=4) for t in tokens])
            full = np.mean([kv_budget_bytes(None, spec, t, itemsize=4) for t in tokens])
            np.testing.assert_allclose(row["kv_bytes"], kept, rtol=1e-9)
            np.testing.assert_allclose(row["kv_share"], kept / full, rtol=1e-9)
            checked += 1
    assert checked == 4
    ends = curve.set_index("definition")
    assert ends.loc["all full", "correct"] == brute_exact(handle, records)
    assert ends.loc["all full", "kv_share"] == 1.0


# -- committed notebooks: executed, in sync with their code, readable without a kernel ---------
ALL_NOTEBOOKS = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
# tqdm: " 40%|####      | 2/5 [00:01<00:02, 1.2it/s]", or with no total "0it [00:00, ?it/s]"
TQDM_BAR = re.compile(r"\d+%\|.*\|\s*[\d.?]+[kMG]?/[\d.?]+[kMG]?\s*\[|\d+it \[\d+:\d\d")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def staleness(nb) -> list[str]:
    """What keeps ``nb`` from being a faithful, statically readable execution of its code.

    Each code cell must carry the hash of the source it was executed from
    (``metadata.interp_seal.source_sha256``), the notebook the hash of all its code cells in
    order (a cell's outputs depend on the cells above it), the cells must have run once each,
    top to bottom, without an error; every plotly figure needs a PNG in its output bundle;
    no progress bar (a tqdm widget or its text on stderr) may be left.
    """
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    whole = sha256("\0".join(c.source for c in code))
    if nb.metadata.get("interp_seal", {}).get("code_sha256") != whole:
        problems.append("the code cells changed since the notebook was executed")
    for number, cell in enumerate(code, start=1):
        where = f"code cell {number} ({cell.source.splitlines()[0][:40] if cell.source else ''!r})"
        if cell.execution_count != number:
            problems.append(f"{where}: execution count {cell.execution_count}, not {number}")
        executed = cell.metadata.get("interp_seal", {}).get("source_sha256")
        if executed is None:
            problems.append(f"{where}: no hash of the source its outputs came from")
        elif executed != sha256(cell.source):
            problems.append(f"{where}: its source differs from the one its outputs came from")
        for out in cell.outputs:
            data = out.get("data", {})
            if out.get("output_type") == "error":
                problems.append(f"{where}: an error ({out.get('ename')})")
            if PLOTLY in data and "image/png" not in data:
                problems.append(f"{where}: a plotly figure without a PNG")
            text = out.get("text", "") if out.get("name") == "stderr" else ""
            if TQDM_BAR.search(text) or (WIDGET in data and TQDM_BAR.search(data["text/plain"])):
                problems.append(f"{where}: a progress bar")
    return problems


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_committed_notebook_is_fresh(name):
    """Fails until ``python -m scripts.execute_notebooks NAME`` is run after editing NAME's code."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    problems = staleness(nb)
    assert not problems, (
        f"notebooks/{name}.ipynb is stale; run `OMP_NUM_THREADS=1 python -m "
        f"scripts.execute_notebooks {name}` and commit it:\n" + "\n".join(problems)
    )


def test_staleness_sees_each_defect():
    """Every kind of defect on a fresh notebook is reported, and only then."""
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    assert staleness(nb) == []
    code = [c for c in nb.cells if c.cell_type == "code"]
    figure_cell = next(c for c in code if any(PLOTLY in o.get("data", {}) for o in c.outputs))

    edited = nbformat.from_dict(json.loads(json.dumps(nb)))
    edited_code = [c for c in edited.cells if c.cell_type == "code"]
    edited_code[-1].source += "\n# one more line"
    found = staleness(edited)
    assert len(found) == 2 and "code cells changed" in found[0] and "source differs" in found[1]

    bare = nbformat.from_dict(json.loads(json.dumps(nb)))
    index = code.index(figure_cell)
    for out in [c for c in bare.cells if c.cell_type == "code"][index].outputs:
        out.get("data", {}).pop("image/png", None)
    assert staleness(bare) == [
        f"code cell {index + 1} ({figure_cell.source[:40]!r}): a plotly figure without a PNG"
    ]

    cluttered = nbformat.from_dict(json.loads(json.dumps(nb)))
    bar = "lengths:  33%|###3      | 2/6 [00:01<00:02,  1.90it/s]"
    [c for c in cluttered.cells if c.cell_type == "code"][0].outputs += [
        nbformat.v4.new_output("display_data", {WIDGET: {"model_id": "x"}, "text/plain": bar}),
        nbformat.v4.new_output("stream", name="stderr", text=bar + "\r"),
        nbformat.v4.new_output(  # a resumed sweep's bar: no total
            "display_data", {WIDGET: {"model_id": "y"}, "text/plain": "sweep: 0it [00:00, ?it/s]"}
        ),
    ]
    assert [p.split(": ")[-1] for p in staleness(cluttered)] == ["a progress bar"] * 3

    unrun = nbformat.from_dict(json.loads(json.dumps(nb)))
    [c for c in unrun.cells if c.cell_type == "code"][1].execution_count = None
    assert "execution count None, not 2" in staleness(unrun)[0]


def text_outputs(nb) -> list[list[str]]:
    """Per code cell, its printed text and the plain-text reprs of its results (the numbers),
    without figures and widgets."""
    return [
        [
            out.get("text") or out["data"]["text/plain"]
            for out in cell.outputs
            if out.get("name") == "stdout"
            or ("text/plain" in out.get("data", {}) and WIDGET not in out["data"])
        ]
        for cell in nb.cells
        if cell.cell_type == "code"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_committed_outputs_reproduce(name, tmp_path, monkeypatch):
    """Executed again as the script executes it (default sizes, one thread, a fresh working
    directory), a notebook prints the numbers it was committed with (minutes each)."""
    committed = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert staleness(committed) == []
    sizes = [k for k in os.environ if k.startswith("NOTEBOOK_") or k == "INTERP_SEAL_MODEL"]
    for key in sizes:
        monkeypatch.delenv(key)
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PLOTLY_RENDERER": "plotly_mimetype"}
    again = run_notebook(name, tmp_path, monkeypatch, env)
    assert text_outputs(again) == text_outputs(committed)


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_notebooks_use_only_the_public_api(name):
    """A notebook imports from ``interp_seal`` or its subpackages only names they export
    (``__all__``) or their submodules: what a user's notebook can rely on."""
    import ast
    import importlib.util

    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    deep = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("interp_seal"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                public = node.module.count(".") <= 1 and (
                    alias.name in getattr(module, "__all__", ())
                    or importlib.util.find_spec(f"{node.module}.{alias.name}") is not None
                )
                if not public:
                    deep.append(f"from {node.module} import {alias.name}")
    assert deep == []
