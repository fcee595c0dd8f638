"""``benchmarks/bench_kvpress.py`` without the kvpress environment (CI has none): the records both
tools read, the head choice both get, the reference of kvpress's convention, and the message
when the peer environment is missing. The side-by-side itself runs only where the peer
environment exists (``benchmarks/peers/README.md``)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp_seal.evaluation import line_retrieval_samples, teacher_force
from interp_seal.models import load_model
from interp_seal.models.spec import ModelSpec
from interp_seal.tasks.sample import Encoded

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
SMOLLM2 = ModelSpec(
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    d_head=64,
    d_model=576,
    vocab_size=49152,
    max_positions=8192,
)


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    sys.path.insert(0, str(BENCHMARKS / "peers"))
    try:
        yield importlib.import_module("bench_kvpress"), importlib.import_module("kvpress_run")
    finally:
        sys.path.remove(str(BENCHMARKS))
        sys.path.remove(str(BENCHMARKS / "peers"))


@pytest.fixture(scope="module")
def handle(llama_checkpoint):
    return load_model(llama_checkpoint)


@pytest.fixture(scope="module")
def records(bench, handle):
    bench_kvpress, _ = bench
    samples = line_retrieval_samples(handle.tokenizer, [6], n=3, seed=1)[6]
    return [
        bench_kvpress.split_record("lines", i, s, handle.tokenizer) for i, s in enumerate(samples)
    ]


def test_records_split_where_the_question_starts(bench, handle, records):
    bench_kvpress, kvpress_run = bench
    samples = line_retrieval_samples(handle.tokenizer, [6], n=3, seed=1)[6]
    for r, s in zip(records, samples, strict=True):
        enc = s.encode(handle.tokenizer)
        assert r["context_ids"] + r["question_ids"] == enc.prompt_ids.tolist()
        assert r["answer_ids"] == enc.answer_ids.tolist()
        assert r["question_text"].lstrip().startswith("Now the record is over")
        assert (
            r["context_text"].rstrip().endswith(">") and "record is over" not in r["context_text"]
        )
        # both tools hash the ids they read the same way
        ids = (r["context_ids"], r["question_ids"], r["answer_ids"])
        assert r["hash"] == kvpress_run.record_hash(*ids) == bench_kvpress.record_hash(*ids)
    assert len({r["hash"] for r in records}) == len(records)


def test_causal_ranking_and_conditions(bench):
    bench_kvpress, _ = bench
    ranking = bench_kvpress.causal_ranking()
    assert len(ranking) == 270 and sorted(ranking["rank"]) == list(range(1, 271))
    best = ranking.sort_values("rank").iloc[0]
    assert (best["layer"], best["head"]) == (16, 0)  # the head tests/acceptance calls most helpful
    conds = bench_kvpress.conditions(SMOLLM2, {"lines": (4, 96)}, [22])
    by_name = {c["name"]: c for c in conds}
    assert by_name["lines/full"]["streaming"] == [] and by_name["lines/full"]["full"] == 90
    assert len(by_name["lines/streaming_llm"]["streaming"]) == 90
    duo = by_name["lines/duo_attention/full=22"]
    assert duo["full"] == 22 and len(duo["streaming"]) == 68
    assert [16, 0] not in duo["streaming"]  # L16H0 reads KV head 0 of layer 16: kept full


def test_reference_without_compression_is_teacher_forcing(bench, handle, records):
    """kvpress's convention re-implemented (prefill the context, then question + answer on the
    cache at true positions): with nothing masked it predicts what teacher forcing does."""
    bench_kvpress, _ = bench
    full = {"name": "lines/full", "task": "lines", "press": "none", "sink": 4, "window": 32}
    full["streaming"] = []
    ref = bench_kvpress.score_reference(handle, records, full)
    encoded = [
        Encoded(
            input_ids=torch.tensor(r["context_ids"] + r["question_ids"] + r["answer_ids"]),
            answer_start=len(r["context_ids"]) + len(r["question_ids"]),
        )
        for r in records
    ]
    scores = teacher_force(handle, encoded, batch_size=1)
    assert [x["predicted"] for x in ref] == [list(s.predicted) for s in scores]
    # a window longer than the prompt masks nothing
    every = [[a, b] for a in range(handle.spec.n_layers) for b in range(handle.spec.n_kv_heads)]
    wide = full | {"press": "streaming_llm", "streaming": every, "window": 10_000}
    assert bench_kvpress.score_reference(handle, records, wide) == [
        x | {"condition": wide["name"]} for x in ref
    ]


def test_missing_peer_environment_is_named(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_kvpress.py"),
            "--peer-python",
            str(tmp_path / "nowhere" / "python"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "kvpress peer environment is missing" in run.stderr
    assert "benchmarks/peers/README.md" in run.stderr
