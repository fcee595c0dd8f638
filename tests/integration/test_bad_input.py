"""Every bad input we know of, CLI and API: a clear error, a non-zero exit, nothing half-written.

Each CLI case runs ``interp-seal`` in-process on files built once per session (a tiny random
checkpoint, damaged copies of it and of a scale file, broken task files) and asserts the exit
status, that stderr names the problem (a regex), and that the case's directory holds exactly the
same files, byte for byte, afterwards. Cases marked ``early`` must fail before any model is
loaded (``load_model`` is replaced by a function that fails the test). API cases assert the
exception type and message.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import pytest
import torch
from conftest import build_checkpoint
from safetensors.torch import load_file, save_file

import interp_seal.models
from interp_seal.cli import main
from interp_seal.evaluation import evaluate_line_retrieval
from interp_seal.evaluation.lengths import check_lengths
from interp_seal.models import load_model
from interp_seal.models.checks import CheckpointError
from interp_seal.models.load import ModelNotFoundError
from interp_seal.outputs import (
    OutputPathError,
    atomic_dir,
    atomic_path,
    check_output_dir,
    check_output_file,
    write_text,
)
from interp_seal.records import RecordStore
from interp_seal.tasks import jsonl, line_retrieval, needle, passages
from interp_seal.tuning.merge import check_mergeable
from interp_seal.tuning.scales import ScaleFile, init_scales, load_scales, save_scales
from interp_seal.widgets.state import FORMAT as STATE_FORMAT
from interp_seal.widgets.state import DashboardState

WINDOW = 128  # the test model's max_position_embeddings: a 3-line record (~160 tokens) is longer
O_PROJ = "model.layers.0.self_attn.o_proj.weight"
WEIGHT_DAMAGE = {  # checkpoints whose weights do not match their config
    "missing_weight": lambda t: t.pop(O_PROJ),
    "extra_weight": lambda t: t.__setitem__("model.layers.0.self_attn.gate", torch.zeros(3)),
    "wrong_shape": lambda t: t.__setitem__(O_PROJ, torch.zeros(5, 5)),
    "nan_weight": lambda t: t["model.layers.1.mlp.up_proj.weight"].__setitem__(
        (0, 0), float("nan")
    ),
    "inf_weight": lambda t: t["model.norm.weight"].__setitem__(0, float("inf")),
}
CONFIG_DAMAGE = {  # configs of impossible geometry
    "zero_heads": {"num_attention_heads": 0},
    "kv_not_dividing": {"num_key_value_heads": 3},
    "zero_layers": {"num_hidden_layers": 0},
}
TASK_DAMAGE = {  # one record with one bad field: (source file, field, value)
    "needle_nan_depth": ("needles", "depth_percent", float("nan")),
    "needle_depth_150": ("needles", "depth_percent", 150),
    "needle_negative_length": ("needles", "context_length", -5),
    "needle_span_reversed": ("needles", "needle_span", [40, 10]),
    "passages_negative_length": ("passages", "length", -1),
    "lines_zero_lines": ("tasks", "num_lines", 0),
}


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> dict[str, Path]:
    """Good and damaged inputs, built once; cases only read them."""
    root = tmp_path_factory.mktemp("bad_input")
    ckpt = Path(build_checkpoint(root / "ckpt", "llama", max_positions=WINDOW))
    weights = (ckpt / "model.safetensors").read_bytes()
    damaged = {
        "truncated": lambda d: (d / "model.safetensors").write_bytes(weights[: len(weights) // 2]),
        "garbage": lambda d: (d / "model.safetensors").write_bytes(bytes(range(256)) * 40),
        "bad_config": lambda d: (d / "config.json").write_text('{"model_type": "llama", '),
        "no_tokenizer": lambda d: (d / "tokenizer.json").unlink(),
    }
    paths = {"ckpt": ckpt}
    for name, damage in damaged.items():
        paths[name] = root / name
        shutil.copytree(ckpt, paths[name])
        damage(paths[name])

    spec = load_model(ckpt).spec
    scales = root / "scales.safetensors"
    save_scales(
        scales,
        ScaleFile(
            scales=init_scales(spec, "head"),
            spec=spec,
            model=str(ckpt),
            granularity="head",
            task="line_retrieval",
        ),
    )
    data = scales.read_bytes()
    paths["scales"] = scales
    paths["scales_truncated"] = root / "scales_truncated.safetensors"
    paths["scales_truncated"].write_bytes(data[: len(data) - 7])
    paths["scales_garbage"] = root / "scales_garbage.safetensors"
    paths["scales_garbage"].write_bytes(b"not a safetensors file at all\n" * 10)
    paths["scales_no_metadata"] = root / "scales_no_metadata.safetensors"
    save_file({"scales": init_scales(spec, "head")}, str(paths["scales_no_metadata"]))
    paths["scales_no_geometry"] = root / "scales_no_geometry.safetensors"
    with_format = {"format": "interp-seal/scales/v1", "model": "m", "granularity": "head"}
    save_file({"scales": init_scales(spec, "head")}, str(paths["scales_no_geometry"]), with_format)
    paths["scales_bad_json"] = root / "scales_bad_json.safetensors"
    bad_json = with_format | {"geometry": "{", "task": "t", "hyperparameters": "{}"}
    save_file({"scales": init_scales(spec, "head")}, str(paths["scales_bad_json"]), bad_json)

    for name, change in WEIGHT_DAMAGE.items():
        paths[name] = root / name
        shutil.copytree(ckpt, paths[name])
        tensors = load_file(paths[name] / "model.safetensors")
        change(tensors)
        save_file(tensors, str(paths[name] / "model.safetensors"), {"format": "pt"})
    for name, fields in CONFIG_DAMAGE.items():
        paths[name] = root / name
        shutil.copytree(ckpt, paths[name])
        config = json.loads((paths[name] / "config.json").read_text())
        (paths[name] / "config.json").write_text(json.dumps(config | fields))
    for name, factor in {"scales_negative": -0.5, "scales_huge": 1e30}.items():
        table = init_scales(spec, "head").clone()
        table[1, 2, 0] = factor
        paths[name] = root / f"{name}.safetensors"
        save_scales(
            paths[name],
            ScaleFile(scales=table, spec=spec, model=str(ckpt), granularity="head", task="t"),
        )

    paths["tasks"] = root / "tasks.jsonl"
    jsonl.write_samples(paths["tasks"], line_retrieval.generate(_cfg(3), 2))
    paths["passages"] = root / "passages.jsonl"
    jsonl.write_samples(paths["passages"], passages.generate(passages.PassagesConfig(), 1))
    tokenizer = load_model(ckpt).tokenizer
    niah = needle.NeedleConfig(context_lengths=(60,), depths=(50.0,), buffer=10)
    paths["needles"] = root / "needles.jsonl"
    jsonl.write_samples(paths["needles"], needle.generate(niah, tokenizer, 1))
    for name, (source, field, value) in TASK_DAMAGE.items():
        record = jsonl.read_jsonl(paths[source])[0]
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text(json.dumps(record | {field: value}) + "\n")  # NaN as JSON's NaN
    paths["records_missing_key"] = root / "records_missing_key.jsonl"
    paths["records_missing_key"].write_text('{"key": "a", "fingerprint": "f"}\n{"value": 1}\n')
    paths["records_binary"] = root / "records_binary.jsonl"
    paths["records_binary"].write_bytes(b'{"key": "a", "fingerprint": "f"}\n\xff\xfe{}\n')
    paths["preds"] = root / "preds.jsonl"
    paths["preds"].write_text('{"pred": "7"}\n{"pred": "8"}\n')
    paths["broken"] = root / "broken.jsonl"
    paths["broken"].write_text('{"pred": "7"}\n\n{"pred": \n')  # line 3 is cut short
    paths["empty"] = root / "empty.jsonl"
    paths["empty"].write_text("")
    paths["blank"] = root / "blank.jsonl"
    paths["blank"].write_text("\n  \n")
    paths["binary"] = root / "binary.jsonl"
    paths["binary"].write_bytes(b'{"pred": "7"}\n\xff\xfe\x00garbage\n')
    paths["scores"] = root / "missing_scores.csv"
    paths["scores_columns"] = root / "scores_columns.csv"
    paths["scores_columns"].write_text("a,b\n1,2\n")
    paths["scores_binary"] = root / "scores_binary.csv"
    paths["scores_binary"].write_bytes(bytes(range(128, 256)) * 3)
    return paths


def _cfg(num_lines: int) -> line_retrieval.LineRetrievalConfig:
    return line_retrieval.LineRetrievalConfig(num_lines=num_lines)


@dataclass(frozen=True, kw_only=True)
class Case:
    """One bad command line: ``{name}`` in ``argv`` becomes ``files[name]``; ``{tmp}`` a fresh
    directory, ``{file}`` a plain file in it; ``early``: must fail before any model loads."""

    argv: str
    message: str
    status: int = 2
    early: bool = False
    offline: bool = True
    extra: tuple[str, ...] = ()  # arguments that .split() cannot carry (an empty string)
    setup: object = None  # (work directory) -> None, run before the snapshot
    env: dict | None = None  # environment variables ({tmp} and {file} filled in)


SMALL = "--num-lines 3 --samples 2 --checkpoint-every 0 --cpu"
CLI_CASES = {
    # damaged checkpoints
    "model-truncated": Case(
        argv="evaluate lines --model {truncated} --lengths 3 --n 2 --out {tmp}/out",
        message=r"model\.safetensors is truncated or corrupt.*save the checkpoint again",
    ),
    "model-garbage": Case(
        argv="tune seal-h --model {garbage} " + SMALL + " --out {tmp}/out",
        message=r"model\.safetensors is truncated or corrupt",
    ),
    "model-bad-config": Case(
        argv="evaluate lines --model {bad_config} --lengths 3 --n 2",
        message=r"config\.json: not valid JSON \(Expecting .*\); the checkpoint is damaged",
    ),
    "model-no-tokenizer": Case(
        argv="analysis head-sweep --model {no_tokenizer} --lengths 3 --n 1 --out {tmp}/out",
        message=r"has no tokenizer .*tokenizer\.save_pretrained",
    ),
    "model-unknown-offline": Case(
        argv="evaluate lines --model someone/no-such-model --lengths 3 --n 2",
        message=r"'someone/no-such-model' .*not in the Hugging Face cache.*HF_HUB_OFFLINE",
    ),
    "model-unknown-no-network": Case(
        argv="evaluate lines --model someone/no-such-model --lengths 3 --n 2",
        message=r"not in the Hugging Face cache, and the hub .* cannot be reached",
        offline=False,
    ),
    "needle-unknown-tokenizer": Case(
        argv="tasks generate --task needle --tokenizer someone/no-such-tok --lengths 500 "
        "--out {tmp}/niah.jsonl",
        message=r"'someone/no-such-tok' not found: .*not in the Hugging Face cache",
        early=True,
    ),
    # damaged scale files
    "scales-truncated": Case(
        argv="tune merge --model {ckpt} --scales {scales_truncated} --out {tmp}/merged",
        message=r"scales_truncated\.safetensors is not a readable safetensors file .*truncated",
    ),
    "scales-garbage": Case(
        argv="tune merge --model {ckpt} --scales {scales_garbage} --out {tmp}/merged",
        message=r"scales_garbage\.safetensors is not a readable safetensors file",
    ),
    "scales-no-metadata": Case(
        argv="tune evaluate --model {ckpt} --scales s={scales_no_metadata} --lengths 3 --n 1",
        message=r"not an interp-seal scale file .*metadata keys \[\]",
    ),
    "scales-no-geometry": Case(
        argv="tune merge --model {ckpt} --scales {scales_no_geometry} --out {tmp}/merged",
        message=r"lacks the metadata \['geometry', 'task', 'hyperparameters'\]",
    ),
    "scales-missing": Case(
        argv="tune merge --model {ckpt} --scales {tmp}/nope.safetensors --out {tmp}/merged",
        message=r"no such scale file: .*nope\.safetensors",
    ),
    # --out that cannot be written, found before any work
    "out-is-file-evaluate": Case(
        argv="evaluate lines --model {ckpt} --lengths 3 --n 2 --out {file}",
        message=r"--out .* is a file, but a directory is needed",
        early=True,
    ),
    "out-in-file-tune": Case(
        argv="tune seal-c --model {ckpt} " + SMALL + " --out {file}/run",
        message=r"--out .*/run lies inside .*, which is a file",
        early=True,
    ),
    "out-is-file-sweep": Case(
        argv="analysis head-sweep --model {ckpt} --lengths 3 --n 1 --out {file}",
        message=r"--out .* is a file",
        early=True,
    ),
    "out-is-file-channel-sweep": Case(
        argv="analysis channel-sweep --model {ckpt} --heads 0.1 --lengths 3 --n 1 --out {file}",
        message=r"--out .* is a file",
        early=True,
    ),
    "out-is-file-merge": Case(
        argv="tune merge --model {ckpt} --scales {scales} --out {file}",
        message=r"--out .* is a file",
        early=True,
    ),
    "out-is-file-dla": Case(
        argv="attribution dla --model {ckpt} --num-lines 3 --out {file}",
        message=r"--out .* is a file",
        early=True,
    ),
    "out-is-file-passage-scores": Case(
        argv="retrieval passage-scores --model {ckpt} --samples {tasks} --out {file}",
        message=r"--out .* is a file",
        early=True,
    ),
    "out-is-file-organism": Case(
        argv="organism train --smoke --out {file}",
        message=r"--out .* is a file",
        early=True,
    ),
    "out-not-writable": Case(
        argv="evaluate lines --model {ckpt} --lengths 3 --n 2 --out {readonly}/out",
        message=r"--out .*: cannot write in .*\(Permission denied\)",
        early=True,
    ),
    "out-is-dir-tasks": Case(
        argv="tasks generate --task line_retrieval --num-lines 3 --out {tmp}",
        message=r"--out .* is a directory, but a file name is needed",
        early=True,
    ),
    # training past the model's window
    "tune-longer-than-window": Case(
        argv="tune seal-h --model {ckpt} " + SMALL + " --out {tmp}/run",
        message=rf"training sample 0 is \d+ tokens long .*window is {WINDOW} positions",
    ),
    # task and prediction files
    "generated-broken-predictions": Case(
        argv="evaluate generated {tasks} --predictions {broken}",
        message=r"broken\.jsonl:3: not valid JSON \(Expecting value, column 10\)",
        early=True,
    ),
    "generated-broken-tasks": Case(
        argv="evaluate generated {broken} --predictions {preds}",
        message=r"broken\.jsonl:3: not valid JSON",
        early=True,
    ),
    "generated-empty": Case(
        argv="evaluate generated {empty} --predictions {preds}",
        message=r"task file .*empty\.jsonl holds no records",
        early=True,
    ),
    "generated-blank-predictions": Case(
        argv="evaluate generated {tasks} --predictions {blank}",
        message=r"--predictions file .*blank\.jsonl holds no records",
        early=True,
    ),
    "generated-not-utf8": Case(
        argv="evaluate generated {tasks} --predictions {binary}",
        message=r"binary\.jsonl:2: not UTF-8 text",
        early=True,
    ),
    "generated-missing-file": Case(
        argv="evaluate generated {tmp}/none.jsonl --predictions {preds}",
        message=r"no such JSONL file: .*none\.jsonl",
        early=True,
    ),
    "passage-scores-broken-samples": Case(
        argv="retrieval passage-scores --model {ckpt} --samples {broken} --out {tmp}/out",
        message=r"broken\.jsonl:1: cannot tell the task",
    ),
    # arguments: argparse names the flag
    "mudaf-heads-x.y": Case(
        argv="tune mudaf --model {ckpt} " + SMALL + " --heads x.y --out {tmp}/run",
        message=r"argument --heads: cannot read head 'x\.y'; write LAYER\.HEAD",
        early=True,
    ),
    "mudaf-top-k-without-scores": Case(
        argv="tune mudaf --model {ckpt} " + SMALL + " --top-k 2 --out {tmp}/run",
        message=r"--top-k and --sample-k need --scores",
        early=True,
    ),
    "mudaf-scores-missing": Case(
        argv="tune mudaf --model {ckpt} " + SMALL + " --top-k 2 --scores {scores} --out {tmp}/r",
        message=r"no such --scores file: .*missing_scores\.csv",
        early=True,
    ),
    "mudaf-scores-without-columns": Case(
        argv="tune mudaf --model {ckpt} " + SMALL + " --sample-k 2 --scores {scores_columns} "
        "--out {tmp}/r",
        message=r"--scores .*scores_columns\.csv lacks the columns \['f1', 'head', 'layer'\]",
        early=True,
    ),
    "masking-scores-not-csv": Case(
        argv="retrieval masking --model {ckpt} --samples {tasks} --scores {scores_binary} "
        "--out {tmp}/m",
        message=r"--scores .*scores_binary\.csv is not a CSV table",
        early=True,
    ),
    "masking-scores-without-columns": Case(
        argv="retrieval masking --model {ckpt} --samples {tasks} --scores {scores_columns} "
        "--out {tmp}/m",
        message=r"--scores .*scores_columns\.csv lacks the columns \['head', 'layer', 'rank'\]",
        early=True,
    ),
    "head-sweep-n-0": Case(
        argv="analysis head-sweep --model {ckpt} --lengths 3 --n 0 --out {tmp}/out",
        message=r"argument --n/--records: must be a whole number >= 1, got 0",
        early=True,
    ),
    "evaluate-lengths-0": Case(
        argv="evaluate lines --model {ckpt} --lengths 3 0 --n 2",
        message=r"argument --lengths: must be a whole number >= 1, got 0",
        early=True,
    ),
    "evaluate-n-word": Case(
        argv="evaluate lines --model {ckpt} --lengths 3 --n ten",
        message=r"argument --n: expected a whole number, got 'ten'",
        early=True,
    ),
    "evaluate-ablate-format": Case(
        argv="evaluate lines --model {ckpt} --lengths 3 --ablate 1",
        message=r"argument --ablate: cannot read head '1'",
        early=True,
    ),
    "channel-sweep-negative-channel": Case(
        argv="analysis channel-sweep --model {ckpt} --heads 0.1 --channels -1 --out {tmp}/o",
        message=r"argument --channels: must be a whole number >= 0, got -1",
        early=True,
    ),
    "tune-samples-0": Case(
        argv="tune seal-h --model {ckpt} --num-lines 3 --samples 0 --out {tmp}/run",
        message=r"argument --samples: must be a whole number >= 1",
        early=True,
    ),
    "tune-evaluate-named-pair": Case(
        argv="tune evaluate --model {ckpt} --scales {scales} --lengths 3",
        message=r"expected NAME=PATH",
        early=True,
    ),
    "patch-last-negative": Case(
        argv="attribution patch --model {ckpt} --num-lines 3 --last -1 --out {tmp}/out",
        message=r"argument --last: must be a whole number >= 0, got -1",
        early=True,
    ),
}


def _foreign(work: Path) -> None:
    """A directory of the user's own files (no run of ours)."""
    (work / "mine").mkdir()
    (work / "mine" / "results.csv").write_text("the user's numbers\n")


