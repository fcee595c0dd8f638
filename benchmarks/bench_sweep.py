"""Benchmark: a per-head zero-ablation sweep, naive loop vs the batched cached sweep.

Command (from the repository root; about a minute on one CPU thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_sweep.py

Uses the bundled model organism when ``interp_seal/organism/checkpoint/config.json`` exists,
else a random GQA Llama with 4 layers and 8 heads (``tests/conftest.py``'s ``build_checkpoint``)
in a temporary directory. On the same LongEval records (``--n`` per length, ``--lengths`` lines)
it runs the sweep twice:

- naive: for every head and length, one ``hf_logits`` forward over the right-padded records
  with the head zeroed (full model, full ``T x vocab`` unembedding), scored at the answer
  positions;
- batched: ``interp_seal.analysis.sweeps.head_sweep`` (one clean forward per chunk of records,
  each head's forward started from the cached residual stream at its layer, the heads of a
  layer in one forward, the last layer and the unembedding only at answer positions).

It asserts that both give the same exact-match verdict for every (head, length, record) and
answer log-probabilities within 1e-4, and prints one final line::

    RESULT sweep sweep_speedup=<naive CPU s / batched CPU s> naive_s=... batched_s=... ...

Times are CPU seconds of this process (robust on a shared machine with one torch thread).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from interp_seal.analysis.batched_forward import AnswerBatch
from interp_seal.analysis.sweeps import SweepOptions, all_heads, head_sweep
from interp_seal.interventions import ablate, hf_logits
from interp_seal.models import load_model
from interp_seal.models.load import ORGANISM_DIR
from interp_seal.tasks import line_retrieval as lr

ROOT = Path(__file__).resolve().parent.parent


def load(tmp: str):
    if (ORGANISM_DIR / "config.json").exists():
        return load_model("organism"), "organism"
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import build_checkpoint

    path = build_checkpoint(Path(tmp) / "random", "llama", n_layers=4, n_heads=8, d_head=16)
    return load_model(path), "random-llama-4x8-gqa"


def naive_sweep(handle, samples: dict) -> dict:
    """``{(layer, head, length): (exact, logprob)}`` with one full forward per head and length."""
    out = {}
    for length, batch in samples.items():
        answers = AnswerBatch.from_encoded(
            [s.encode(handle.tokenizer) for s in batch], pad_id=handle.tokenizer.pad_token_id or 0
        )
        for layer, head in all_heads(handle):
            logits = hf_logits(handle, answers.ids, ablate(handle.spec, [(layer, head)], "zero"))
            rows = torch.arange(len(answers))[:, None]
            out[(layer, head, length)] = answers.score(logits[rows, answers.query])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 40], help="lines per record")
    parser.add_argument("--n", type=int, default=8, help="records per length")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        handle, model_name = load(tmp)
        samples = {n: lr.generate(lr.LineRetrievalConfig(num_lines=n), args.n, seed=0) for n in args.lengths}
        tokens = {n: max(len(s.encode(handle.tokenizer)) for s in b) for n, b in samples.items()}

        start = time.process_time()
        naive = naive_sweep(handle, samples)
        naive_s = time.process_time() - start

        start = time.process_time()
        options = SweepOptions(out=Path(tmp) / "sweep", progress=False, batch_rows=64, batch_samples=8)
        table = head_sweep(handle, samples, options=options)
        batched_s = time.process_time() - start

        # per-record agreement, read back from the sweep's own records
        import json

        units = all_heads(handle)
        n_checked = 0
        for line in (Path(tmp) / "sweep" / "records.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec["unit"] < 0:
                continue
            layer, head = units[rec["unit"]]
            exact, logprob = naive[(layer, head, rec["length"])]
            assert rec["exact_match"] == bool(exact[rec["sample"]]), rec
            assert abs(rec["answer_logprob"] - float(logprob[rec["sample"]])) < 1e-4, rec
            n_checked += 1
        assert n_checked == len(units) * args.n * len(args.lengths)

    exact = table[table.metric == "exact_match"]
    print(exact.groupby("length")[["baseline"]].first().rename(columns={"baseline": "accuracy"}))
    print(f"naive: {naive_s:.2f} CPU s, batched cached sweep: {batched_s:.2f} CPU s")
    print(
        f"RESULT sweep sweep_speedup={naive_s / batched_s:.2f} naive_s={naive_s:.2f} "
        f"batched_s={batched_s:.2f} heads={len(units)} lengths={'/'.join(map(str, args.lengths))} "
        f"n={args.n} max_tokens={max(tokens.values())} model={model_name} "
        f"identical_accuracy=True threads={args.threads}"
    )


if __name__ == "__main__":
    main()
