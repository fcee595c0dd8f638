"""Benchmark: interp-seal's streaming heads beside NVIDIA's kvpress, on the same records.

Command (from the repository root, the main environment; the peer environment made first as
``benchmarks/peers/README.md`` says; ~13 CPU minutes on one thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_kvpress.py
    OMP_NUM_THREADS=1 python benchmarks/bench_kvpress.py --n 5 --full-counts 30  # a quick look

DuoAttention (Xiao et al. 2024) keeps a full KV cache for a few *retrieval* KV heads and gives
every other KV head its attention sinks and a recent window; StreamingLLM (Xiao et al. 2023)
does that to every head. interp-seal runs both as an attention mode
(``interp_seal.models.streaming_heads``); kvpress (NVIDIA, PyPI ``kvpress``) has them as
``DuoAttentionPress`` and ``StreamingLLMPress``. This script puts the two tools on one model
(SmolLM2-135M-Instruct, the only real model offline), the same records and the same budgets:

1. **Records**, built with interp-seal's generators in the regime where SmolLM2 retrieves
   (``docs/smollm2.md``): LongEval line retrieval with integer indices inside the tokenizer's
   chat template, SEAL's answer prefix forced (``--lines`` lines); needles in the bundled essays
   (``--needle-tokens`` tokens, depths 0-100 %), answered by their key phrase after the needle's
   lead-in. Both seeded with ``--seed`` (1: the causal ranking below used seed 0's line records,
   so the heads are chosen on other data than they are scored on). Each record is split into a
   **context** and a **question**: kvpress compresses the context while prefilling it and then
   reads the question on the compressed cache, so the split is where the question starts (lines:
   ``"\\nNow the record is over. ..."``; needles: ``"\\nBased on the content of the book, ..."``;
   the chat template's closing turn and the forced answer prefix belong to the question; a token
   that straddles the point goes to the question). ``records.jsonl`` in ``--out`` holds each
   record's prompt and answer text, its token ids (context, question, answer) and ``hash``
   (sha256 of the three id lists). Both tools read these ids; the table prints each task's
   digest of its record hashes as each tool computed it.
2. **Heads.** StreamingLLM: every KV head streams. DuoAttention: the ``m`` best KV heads by a
   causal ranking stay full (``--full-counts``), the rest stream. The ranking is the exact
   zero-ablation sweep of all 270 query heads kept in ``tests/data/smollm2_head_sweep`` (mean
   change of the answer's log-probability; a KV head ranks by its best query head,
   ``kv_compression.kv_head_order``), the ranking ``interp-seal retrieval compress --sweep`` uses.
   kvpress's ``DuoAttentionPress`` would download DuoAttention's trained patterns from GitHub
   (unreachable here, and none exist for SmolLM2): it gets this same head choice from
   ``conditions.json`` instead (``benchmarks/peers/kvpress_run.py`` says how).
3. **Budgets.** Each task has one ``sink`` and ``window``. interp-seal's streaming heads let
   query ``i`` see keys ``j < sink`` or ``i - j < window``, in the prefill too, and its cache
   keeps ``sink + window - 1`` positions per streaming head after the prompt. kvpress keeps
   ``sink + recent`` context positions per streaming head, attends fully while prefilling, then
   appends the question; with ``recent = window - len(question)`` the last prompt token (which
   predicts the first answer token) sees the same key positions in both tools, and kvpress's
   cache holds ``sink + window`` positions per streaming head after the prompt (one more than
   interp-seal's: both byte counts are printed).
4. **Metric**: greedy exact match of the whole answer, decided by teacher forcing (greedy
   decoding reproduces the answer iff the argmax at every answer position is the answer token):
   interp-seal's ``teacher_force`` over prompt + answer in one forward; kvpress's side prefills
   the context under the press and then runs the question and the answer tokens on the
   compressed cache at their true positions (its pipeline's ``generate_answer``), taking the same
   argmaxes. With no compression the two must agree on every record (the harness check printed
   first); under compression they compute different things by design (prefill attention
   restricted or not; the window sliding or fixed) and the table shows by how much.

KV bytes are float32 keys and values after the prompt, averaged over a task's records:
interp-seal's ``kv_budget_bytes``; kvpress's counted from its cache after the question (for
``DuoAttentionPress``, whose cache keeps every position and masks a streaming head's middle
keys, the unmasked ones; ``held`` is what its cache physically holds).

Measured on the shared 2-core machine (one torch thread, other jobs running: 784 CPU s in all,
27 min wall), defaults (20 records per task, seed 1; lines: 7 lines, 301 prompt tokens of which
50 are the question, sink 4, window 96; needles: 874 tokens of which 36 are the question, sink 4,
window 256), exact match interp-seal / kvpress, KV MiB interp-seal / kvpress (held)::

    task    condition        full KV heads  exact match    KV MiB
    lines   full                   90       0.15 / 0.15    13.25 / 13.25 (13.25)
    lines   StreamingLLM            0       0.05 / 0.10     4.35 /  4.39 ( 4.39)
    lines   DuoAttention           22       0.15 / 0.15     6.52 /  6.56 (13.25)
    lines   DuoAttention           45       0.15 / 0.20     8.80 /  8.82 (13.25)
    needle  full                   90       0.80 / 0.80    38.42 / 38.42 (38.42)
    needle  StreamingLLM            0       0.25 / 0.25    11.38 / 11.43 (11.43)
    needle  DuoAttention           22       0.25 / 0.25    17.99 / 18.02 (38.42)
    needle  DuoAttention           45       0.20 / 0.30    24.90 / 24.92 (38.42)

Both tools read the same records (equal digests); uncompressed, their verdicts agree on all 40
records. kvpress predicts exactly what the reference predicts (the same argmax at every answer
position of all 160 scored records), so it is configured as described. interp-seal and kvpress
disagree on 4 of the 120 compressed records, each time with kvpress right and interp-seal wrong
(a sign test on 4 discordant pairs: p = 0.125): restricting a streaming head's attention in the
prefill as well costs a little here, never helps. With 22 of 90 KV heads full (the causal
ranking's top quarter) both tools keep the uncompressed line accuracy at 49 % of the bytes; on
needles every compressed setting loses most of the 0.80. n = 20 per cell: one standard error is
about 0.1.

Final lines, one per task and condition, then a summary::

    RESULT kvpress_side_by_side task=<lines|needle> condition=<name> full_kv_heads=<m> n=<n>
        same_records=<True|False> ours_em=<...> kvpress_em=<...> agree=<records with the same
        verdict / n> ours_kv_bytes=<...> kvpress_kv_bytes=<...> kvpress_kv_bytes_held=<...>
        device=cpu dtype=float32 clock=cpu_s
    RESULT kvpress harness_agree=<records agreeing with no compression / all> ours_cpu_s=<...>
        kvpress_cpu_s=<...> device=cpu dtype=float32 clock=cpu_s
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from common import Clock, result_tags

from interp_seal.analysis.kv_compression import kv_head_order, kv_heads
from interp_seal.evaluation import line_retrieval_samples, teacher_force
from interp_seal.models import ModelHandle, StreamingHeads, compress_kv, kv_budget_bytes, load_model
from interp_seal.models.spec import ModelSpec
from interp_seal.records import read_records
from interp_seal.tasks import needle
from interp_seal.tasks.chat import force_prefix, wrap_samples
from interp_seal.tasks.sample import Encoded, Sample

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / "benchmarks" / "peers" / ".venv" / "bin" / "python"
PEER_SCRIPT = ROOT / "benchmarks" / "peers" / "kvpress_run.py"
SWEEP = ROOT / "tests" / "data" / "smollm2_head_sweep"
QUESTION_STARTS = {  # task -> the text the question part starts with
    "lines": "\nNow the record is over.",
    "needle": "\nBased on the content of the book,",
}
PEER_MISSING = (
    "The kvpress peer environment is missing: {python} does not exist. Make it as "
    "benchmarks/peers/README.md says (python -m venv benchmarks/peers/.venv; "
    "benchmarks/peers/.venv/bin/pip install torch==2.13.0; "
    "benchmarks/peers/.venv/bin/pip install -r benchmarks/peers/requirements-kvpress.txt), or "
    "pass --peer-python, or --no-peer for interp-seal's side alone."
)


# -- records -----------------------------------------------------------------------------------
def record_hash(context: list[int], question: list[int], answer: list[int]) -> str:
    """sha256 (16 hex digits) of the three id lists, as ``kvpress_run.record_hash`` computes it."""
    text = json.dumps([context, question, answer], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def task_samples(handle: ModelHandle, *, n: int, seed: int, lines: int, needle_tokens: int):
    """``{"lines": [...], "needle": [...]}``: ``n`` records of each task in the SmolLM2 gallery's
    format (integer indices, the tokenizer's chat template, answers' lead-ins forced, its
    haystack)."""
    tok = handle.tokenizer
    line_records = line_retrieval_samples(
        tok, [lines], n=n, seed=seed, index_style="integers", chat_template="tokenizer"
    )[lines]
    depths = needle.linear_grid(0, 100, n)
    cfg = needle.NeedleConfig(
        context_lengths=(needle_tokens,),
        depths=depths,
        haystack=needle.read_haystack("essays"),  # the gallery's; 1K tokens fit it unrepeated
        answer="key_phrase",
    )
    raw = needle.generate(cfg, tok, 1, seed)
    needles = wrap_samples([force_prefix(s, needle.lead_in(s)) for s in raw], "tokenizer", tok)
    return {"lines": line_records, "needle": needles}


def split_record(task: str, index: int, sample: Sample, tokenizer) -> dict:
    """One record as both tools read it: the prompt's ids cut where the question starts (a
    token straddling that point goes to the question), and the answer's ids."""
    enc = sample.encode(tokenizer)
    prompt_ids = enc.prompt_ids.tolist()
    at = sample.prompt.rfind(QUESTION_STARTS[task])
    if at < 0:
        raise ValueError(f"{task} record {index}: no {QUESTION_STARTS[task]!r} in its prompt")
    offsets = tokenizer(sample.prompt, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) != len(prompt_ids):
        raise ValueError(f"{task} record {index}: offsets and ids disagree in length")
    cut = sum(1 for a, b in offsets if b <= at)
    context, question = prompt_ids[:cut], prompt_ids[cut:]
    answer = enc.answer_ids.tolist()
    return {
        "task": task,
        "id": f"{task}/{index}",
        "hash": record_hash(context, question, answer),
        "prompt": sample.prompt,
        "answer": sample.answer,
        "context_text": tokenizer.decode(context),
        "question_text": tokenizer.decode(question),
        "context_ids": context,
        "question_ids": question,
        "answer_ids": answer,
    }