def _link_to_foreign(work: Path) -> None:
    _foreign(work)
    (work / "link").symlink_to(work / "mine")


def _dangling(work: Path) -> None:
    (work / "link").symlink_to(work / "nowhere")


def _loop(work: Path) -> None:
    (work / "loop1").symlink_to(work / "loop2")
    (work / "loop2").symlink_to(work / "loop1")


HELD = []  # open descriptors holding locks for the duration of a case


def _in_use(work: Path) -> None:
    """Another run holds ``work/run``: its mark exists and is locked (by this process's
    descriptor, which conflicts with any other open of the file, as another process's would)."""
    import fcntl

    (work / "run").mkdir()
    mark = work / "run" / ".interp-seal-run"
    mark.write_text(json.dumps({"pid": 4242, "command": "interp-seal analysis head-sweep"}))
    fd = open(mark)  # noqa: SIM115 - closed by the test's finaliser
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    HELD.append(fd)


def _release_held() -> None:
    while HELD:
        HELD.pop().close()


EVAL = "evaluate lines --model {ckpt} --lengths 3 --n 1"
FOREIGN = r"--out .*mine holds files interp-seal did not write \(results\.csv\); choose a new"
FOREIGN_OUT = {  # every command that writes a run directory, pointed at the user's own
    "evaluate": EVAL,
    "sweep": "analysis head-sweep --model {ckpt} --lengths 3 --n 1",
    "channel-sweep": "analysis channel-sweep --model {ckpt} --heads 0.1 --lengths 3",
    "tune": "tune seal-h --model {ckpt} " + SMALL,
    "merge": "tune merge --model {ckpt} --scales {scales}",
    "dla": "attribution dla --model {ckpt} --num-lines 3",
    "patch": "attribution patch --model {ckpt} --num-lines 3",
    "passage-scores": "retrieval passage-scores --model {ckpt} --samples {passages}",
    "figures": "figures --model {ckpt} --quick",
    "organism": "organism train --smoke",
    "tune-evaluate": "tune evaluate --model {ckpt} --scales s={scales} --lengths 3",
}
HOSTILE_CASES = {
    f"out-foreign-{name}": Case(
        argv=argv + " --out {tmp}/mine", message=FOREIGN, setup=_foreign, early=True
    )
    for name, argv in FOREIGN_OUT.items()
} | {
    # --out: links, empty, locked by another run
    "out-link-to-foreign": Case(
        argv=EVAL + " --out {tmp}/link",
        message=r"--out .*link holds files interp-seal did not write",
        setup=_link_to_foreign,
        early=True,
    ),
    "out-dangling-link": Case(
        argv=EVAL + " --out {tmp}/link",
        message=r"--out .*link is a symbolic link to .*nowhere, which does not exist",
        setup=_dangling,
        early=True,
    ),
    "out-link-loop": Case(
        argv=EVAL + " --out {tmp}/loop1",
        message=r"--out .*loop1: cannot follow its symbolic links",
        setup=_loop,
        early=True,
    ),
    "out-empty-evaluate": Case(
        argv=EVAL,
        extra=("--out", ""),
        message=r"argument --out: is empty; name the directory",
        early=True,
    ),
    "out-empty-tune": Case(
        argv="tune seal-h --model {ckpt} " + SMALL,
        extra=("--out", ""),
        message=r"argument --out: is empty",
        early=True,
    ),
    "out-empty-tasks": Case(
        argv="tasks generate --task line_retrieval",
        extra=("--out", " "),
        message=r"argument --out: is empty",
        early=True,
    ),
    "out-name-too-long": Case(
        argv=EVAL + " --out {tmp}/" + "x" * 300,
        message=r"a file name is too long: choose a shorter --out",
        early=True,
    ),
    "out-in-use-evaluate": Case(
        argv=EVAL + " --out {tmp}/run",
        message=r"--out .*run is in use by PID 4242 \(interp-seal analysis head-sweep\); wait",
        setup=_in_use,
        early=True,
    ),
    "out-in-use-sweep": Case(
        argv="analysis head-sweep --model {ckpt} --lengths 3 --n 1 --out {tmp}/run --resume",
        message=r"is in use by PID 4242",
        setup=_in_use,
        early=True,
    ),
    "out-in-use-tune": Case(
        argv="tune seal-c --model {ckpt} " + SMALL + " --out {tmp}/run",
        message=r"is in use by PID 4242",
        setup=_in_use,
        early=True,
    ),
    # a cache that cannot be written: one line naming the path
    "cache-is-a-file": Case(
        argv="evaluate lines --model smollm2 --lengths 3 --n 1",
        message=r"a_file/gguf: a part of the path is a file, not a directory: fix the path",
        env={"INTERP_SEAL_CACHE": "{file}"},
    ),
    "cache-read-only": Case(
        argv="evaluate lines --model smollm2 --lengths 3 --n 1",
        message=r"/cache(/gguf)?: (permission denied|the file system is read-only|operation not permitted)",
        env={"INTERP_SEAL_CACHE": "{readonly}/cache"},
    ),
    "home-is-a-file": Case(
        argv="evaluate lines --model smollm2 --lengths 3 --n 1",
        message=r"a_file/\.cache/interp_seal/gguf: a part of the path is a file",
        env={"INTERP_SEAL_CACHE": None, "HOME": "{file}"},
    ),
    # checkpoints whose weights or geometry are wrong
    "model-missing-weight": Case(
        argv=EVAL.replace("{ckpt}", "{missing_weight}"),
        message=r"lacks the weights model\.layers\.0\.self_attn\.o_proj\.weight",
    ),
    "model-missing-weight-tune": Case(
        argv="tune seal-h --model {missing_weight} " + SMALL + " --out {tmp}/run",
        message=r"lacks the weights model\.layers\.0\.self_attn\.o_proj\.weight",
    ),
    "model-missing-weight-sweep": Case(
        argv="analysis head-sweep --model {missing_weight} --lengths 3 --n 1 --out {tmp}/run",
        message=r"lacks the weights",
    ),
    "model-extra-weight": Case(
        argv=EVAL.replace("{ckpt}", "{extra_weight}"),
        message=r"has weights the model does not use .*self_attn\.gate",
    ),
    "model-wrong-shape": Case(
        argv=EVAL.replace("{ckpt}", "{wrong_shape}"),
        message=r"wrong shape: model\.layers\.0\.self_attn\.o_proj\.weight \(\[5, 5\] in the file, "
        r"\[64, 64\] in the model\)",
    ),
    "model-nan-weight": Case(
        argv=EVAL.replace("{ckpt}", "{nan_weight}"),
        message=r"weight model\.layers\.1\.mlp\.up_proj\.weight holds 1 NaN or infinite",
    ),
    "model-nan-weight-dla": Case(
        argv="attribution dla --model {nan_weight} --num-lines 3 --out {tmp}/run",
        message=r"holds 1 NaN or infinite values",
    ),
    "model-inf-weight": Case(
        argv=EVAL.replace("{ckpt}", "{inf_weight}"),
        message=r"weight model\.norm\.weight holds 1 NaN or infinite",
    ),
    "model-zero-heads": Case(
        argv=EVAL.replace("{ckpt}", "{zero_heads}"),
        message=r"zero_heads/config\.json: field 'num_attention_heads' must be a whole number >= 1",
    ),
    "model-kv-not-dividing": Case(
        argv=EVAL.replace("{ckpt}", "{kv_not_dividing}"),
        message=r"field 'num_key_value_heads' is 3, which does not divide num_attention_heads 4: an "
        r"impossible model",
    ),
    "model-zero-layers": Case(
        argv=EVAL.replace("{ckpt}", "{zero_layers}"),
        message=r"field 'num_hidden_layers' must be a whole number >= 1, got 0 \(int\)",
    ),
    # scales a merge must not fold in silently
    "merge-negative-scale": Case(
        argv="tune merge --model {ckpt} --scales {scales_negative} --out {tmp}/merged",
        message=r"1 factors negative .*--allow-negative.*-0\.5 at layer 1, head 2",
    ),
    "merge-huge-scale": Case(
        argv="tune merge --model {ckpt} --scales {scales_huge} --out {tmp}/merged",
        message=r"1 factors beyond 1000 in size; the first is 1e\+30 at layer 1, head 2",
    ),
    "merge-huge-scale-allowed-negative": Case(
        argv="tune merge --model {ckpt} --scales {scales_huge} --allow-negative --out {tmp}/m",
        message=r"beyond 1000 in size",
    ),
    # absurd counts, refused when parsed
    "tasks-n-huge": Case(
        argv="tasks generate --task line_retrieval --n 1000000 --out {tmp}/t.jsonl",
        message=r"argument --n: must be at most 100,000 records",
        early=True,
    ),
    "tasks-num-lines-huge": Case(
        argv="tasks generate --task line_retrieval --num-lines 5000000 --out {tmp}/t.jsonl",
        message=r"argument --num-lines: must be at most 100,000 lines",
        early=True,
    ),
    "tasks-num-passages-huge": Case(
        argv="tasks generate --task passages --num-passages 999999 --out {tmp}/t.jsonl",
        message=r"argument --num-passages: must be at most 100,000",
        early=True,
    ),
    "evaluate-n-huge": Case(
        argv="evaluate lines --model {ckpt} --lengths 3 --n 10000000",
        message=r"argument --n: must be at most 100,000",
        early=True,
    ),
    "sweep-lengths-huge": Case(
        argv="analysis head-sweep --model {ckpt} --lengths 3 1000000 --out {tmp}/run",
        message=r"argument --lengths: must be at most 100,000 lines",
        early=True,
    ),
    "tune-samples-huge": Case(
        argv="tune seal-h --model {ckpt} --num-lines 3 --samples 500000 --out {tmp}/run",
        message=r"argument --samples: must be at most 100,000",
        early=True,
    ),
    "dashboard-n-huge": Case(
        argv="dashboard --model {ckpt} --n 200000",
        message=r"argument --n: must be at most 100,000",
        early=True,
    ),
    # a head named twice, refused when parsed
    "sweep-duplicate-heads": Case(
        argv="analysis head-sweep --model {ckpt} --heads 0.1 1.2 0.1 --out {tmp}/run",
        message=r"argument --heads: head 0\.1 is listed twice",
        early=True,
    ),
    "channel-sweep-duplicate-heads": Case(
        argv="analysis channel-sweep --model {ckpt} --heads 1.0 1.0 --out {tmp}/run",
        message=r"argument --heads: head 1\.0 is listed twice",
        early=True,
    ),
    "evaluate-duplicate-ablate": Case(
        argv=EVAL + " --ablate 0.3 0.3",
        message=r"argument --ablate: head 0\.3 is listed twice",
        early=True,
    ),
    "mudaf-duplicate-heads": Case(
        argv="tune mudaf --model {ckpt} " + SMALL + " --heads 1.1 1.1 --out {tmp}/run",
        message=r"argument --heads: head 1\.1 is listed twice",
        early=True,
    ),
    # task files with impossible values, and task types a command cannot score
    "needle-nan-depth": Case(
        argv="retrieval needle-scores --model {ckpt} --samples {needle_nan_depth} --out {tmp}/r",
        message=r"field 'depth_percent' must be a number from 0 to 100, got nan",
        early=True,
    ),
    "needle-depth-150": Case(
        argv="retrieval needle-scores --model {ckpt} --samples {needle_depth_150} --out {tmp}/r",
        message=r"field 'depth_percent' must be a number from 0 to 100, got 150",
        early=True,
    ),
    "needle-negative-length": Case(
        argv="retrieval needle-scores --model {ckpt} --samples {needle_negative_length} "
        "--out {tmp}/r",
        message=r"field 'context_length' must be an integer >= 1, got -5",
        early=True,
    ),
    "needle-span-reversed": Case(
        argv="retrieval needle-scores --model {ckpt} --samples {needle_span_reversed} "
        "--out {tmp}/r",
        message=r"field 'needle_span' must be a \[start, end\] pair of integers, 0 <= start <= end",
        early=True,
    ),
    "passages-negative-length": Case(
        argv="retrieval passage-scores --model {ckpt} --samples {passages_negative_length} "
        "--out {tmp}/r",
        message=r"field 'length' must be an integer >= 0, got -1",
        early=True,
    ),
    "lines-zero-lines": Case(
        argv="evaluate generate {lines_zero_lines} --model {ckpt}",
        message=r"field 'num_lines' must be an integer >= 1, got 0",
        early=True,
    ),
    "passage-scores-on-lines": Case(
        argv="retrieval passage-scores --model {ckpt} --samples {tasks} --out {tmp}/r",
        message=r"sample 0 is a line_retrieval sample without passages with golden ids.*"
        r"--task passages",
        early=True,
    ),
    "needle-scores-on-passages": Case(
        argv="retrieval needle-scores --model {ckpt} --samples {passages} --out {tmp}/r",
        message=r"sample 0 is a passages sample without a needle span.*--task needle",
        early=True,
    ),
    # the dashboard's own arguments
    "dashboard-short-token": Case(
        argv="dashboard --model {ckpt} --token abc",
        message=r"--token must be at least 16 characters",
        early=True,
    ),
    "dashboard-save-dir-missing": Case(
        argv="dashboard --model {ckpt} --save-dir {tmp}/nowhere",
        message=r"--save-dir .*nowhere is not a directory; create it first",
        early=True,
    ),
    "dashboard-save-dir-file": Case(
        argv="dashboard --model {ckpt} --save-dir {file}",
        message=r"--save-dir .*a_file is not a directory",
        early=True,
    ),
    "dashboard-max-kernels-zero": Case(
        argv="dashboard --model {ckpt} --max-kernels 0",
        message=r"argument --max-kernels: must be a whole number >= 1, got 0",
        early=True,
    ),
}
CLI_CASES |= HOSTILE_CASES


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under ``root``."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


