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
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import interp_seal.models
from interp_seal.cli import main
from interp_seal.evaluation import evaluate_line_retrieval, score_records
from interp_seal.evaluation.lengths import check_lengths
from interp_seal.interventions import HeadIntervention
from interp_seal.models import load_model
from interp_seal.models.checks import CheckpointError, check_config
from interp_seal.models.load import ModelNotFoundError
from interp_seal.models.spec import UnsupportedModelError
from interp_seal.outputs import (
    OutputPathError,
    atomic_dir,
    atomic_path,
    check_output_dir,
    check_output_file,
    write_text,
)
from interp_seal.records import RecordStore, read_records
from interp_seal.tasks import jsonl, line_retrieval, needle, passages
from interp_seal.tasks.chat import wrap_sample
from interp_seal.tuning.merge import check_mergeable
from interp_seal.tuning.scales import (
    ScaleFile,
    check_scales,
    init_scales,
    load_scales,
    save_scales,
)
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
NORM = "model.norm.weight"
WEIGHT_DAMAGE |= {  # weights that are not floating point: refused, never cast silently
    f"{name}_weight": lambda t, dtype=dtype: t.__setitem__(NORM, t[NORM].to(dtype))
    for name, dtype in {
        "int8": torch.int8,
        "uint8": torch.uint8,
        "int16": torch.int16,
        "int32": torch.int32,
        "int64": torch.int64,
        "float8_e4m3": torch.float8_e4m3fn,
        "float8_e5m2": torch.float8_e5m2,
        "bool": torch.bool,
        "complex": torch.complex64,
    }.items()
}
NAN, INF = float("nan"), float("inf")


def _rope(**params) -> dict:
    return {"rope_parameters": {"rope_theta": 10000.0, **params}}


