"""``interp-seal tune``: every sub-command end to end on a tiny model, and the evaluation helpers."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import transformers

from interp_seal.cli import main
from interp_seal.evaluation.lengths import evaluate_line_retrieval
from interp_seal.interventions.head_edit import HeadIntervention
from interp_seal.models import load_model
from interp_seal.tuning.evaluate import accuracy_by_method
from interp_seal.tuning.merge import merged_model
from interp_seal.tuning.scales import load_scales

SMALL = ["--num-lines", "4", "--samples", "4", "--checkpoint-every", "2", "--cpu"]


def test_seal_then_merge_then_evaluate(llama_checkpoint, tmp_path, capsys):
    run = tmp_path / "seal_h"
    assert main(["tune", "seal-h", "--model", llama_checkpoint, *SMALL, "--out", str(run)]) == 0
    scale_file = load_scales(run / "scales.safetensors", load_model(llama_checkpoint).spec)
    assert scale_file.granularity == "head" and scale_file.task == "line_retrieval"
    assert scale_file.hyperparameters["lr"] == 1e-2 and scale_file.hyperparameters["samples"] == 4
    log = json.loads((run / "train_log.json").read_text())
    assert log["method"] == "seal-h" and log["steps"] == 4 and len(log["losses"]) == 4
    base = sum(p.numel() for p in load_model(llama_checkpoint).model.parameters())
    assert log["trainable_parameters"] == scale_file.scales.numel() == 2 * 4
    assert log["base_parameters"] == base

    merged = tmp_path / "merged"
    assert (
        main(
            [
                "tune",
                "merge",
                "--model",
                llama_checkpoint,
                "--scales",
                str(run / "scales.safetensors"),
                "--out",
                str(merged),
            ]
        )
        == 0
    )
    assert isinstance(
        transformers.AutoModelForCausalLM.from_pretrained(merged), transformers.LlamaForCausalLM
    )

    out = tmp_path / "eval"
    args = ["tune", "evaluate", "--model", llama_checkpoint, "--lengths", "3", "5", "--n", "4"]
    args += ["--scales", f"seal-h={run / 'scales.safetensors'}", "--tuned", f"merged={merged}"]
    assert main([*args, "--out", str(out)]) == 0
    table = pd.read_csv(out / "accuracy.csv")
    assert sorted(set(table["method"])) == ["base", "merged", "seal-h"]
    assert "seal-h" in capsys.readouterr().out


def test_accuracy_by_method_agrees_with_direct_evaluation(llama_checkpoint):
    base = load_model(llama_checkpoint)
    scales = 1 + 0.3 * torch.randn(2, 4, 1, generator=torch.Generator().manual_seed(0))
    variants = {
        "scaled": HeadIntervention.from_scales(base.spec, scales),
        "merged": merged_model(base, scales),
    }
    table = accuracy_by_method(base, variants, [3, 6], n=6, progress=False).set_index(
        ["method", "length"]
    )
    direct = evaluate_line_retrieval(base, [3, 6], n=6, progress=False).set_index("length")
    for length in (3, 6):
        assert table.loc[("base", length), "answer_logprob"] == direct.loc[length, "answer_logprob"]
        scaled, merged = table.loc[("scaled", length)], table.loc[("merged", length)]
        assert scaled["exact_match"] == merged["exact_match"]
        assert scaled["answer_logprob"] == pytest.approx(merged["answer_logprob"], abs=1e-4)
    assert (table.xs("scaled", level="method")["answer_logprob"] != direct["answer_logprob"]).all()


@pytest.mark.parametrize("method", ["lora", "dora"])
def test_peft_commands_write_a_plain_checkpoint(llama_checkpoint, tmp_path, method):
    run = tmp_path / method
    assert main(["tune", method, "--model", llama_checkpoint, *SMALL, "--out", str(run)]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(run / "model")
    assert list(model.state_dict()) == list(load_model(llama_checkpoint).model.state_dict())
    log = json.loads((run / "train_log.json").read_text())
    assert log["method"] == ("seal-d" if method == "dora" else "seal-l")
    # rank 4 on q/k/v/o: 4 * (in + out) per projection; DoRA adds one magnitude per output row
    projections = [
        m
        for name, m in load_model(llama_checkpoint).model.named_modules()
        if name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "o_proj")
    ]
    lora = sum(4 * (m.in_features + m.out_features) for m in projections)
    magnitudes = sum(m.out_features for m in projections) if method == "dora" else 0
    assert log["trainable_parameters"] == lora + magnitudes


def test_mudaf_and_sft_commands_then_retrieval_scores(llama_checkpoint, tmp_path, capsys):
    mudaf, sft = tmp_path / "mudaf", tmp_path / "sft"
    common = ["--model", llama_checkpoint, *SMALL, "--lr", "1e-3"]
    assert main(["tune", "mudaf", *common, "--heads", "1.0", "1.2", "--out", str(mudaf)]) == 0
    assert json.loads((mudaf / "heads.json").read_text()) == [[1, 0], [1, 2]]
    log = json.loads((mudaf / "train_log.json").read_text())
    assert log["method"] == "mudaf" and set(log["parts"][0]) == {"lm", "contrastive"}
    assert main(["tune", "sft", *common, "--out", str(sft)]) == 0
    assert json.loads((sft / "train_log.json").read_text())["parts"][0] == {}

    out = tmp_path / "retrieval"
    args = ["tune", "retrieval", "--model", llama_checkpoint, "--task", "line_retrieval"]
    args += ["--num-lines", "4", "--n", "3", "--targets", str(mudaf / "heads.json")]
    args += ["--tuned", f"mudaf={mudaf / 'model'}", f"sft={sft / 'model'}", "--out", str(out)]
    assert main(args) == 0
    table = pd.read_csv(out / "retrieval.csv")
    assert sorted(set(table["method"])) == ["base", "mudaf", "sft"]
    assert len(table) == 3 * 8 and table["target"].sum() == 3 * 2

    # the table selects heads for another run: top 2 by the base model's F1 (R_h)
    base = table[table["method"] == "base"].assign(neg=lambda t: -t["f1"])
    top = base.sort_values(["neg", "layer", "head"]).head(2)
    again = tmp_path / "mudaf_top"
    scores = ["--top-k", "2", "--scores", str(out / "retrieval.csv")]
    assert main(["tune", "mudaf", *common, *scores, "--epochs", "1", "--out", str(again)]) == 0
    assert json.loads((again / "heads.json").read_text()) == top[["layer", "head"]].values.tolist()


def test_mudaf_top_k_needs_scores(llama_checkpoint, tmp_path, capsys):
    args = [
        "tune",
        "mudaf",
        "--model",
        llama_checkpoint,
        *SMALL,
        "--top-k",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 2
    assert "--top-k and --sample-k need --scores" in capsys.readouterr().err


def test_tune_index_style_reaches_training_samples_and_evaluation(llama_checkpoint, tmp_path):
    """``--index-style`` sets the line indices of the training samples and evaluation records."""
    run = tmp_path / "seal_h"
    args = ["tune", "seal-h", "--model", llama_checkpoint, *SMALL, "--index-style", "integers"]
    assert main([*args, "--out", str(run)]) == 0
    scale_file = load_scales(run / "scales.safetensors", load_model(llama_checkpoint).spec)
    assert scale_file.hyperparameters["index_style"] == "integers"
    log = json.loads((run / "train_log.json").read_text())
    assert log["hyperparameters"]["index_style"] == "integers"

    out = tmp_path / "eval"
    args = ["tune", "evaluate", "--model", llama_checkpoint, "--lengths", "3", "--n", "4"]
    assert main([*args, "--index-style", "integers", "--out", str(out)]) == 0
    table = pd.read_csv(out / "accuracy.csv").set_index("length")
    base = load_model(llama_checkpoint)
    direct = evaluate_line_retrieval(base, [3], n=4, index_style="integers", progress=False)
    other = evaluate_line_retrieval(base, [3], n=4, progress=False)
    direct, other = direct.set_index("length"), other.set_index("length")
    logprob = table.loc[3, "answer_logprob"]
    assert logprob == pytest.approx(direct.loc[3, "answer_logprob"], abs=1e-6)
    assert logprob != pytest.approx(other.loc[3, "answer_logprob"], abs=1e-6)