@pytest.fixture
def readonly(tmp_path):
    """A directory this process cannot write in (root ignores permissions: /sys is read-only)."""
    path = tmp_path / "readonly"
    path.mkdir()
    path.chmod(0o555)
    for candidate in (path, Path("/sys")):
        try:
            tempfile.TemporaryFile(dir=candidate).close()
        except OSError:
            yield candidate
            break
    else:
        pytest.skip("no directory here refuses writes (root on a writable /sys)")
    path.chmod(0o755)


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_bad_input(name, files, tmp_path, request, monkeypatch, capsys):
    case = CLI_CASES[name]
    work = tmp_path / "work"
    work.mkdir()
    (work / "a_file").write_text("keep me\n")
    names = {k: str(v) for k, v in files.items()} | {"tmp": str(work), "file": str(work / "a_file")}
    if case.setup is not None:
        case.setup(work)
        request.addfinalizer(_release_held)
    if "{readonly}" in case.argv + json.dumps(case.env):
        names["readonly"] = str(request.getfixturevalue("readonly"))
    for key, value in (case.env or {}).items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value.format(**names))
    if case.early:

        def no_work(*args, **kwargs):
            raise AssertionError("the command started working before rejecting its input")

        monkeypatch.setattr(interp_seal.models, "load_model", no_work)
    if not case.offline:  # hub allowed but unreachable (conftest refuses every connection)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    before, inputs = _snapshot(work), _snapshot(files["ckpt"].parent)
    start = time.perf_counter()
    try:
        status = main([*case.argv.format(**names).split(), *case.extra])
    except SystemExit as exit_:
        status = exit_.code
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert status == case.status, err
    assert re.search(case.message, err), err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()[-1]) > 40  # one explanatory line, not a bare code
    assert _snapshot(work) == before  # nothing written, not even an empty directory
    assert _snapshot(files["ckpt"].parent) == inputs
    if "unknown" in name:
        assert seconds < 5, f"took {seconds:.1f} s to say the model is unavailable"