CONFIG_DAMAGE = {  # configs of impossible geometry, or values no model can have
    "zero_heads": {"num_attention_heads": 0},
    "kv_not_dividing": {"num_key_value_heads": 3},
    "zero_layers": {"num_hidden_layers": 0},
    "act_unknown": {"hidden_act": "banana"},
    "act_number": {"hidden_act": 3},
    "layers_string": {"num_hidden_layers": "2"},
    "layers_fraction": {"num_hidden_layers": 2.5},
    "layers_bool": {"num_hidden_layers": True},
    "heads_string": {"num_attention_heads": "4"},
    "hidden_string": {"hidden_size": "64"},
    "hidden_not_dividing": {"hidden_size": 66, "head_dim": None},
    "head_dim_odd": {"head_dim": 15},
    "head_dim_zero": {"head_dim": 0},
    "head_dim_derived_odd": {"hidden_size": 60, "head_dim": None},  # 60 / 4 heads = 15
    "kv_zero": {"num_key_value_heads": 0},
    "kv_string": {"num_key_value_heads": "2"},
    "vocab_zero": {"vocab_size": 0},
    "vocab_below_tokenizer": {"vocab_size": 100},
    "window_negative": {"max_position_embeddings": -128},
    "intermediate_zero": {"intermediate_size": 0},
    "eps_negative": {"rms_norm_eps": -1e-6},
    "eps_nan": {"rms_norm_eps": NAN},
    "eps_inf": {"rms_norm_eps": INF},
    "eps_string": {"rms_norm_eps": "1e-6"},
    "theta_zero": _rope(rope_type="default", rope_theta=0.0),
    "theta_negative": _rope(rope_type="default", rope_theta=-10000.0),
    "theta_nan": _rope(rope_type="default", rope_theta=NAN),
    "theta_string": _rope(rope_type="default", rope_theta="10000"),
    "theta_legacy_zero": {"rope_parameters": None, "rope_theta": 0},
    "yarn_no_factor": _rope(rope_type="yarn", original_max_position_embeddings=64),
    "linear_no_factor": _rope(rope_type="linear"),
    "dynamic_no_factor": _rope(rope_type="dynamic"),
    "llama3_incomplete": _rope(rope_type="llama3", factor=8.0),
    "longrope_no_factors": _rope(rope_type="longrope", original_max_position_embeddings=64),
    "rope_factor_zero": _rope(rope_type="linear", factor=0),
    "rope_factor_nan": _rope(rope_type="yarn", factor=NAN, original_max_position_embeddings=64),
    "rope_unknown_type": _rope(rope_type="banana"),
    "rope_not_object": {"rope_parameters": "yarn"},
    "rope_scaling_legacy": {"rope_parameters": None, "rope_scaling": {"type": "yarn"}},
    "quantized": {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}},
    "model_type_unknown": {"model_type": "llama99"},
    "model_type_missing": {"model_type": None},
}
CONFIG_TEXT = {  # config.json files that are not a config at all
    "config_deep": '{"model_type": "llama", "x": ' + "[" * 100 + "]" * 100 + "}",
    "config_very_deep": "[" * 100_000 + "]" * 100_000,  # past Python's own recursion limit
    "config_surrogate": '{"model_type": "llama\\ud800"}',
    "config_array": "[1, 2, 3]",
}
# chat templates a hostile checkpoint may ship (rendered by `--chat-template tokenizer`)
PROMPT = "{{ messages[0]['content'] }}"
TEMPLATE_DAMAGE = {
    "template_loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}" + PROMPT,
    "template_syntax": "{% for m in messages %}{{ m['content'] }",
    "template_raises": "{{ raise_exception('this template refuses') }}",
    "template_range": "{% for i in range(10**9) %}{% endfor %}" + PROMPT,
    "template_escape": "{{ messages.__class__.__mro__[1].__subclasses__() }}" + PROMPT,
    "template_divide": "{{ 1 / 0 }}" + PROMPT,
    "template_recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}" + PROMPT,
}
SCALE_DTYPES = {  # scale tables of a type a scale file never holds
    "complex": lambda t: t.to(torch.complex64) * 1j,
    "float8": lambda t: t.to(torch.float8_e4m3fn),
    "int64": lambda t: t.to(torch.int64),
    "bool": lambda t: t.to(torch.bool),
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
    for name, text in CONFIG_TEXT.items():
        paths[name] = root / name
        shutil.copytree(ckpt, paths[name])
        (paths[name] / "config.json").write_text(text)
    paths["config_latin1"] = root / "config_latin1"
    shutil.copytree(ckpt, paths["config_latin1"])
    (paths["config_latin1"] / "config.json").write_bytes(b'{"model_type": "llama\xe9"}')
    for name, template in TEMPLATE_DAMAGE.items():
        paths[name] = root / name
        shutil.copytree(ckpt, paths[name])
        (paths[name] / "chat_template.jinja").write_text(template)
    with safe_open(str(scales), framework="pt") as f:
        metadata = f.metadata()
    for name, cast in SCALE_DTYPES.items():
        paths[f"scales_{name}"] = root / f"scales_{name}.safetensors"
        save_file(
            {"scales": cast(init_scales(spec, "head"))}, str(paths[f"scales_{name}"]), metadata
        )
    for name, text in {
        "scales_deep_meta": "[" * 100 + "]" * 100,
        "scales_surrogate_meta": '{"lr": "\\udc00"}',
    }.items():
        paths[name] = root / f"{name}.safetensors"
        save_file(
            {"scales": init_scales(spec, "head")},
            str(paths[name]),
            metadata | {"hyperparameters": text},
        )
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
    record = jsonl.read_jsonl(paths["tasks"])[0]
    for name, line in {
        "tasks_deep": "[" * 100_000 + "]" * 100_000,
        "tasks_nested": json.dumps(record | {"meta": json.loads("[" * 80 + "]" * 80)}),
        "tasks_surrogate_prompt": json.dumps(record | {"prompt": "line \ud800" + record["prompt"]}),
        "tasks_surrogate_answer": json.dumps(record | {"answer": " \udfff 7."}),
        "tasks_surrogate_key": json.dumps(record | {"\ud83d": 1}),
        "preds_int": '{"pred": 7}',
        "preds_null": '{"pred": null}',
        "preds_list": '{"pred": ["7"]}',
        "preds_object": '{"pred": {"text": "7"}}',
        "preds_bool": '{"pred": true}',
        "preds_surrogate": '{"pred": "\\ud800"}',
        "preds_deep": '{"pred": ' + "[" * 70 + "]" * 70 + "}",
    }.items():
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text((line + "\n") * (2 if name.startswith("preds") else 1))
    passage = jsonl.read_jsonl(paths["passages"])[0]
    paths["passages_surrogate"] = root / "passages_surrogate.jsonl"
    paths["passages_surrogate"].write_text(json.dumps(passage | {"answers": ["\ud800"]}) + "\n")
    paths["targets_deep"] = root / "targets_deep.json"
    paths["targets_deep"].write_text("[" * 100_000 + "]" * 100_000)
    paths["targets_flat"] = root / "targets_flat.json"
    paths["targets_flat"].write_text("[1, 2]")
    paths["golden_deep"] = root / "golden_deep.json"
    paths["golden_deep"].write_text('{"q": ' + "[" * 100 + "]" * 100 + "}")
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


# -- validation before work (issue 42, item 4): configs, weights, scales, JSON, templates,
# devices, Unicode, special files. Each names the file, the field and the fix.
def _model_dir(work: Path, config: str | None = "{}") -> Path:
    """``work/model``, a directory holding ``config.json`` (unless None)."""
    (work / "model").mkdir()
    if config is not None:
        (work / "model" / "config.json").write_text(config)
    return work / "model"


def _fifo_config(work: Path) -> None:
    os.mkfifo(_model_dir(work, None) / "config.json")


def _device_config(work: Path) -> None:
    (_model_dir(work, None) / "config.json").symlink_to("/dev/zero")


def _dir_config(work: Path) -> None:
    (_model_dir(work, None) / "config.json").mkdir()


def _huge_config(work: Path) -> None:
    with open(_model_dir(work, None) / "config.json", "wb") as f:
        f.truncate((16 << 20) + 1)  # sparse: 16 MiB + 1 byte of zeros, nothing on disk


def _fifo_weights(work: Path) -> None:
    os.mkfifo(_model_dir(work) / "model.safetensors")


def _fifo(work: Path) -> None:
    os.mkfifo(work / "fifo")


def _huge_line(work: Path) -> None:
    (work / "huge.jsonl").write_bytes(b'{"prompt": "' + b"x" * (16 << 20) + b'"}\n')


def _deep_in_run(name: str):
    """A setup: ``work/run`` holding ``name`` (a run mark or manifest) nested 30,000 deep."""

    def setup(work: Path) -> None:
        (work / "run").mkdir()
        (work / "run" / name).write_text("[" * 30_000 + "]" * 30_000)

    return setup


def _eval(model: str, extra: str = "") -> str:
    return f"evaluate lines --model {{{model}}} --lengths 3 --n 1 --out {{tmp}}/out {extra}"


FIX_CONFIG = r"; fix it in config\.json \(the value the model was trained with\), or save the"
SPECIAL = r"is {}, not a regular file; a {} is read whole, so pass a regular file"
NOT_FLOAT = (
    r"weight model\.norm\.weight is stored as {}, not as floating point; quantised or integer "
    r"weights are never cast to float silently .*Dequantise the model"
)
REAL_SCALES = r"scales are {}, but a scale table holds real floats \(float32\): convert it"
TEMPLATE = r"the chat template of .*{} failed \({}.*\); fix the template .*--chat-template none"
CONFIG_CASES = {  # (config damage, field, what the message says of it)
    "act-unknown": ("act_unknown", "hidden_act", r"must be an activation transformers knows"),
    "act-number": ("act_number", "hidden_act", r"must be an activation .*got 3 \(int\)"),
    "layers-string": ("layers_string", "num_hidden_layers", r"whole number >= 1, got '2' \(str\)"),
    "layers-fraction": ("layers_fraction", "num_hidden_layers", r"whole number >= 1, got 2\.5"),
    "layers-bool": ("layers_bool", "num_hidden_layers", r"whole number >= 1, got True \(bool\)"),
    "heads-string": ("heads_string", "num_attention_heads", r"whole number >= 1, got '4'"),
    "hidden-string": ("hidden_string", "hidden_size", r"whole number >= 1, got '64'"),
    "hidden-not-dividing": (
        "hidden_not_dividing",
        "hidden_size",
        r"is 66, not a multiple of num_attention_heads 4, and no head_dim is given",
    ),
    "head-dim-odd": ("head_dim_odd", "head_dim", r"is 15: RoPE rotates channel pairs"),
    "head-dim-zero": ("head_dim_zero", "head_dim", r"whole number >= 1, got 0"),
    "head-dim-derived-odd": ("head_dim_derived_odd", "head_dim", r"is 15: RoPE rotates"),
    "kv-zero": ("kv_zero", "num_key_value_heads", r"whole number >= 1, got 0"),
    "kv-string": ("kv_string", "num_key_value_heads", r"whole number >= 1, got '2'"),
    "vocab-zero": ("vocab_zero", "vocab_size", r"whole number >= 1, got 0"),
    "window-negative": ("window_negative", "max_position_embeddings", r"got -128"),
    "intermediate-zero": ("intermediate_zero", "intermediate_size", r"whole number >= 1, got 0"),
    "eps-negative": ("eps_negative", "rms_norm_eps", r"finite number >= 0, got -1e-06"),
    "eps-nan": ("eps_nan", "rms_norm_eps", r"finite number >= 0, got nan"),
    "eps-inf": ("eps_inf", "rms_norm_eps", r"finite number >= 0, got inf"),
    "eps-string": ("eps_string", "rms_norm_eps", r"finite number >= 0, got '1e-6' \(str\)"),
    "theta-zero": ("theta_zero", "rope_parameters.rope_theta", r"finite number > 0, got 0\.0"),
    "theta-negative": ("theta_negative", "rope_parameters.rope_theta", r"> 0, got -10000\.0"),
    "theta-nan": ("theta_nan", "rope_parameters.rope_theta", r"finite number > 0, got nan"),
    "theta-string": ("theta_string", "rope_parameters.rope_theta", r"> 0, got '10000'"),
    "theta-legacy-zero": ("theta_legacy_zero", "rope_theta", r"finite number > 0, got 0 "),
    "yarn-no-factor": (
        "yarn_no_factor",
        "rope_parameters.factor",
        r"is missing: RoPE type 'yarn' needs factor",
    ),
    "linear-no-factor": ("linear_no_factor", "rope_parameters.factor", r"RoPE type 'linear'"),
    "dynamic-no-factor": ("dynamic_no_factor", "rope_parameters.factor", r"type 'dynamic'"),
    "llama3-incomplete": (
        "llama3_incomplete",
        "rope_parameters.low_freq_factor",
        r"is missing: RoPE type 'llama3' needs factor, low_freq_factor, high_freq_factor",
    ),
    "longrope-no-factors": ("longrope_no_factors", "rope_parameters.short_factor", r"longrope"),
    "rope-factor-zero": ("rope_factor_zero", "rope_parameters.factor", r">= 1, got 0 \(int\)"),
    "rope-factor-nan": ("rope_factor_nan", "rope_parameters.factor", r">= 1, got nan"),
    "rope-unknown-type": (
        "rope_unknown_type",
        "rope_parameters.rope_type",
        r"is 'banana', not a RoPE type transformers knows \(default, linear",
    ),
    "rope-not-object": ("rope_not_object", "rope_parameters", r"must be an object of RoPE"),
    "rope-scaling-legacy": (
        "rope_scaling_legacy",
        "rope_scaling.factor",
        r"is missing: RoPE type 'yarn' needs factor",
    ),
}
VALIDATION_CASES = (
    {
        f"config-{name}": Case(
            argv=_eval(damage),
            message=rf"{damage}/config\.json: field '{re.escape(field)}' .*{says}.*{FIX_CONFIG}",
        )
        for name, (damage, field, says) in CONFIG_CASES.items()
    }
    | {
        "config-quantized": Case(
            argv=_eval("quantized"),
            message=r"quantized/config\.json: field 'quantization_config' says the weights are "
            r"quantised \('bitsandbytes'\); .*dequantise the model and save it in float16",
        ),
        "config-model-type-unknown": Case(
            argv=_eval("model_type_unknown"),
            message=r"field 'model_type' is 'llama99', not a model type the installed transformers "
            r"5\.\d+\.\d+ knows \(the version the lock pins\); interp-seal supports .*llama.*: use a",
        ),
        "config-model-type-missing": Case(
            argv=_eval("model_type_missing"),
            message=r"model_type_missing/config\.json: field 'model_type' is None, not a model type",
        ),
        "config-vocab-below-tokenizer": Case(
            argv=_eval("vocab_below_tokenizer"),
            message=r"vocab_below_tokenizer: field 'vocab_size' of config\.json is 100, but the "
            r"tokenizer has \d+ tokens: ids 100\.\.\d+ would have no embedding\. Use the tokenizer",
        ),
        # config.json that is not a JSON object of sane size and depth
        "config-deep": Case(
            argv=_eval("config_deep"),
            message=r"config_deep/config\.json: nests arrays or objects more than 64 levels deep; "
            r"the checkpoint is damaged: save the checkpoint again",
        ),
        "config-very-deep": Case(
            argv=_eval("config_very_deep"),
            message=r"config_very_deep/config\.json: nests arrays or objects more than 64 levels",
        ),
        "config-surrogate": Case(
            argv=_eval("config_surrogate"),
            message=r"config_surrogate/config\.json: field 'model_type' holds a lone surrogate "
            r"U\+D800 at character 5, which is not valid Unicode .*write the text as UTF-8",
        ),
        "config-latin1": Case(
            argv=_eval("config_latin1"),
            message=r"config_latin1/config\.json: not UTF-8 text \(byte 22\); the checkpoint is damaged",
        ),
        "config-array": Case(
            argv=_eval("config_array"),
            message=r"config_array/config\.json is not a JSON object; save the checkpoint again",
        ),
        "config-huge": Case(
            argv="evaluate lines --model {tmp}/model --lengths 3 --n 1 --out {tmp}/out",
            message=r"model/config\.json: is 16,777,217 bytes, more than the 16 MiB a JSON document "
            r"may hold \(is it the right file\?\)",
            setup=_huge_config,
        ),
        # special files where a checkpoint's files should be
        "config-fifo": Case(
            argv="evaluate lines --model {tmp}/model --lengths 3 --n 1 --out {tmp}/out",
            message="model/config\\.json "
            + SPECIAL.format(r"a FIFO \(named pipe\)", "checkpoint file"),
            setup=_fifo_config,
        ),
        "config-device": Case(
            argv="tune merge --model {tmp}/model --scales {scales} --out {tmp}/merged",
            message="model/config\\.json "
            + SPECIAL.format("a character device", "checkpoint file"),
            setup=_device_config,
        ),
        "config-directory": Case(
            argv="analysis head-sweep --model {tmp}/model --lengths 3 --n 1 --out {tmp}/out",
            message=r"model/config\.json is a directory, not a regular file",
            setup=_dir_config,
        ),
        "weights-fifo": Case(
            argv="evaluate lines --model {tmp}/model --lengths 3 --n 1",
            message="model/model\\.safetensors " + SPECIAL.format(r"a FIFO.*", "checkpoint file"),
            setup=_fifo_weights,
        ),
    }
    | {
        f"weights-{name}": Case(
            argv=_eval(f"{name.replace('-', '_')}_weight"), message=NOT_FLOAT.format(dtype)
        )
        for name, dtype in {
            "int8": "I8",
            "uint8": "U8",
            "int16": "I16",
            "int32": "I32",
            "int64": "I64",
            "float8-e4m3": "F8_E4M3",
            "float8-e5m2": "F8_E5M2",
            "bool": "BOOL",
            "complex": "C64",
        }.items()
    }
    | {
        # scale tables: real finite floats only, in every command that reads them
        **{
            f"merge-scales-{name}": Case(
                argv=f"tune merge --model {{ckpt}} --scales {{scales_{name}}} --out {{tmp}}/merged",
                message=rf"scales_{name}\.safetensors: " + REAL_SCALES.format(dtype),
            )
            for name, dtype in {
                "complex": "complex64",
                "float8": "float8_e4m3fn",
                "int64": "int64",
                "bool": "bool",
            }.items()
        },
        "evaluate-scales-complex": Case(  # once: every head pruned (the imaginary part dropped)
            argv="tune evaluate --model {ckpt} --scales c={scales_complex} --lengths 3 --n 1",
            message=r"scales_complex\.safetensors: " + REAL_SCALES.format("complex64"),
        ),
        "evaluate-scales-float8": Case(
            argv="tune evaluate --model {ckpt} --scales c={scales_float8} --lengths 3 --n 1",
            message=REAL_SCALES.format("float8_e4m3fn"),
        ),
        "scales-deep-metadata": Case(
            argv="tune merge --model {ckpt} --scales {scales_deep_meta} --out {tmp}/merged",
            message=r"scales_deep_meta\.safetensors: metadata 'hyperparameters': nests arrays or "
            r"objects more than 64 levels deep; write it again with `interp-seal tune seal-h`",
        ),
        "scales-surrogate-metadata": Case(
            argv="tune merge --model {ckpt} --scales {scales_surrogate_meta} --out {tmp}/merged",
            message=r"metadata 'hyperparameters': field 'lr' holds a lone surrogate U\+DC00",
        ),
        "scales-duplicate-name": Case(
            argv="tune evaluate --model {ckpt} --scales a={scales} a={scales_negative} --lengths 3",
            message=r"--scales: the name 'a' is given twice \('a=.*scales_negative\.safetensors'\); "
            r"give each file its own name",
            early=True,
        ),
        "scales-named-base": Case(
            argv="tune evaluate --model {ckpt} --scales base={scales} --lengths 3",
            message=r"--scales: the name 'base' is the base model's row .*give each file its own name",
            early=True,
        ),
        "tuned-named-like-scales": Case(
            argv="tune evaluate --model {ckpt} --scales s={scales} --tuned s={ckpt} --lengths 3",
            message=r"--tuned: the name 's' is given twice",
            early=True,
        ),
        "retrieval-tuned-named-base": Case(
            argv="tune retrieval --model {ckpt} --tuned base={ckpt} --n 1",
            message=r"--tuned: the name 'base' is the base model's row",
            early=True,
        ),
        "scales-fifo": Case(
            argv="tune merge --model {ckpt} --scales {tmp}/fifo --out {tmp}/merged",
            message=r"fifo " + SPECIAL.format(r"a FIFO \(named pipe\)", "scale file"),
            setup=_fifo,
        ),
        "scales-dev-zero": Case(
            argv="tune merge --model {ckpt} --scales /dev/zero --out {tmp}/merged",
            message=r"/dev/zero " + SPECIAL.format("a character device", "scale file"),
        ),
        "scales-directory": Case(
            argv="tune evaluate --model {ckpt} --scales s={tmp} --lengths 3",
            message=r"is a directory, not a regular file; a scale file is read whole",
        ),
        # predictions: the text a model generated, nothing else
        **{
            f"predictions-{kind}": Case(
                argv=f"evaluate generated {{tasks}} --predictions {{preds_{kind}}}",
                message=rf"preds_{kind}\.jsonl record 1: field 'pred' is {shown} \({type_}\), "
                r"not the text a model generated; write each prediction as a JSON string",
                early=True,
            )
            for kind, shown, type_ in (
                ("int", "7", "int"),
                ("null", "None", "NoneType"),
                ("list", r"\['7'\]", "list"),
                ("object", r"\{'text': '7'\}", "dict"),
                ("bool", "True", "bool"),
            )
        },
        "predictions-field-number": Case(
            argv="evaluate generated {tasks} --predictions {tasks} --field expected_number",
            message=r"record 1: field 'expected_number' is \d+ \(int\), not the text",
            early=True,
        ),
        "predictions-surrogate": Case(
            argv="evaluate generated {tasks} --predictions {preds_surrogate}",
            message=r"preds_surrogate\.jsonl:1: field 'pred' holds a lone surrogate U\+D800",
            early=True,
        ),
        "predictions-deep": Case(
            argv="evaluate generated {tasks} --predictions {preds_deep}",
            message=r"preds_deep\.jsonl:1: nests arrays or objects more than 64 levels deep; each "
            r"line must hold one complete JSON object",
            early=True,
        ),
        "predictions-fifo": Case(
            argv="evaluate generated {tasks} --predictions {tmp}/fifo",
            message=r"fifo " + SPECIAL.format(r"a FIFO \(named pipe\)", "JSONL file"),
            setup=_fifo,
            early=True,
        ),
        "predictions-huge-line": Case(
            argv="evaluate generated {tasks} --predictions {tmp}/huge.jsonl",
            message=r"huge\.jsonl:1: is longer than the 16 MiB a JSON document may hold",
            setup=_huge_line,
            early=True,
        ),
        # task files: JSON within limits, valid Unicode, regular files
        "tasks-deep": Case(
            argv="evaluate generate {tasks_deep} --model {ckpt}",
            message=r"tasks_deep\.jsonl:1: nests arrays or objects more than 64 levels deep",
            early=True,
        ),
        "tasks-nested-field": Case(
            argv="evaluate generated {tasks_nested} --predictions {preds}",
            message=r"tasks_nested\.jsonl:1: nests arrays or objects more than 64 levels deep",
            early=True,
        ),
        "tasks-surrogate-prompt": Case(
            argv="evaluate generate {tasks_surrogate_prompt} --model {ckpt}",
            message=r"tasks_surrogate_prompt\.jsonl:1: field 'prompt' holds a lone surrogate U\+D800 "
            r"at character 5, which is not valid Unicode",
            early=True,
        ),
        "tasks-surrogate-answer": Case(
            argv="evaluate generated {tasks_surrogate_answer} --predictions {preds}",
            message=r"tasks_surrogate_answer\.jsonl:1: field 'answer' holds a lone surrogate "
            r"U\+DFFF at character 1, which is not valid Unicode \(half of a UTF-16 pair\); "
            r"write the text as UTF-8",
            early=True,
        ),
        "tasks-surrogate-key": Case(
            argv="evaluate generated {tasks_surrogate_key} --predictions {preds}",
            message=r"tasks_surrogate_key\.jsonl:1: field '\\ud83d' holds a lone surrogate U\+D83D",
            early=True,
        ),
        "passages-surrogate": Case(
            argv="retrieval passage-scores --model {ckpt} --samples {passages_surrogate} --out {tmp}/r",
            message=r"passages_surrogate\.jsonl:1: field 'answers\[0\]' holds a lone surrogate",
            early=True,
        ),
        "tasks-fifo": Case(
            argv="evaluate generate {tmp}/fifo --model {ckpt}",
            message=r"fifo " + SPECIAL.format(r"a FIFO \(named pipe\)", "JSONL file"),
            setup=_fifo,
            early=True,
        ),
        "tasks-dev-zero": Case(
            argv="retrieval needle-scores --model {ckpt} --samples /dev/zero --out {tmp}/r",
            message=r"/dev/zero " + SPECIAL.format("a character device", "sample file"),
            early=True,
        ),
        "tasks-directory": Case(
            argv="evaluate generated {tmp} --predictions {preds}",
            message=r"is a directory, not a regular file; a JSONL file is read whole",
            early=True,
        ),
        "tasks-huge-line": Case(
            argv="evaluate generate {tmp}/huge.jsonl --model {ckpt}",
            message=r"huge\.jsonl:1: is longer than the 16 MiB a JSON document may hold \(is it the "
            r"right file\?\); each line must hold one complete JSON object",
            setup=_huge_line,
            early=True,
        ),
        "scores-fifo": Case(
            argv="retrieval masking --model {ckpt} --samples {tasks} --scores {tmp}/fifo --out {tmp}/m",
            message=r"fifo " + SPECIAL.format(r"a FIFO \(named pipe\)", "--scores file"),
            setup=_fifo,
            early=True,
        ),
        "targets-deep": Case(
            argv="tune retrieval --model {ckpt} --targets {targets_deep} --n 1",
            message=r"targets_deep\.json: nests arrays or objects more than 64 levels deep; pass the "
            r"heads\.json that `interp-seal tune mudaf` writes",
            early=True,
        ),
        "targets-not-pairs": Case(
            argv="tune retrieval --model {ckpt} --targets {targets_flat} --n 1",
            message=r"--targets .*targets_flat\.json is not a JSON list of \[layer, head\] pairs",
            early=True,
        ),
        "targets-fifo": Case(
            argv="tune retrieval --model {ckpt} --targets {tmp}/fifo --n 1",
            message=r"fifo " + SPECIAL.format(r"a FIFO \(named pipe\)", "--targets file"),
            setup=_fifo,
            early=True,
        ),
        # a run mark or manifest in --out nested past Python's parser: not one of ours
        **{
            f"out-deep-{name.strip('.').replace('.', '-')}": Case(
                argv=EVAL + " --out {tmp}/run",
                message=rf"--out .*run holds files interp-seal did not write \({re.escape(name)}\)",
                setup=_deep_in_run(name),
                early=True,
            )
            for name in (".interp-seal-run", "manifest.json")
        },
        # chat templates: rendered in jinja2's sandbox, within a time limit
        "template-loop": Case(
            argv=_eval("template_loop", "--chat-template tokenizer"),
            message=r"the chat template of .*template_loop did not finish rendering one message in "
            r"5 s \(a loop that never ends\?\); fix the template .*--chat-template none or vicuna",
        ),
        "template-syntax": Case(
            argv=_eval("template_syntax", "--chat-template tokenizer"),
            message=TEMPLATE.format("template_syntax", "TemplateSyntaxError"),
        ),
        "template-raises": Case(
            argv=_eval("template_raises", "--chat-template tokenizer"),
            message=TEMPLATE.format("template_raises", "TemplateError: this template refuses"),
        ),
        "template-range": Case(
            argv=_eval("template_range", "--chat-template tokenizer"),
            message=TEMPLATE.format("template_range", "OverflowError: Range too big"),
        ),
        "template-escape": Case(
            argv=_eval("template_escape", "--chat-template tokenizer"),
            message=TEMPLATE.format("template_escape", "(UndefinedError|SecurityError)"),
        ),
        "template-divide": Case(
            argv=_eval("template_divide", "--chat-template tokenizer"),
            message=TEMPLATE.format("template_divide", "ZeroDivisionError"),
        ),
        "template-recursion": Case(
            argv=_eval("template_recursion", "--chat-template tokenizer"),
            message=TEMPLATE.format("template_recursion", "RecursionError"),
        ),
        # devices: one that exists, refused when the arguments are parsed
        **{
            f"device-{name.replace(':', '-')}": Case(
                argv=f"{command} --device {name}",
                message=rf"argument --device: {says}",
                early=True,
            )
            for name, command, says in (
                (
                    "meta",
                    EVAL,
                    r"device 'meta' holds shapes but no data, .*; use --device cpu, cuda",
                ),
                (
                    "vulkan",
                    EVAL,
                    r"device 'vulkan' is not a device interp-seal runs models on; use",
                ),
                (
                    "xla",
                    "dashboard --model {ckpt}",
                    r"device 'xla' is not a device interp-seal runs",
                ),
                (
                    "cuda:99",
                    EVAL,
                    r"device cuda:99 asked for, but (no CUDA GPU is available here; use "
                    r"--device cpu|this machine has \d+ CUDA GPUs)",
                ),
                ("cuda:-1", EVAL, r"unknown device 'cuda:-1'; use --device cpu, cuda, cuda:N, mps"),
                (
                    "gpu",
                    "analysis head-sweep --model {ckpt} --out {tmp}/o",
                    r"unknown device 'gpu'",
                ),
                ("cpu:1", EVAL, r"device cpu:1 does not exist \(the CPU is cpu\)"),
                (
                    "mps",
                    "attribution dla --model {ckpt} --out {tmp}/o",
                    r"device mps asked for, but "
                    r"Apple's MPS is not available here; use --device cpu",
                ),
            )
        },
        # real numbers: finite, and in range, when the arguments are parsed
        **{
            f"float-{flag}-{value}": Case(
                argv=f"{command} --{flag} {value}",
                message=rf"argument --{flag}: must be {says}, got {value}",
                early=True,
            )
            for flag, value, command, says in (
                ("max-minutes", "nan", "organism train --smoke --out {tmp}/o", "a finite number"),
                ("max-minutes", "inf", "organism train --smoke --out {tmp}/o", "a finite number"),
                ("max-minutes", "0", "organism train --smoke --out {tmp}/o", "a number > 0"),
                ("max-minutes", "-5", "organism train --smoke --out {tmp}/o", "a number > 0"),
                (
                    "lr",
                    "nan",
                    "tune seal-h --model {ckpt} " + SMALL + " --out {tmp}/o",
                    "a finite number",
                ),
                (
                    "lr",
                    "-0.01",
                    "tune seal-c --model {ckpt} " + SMALL + " --out {tmp}/o",
                    "a number > 0",
                ),
                ("lr", "0", "tune lora --model {ckpt} " + SMALL + " --out {tmp}/o", "a number > 0"),
                (
                    "alpha",
                    "nan",
                    "tune dora --model {ckpt} " + SMALL + " --out {tmp}/o",
                    "a finite number",
                ),
                (
                    "alpha",
                    "1.5",
                    "tune mudaf --model {ckpt} --heads 0.1 " + SMALL + " --out {tmp}/o",
                    "a number from 0 to 1",
                ),
                (
                    "tau",
                    "0",
                    "tune mudaf --model {ckpt} --heads 0.1 " + SMALL + " --out {tmp}/o",
                    "a number > 0",
                ),
                (
                    "select-tau",
                    "nan",
                    "tune mudaf --model {ckpt} --sample-k 2 --scores {scores_columns} "
                    + SMALL
                    + " --out {tmp}/o",
                    "a finite number",
                ),
                ("factor", "nan", EVAL + " --ablate 0.1 --mode scale", "a finite number"),
                (
                    "factor",
                    "inf",
                    "analysis head-sweep --model {ckpt} --mode scale --out {tmp}/o",
                    "a finite number",
                ),
                (
                    "eps",
                    "2",
                    "retrieval passage-scores --model {ckpt} --samples {passages} --out {tmp}/o",
                    "a number from 0 to 1",
                ),
                (
                    "threshold",
                    "nan",
                    "retrieval needle-scores --model {ckpt} --samples {needles} --out {tmp}/o",
                    "a finite number",
                ),
            )
        },
    }
)
CLI_CASES |= VALIDATION_CASES


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
    # validation before work (issue 42, item 4), through the library
    **{
        f"intervention-{name}": ApiCase(
            call=lambda f, h, dtype=dtype: HeadIntervention.from_scales(
                h.spec, init_scales(h.spec, "head").to(dtype)
            ),
            error=ValueError,
            message=rf"scales are {name}, but a scale table holds real floats",
        )
        for name, dtype in {
            "complex64": torch.complex64,
            "float8_e4m3fn": torch.float8_e4m3fn,
            "int64": torch.int64,
        }.items()
    },
    "intervention-imaginary": ApiCase(  # 1j: its real part, 0, would prune every head
        call=lambda f, h: HeadIntervention.from_scales(h.spec, init_scales(h.spec, "head") * 1j),
        error=ValueError,
        message=r"scales are complex64, .*complex factors would lose their imaginary part",
    ),
    "check-scales-complex": ApiCase(
        call=lambda f, h: check_scales(init_scales(h.spec, "channel") * 1j, h.spec),
        error=ValueError,
        message=r"scales are complex64",
    ),
    "merge-complex-api": ApiCase(
        call=lambda f, h: check_mergeable(h, init_scales(h.spec, "head") * 1j, "o_proj"),
        error=ValueError,
        message=r"scales are complex64",
    ),
    "load-scales-float8": ApiCase(
        call=_load_scales("scales_float8"),
        error=ValueError,
        message=r"scales_float8\.safetensors: scales are float8_e4m3fn",
    ),
    "load-scales-dev-zero": ApiCase(
        call=lambda f, h: load_scales("/dev/zero", h.spec),
        error=ValueError,
        message=r"/dev/zero is a character device, not a regular file; a scale file is read whole",
    ),
    "score-non-string": ApiCase(
        call=lambda f, h: inspect.unwrap(score_records)([{"expected_number": 7}], [7]),
        error=TypeError,
        message=r"prediction 0 is 7 \(int\), not the text a model generated; pass strings",
    ),
    "load-device-meta": ApiCase(
        call=lambda f, h: load_model(f["ckpt"], device="meta"),
        error=ValueError,
        message=r"device 'meta' holds shapes but no data",
    ),
    "load-device-vulkan": ApiCase(
        call=lambda f, h: load_model(f["ckpt"], device="vulkan"),
        error=ValueError,
        message=r"device 'vulkan' is not a device interp-seal runs models on",
    ),
    "load-int8-weight": ApiCase(
        call=lambda f, h: load_model(f["int8_weight"]),
        error=CheckpointError,
        message=r"weight model\.norm\.weight is stored as I8, not as floating point",
    ),
    "load-quantized": ApiCase(
        call=lambda f, h: load_model(f["quantized"]),
        error=CheckpointError,
        message=r"field 'quantization_config' says the weights are quantised",
    ),
    "load-vocab-below-tokenizer": ApiCase(
        call=lambda f, h: load_model(f["vocab_below_tokenizer"]),
        error=CheckpointError,
        message=r"field 'vocab_size' of config\.json is 100, but the tokenizer has",
    ),
    "load-model-type-unknown": ApiCase(
        call=lambda f, h: load_model(f["model_type_unknown"]),
        error=UnsupportedModelError,
        message=r"'llama99', not a model type the installed transformers .* knows",
    ),
    "config-yarn-api": ApiCase(
        call=lambda f, h: check_config(
            {"model_type": "llama", "rope_parameters": {"rope_type": "yarn"}}, "cfg.json"
        ),
        error=CheckpointError,
        message=r"cfg\.json: field 'rope_parameters\.factor' is missing: RoPE type 'yarn'",
    ),
    "config-rope-per-layer-type": ApiCase(
        call=lambda f, h: check_config(
            {
                "model_type": "llama",
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": -1.0},
                },
            },
            "cfg.json",
        ),
        error=CheckpointError,
        message=r"field 'rope_parameters\.sliding_attention\.rope_theta' must be a finite number > 0",
    ),
    "state-deep": ApiCase(
        call=lambda f, h: DashboardState.from_json(
            json.dumps({"format": STATE_FORMAT, "model": "m"})[:-1]
            + ', "geometry": '
            + "[" * 100
            + "]" * 100
            + "}"
        ),
        error=ValueError,
        message=r"the dashboard state: nests arrays or objects more than 64 levels deep; copy it",
    ),
    "state-very-deep": ApiCase(
        call=lambda f, h: DashboardState.from_json("[" * 100_000 + "]" * 100_000),
        error=ValueError,
        message=r"the dashboard state: nests arrays or objects more than 64 levels deep",
    ),
    "state-huge": ApiCase(
        call=lambda f, h: DashboardState.from_json(" " * (16 << 20) + "{}"),
        error=ValueError,
        message=r"the dashboard state: is longer than the 16 MiB a JSON document may hold",
    ),
    "state-surrogate": ApiCase(
        call=lambda f, h: DashboardState.from_json('{"model": "\\ud800", "geometry": {}}'),
        error=ValueError,
        message=r"the dashboard state: field 'model' holds a lone surrogate U\+D800",
    ),
    "read-jsonl-deep": ApiCase(
        call=lambda f, h: jsonl.read_jsonl(f["tasks_deep"]),
        error=ValueError,
        message=r"tasks_deep\.jsonl:1: nests arrays or objects more than 64 levels deep",
    ),
    "read-jsonl-dev-zero": ApiCase(
        call=lambda f, h: jsonl.read_jsonl("/dev/zero"),
        error=ValueError,
        message=r"/dev/zero is a character device, not a regular file",
    ),
    "read-samples-surrogate": ApiCase(
        call=lambda f, h: jsonl.read_samples(f["tasks_surrogate_prompt"]),
        error=ValueError,
        message=r"tasks_surrogate_prompt\.jsonl:1: field 'prompt' holds a lone surrogate",
    ),
    "read-golden-deep": ApiCase(
        call=lambda f, h: jsonl.read_golden(f["golden_deep"]),
        error=ValueError,
        message=r"golden_deep\.json: nests arrays or objects more than 64 levels deep; expected "
        r"a JSON object of _id -> golden ids",
    ),
    "read-golden-directory": ApiCase(
        call=lambda f, h: jsonl.read_golden(f["ckpt"]),
        error=ValueError,
        message=r"ckpt is a directory, not a regular file; a golden-id file is read whole",
    ),
    "records-deep": ApiCase(
        call=lambda f, h: read_records(f["tasks_deep"], repair=False),
        error=ValueError,
        message=r"tasks_deep\.jsonl:1: nests arrays or objects more than 64 levels deep; "
        r"damaged\? delete the file to start over",
    ),
    "wrap-sample-template-raises": ApiCase(
        call=lambda f, h: wrap_sample(
            line_retrieval.generate(_cfg(3), 1)[0],
            "tokenizer",
            load_model(f["template_raises"]).tokenizer,
        ),
        error=ValueError,
        message=r"template_raises failed \(TemplateError: this template refuses\); fix the",
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