def task_digest(hashes: list[str]) -> str:
    """One digest of a task's record hashes, in order."""
    return hashlib.sha256(",".join(hashes).encode()).hexdigest()[:16]


# -- heads and conditions ----------------------------------------------------------------------
def causal_ranking(sweep_dir: Path = SWEEP) -> pd.DataFrame:
    """Query heads ranked by the mean change of the answer's log-probability when each is zeroed
    (the stored exact sweep; rank 1 hurts most)."""
    records = read_records(sweep_dir / "records.jsonl")
    base = {(r["length"], r["sample"]): r["answer_logprob"] for r in records if r["unit"] < 0}
    delta: dict[int, list[float]] = {}
    for r in records:
        if r["unit"] >= 0:
            delta.setdefault(r["unit"], []).append(
                r["answer_logprob"] - base[r["length"], r["sample"]]
            )
    units = sorted(delta)
    heads_per_layer = 9  # SmolLM2: unit = layer * 9 + head
    table = pd.DataFrame(
        {
            "layer": [u // heads_per_layer for u in units],
            "head": [u % heads_per_layer for u in units],
            "delta": [float(np.mean(delta[u])) for u in units],
        }
    )
    table["rank"] = table["delta"].rank(method="first").astype(int)
    return table


def conditions(
    spec: ModelSpec, windows: dict[str, tuple[int, int]], full_counts: list[int]
) -> list[dict]:
    """Per task: no compression, StreamingLLM (every KV head streaming) and DuoAttention with
    the ``m`` causally best KV heads full, for each ``m``."""
    every = kv_heads(spec)
    order = kv_head_order(causal_ranking(), spec)
    out = []
    for task, (sink, window) in windows.items():
        base = {"task": task, "sink": sink, "window": window}
        out.append(base | {"name": f"{task}/full", "press": "none", "streaming": []})
        out.append(
            base
            | {
                "name": f"{task}/streaming_llm",
                "press": "streaming_llm",
                "streaming": [list(h) for h in every],
            }
        )
        for m in full_counts:
            out.append(
                base
                | {
                    "name": f"{task}/duo_attention/full={m}",
                    "press": "duo_attention",
                    "streaming": [list(h) for h in sorted(order[m:])],
                }
            )
    for c in out:
        c["full"] = len(every) - len(c["streaming"])
    return out


# -- interp-seal's side ------------------------------------------------------------------------
def score_ours(handle: ModelHandle, records: list[dict], condition: dict) -> list[dict]:
    """Teacher-forced exact match of each record with ``condition``'s streaming heads (the
    whole prompt + answer in one forward; streaming heads on sink + window throughout)."""
    encoded = [
        Encoded(
            input_ids=torch.tensor(r["context_ids"] + r["question_ids"] + r["answer_ids"]),
            answer_start=len(r["context_ids"]) + len(r["question_ids"]),
        )
        for r in records
    ]
    config = None
    if condition["press"] != "none":
        config = StreamingHeads(
            heads=frozenset(map(tuple, condition["streaming"])),
            sink=condition["sink"],
            window=condition["window"],
        )
    if config is None:
        scores = teacher_force(handle, encoded, batch_size=1)
    else:
        with compress_kv(handle, config):
            scores = teacher_force(handle, encoded, batch_size=1)
    itemsize = next(handle.model.parameters()).element_size()
    return [
        {
            "condition": condition["name"],
            "record": r["id"],
            "hash": record_hash(r["context_ids"], r["question_ids"], r["answer_ids"]),
            "exact_match": bool(s.exact_match),
            "predicted": list(s.predicted),
            "kv_bytes": kv_budget_bytes(config, handle.spec, e.answer_start, itemsize=itemsize),
        }
        for r, s, e in zip(records, scores, encoded, strict=True)
    ]


# -- kvpress's convention, re-implemented here -------------------------------------------------
REFERENCE_ATTENTION = "bench_kvpress_evict_after_prefill"


def masked_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention of the question / answer rows over the full prefilled cache, with a
    streaming KV head's context keys between its sinks and its recent window masked out
    (``module._evict``: ``(streaming KV heads, sink, first recent position, context length)``);
    causal among the new rows. Plain causal attention while prefilling."""
    B, H, Tq, D = query.shape
    Tk, n_kv = key.shape[2], key.shape[1]
    k = key.repeat_interleave(H // n_kv, dim=1)
    v = value.repeat_interleave(H // n_kv, dim=1)
    scores = (query @ k.transpose(-1, -2)) * (D**-0.5 if scaling is None else scaling)
    q_pos = torch.arange(Tk - Tq, Tk)
    k_pos = torch.arange(Tk)
    visible = (k_pos[None, :] <= q_pos[:, None]).expand(H, Tq, Tk).clone()  # (head, q, k)
    streaming, sink, first_recent, context = getattr(module, "_evict", ((), 0, 0, 0))
    if Tq < Tk:  # decoding on the prefilled context, as kvpress's attention patch
        middle = (k_pos >= sink) & (k_pos < first_recent)
        for kv in streaming:
            visible[kv * (H // n_kv) : (kv + 1) * (H // n_kv), :, middle] = False
    scores = scores.masked_fill(~visible, float("-inf"))
    out = scores.softmax(-1) @ v
    return out.transpose(1, 2).contiguous(), None


def score_reference(handle: ModelHandle, records: list[dict], condition: dict) -> list[dict]:
    """kvpress's convention without kvpress: the context prefilled with full attention into a
    plain cache, then the question and the answer tokens (teacher-forced, at their true
    positions) with each streaming KV head's context keys outside its sinks and its last
    ``window - len(question)`` positions masked: what ``StreamingLLMPress`` evicts and what
    ``DuoAttentionPress`` masks. A check of the peer's configuration, and the split of any gap
    between the tools: reference vs kvpress is the harness, interp-seal vs reference is the
    method (prefill attention restricted, the window sliding)."""
    from transformers import AttentionInterface

    from interp_seal.models.kv_cache import cache_arg, returned_cache

    model = handle.model
    AttentionInterface.register(REFERENCE_ATTENTION, masked_eager)
    old = model.config._attn_implementation
    streaming = {}
    for layer, head in condition["streaming"]:
        streaming.setdefault(layer, []).append(head)
    out = []
    try:
        for r in records:
            C, Q = len(r["context_ids"]), len(r["question_ids"])
            recent = condition["window"] - Q
            first_recent = C - recent if condition["press"] != "none" else 0
            with torch.no_grad():
                model.set_attn_implementation("sdpa")
                pre = model.base_model(
                    torch.tensor([r["context_ids"]]), use_cache=True
                )  # no logits
                model.set_attn_implementation(REFERENCE_ATTENTION)
                for i in range(handle.spec.n_layers):
                    heads = streaming.get(i, []) if condition["press"] != "none" else []
                    handle.attn(i)._evict = (heads, condition["sink"], first_recent, C)
                rest = r["question_ids"] + r["answer_ids"][:-1]
                logits = model(
                    torch.tensor([rest]),
                    position_ids=torch.arange(C, C + len(rest))[None],
                    **cache_arg(returned_cache(pre)),
                ).logits[0, Q - 1 :]
            predicted = logits.argmax(-1).tolist()
            out.append(
                {
                    "condition": condition["name"],
                    "record": r["id"],
                    "exact_match": predicted == r["answer_ids"],
                    "predicted": predicted,
                }
            )
    finally:
        model.set_attn_implementation(old)
        for i in range(handle.spec.n_layers):
            if hasattr(handle.attn(i), "_evict"):
                del handle.attn(i)._evict
    return out


# -- the peer ----------------------------------------------------------------------------------
def run_peer(python: Path, model_dir: str, out: Path, threads: int) -> float:
    """``kvpress_run.py`` in the peer environment; returns its CPU seconds (children's)."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    before = os.times()
    subprocess.run(
        [
            str(python),
            str(PEER_SCRIPT),
            "--model",
            model_dir,
            "--records",
            str(out / "records.jsonl"),
            "--conditions",
            str(out / "conditions.json"),
            "--out",
            str(out / "kvpress.jsonl"),
            "--threads",
            str(threads),
        ],
        check=True,
        env=env,
        cwd=ROOT,
    )
    after = os.times()
    return (after.children_user + after.children_system) - (
        before.children_user + before.children_system
    )


# -- the table ---------------------------------------------------------------------------------
def side_by_side(records, conds, ours: list[dict], peer: list[dict], ref: list[dict]):
    """One row per condition: both tools' exact match and the reference's, agreements (records
    with the same verdict), KV bytes, record digests."""
    rows = []
    for c in conds:
        task_records = [r for r in records if r["task"] == c["task"]]
        mine = [o for o in ours if o["condition"] == c["name"]]
        theirs = {p["record"]: p for p in peer if p["condition"] == c["name"]}
        pairs = [(o, theirs.get(o["record"])) for o in mine]
        check = {x["record"]: x for x in ref if x["condition"] == c["name"]}
        refs = [check[o["record"]] for o in mine]
        if any(p is None for _, p in pairs):
            raise ValueError(f"{c['name']}: kvpress scored {len(theirs)} of {len(mine)} records")
        rows.append(
            {
                "task": c["task"],
                "condition": c["name"].split("/", 1)[1],
                "full_kv_heads": c["full"],
                "sink": c["sink"],
                "window": c["window"],
                "n": len(mine),
                "tokens": float(
                    np.mean([len(r["context_ids"]) + len(r["question_ids"]) for r in task_records])
                ),
                "question_tokens": float(np.mean([len(r["question_ids"]) for r in task_records])),
                "ours_records": task_digest([o["hash"] for o in mine]),
                "kvpress_records": task_digest([p["hash"] for _, p in pairs]),
                "ours_em": float(np.mean([o["exact_match"] for o in mine])),
                "kvpress_em": float(np.mean([p["exact_match"] for _, p in pairs])),
                "agree": sum(o["exact_match"] == p["exact_match"] for o, p in pairs),
                "first_token_agree": sum(o["predicted"][0] == p["predicted"][0] for o, p in pairs),
                "ref_em": float(np.mean([x["exact_match"] for x in refs])),
                "ref_kvpress_agree": sum(
                    x["predicted"] == p["predicted"] for x, (_, p) in zip(refs, pairs, strict=True)
                ),
                "ours_ref_agree": sum(
                    o["exact_match"] == x["exact_match"]
                    for x, (o, _) in zip(refs, pairs, strict=True)
                ),
                "ours_kv_bytes": float(np.mean([o["kv_bytes"] for o in mine])),
                "kvpress_kv_bytes": float(np.mean([p["kv_bytes"] for _, p in pairs])),
                "kvpress_kv_bytes_held": float(np.mean([p["kv_bytes_held"] for _, p in pairs])),
            }
        )
    table = pd.DataFrame(rows)
    table["same_records"] = table["ours_records"] == table["kvpress_records"]
    return table


def print_table(table: pd.DataFrame, records: list[dict]) -> None:
    for task, group in table.groupby("task", sort=False):
        first = group.iloc[0]
        example = next(r for r in records if r["task"] == task)
        print(
            f"\n== task {task}: {first['n']} records, {first['tokens']:.0f} prompt tokens on "
            f"average ({first['question_tokens']:.0f} of them the question), sink "
            f"{first['sink']}, window {first['window']}; record digest interp-seal "
            f"{first['ours_records']}, kvpress {first['kvpress_records']} "
            f"({'the same' if first['same_records'] else 'DIFFERENT'})"
        )
        print(f"   question part of record 0: {example['question_text']!r}")
        print(f"   answer of record 0: {example['answer']!r}")
        print(
            f"   {'condition':28s} {'full KV':>7s} {'EM ours':>8s} {'EM kvpress':>10s} "
            f"{'agree':>6s} {'1st tok':>7s} {'KV MiB ours':>11s} {'KV MiB kvpress':>14s} "
            f"{'(held)':>8s} {'EM ref':>6s} {'ref=kvpress':>11s} {'ours~ref':>8s}"
        )
        for row in group.itertuples():
            print(
                f"   {row.condition:28s} {row.full_kv_heads:7d} {row.ours_em:8.2f} "
                f"{row.kvpress_em:10.2f} {row.agree:3d}/{row.n:<2d} "
                f"{row.first_token_agree:4d}/{row.n:<2d} {row.ours_kv_bytes / 2**20:11.2f} "
                f"{row.kvpress_kv_bytes / 2**20:14.2f} {row.kvpress_kv_bytes_held / 2**20:8.2f} "
                f"{row.ref_em:6.2f} {row.ref_kvpress_agree:8d}/{row.n:<2d} "
                f"{row.ours_ref_agree:5d}/{row.n:<2d}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20, help="records per task (default: 20)")
    parser.add_argument("--seed", type=int, default=1, help="records' seed (default: 1)")
    parser.add_argument("--lines", type=int, default=7, help="lines per record (default: 7)")
    parser.add_argument("--needle-tokens", type=int, default=1000, help="needle context length")
    parser.add_argument(
        "--line-window", type=int, nargs=2, default=[4, 96], metavar=("SINK", "WINDOW")
    )
    parser.add_argument(
        "--needle-window", type=int, nargs=2, default=[4, 256], metavar=("SINK", "WINDOW")
    )
    parser.add_argument(
        "--full-counts",
        type=int,
        nargs="+",
        default=[22, 45],
        help="DuoAttention: KV heads kept full, of 90 (default: 22 45, a quarter and a half)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_kvpress")
    parser.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    parser.add_argument("--no-peer", action="store_true", help="interp-seal's side only")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    args.dtype, args.device = "float32", "cpu"
    if not args.no_peer and not args.peer_python.exists():
        sys.exit(PEER_MISSING.format(python=args.peer_python))
    torch.set_num_threads(args.threads)
    clock = Clock("cpu")
    handle = load_model("smollm2")
    samples = task_samples(
        handle, n=args.n, seed=args.seed, lines=args.lines, needle_tokens=args.needle_tokens
    )
    records = [
        split_record(task, i, s, handle.tokenizer)
        for task, batch in samples.items()
        for i, s in enumerate(batch)
    ]
    windows = {"lines": tuple(args.line_window), "needle": tuple(args.needle_window)}
    conds = conditions(handle.spec, windows, args.full_counts)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "records.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    (args.out / "conditions.json").write_text(json.dumps(conds, indent=1))
    print(f"records and conditions written to {args.out}", flush=True)

    start = clock()
    ours = []
    for c in conds:
        ours += score_ours(handle, [r for r in records if r["task"] == c["task"]], c)
        print(f"interp-seal: {c['name']} done", flush=True)
    ours_s = clock() - start
    with open(args.out / "interp_seal.jsonl", "w", encoding="utf-8") as f:
        for o in ours:
            f.write(json.dumps(o) + "\n")
    if args.no_peer:
        for c in conds:
            em = np.mean([o["exact_match"] for o in ours if o["condition"] == c["name"]])
            print(f"{c['name']:40s} interp-seal exact match {em:.2f}")
        return
    start = clock()
    ref = []
    for c in conds:
        ref += score_reference(handle, [r for r in records if r["task"] == c["task"]], c)
    ref_s = clock() - start
    print(f"reference (kvpress's convention, here): {ref_s:.0f} CPU s", flush=True)
    peer_s = run_peer(args.peer_python, str(handle.name_or_path), args.out, args.threads)
    peer = read_records(args.out / "kvpress.jsonl")
    table = side_by_side(records, conds, ours, peer, ref)
    table.to_csv(args.out / "side_by_side.csv", index=False)
    print(
        "\nSmolLM2-135M-Instruct, float32, CPU. Exact match = greedy exact match of the whole "
        "answer by teacher forcing, both tools. DuoAttentionPress is given interp-seal's causal "
        "head choice from conditions.json (kvpress would download DuoAttention's trained "
        "patterns from GitHub: unreachable here, none for SmolLM2). KV MiB: float32 keys and "
        "values after the prompt, mean per record; (held): what kvpress's cache physically "
        "holds (DuoAttentionPress masks instead of evicting)."
    )
    print_table(table, records)
    tags = result_tags(args, clock)
    print()
    for row in table.itertuples():
        print(
            f"RESULT kvpress_side_by_side task={row.task} condition={row.condition} "
            f"full_kv_heads={row.full_kv_heads} n={row.n} same_records={row.same_records} "
            f"ours_em={row.ours_em:.2f} kvpress_em={row.kvpress_em:.2f} "
            f"agree={row.agree}/{row.n} ours_kv_bytes={row.ours_kv_bytes:.0f} "
            f"kvpress_kv_bytes={row.kvpress_kv_bytes:.0f} "
            f"kvpress_kv_bytes_held={row.kvpress_kv_bytes_held:.0f} {tags}"
        )
    full = table[table["condition"] == "full"]
    print(
        f"RESULT kvpress harness_agree={int(full['agree'].sum())}/{int(full['n'].sum())} "
        f"same_records={bool(table['same_records'].all())} ours_cpu_s={ours_s:.0f} "
        f"kvpress_cpu_s={peer_s:.0f} {tags}"
    )


if __name__ == "__main__":
    main()
