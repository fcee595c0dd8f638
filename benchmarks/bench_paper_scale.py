"""Benchmark: every analysis at paper scale (7-8B models, 8K-31K tokens), with nothing downloaded.

Commands (from the repository root)::

    # CPU: tiny geometry (4 layers x 4 heads of 16), 256 and 512 tokens, float32; ~30 s
    OMP_NUM_THREADS=1 python benchmarks/bench_paper_scale.py --tiny

    # one GPU (H100 80 GB or H200), bfloat16, every geometry at 8K / 16K / 31K tokens
    python benchmarks/bench_paper_scale.py --device cuda --geometry longchat llama31 qwen25 \\
        --peers --timeout-per-cell 60 --stop-after 480 --out paper_scale.jsonl
    # the tables of one or several such runs (a later run's cells replace skipped ones)
    python benchmarks/bench_paper_scale.py --table paper_scale.jsonl

The model has the geometry of LongChat-7B-32K (``tests/data/longchat_7b_32k_config.json``:
LLaMA-2-7B, 32 layers x 32 heads x 128, no GQA, vocabulary 32000), Llama-3.1-8B
(``llama_3_1_8b_config.json``: 32 x 32 heads over 8 KV heads, MLP 14336, vocabulary 128256,
llama3 RoPE) or Qwen2.5-7B (``qwen2_5_7b_config.json``: 28 x 28 heads over 4 KV heads, MLP
18944, vocabulary 152064, q/k/v biases). It is built directly on ``--device``: constructed on
``torch.device("meta")`` (no memory), materialised with ``to_empty`` and initialised in place
in ``--dtype`` (``initialize_weights``: linear and embedding weights ~ N(0, 0.02), norm weights
1, biases 0, RoPE buffers recomputed; seeded by ``--seed``), then wrapped in a ``ModelHandle``
as ``load_model`` wraps what it loads. No weight is read from disk or sent over the bus.

**Random weights are honest for time and memory, not for accuracy.** Every analysis runs the
same kernels on tensors of the same shapes whatever the weights hold, so seconds and bytes are
those of the real model; the scores, the heads found and the generated text mean nothing. The
one place content changes the work is decoding: a random model rarely emits EOS, so generation
runs its full ``--decode-tokens`` (as a real model that does not stop would).

The prompts are LongEval line-retrieval records (``tasks.line_retrieval``, adjective-noun
indices) tokenised by the project's word-level line-retrieval tokenizer
(``interp_seal.testing.line_retrieval_tokenizer``, 2,582 entries, smaller than the models'
vocabularies, which is fine for random weights): for each target length the number of lines
whose record (prompt + answer) has the most tokens not above it (``num_lines_for_tokens``;
this tokenizer spells numbers digit by digit, ~12.8 tokens a line, so 31,744 tokens is 2,477
lines where Llama's tokenizer needs ~1,350). The RESULT lines give the actual token count.

**The analyses**, each called through the library's public function as its command calls it
(and as ``tests/integration/test_plan.py``'s ``_runner`` does, but for ``dla``, whose command
no longer keeps the ``T x vocab`` logits that runner and the planner still count), one record,
one at a time:

- ``teacher-forcing``: ``evaluation.teacher_force`` (greedy exact match in one forward);
- ``head-sweep``: ``analysis.sweeps.head_sweep`` (zero ablation, one record per clean forward,
  ``--batch-rows`` rows per edited forward) over a fixed sample of heads:
  ``--sample-heads`` heads in each of ``--sample-layers`` layers at the centres of equal
  bands of layers (4 x 2 = 8 heads of 1,024 on LongChat). ``all_heads_s`` extrapolates to
  every head: the clean forward once plus the edited forwards' seconds per head times the
  model's heads (the sampled layers' mean depth is the model's);
- ``dla``: ``attribution dla``'s calls: ``strongest_wrong_token`` (one forward, last position),
  ``logit_attribution`` of the correct and that token, ``logit_diff_attribution`` (a wrong
  token outside the small tokenizer's vocabulary is folded into it: same cost);
- ``patching``: ``analysis.patching.patch`` of whole heads on a key-corruption pair
  (``line_retrieval_pair``: the question asks for another line), the same sampled heads,
  ``--patch-batch`` patched runs per forward; ``all_heads_s`` adds the patched runs' seconds
  per head times the model's heads to one teacher-forced forward (standing in for the shared
  prefix's forward, which dominates);
- ``screen``: ``analysis.screening.screened_head_sweep`` (attribution patching: one forward and
  one backward for every head, then the exact sweep of the ``2 x --screen-top-k`` likeliest);
- ``passage-scores``: ``retrieval_scores.passage_attention`` with every record line a passage
  (``tuning.data.with_line_passages``; its time includes tokenising the line spans);
- ``needle-scores``: ``retrieval_scores.copy_paste_score``, the queried line as the needle,
  ``--decode-tokens`` greedy steps on the KV cache;
- ``seal-h`` / ``seal-c``: ``tuning.tune(handle, "seal-h" | "seal-c", [record])``: one AdamW step
  of SEAL-H / SEAL-C scales at the method's default learning rate, with gradient checkpointing
  (what ``interp-seal figures`` uses for long records);
- ``generate``: ``evaluation.generate_answers`` under a head edit (the sampled heads scaled by
  0.5): prefill, then ``--decode-tokens`` greedy steps on the KV cache.

With ``--peers``, the same model through its peers' usual calls:

- ``tl-run-with-cache``: TransformerLens 4's bridge booted on a private copy of the weights
  (``handle.bridge()``; ``boot_s``), then ``run_with_cache`` of the record with every hook, as
  its tutorials call it (eager attention: every layer's ``H x T x T`` scores and pattern stay
  in the cache);
- ``nnsight-patch``: patching of the sampled heads written with nnsight 0.8 on the same weights
  (``handle.nnsight()``): one trace of the clean prompt saves their ``o_proj`` inputs, then one
  trace of the corrupted prompt per head writes that head's clean output (full forwards with
  the default KV cache and ``T x vocab`` logits). On the tiny float32 model it gives the
  library's patched logit differences exactly; ``all_heads_s`` extrapolates it to every head.

Each cell runs once, after a warm-up of every analysis on a 5-line record. On CUDA its seconds
are wall seconds read after ``torch.cuda.synchronize`` and its peak is
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (weights included; the
CUDA context and the allocator's cache are not). On the CPU the seconds are wall seconds of one
run and the peak is the weights plus the most bytes torch's allocator held during a second,
profiled run (``interp_seal.testing.allocated_peak``, as the planner's CPU validation measures).
Beside it, ``interp-seal plan``'s prediction (``analysis.plan.plan``) for the same analysis,
tokens, batch and dtype; the planner does not model tuning or ``generate`` (``plan_gib=na``).
An out-of-memory error (``torch.OutOfMemoryError``, or the CPU allocator's) is reported as
``status=oom`` and the next cell runs; ``--timeout-per-cell`` stops a cell with
``status=timeout`` (checked between kernel launches); ``--stop-after`` skips the cells not
started after that many seconds (``status=skipped``). Any other exception is printed with its
traceback as ``status=error``, the run goes on, and the script exits with status 1.

**RESULT lines**, one per cell (and ``--out FILE`` appends the same as JSON lines)::

    RESULT paper_scale geometry=<longchat|llama31|qwen25> length=<tokens> target=<asked>
        lines=<record lines> analysis=<name> status=<ok|oom|timeout|skipped|error>
        wall_s=<seconds> peak_gib=<peak, weights included> plan_gib=<planned peak>
        ratio=<plan_gib / peak_gib> work_gib=<peak above what was allocated before the call>
        plan_work_gib=<planned peak minus weights> work_ratio=<plan_work_gib / work_gib>
        [units=<sampled heads>/<all heads> all_heads_s=<extrapolated seconds>] [boot_s=<s>]
        device=<device> dtype=<dtype> clock=wall_s

``ratio`` compares totals (dominated by the weights for light analyses); ``work_ratio`` is the
planner's own claim (``tests/integration/test_plan.py``: within 25% on the CPU). After all
cells, a markdown table per geometry (analysis x length: seconds, peak / planned GiB) for
``docs/scale.md``.

Expected run time on one H100 in bfloat16 (estimated from the FLOPs, not yet measured): a
forward of 31K tokens through a 7B model takes ~1.5 s; at 31K a cell takes 2-10 s (the head
sweep, the SEAL steps and the screen, whose head outputs and gradients, 2 x 16.6 GB in float32
on LongChat, go to host memory, the longest; nnsight's patching, 9 full forwards, ~15 s); a
geometry at 8K + 16K + 31K with its construction and warm-up ~2-3 minutes, the three ~7-8
minutes. ``--stop-after 480`` keeps one
command inside a 10-minute limit and still prints the tables of what ran; run the skipped
geometries in a second command with the same ``--out`` and print both with ``--table``.
``interp-seal plan`` puts LongChat's patching at 31K tokens (four copies of its 15.5 GiB KV
cache) near an H100's 80 GB; a cell past the GPU's memory reports ``oom``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from common import Clock, add_device_arguments, result_tags

from interp_seal.analysis.plan import GiB, Plan, plan
from interp_seal.models import ModelHandle
from interp_seal.models.load import resolve_device
from interp_seal.models.spec import ModelSpec, family_for
from interp_seal.tasks import line_retrieval
from interp_seal.tasks.sample import Encoded, Sample
from interp_seal.testing import allocated_peak, line_retrieval_tokenizer

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
GEOMETRIES = {
    "longchat": DATA / "longchat_7b_32k_config.json",
    "llama31": DATA / "llama_3_1_8b_config.json",
    "qwen25": DATA / "qwen2_5_7b_config.json",
}
ANALYSES = (
    "teacher-forcing",
    "head-sweep",
    "dla",
    "patching",
    "screen",
    "passage-scores",
    "needle-scores",
    "seal-h",
    "seal-c",
    "generate",
)
PEERS = ("tl-run-with-cache", "nnsight-patch")
LENGTHS = (8192, 16384, 31744)
TINY_LENGTHS = (256, 512)
TINY_LAYERS, TINY_HEADS, TINY_D_HEAD = 4, 4, 16
WARMUP_LINES = 5
Head = tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How each analysis runs (the command-line options of the same names)."""

    sample_layers: int = 4
    sample_heads: int = 2
    batch_rows: int = 8
    patch_batch: int = 2
    screen_top_k: int = 1
    decode_tokens: int = 8