@dataclass(frozen=True, kw_only=True)
class ApiCase:
    call: object  # (files, handle) -> anything; must raise
    error: type[Exception]
    message: str


def _load_scales(name: str):
    return lambda f, h: load_scales(f[name], h.spec)


API_CASES = {
    "evaluate-no-lengths": ApiCase(
        call=lambda f, h: evaluate_line_retrieval(h, []),
        error=ValueError,
        message=r"lengths is empty",
    ),
    # a runtime type checker (the test suite's jaxtyping hook) may answer first, naming the
    # parameter; unwrapped, the library's own check answers
    "evaluate-string-lengths": ApiCase(
        call=lambda f, h: evaluate_line_retrieval(h, ["10"]),
        error=TypeError,
        message=r"lengths must be integers, got '10' \(str\)|parameter 'lengths'",
    ),
    "check-string-lengths": ApiCase(
        call=lambda f, h: inspect.unwrap(check_lengths)(["10"]),
        error=TypeError,
        message=r"lengths must be integers, got '10' \(str\); convert them first",
    ),
    "check-lengths-string": ApiCase(
        call=lambda f, h: inspect.unwrap(check_lengths)("10"),
        error=TypeError,
        message=r"lengths must be a list of integers such as \[20, 40\], got '10'",
    ),
    "evaluate-length-0": ApiCase(
        call=lambda f, h: evaluate_line_retrieval(h, [3, 0]),
        error=ValueError,
        message=r"every length must be >= 1, got 0",
    ),
    "evaluate-repeated-length": ApiCase(
        call=lambda f, h: evaluate_line_retrieval(h, [3, 3]),
        error=ValueError,
        message=r"repeat a value",
    ),
    "evaluate-n-0": ApiCase(
        call=lambda f, h: evaluate_line_retrieval(h, [3], n=0),
        error=ValueError,
        message=r"n \(records per length\) must be an integer >= 1, got 0",
    ),
    "evaluate-longer-than-window": ApiCase(
        call=lambda f, h: evaluate_line_retrieval(h, [3], n=1, progress=False),
        error=ValueError,
        message=rf"length 3: .*\d+ tokens long .*{WINDOW} positions",
    ),
    "generate-negative": ApiCase(
        call=lambda f, h: line_retrieval.generate(_cfg(3), -1),
        error=ValueError,
        message=r"n_samples must be >= 0 \(records\), got -1",
    ),
    "generate-float": ApiCase(
        call=lambda f, h: inspect.unwrap(line_retrieval.generate)(_cfg(3), 2.5),
        error=TypeError,
        message=r"n_samples must be an integer \(records\), got 2\.5",
    ),
    "scales-truncated": ApiCase(
        call=_load_scales("scales_truncated"), error=ValueError, message=r"truncated or corrupt"
    ),
    "scales-garbage": ApiCase(
        call=_load_scales("scales_garbage"), error=ValueError, message=r"not a readable"
    ),
    "scales-no-metadata": ApiCase(
        call=_load_scales("scales_no_metadata"),
        error=ValueError,
        message=r"not an interp-seal scale file",
    ),
    "scales-no-geometry": ApiCase(
        call=_load_scales("scales_no_geometry"),
        error=ValueError,
        message=r"lacks the metadata \['geometry'",
    ),
    "scales-bad-json": ApiCase(
        call=_load_scales("scales_bad_json"),
        error=ValueError,
        message=r"metadata 'geometry': not valid JSON",
    ),
    "load-truncated": ApiCase(
        call=lambda f, h: load_model(f["truncated"]),
        error=CheckpointError,
        message=r"truncated/model\.safetensors is truncated or corrupt",
    ),
    "load-bad-config": ApiCase(
        call=lambda f, h: load_model(f["bad_config"]),
        error=CheckpointError,
        message=r"config\.json: not valid JSON",
    ),
    "load-unknown": ApiCase(
        call=lambda f, h: load_model("someone/no-such-model"),
        error=ModelNotFoundError,
        message=r"not in the Hugging Face cache",
    ),
    "read-samples-broken": ApiCase(
        call=lambda f, h: jsonl.read_samples(f["broken"]),
        error=ValueError,
        message=r"broken\.jsonl:1: cannot tell the task",
    ),
    "read-golden-binary": ApiCase(
        call=lambda f, h: jsonl.read_golden(f["scores_binary"]),
        error=ValueError,
        message=r"scores_binary\.csv: not UTF-8 text",
    ),
    "read-golden-missing": ApiCase(
        call=lambda f, h: jsonl.read_golden(f["scores"]),
        error=FileNotFoundError,
        message=r"no such golden-id file: .*missing_scores\.csv",
    ),
    "read-records-broken": ApiCase(
        call=lambda f, h: jsonl.read_jsonl(f["broken"]),
        error=ValueError,
        message=r"broken\.jsonl:3: not valid JSON",
    ),
    "records-missing-key": ApiCase(
        call=lambda f, h: RecordStore(f["records_missing_key"]).get("a", "f"),
        error=ValueError,
        message=r"records_missing_key\.jsonl:2 lacks the fields \['key', 'fingerprint'\]",
    ),
    "records-not-utf8": ApiCase(
        call=lambda f, h: RecordStore(f["records_binary"]).load(),
        error=ValueError,
        message=r"records_binary\.jsonl:2: not UTF-8 text",
    ),
    "state-for-another-model-geometry": ApiCase(
        call=lambda f, h: DashboardState.from_json(
            json.dumps({"format": STATE_FORMAT, "model": "m", "geometry": {"n_layers": 0}})
        ),
        error=ValueError,
        message=r"state field 'geometry' is not a model geometry",
    ),
    "load-missing-weight": ApiCase(
        call=lambda f, h: load_model(f["missing_weight"]),
        error=CheckpointError,
        message=r"lacks the weights model\.layers\.0\.self_attn\.o_proj\.weight",
    ),
    "load-nan-weight": ApiCase(
        call=lambda f, h: load_model(f["nan_weight"]),
        error=CheckpointError,
        message=r"holds 1 NaN or infinite values",
    ),
    "merge-negative-api": ApiCase(
        call=lambda f, h: check_mergeable(
            h, load_scales(f["scales_negative"], h.spec).scales, "o_proj", allow_negative=False
        ),
        error=ValueError,
        message=r"1 factors negative",
    ),
    "out-dir-is-file": ApiCase(
        call=lambda f, h: check_output_dir(f["tasks"]),
        error=OutputPathError,
        message=r"is a file, but a directory is needed",
    ),
    "out-file-is-dir": ApiCase(
        call=lambda f, h: check_output_file(f["ckpt"]),
        error=OutputPathError,
        message=r"is a directory, but a file name is needed",
    ),
}


