"""``interp-seal figures --quick`` removes the tuned models it leaves, unless kept."""

from __future__ import annotations

from interp_seal.cli.figures import _drop_models


def test_quick_runs_drop_tuned_model_checkpoints_and_keep_the_rest(tmp_path):
    work = tmp_path / "work"
    for tag in ("seal-l_seed0", "sft_seed0"):
        (work / tag / "model").mkdir(parents=True)
        (work / tag / "model" / "config.json").write_text("{}")
        (work / tag / "model" / "model.safetensors").write_bytes(b"x" * 2**20)
        (work / tag / "compute.jsonl").write_text("{}\n")
    (work / "seal-h" / "scales.safetensors").parent.mkdir()
    (work / "seal-h" / "scales.safetensors").write_bytes(b"s")
    (work / "odd" / "model").mkdir(parents=True)  # not a checkpoint: left alone
    said = _drop_models(work)
    assert said == " (2 tuned models removed, 2 MB; --keep-models keeps them)"
    assert not (work / "seal-l_seed0" / "model").exists()
    assert (work / "seal-l_seed0" / "compute.jsonl").exists()
    assert (work / "seal-h" / "scales.safetensors").exists() and (work / "odd" / "model").is_dir()
    assert _drop_models(work) == ""
