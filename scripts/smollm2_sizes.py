"""The measurements behind the SmolLM2 gallery's sizes (``interp_seal/figures/sizes.py``).

Each prints one JSON line per point, on one torch thread, through ``FigureRun.samples`` (the
format every figure of the SmolLM2 gallery uses: integer line indices, the chat template, the
needles' and passage questions' lead-in forced):

    OMP_NUM_THREADS=1 python -m scripts.smollm2_sizes forward              # CPU s per forward, 1K-8K tokens
    OMP_NUM_THREADS=1 python -m scripts.smollm2_sizes needle 1000,4000,7000 1
    OMP_NUM_THREADS=1 python -m scripts.smollm2_sizes generate 1000,4000,7000   # greedy text, 12 tokens
    OMP_NUM_THREADS=1 python -m scripts.smollm2_sizes passages 10,20 20
    OMP_NUM_THREADS=1 python -m scripts.smollm2_sizes line_retrieval 3,5,7,10 20

``forward``: the CPU time of one teacher-forced forward on a needle prompt of each length (the
second of two runs); ``needle`` / ``passages`` / ``line_retrieval``: teacher-forced exact match
and first-token accuracy of ``N`` samples per size (needles: ``N`` per depth at 5 depths);
``generate``: the needles' greedy continuations after the lead-in, whether they start with the
key phrase (the model's own words, beside the strict exact match).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import torch

from interp_seal.evaluation import summarize, teacher_force
from interp_seal.figures.run import FigureRun
from interp_seal.figures.sizes import preset_sizes


def main(what: str, sizes: str = "1000,2000,4000,6000,8000", n: str = "1") -> None:
    torch.set_num_threads(1)
    run = FigureRun("smollm2", preset_sizes("smollm2"), tempfile.mkdtemp(), progress=False)
    for size in (int(x) for x in sizes.split(",")):
        task = "needle" if what in ("forward", "generate") else what
        samples = run.samples(task, int(n), seed=0, size=size)
        if what == "forward":
            samples = samples[len(samples) // 2 : len(samples) // 2 + 1]  # the 50 % depth
            teacher_force(run.handle, samples)
        if what == "generate":
            for s in samples:
                print(json.dumps({"size": size, **_generated(run, s)}), flush=True)
            continue
        cpu = time.process_time()
        scores = teacher_force(run.handle, samples)
        row = {"task": task, "size": size, "n": len(scores)}
        row["tokens"] = max(x.n_tokens for x in scores)
        row["cpu_s"] = round(time.process_time() - cpu, 2)
        if what != "forward":
            summary = summarize(scores)
            row |= {"exact_match": summary["exact_match"], "first_token": summary["first_token"]}
        print(json.dumps(row), flush=True)


def _generated(run: FigureRun, sample) -> dict:
    tok = run.handle.tokenizer
    ids = tok(sample.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = run.handle.model.generate(ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids.shape[1] :])
    key = sample.answer.strip()
    return {
        "depth": sample.meta["depth_percent"],
        "generated": text,
        "starts_with_key": text.strip().lower().startswith(key.lower()[:25]),
    }


if __name__ == "__main__":
    main(*sys.argv[1:])