@pytest.fixture(scope="session")
def handle(files):
    return load_model(files["ckpt"])


@pytest.mark.parametrize("name", list(API_CASES))
def test_api_bad_input(name, files, handle):
    case = API_CASES[name]
    before = _snapshot(files["ckpt"].parent)
    with pytest.raises(case.error, match=case.message):
        case.call(files, handle)
    assert _snapshot(files["ckpt"].parent) == before


def test_the_checks_let_good_input_through(files, tmp_path):
    """Controls: the same helpers accept what they should, and the CLI writes where asked."""
    assert check_output_dir(tmp_path / "new" / "dir") == tmp_path / "new" / "dir"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    out = tmp_path / "deep" / "tasks.jsonl"
    assert (
        main(f"tasks generate --task line_retrieval --num-lines 3 --n 2 --out {out}".split()) == 0
    )
    expected = line_retrieval.generate(_cfg(3), 2, 0)
    assert [s.prompt for s in jsonl.read_samples(out)] == [s.prompt for s in expected]
    assert jsonl.read_jsonl(files["broken"].with_name("preds.jsonl")) == [
        {"pred": "7"},
        {"pred": "8"},
    ]
    assert line_retrieval.generate(_cfg(3), 0) == []


def test_atomic_writes_leave_the_old_file_or_none(tmp_path):
    """An exception while writing leaves the previous content and no temporary file."""
    target = write_text(tmp_path / "log.json", json.dumps({"step": 1}))

    class Killed(Exception):
        pass

    with pytest.raises(Killed), atomic_dir(tmp_path / "model") as tmp:
        (tmp / "config.json").write_text("{}")
        raise Killed
    assert not (tmp_path / "model").exists()
    with pytest.raises(Killed), atomic_path(target) as tmp:
        tmp.write_text('{"step": ')  # half a file
        raise Killed
    assert json.loads(target.read_text()) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.json"]
    weights = torch.arange(3).numpy().tobytes()
    with atomic_dir(tmp_path / "model") as tmp:
        (tmp / "weights.bin").write_bytes(weights)
    assert (tmp_path / "model" / "weights.bin").read_bytes() == weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.json", "model"]