# -- the model -----------------------------------------------------------------------------


def geometry_config(name: str, tokenizer, *, tiny: bool) -> transformers.PretrainedConfig:
    """The public config of ``name``; with ``tiny``, the same family and settings (RoPE, biases,
    GQA or not) at 4 layers x 4 heads of 16 (2 KV heads with GQA), the MLP in the same ratio
    to the width, and the tokenizer's vocabulary."""
    fields = json.loads(GEOMETRIES[name].read_text())
    if tiny:
        width = TINY_HEADS * TINY_D_HEAD
        mha = fields["num_key_value_heads"] == fields["num_attention_heads"]
        fields |= {
            "num_hidden_layers": TINY_LAYERS,
            "num_attention_heads": TINY_HEADS,
            "num_key_value_heads": TINY_HEADS if mha else 2,
            "head_dim": TINY_D_HEAD,
            "hidden_size": width,
            "intermediate_size": round(width * fields["intermediate_size"] / fields["hidden_size"]),
            "vocab_size": len(tokenizer),
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }
    return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)


def build_handle(
    config: transformers.PretrainedConfig,
    tokenizer,
    *,
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> ModelHandle:
    """A random model of ``config`` made on ``device`` in ``dtype`` (module docstring), wrapped
    as ``load_model`` wraps a loaded one (sdpa attention, eval mode, frozen)."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation="sdpa"
        )
    model.to_empty(device=device)
    torch.manual_seed(seed)
    model.initialize_weights()  # N(0, initializer_range) weights, norms 1, biases 0, RoPE buffers
    model.eval()
    model.requires_grad_(False)
    return ModelHandle(
        model=model,
        tokenizer=tokenizer,
        spec=ModelSpec.from_config(config),
        family=family_for(config),
        name_or_path=f"random-{name}",
    )


def head_sample(spec: ModelSpec, layers: int, per_layer: int) -> list[Head]:
    """``per_layer`` evenly spaced heads in each of ``layers`` layers at the centres of equal
    bands (4 of 32: layers 4, 12, 20, 28), layer-major."""
    n_layers, k = min(layers, spec.n_layers), min(per_layer, spec.n_heads)
    chosen = sorted({(2 * i + 1) * spec.n_layers // (2 * n_layers) for i in range(n_layers)})
    return [(layer, j * spec.n_heads // k) for layer in chosen for j in range(k)]


# -- the records ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class Record:
    """One LongEval record in the forms the analyses take.

    Attributes:
        target: the tokens asked for.
        lines: the record's lines.
        sample: the record (answer prefix forced: the answer is the number).
        encoded: its tokens.
        passages: the record with every line a passage and the queried line golden.
        needle: its tokens with the queried line as the needle.
        pair: the key-corruption pair for patching (another line asked for).
    """

    target: int
    lines: int
    sample: Sample
    encoded: Encoded
    passages: Sample
    needle: Encoded
    pair: object

    @property
    def tokens(self) -> int:
        return len(self.encoded)


def line_record(tokenizer, *, target: int | None = None, lines: int | None = None, seed: int = 0):
    """The record of ``lines`` lines, or of the most lines whose tokens do not pass ``target``."""
    from interp_seal.analysis.patching import line_retrieval_pair
    from interp_seal.tuning.data import with_line_passages

    if lines is None:
        lines = line_retrieval.num_lines_for_tokens(tokenizer, target, seed=seed)
    cfg = line_retrieval.LineRetrievalConfig(num_lines=lines)
    sample = line_retrieval.generate(cfg, 1, seed=seed)[0]
    queried = line_retrieval.parse_record(sample.prompt)[sample.meta["random_idx"][1]]
    needle = dataclasses.replace(sample, needle=(queried.start, queried.end))
    encoded = sample.encode(tokenizer)
    return Record(
        target=target or len(encoded),
        lines=lines,
        sample=sample,
        encoded=encoded,
        passages=with_line_passages(sample),
        needle=needle.encode(tokenizer),
        pair=line_retrieval_pair(sample, tokenizer, seed=seed),
    )


# -- the analyses --------------------------------------------------------------------------


@dataclass(kw_only=True)
class Run:
    """One analysis on one record: ``fn()`` runs it; ``marks`` collects clock readings (the
    head sweep's after each forward) for ``extra``, its additional RESULT keys."""

    fn: Callable[[], object]
    extra: Callable[[float], dict] = lambda wall: {}
    marks: list[float] = field(default_factory=list)


def make_run(
    handle: ModelHandle,
    analysis: str,
    record: Record,
    s: Settings,
    clock: Clock,
    fixed_s: float | None = None,
) -> Run:
    """The call that runs ``analysis`` on ``record`` the way its command does (module doc);
    ``fixed_s``: a teacher-forced forward's seconds at this length, for patching's estimate."""
    from interp_seal.analysis import sweeps

    spec = handle.spec
    heads = head_sample(spec, s.sample_layers, s.sample_heads)
    samples = {record.tokens: [record.encoded]}
    units = f"{len(heads)}/{spec.n_layers * spec.n_heads}"
    if analysis == "teacher-forcing":
        from interp_seal.evaluation.teacher_forcing import teacher_force

        return Run(fn=lambda: teacher_force(handle, [record.encoded], batch_size=1))
    if analysis == "head-sweep":
        options = sweeps.SweepOptions(batch_samples=1, batch_rows=s.batch_rows, progress=False)
        run = Run(fn=lambda: None)

        def sweep():
            run.marks[:] = [clock()]
            return sweeps.head_sweep(
                handle,
                samples,
                heads=heads,
                options=options,
                on_progress=lambda *_: run.marks.append(clock()),
            )

        def extrapolated(wall: float) -> dict:
            clean = run.marks[1] - run.marks[0]  # the first forward is the clean one
            per_head = (run.marks[-1] - run.marks[1]) / len(heads)
            return {"units": units, "all_heads_s": clean + per_head * spec.n_layers * spec.n_heads}

        run.fn, run.extra = sweep, extrapolated
        return run
    if analysis == "dla":
        return Run(fn=lambda: dla_command(handle, record))
    if analysis == "patching":
        from interp_seal.analysis.patching import Patch, patch

        patches = [Patch(site="head", layer=layer, head=h) for layer, h in heads]

        def all_heads(wall: float) -> dict:
            if fixed_s is None:
                return {"units": units, "all_heads_s": "na"}
            per_head = max(wall - fixed_s, 0.0) / len(heads)
            return {
                "units": units,
                "all_heads_s": fixed_s + per_head * spec.n_layers * spec.n_heads,
            }

        return Run(
            fn=lambda: patch(
                handle, record.pair, patches, batch_size=s.patch_batch, progress=False
            ),
            extra=all_heads,
        )
    if analysis == "screen":
        from interp_seal.analysis.screening import screened_head_sweep

        options = sweeps.SweepOptions(batch_samples=1, batch_rows=1, progress=False)
        return Run(
            fn=lambda: screened_head_sweep(handle, samples, top_k=s.screen_top_k, options=options)
        )
    if analysis == "passage-scores":
        from interp_seal.analysis.retrieval_scores import passage_attention

        return Run(fn=lambda: passage_attention(handle, record.passages))
    if analysis == "needle-scores":
        from interp_seal.analysis.retrieval_scores import copy_paste_score

        return Run(
            fn=lambda: copy_paste_score(handle, record.needle, max_new_tokens=s.decode_tokens)
        )
    if analysis in ("seal-h", "seal-c"):
        from interp_seal.tuning import TrainConfig, tune
        from interp_seal.tuning.methods import METHODS

        config = TrainConfig(lr=METHODS[analysis].lr, gradient_checkpointing=True)
        return Run(fn=lambda: tune(handle, analysis, [record.sample], train_config=config))
    if analysis == "generate":
        from interp_seal.evaluation.generation import generate_answers
        from interp_seal.interventions import ablate

        edit = ablate(spec, heads, "scale", factor=0.5)
        return Run(
            fn=lambda: generate_answers(
                handle,
                [record.sample],
                max_new_tokens=s.decode_tokens,
                intervention=edit,
                progress=False,
            )
        )
    if analysis == "tl-run-with-cache":
        return tl_run_with_cache(handle, record, clock)
    if analysis == "nnsight-patch":
        return nnsight_patch(handle, record, heads, units)
    raise ValueError(f"unknown analysis {analysis!r}; choose from {', '.join(ANALYSES + PEERS)}")


def tl_run_with_cache(handle: ModelHandle, record: Record, clock: Clock) -> Run:
    """TransformerLens 4: boot the bridge on a private copy of the weights (``handle.bridge()``,
    its seconds in ``boot_s``), ``run_with_cache`` of the whole record with every hook (the
    tutorials' call; eager attention keeps each layer's ``H x T x T`` scores and pattern), and
    drop the bridge (``reset_backends``) so the copy leaves with the cell."""
    run = Run(fn=lambda: None)

    def cached():
        start = clock()
        try:
            bridge = handle.bridge()
            run.marks[:] = [clock() - start]
            _, cache = bridge.run_with_cache(record.encoded.input_ids[None].to(handle.device))
            return len(cache)
        finally:
            handle.reset_backends()

    run.fn, run.extra = cached, lambda wall: {"boot_s": run.marks[0]}
    return run


def nnsight_patch(handle: ModelHandle, record: Record, heads: list[Head], units: str) -> Run:
    """Activation patching written the nnsight way (``handle.nnsight()``, the same weights): one
    trace of the clean prompt saves the sampled layers' head outputs (``o_proj``'s input), then
    one trace of the corrupted prompt per sampled head writes that head's clean output at every
    position and reads the last position's logit difference (full forwards with the model's
    default KV cache and ``T x vocab`` logits, as a user's trace runs). ``all_heads_s``: the
    clean trace plus the patched traces' seconds per head times the model's heads."""
    pair, family, D = record.pair, handle.family, handle.spec.d_head
    run = Run(fn=lambda: None)

    def o_proj(model, layer: int):
        return model.get(f"{family.layers}.{layer}.{family.attn}.{family.o_proj}")

    def patched() -> list[float]:
        model = handle.nnsight()
        run.marks[:] = [time.perf_counter()]
        clean = {}  # filled inside the trace (nnsight runs its body in its own scope)
        with torch.no_grad(), model.trace(pair.clean_ids[None].to(handle.device)):
            for layer in sorted({la for la, _ in heads}):
                clean[layer] = o_proj(model, layer).input.save()
        run.marks.append(time.perf_counter())
        diffs = []
        for layer, head in heads:
            columns = slice(head * D, (head + 1) * D)
            with torch.no_grad(), model.trace(pair.corrupted_ids[None].to(handle.device)):
                z = o_proj(model, layer).input.clone()  # (1, T, H*D)
                z[..., columns] = clean[layer][..., columns]
                o_proj(model, layer).input = z
                last = model.output.logits[0, -1].save()
            diffs.append(float(last[pair.clean_token] - last[pair.corrupted_token]))
        run.marks.append(time.perf_counter())
        return diffs

    def extrapolated(wall: float) -> dict:
        clean = run.marks[1] - run.marks[0]
        per_head = (run.marks[2] - run.marks[1]) / len(heads)
        all_heads = handle.spec.n_layers * handle.spec.n_heads
        return {"units": units, "all_heads_s": clean + per_head * all_heads}

    run.fn, run.extra = patched, extrapolated
    return run


def dla_command(handle: ModelHandle, record: Record) -> None:
    """What ``interp-seal attribution dla`` runs (``cli/attribution.py``, ``run_dla``)."""
    from interp_seal.analysis.logit_attribution import (
        logit_attribution,
        logit_diff_attribution,
        strongest_wrong_token,
    )

    ids, correct = record.encoded.prompt_ids, int(record.encoded.answer_ids[0])
    _, wrong = strongest_wrong_token(handle, ids, correct)
    wrong %= len(handle.tokenizer)  # random weights: any token; it must be the tokenizer's
    wrong += wrong == correct
    logit_attribution(handle, ids, [correct, wrong])
    logit_diff_attribution(handle, ids, correct, wrong)


def planned(
    config: transformers.PretrainedConfig,
    analysis: str,
    record: Record,
    s: Settings,
    dtype: torch.dtype,
    spec: ModelSpec,
) -> Plan | None:
    """The planner's prediction for the cell, with the tokens each analysis runs on (None for
    tuning and generation, which it does not model)."""
    answer = len(record.encoded.answer_ids)
    prompt = record.encoded.answer_start
    heads = head_sample(spec, s.sample_layers, s.sample_heads)
    per_layer = min(s.sample_heads, spec.n_heads)
    budget = 2**50  # only the peak is read
    args = {"budget_bytes": budget, "dtype": dtype}
    if analysis == "teacher-forcing":
        return plan(config, analysis, length=record.tokens, answer_tokens=answer, **args)
    if analysis == "head-sweep":
        # the planner fills layers in order: 8 heads of layer 0 in one forward of 8 rows;
        # the sample's rows per edited forward are its heads per layer
        rows = min(s.batch_rows, per_layer)
        return plan(
            config,
            analysis,
            length=record.tokens,
            n_units=len(heads),
            batch_rows=rows,
            answer_tokens=answer,
            **args,
        )
    if analysis == "screen":
        n_units = 2 * s.screen_top_k
        return plan(config, analysis, length=record.tokens, n_units=n_units, batch_rows=1, **args)
    if analysis == "passage-scores":
        return plan(config, analysis, length=prompt, **args)
    if analysis == "needle-scores":
        return plan(config, analysis, length=prompt, answer_tokens=s.decode_tokens, **args)
    if analysis == "patching":
        length = len(record.pair.clean_ids)
        batch = min(s.patch_batch, per_layer)
        return plan(config, analysis, length=length, batch=batch, n_units=len(heads), **args)
    if analysis == "dla":
        return plan(config, analysis, length=prompt, **args)
    return None


# -- measuring -----------------------------------------------------------------------------


class CellTimeout(Exception):
    """A cell ran past ``--timeout-per-cell``."""


@contextmanager
def time_limit(seconds: float | None):
    """Raise ``CellTimeout`` in this (the main) thread after ``seconds`` (None: no limit)."""
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise CellTimeout(f"ran past {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def is_oom(err: BaseException) -> bool:
    """A device's or the CPU allocator's out-of-memory error."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(err)
    )


def model_bytes(handle: ModelHandle) -> int:
    """Bytes of the model's parameters and buffers."""
    tensors = [*handle.model.parameters(), *handle.model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(run: Run, handle: ModelHandle, clock: Clock) -> tuple[float, int, int]:
    """``(wall seconds, peak bytes, bytes above the start)`` of ``run.fn()`` (module doc)."""
    device = handle.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        start = clock()
        run.fn()
        wall = clock() - start
        peak = torch.cuda.max_memory_allocated(device)
        return wall, peak, peak - base
    start = clock()
    run.fn()
    wall = clock() - start
    marks = list(run.marks)  # the timed run's, not the profiled run's
    work = allocated_peak(run.fn)
    run.marks[:] = marks
    return wall, model_bytes(handle) + work, work


def free_memory(device: torch.device, *, collect: bool = False) -> None:
    """Give the CUDA allocator's cached blocks back (the next cell starts unfragmented);
    ``collect`` first frees what only reference cycles hold (0.3 s: after failures only)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass(kw_only=True)
class Cell:
    """One (geometry, length, analysis) measurement; ``model`` describes the built model."""

    geometry: str
    model: str
    analysis: str
    length: int
    target: int
    lines: int
    status: str = "ok"
    wall_s: float | None = None
    peak: int | None = None
    work: int | None = None
    plan: Plan | None = None
    extra: dict = field(default_factory=dict)
    error: str = ""

    def row(self) -> dict[str, str]:
        """The RESULT keys (module docstring) as strings, then ``error`` and ``model`` (the
        JSON line ``--out`` appends; ``markdown`` renders these)."""
        p = self.plan
        plan_total = p.peak_bytes if p else None
        plan_work = p.peak_bytes - p.weights_bytes if p else None
        return {
            "geometry": self.geometry,
            "length": str(self.length),
            "target": str(self.target),
            "lines": str(self.lines),
            "analysis": self.analysis,
            "status": self.status,
            "wall_s": _num(self.wall_s),
            "peak_gib": _num(self.peak and self.peak / GiB),
            "plan_gib": _num(plan_total and plan_total / GiB),
            "ratio": _ratio(plan_total, self.peak),
            "work_gib": _num(self.work and self.work / GiB),
            "plan_work_gib": _num(plan_work and plan_work / GiB),
            "work_ratio": _ratio(plan_work, self.work),
            **{k: _num(v) if isinstance(v, float) else str(v) for k, v in self.extra.items()},
            "error": self.error,
            "model": self.model,
        }


def report(cell: Cell, args: argparse.Namespace, clock: Clock) -> None:
    """Print the cell's RESULT line and append its row to ``--out``."""
    row = cell.row()
    keys = [f"{k}={v}" for k, v in row.items() if k not in ("error", "model")]
    print(" ".join(["RESULT paper_scale", *keys, result_tags(args, clock)]), flush=True)
    if args.out is not None:
        with args.out.open("a") as f:
            f.write(json.dumps(row | {"device": args.device_name}) + "\n")


def _num(x: float | None) -> str:
    return "na" if x is None else f"{x:.4g}"


def _ratio(planned_bytes: int | None, measured: int | None) -> str:
    return "na" if not planned_bytes or not measured else f"{planned_bytes / measured:.3f}"


def run_cell(cell: Cell, run: Run, handle: ModelHandle, clock: Clock, timeout: float | None):
    """Measure ``run`` into ``cell``: ok, oom, timeout or error (traceback printed)."""
    failure = None
    try:
        with time_limit(timeout):
            cell.wall_s, cell.peak, cell.work = measure(run, handle, clock)
        cell.extra |= run.extra(cell.wall_s)
    except CellTimeout as err:
        cell.status, cell.error = "timeout", str(err)
    except Exception as err:  # noqa: BLE001 - reported per cell, the run goes on
        if is_oom(err):
            cell.status, cell.error = "oom", str(err).splitlines()[0]
        else:
            cell.status, failure = "error", traceback.format_exc()
    free_memory(handle.device, collect=cell.status != "ok")  # the traceback's frames are gone
    if failure:
        print(f"{cell.geometry} {cell.analysis} at {cell.length} tokens failed:\n{failure}")
        cell.error = failure.strip().splitlines()[-1]


# -- the report ----------------------------------------------------------------------------


def markdown(rows: list[dict[str, str]]) -> str:
    """Per geometry, analysis x length: seconds (with the all-heads estimate) and measured /
    planned peak in GiB (MiB when every size is below 1 GiB), or the status and the plan. Of
    several rows for one cell (``--table`` over runs that appended to one file) the last one
    that ran wins."""
    cells: dict[tuple[str, str, int], dict[str, str]] = {}
    for r in rows:
        key = (r["geometry"], r["analysis"], int(r["target"]))
        if r["status"] != "skipped" or key not in cells:
            cells[key] = r
    tables = []
    for geometry in dict.fromkeys(g for g, _, _ in cells):
        mine = [r for (g, _, _), r in cells.items() if g == geometry]
        sizes = [float(r[k]) for r in mine for k in ("peak_gib", "plan_gib") if r[k] != "na"]
        unit, name = (1, "GiB") if max(sizes, default=0) >= 1 else (1 / 1024, "MiB")
        targets = sorted({int(r["target"]) for r in mine})
        tokens = {int(r["target"]): int(r["length"]) for r in mine}
        lines = [
            max((r["model"] for r in mine), key=len),  # a skipped geometry's is its name only
            "",
            "| analysis | " + " | ".join(f"{t:,} ({tokens[t]:,} tokens)" for t in targets) + " |",
            "|---" * (len(targets) + 1) + "|",
        ]
        for analysis in dict.fromkeys(r["analysis"] for r in mine):
            row = []
            for t in targets:
                r = cells.get((geometry, analysis, t))
                if r is None:
                    row.append("")
                    continue
                planned = "na" if r["plan_gib"] == "na" else f"{float(r['plan_gib']) / unit:.3g}"
                if r["status"] != "ok":
                    row.append(f"{r['status']} (plan {planned} {name})")
                    continue
                seconds = f"{float(r['wall_s']):.3g} s"
                if r.get("all_heads_s", "na") != "na":
                    seconds += f" (all heads ~{float(r['all_heads_s']):.3g} s)"
                row.append(f"{seconds}, {float(r['peak_gib']) / unit:.3g} / {planned} {name}")
            lines.append(f"| {analysis} | " + " | ".join(row) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


# -- main ----------------------------------------------------------------------------------


def run_geometry(
    geometry: str, tokenizer, records: dict[int, Record], warmup: Record, settings: Settings, args
) -> list[Cell]:
    """Build ``geometry`` on ``args.device``, warm every analysis up on ``warmup``, measure
    every cell (``records`` by target length), print and (``--out``) append its RESULT."""
    device, dtype = args.device, getattr(torch, args.dtype)
    clock = Clock(device, wall=True)
    config = geometry_config(geometry, tokenizer, tiny=args.tiny)
    if args.stop_after and time.perf_counter() - args.began > args.stop_after:
        spec = ModelSpec.from_config(config)  # not built: every cell skipped, with its plan
        cells = [
            Cell(
                geometry=geometry,
                model=f"### {geometry}",
                analysis=analysis,
                length=record.tokens,
                target=target,
                lines=record.lines,
                status="skipped",
                plan=planned(config, analysis, record, settings, dtype, spec),
            )
            for target, record in records.items()
            for analysis in args.analyses
        ]
        for cell in cells:
            report(cell, args, clock)
        return cells
    start = clock()
    handle = build_handle(
        config, tokenizer, name=geometry, device=device, dtype=dtype, seed=args.seed
    )
    built = clock() - start
    spec = handle.spec
    model = (
        f"### {geometry}: {sum(p.numel() for p in handle.model.parameters()) / 1e9:.3g}B "
        f"parameters ({spec.n_layers} layers x {spec.n_heads} heads over {spec.n_kv_heads} "
        f"KV heads, d_head {spec.d_head}), {args.dtype} on {args.device_name}"
    )
    print(f"{model}; built in {built:.1f} s", flush=True)
    broken = {}
    for analysis in args.analyses:  # warm-up: kernels, allocator, lazy imports
        try:
            make_run(handle, analysis, warmup, settings, clock, fixed_s=0.0).fn()
        except Exception:  # noqa: BLE001 - the analysis' cells report it
            broken[analysis] = traceback.format_exc()
            print(f"{geometry} {analysis} failed its warm-up:\n{broken[analysis]}")
        free_memory(device, collect=analysis in broken)
    cells = []
    for target, record in records.items():
        fixed_s = None  # the teacher-forced forward's seconds, for patching's estimate
        for analysis in args.analyses:
            cell = Cell(
                geometry=geometry,
                model=model,
                analysis=analysis,
                length=record.tokens,
                target=target,
                lines=record.lines,
                plan=planned(config, analysis, record, settings, dtype, spec),
            )
            if analysis in broken:
                cell.status, cell.error = "error", broken[analysis].strip().splitlines()[-1]
            elif args.stop_after and time.perf_counter() - args.began > args.stop_after:
                cell.status = "skipped"
            else:
                run = make_run(handle, analysis, record, settings, clock, fixed_s=fixed_s)
                run_cell(cell, run, handle, clock, args.timeout_per_cell)
            if analysis == "teacher-forcing" and cell.status == "ok":
                fixed_s = cell.wall_s
            cells.append(cell)
            report(cell, args, clock)
    del handle
    free_memory(device, collect=True)
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--geometry", nargs="+", choices=sorted(GEOMETRIES), default=["longchat"],
        help="model geometries to build (default: longchat)",
    )  # fmt: skip
    parser.add_argument("--lengths", nargs="+", type=int, help="target tokens per record")
    parser.add_argument("--analyses", nargs="+", choices=ANALYSES + PEERS, default=list(ANALYSES))
    parser.add_argument(
        "--peers", action="store_true", help=f"also run the peers: {', '.join(PEERS)}"
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help=f"{TINY_LAYERS} layers x {TINY_HEADS} heads of {TINY_D_HEAD}, lengths "
        f"{' '.join(map(str, TINY_LENGTHS))}, float32 by default (the CPU test)",
    )
    parser.add_argument("--sample-layers", type=int, default=Settings.sample_layers)
    parser.add_argument("--sample-heads", type=int, default=Settings.sample_heads)
    parser.add_argument("--batch-rows", type=int, default=Settings.batch_rows)
    parser.add_argument("--patch-batch", type=int, default=Settings.patch_batch)
    parser.add_argument("--screen-top-k", type=int, default=Settings.screen_top_k)
    parser.add_argument("--decode-tokens", type=int, default=Settings.decode_tokens)
    parser.add_argument("--seed", type=int, default=0, help="weights and records")
    parser.add_argument("--timeout-per-cell", type=float, help="seconds; a cell past it: timeout")
    parser.add_argument("--stop-after", type=float, help="seconds; later cells are skipped")
    parser.add_argument("--out", type=Path, help="append every cell as a JSON line")
    parser.add_argument(
        "--table", nargs="+", type=Path, metavar="JSONL",
        help="print the markdown tables of these --out files and run nothing",
    )  # fmt: skip
    add_device_arguments(parser)
    parser.set_defaults(dtype=None)  # bfloat16, or float32 with --tiny
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for path in args.table for line in path.read_text().splitlines()]
        print(markdown(rows))
        return 0
    args.began = time.perf_counter()
    args.dtype = args.dtype or ("float32" if args.tiny else "bfloat16")
    args.device = resolve_device(args.device)
    cuda = args.device.type == "cuda"
    args.device_name = torch.cuda.get_device_name(args.device) if cuda else "CPU"
    settings = Settings(
        sample_layers=args.sample_layers,
        sample_heads=args.sample_heads,
        batch_rows=args.batch_rows,
        patch_batch=args.patch_batch,
        screen_top_k=args.screen_top_k,
        decode_tokens=args.decode_tokens,
    )
    print(
        f"paper scale on {args.device_name}, {args.dtype}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; random weights: times and memory only",
        flush=True,
    )
    if args.peers:
        args.analyses = [*args.analyses, *PEERS]
    lengths = args.lengths or (TINY_LENGTHS if args.tiny else LENGTHS)
    with tempfile.TemporaryDirectory() as tmp:  # TransformerLens reloads the tokenizer from it
        line_retrieval_tokenizer().save_pretrained(tmp)
        tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(tmp)  # as load_model
        records = {n: line_record(tokenizer, target=n, seed=args.seed) for n in lengths}
        warmup = line_record(tokenizer, lines=WARMUP_LINES, seed=args.seed)
        cells = []
        for geometry in args.geometry:
            cells += run_geometry(geometry, tokenizer, records, warmup, settings, args)
    print("\n" + markdown([c.row() for c in cells]))
    return 1 if any(c.status == "error" for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