def test_a_killed_writer_leaves_no_half_file(tmp_path):
    """``kill -9`` in the middle of a write: the target keeps its old content."""
    target = tmp_path / "results.csv"
    target.write_text("old\n")
    started = tmp_path / "started"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from interp_seal.outputs import atomic_path\n"
        "with atomic_path(sys.argv[1]) as tmp, open(tmp, 'w') as f:\n"
        "    f.write('new,half'); f.flush()\n"
        "    Path(sys.argv[2]).write_text('')\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(target), str(started)])
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the writer never started"
        leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".results.tmp-")]
        assert [p.read_text() for p in leftovers] == ["new,half"]  # it was mid-write
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert target.read_text() == "old\n"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "interp_seal.cli", *args]


CLI_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_two_runs_on_one_out_one_refuses(tmp_path):
    """Two sweeps started on one --out: the second stops at once naming the first's PID; the
    first finishes alone, with each record once."""
    out = tmp_path / "run"
    sweep = _cli("analysis", "head-sweep", "--model", "organism", "--lengths", "80", "--n", "12")
    first = subprocess.Popen(
        [*sweep, "--out", str(out)],
        env=CLI_ENV,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        mark, deadline = out / ".interp-seal-run", time.monotonic() + 60
        while time.monotonic() < deadline:  # until the first run holds the directory
            if mark.exists() and f'"pid": {first.pid}' in mark.read_text():
                break
            time.sleep(0.05)
        second = subprocess.run(
            [*sweep, "--out", str(out), "--resume"],
            env=CLI_ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert first.poll() is None, "the first run ended before the second started"
        assert second.returncode == 2, second.stderr
        assert f"--out {out} is in use by PID {first.pid} (interp-seal analysis head-sweep" in (
            second.stderr
        )
        assert "Traceback" not in second.stderr
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    keys = [(r["length"], r["sample"], r["unit"]) for r in records]
    assert len(keys) == len(set(keys)) == 12 * (1 + 4 * 8)  # baseline + 32 heads, once each
    # the directory is the first run's: a later run may resume it
    again = subprocess.run(
        [*sweep, "--out", str(out), "--resume"],
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root only): writes past it fail with ENOSPC."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_one_line_and_keeps_earlier_data(small_disk, capsys):
    earlier = small_disk / "earlier" / "accuracy.csv"
    earlier.parent.mkdir()
    earlier.write_text("length,exact_match\n10,1.0\n")
    (small_disk / "earlier" / ".interp-seal-run").write_text('{"command": "interp-seal evaluate"}')
    # an evaluation whose plotly.min.js (~5 MB, beside its HTML page) cannot fit
    out = small_disk / "earlier"
    status = main(
        [
            "evaluate",
            "lines",
            "--model",
            "organism",
            "--lengths",
            "5",
            "--n",
            "1",
            "--out",
            str(out),
            "--force",  # replace the earlier results: the disk fills meanwhile
        ]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert re.fullmatch(
        r"interp-seal evaluate: error: .*/(accuracy\.(csv|html)|plotly\.min\.js): the disk is "
        r"full: free some space, or choose an --out on another disk \(No space left on device\)",
        err.strip().splitlines()[-1],
    )
    assert "Traceback" not in err
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if ".tmp-" in n], names  # no half-written file left behind
    assert all((out / n).stat().st_size > 0 for n in names)
    # a task file that does not fit: refused the same way, nothing left
    big = small_disk / "tasks.jsonl"
    status = main(
        [
            "tasks",
            "generate",
            "--task",
            "line_retrieval",
            "--num-lines",
            "200",
            "--n",
            "200",
            "--out",
            str(big),
        ]
    )
    err = capsys.readouterr().err
    assert status == 2 and "the disk is full" in err and "Traceback" not in err
    assert not big.exists()
    assert [p.name for p in small_disk.iterdir()] == ["earlier"]


def test_out_rules_let_our_runs_through(tmp_path):
    """Controls for the --out claim: new, empty, our runs' directories and --force pass."""
    good = ["evaluate", "lines", "--model", "organism", "--lengths", "3", "--n", "1"]
    assert main([*good, "--out", str(tmp_path / "results" / "smollm2")]) == 0
    assert main([*good, "--out", str(tmp_path / "results")]) == 0  # holds only our runs
    table = (tmp_path / "results" / "accuracy.csv").read_bytes()
    other = ["evaluate", "lines", "--model", "organism", "--lengths", "4", "--n", "1"]
    assert main([*other, "--out", str(tmp_path / "results")]) == 2  # an earlier run's results
    assert (tmp_path / "results" / "accuracy.csv").read_bytes() == table  # kept
    assert main([*other, "--out", str(tmp_path / "results"), "--force"]) == 0  # replaced
    assert (tmp_path / "results" / "accuracy.csv").read_bytes() != table
    (tmp_path / "empty").mkdir()
    assert main([*good, "--out", str(tmp_path / "empty")]) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    assert main([*good, "--out", str(mine)]) == 2
    missing = ["evaluate", "lines", "--model", str(tmp_path / "nothing"), "--out", str(mine)]
    assert main([*missing, "--force"]) == 2  # failed before writing: the directory stays theirs
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert main([*good, "--out", str(mine), "--force"]) == 0
    assert (mine / "notes.txt").read_text() == "keep me\n"
    assert (mine / "accuracy.csv").is_file() and (mine / ".interp-seal-run").is_file()
    (tmp_path / "link").symlink_to(tmp_path / "results")  # followed, and judged the same
    assert main([*good, "--out", str(tmp_path / "link")]) == 2
    assert main([*good, "--out", str(tmp_path / "link"), "--force"]) == 0


def test_a_file_name_alone_does_not_make_a_directory_ours(tmp_path, capsys):
    """A user's directory with a ``manifest.json`` / ``run.json`` of their own, or a planted
    mark that is a link, is not taken for one of our runs: refused, every byte unchanged."""
    good = ["evaluate", "lines", "--model", "organism", "--lengths", "3", "--n", "1"]
    for name, text in (("manifest.json", '{"name": "my app", "icons": []}'), ("run.json", "{}")):
        theirs = tmp_path / name.split(".")[0]
        theirs.mkdir()
        (theirs / name).write_text(text)
        (theirs / "accuracy.csv").write_text("my own table\n")
        assert main([*good, "--out", str(theirs)]) == 2
        assert "holds files interp-seal did not write" in capsys.readouterr().err
        assert sorted(p.name for p in theirs.iterdir()) == ["accuracy.csv", name]
        assert (theirs / "accuracy.csv").read_text() == "my own table\n"
    victim = tmp_path / "victim.txt"
    victim.write_text("another user's file\n")
    for how in ("symlink", "hardlink"):
        planted = tmp_path / how
        planted.mkdir()
        mark = planted / ".interp-seal-run"
        mark.symlink_to(victim) if how == "symlink" else os.link(victim, mark)
        assert main([*good, "--out", str(planted), "--force"]) == 2
        assert "run mark .interp-seal-run" in capsys.readouterr().err
        assert victim.read_text() == "another user's file\n"
        assert not (planted / "accuracy.csv").exists()


def test_file_outputs_replace_only_regular_files_and_only_when_asked(tmp_path, capsys):
    """``tasks generate --out FILE``: an existing file is kept unless ``--force``; a link, a FIFO
    and a device node are refused (never replaced, never opened), with one line each."""
    gen = ["tasks", "generate", "--task", "passages", "--n", "2", "--out"]
    existing = tmp_path / "mine.jsonl"
    existing.write_text("my own records\n")
    assert main([*gen, str(existing)]) == 2
    assert "exists; choose a new file name, or pass --force" in capsys.readouterr().err
    assert existing.read_text() == "my own records\n"
    assert main([*gen, str(existing), "--force"]) == 0
    assert existing.read_text().startswith("{")
    target = tmp_path / "target.txt"
    target.write_text("linked\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    specials = {link: "a symbolic link", fifo: "not a regular file"}
    try:
        node = tmp_path / "null.jsonl"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
        specials[node] = "not a regular file"
    except PermissionError:
        node = None  # creating a device node needs root
    for path, kind in specials.items():
        assert main([*gen, str(path), "--force"]) == 2
        err = capsys.readouterr().err
        assert f"is {kind}; interp-seal replaces only regular files" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert link.is_symlink() and target.read_text() == "linked\n"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    if node is not None:
        assert stat.S_ISCHR(node.lstat().st_mode)
