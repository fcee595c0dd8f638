"""The kvpress side of ``benchmarks/bench_kvpress.py``; runs inside the peer environment only.

Command (``bench_kvpress.py`` runs it; by hand, from the repository root)::

    OMP_NUM_THREADS=1 benchmarks/peers/.venv/bin/python benchmarks/peers/kvpress_run.py \\
        --model ~/.cache/interp_seal/gguf/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f \\
        --records runs/bench_kvpress/records.jsonl \\
        --conditions runs/bench_kvpress/conditions.json --out runs/bench_kvpress/kvpress.jsonl

The environment (``benchmarks/peers/README.md``) has NVIDIA's kvpress and the older transformers
it requires; interp-seal is not installed in it, and this file imports nothing from it. kvpress
and transformers are imported where they are used, so that the main environment's tests can
import ``record_hash`` from here without them.

Each record arrives as token ids already split into a *context* and a *question* (the question
ends with the answer's forced prefix) plus the answer's ids. kvpress's protocol
(``KVPressTextGenerationPipeline._forward``) is followed step by step:

1. the context is prefilled through ``model.model`` inside the press's context manager, into a
   fresh ``DynamicCache``; the press's forward hooks compress the cache after each layer;
2. outside the press, the question runs on that cache at its true positions
   (``position_ids = context_length + arange``, as ``generate_answer`` passes them);
3. then the answer's tokens but the last, teacher-forced. Greedy decoding of the answer
   reproduces it iff the argmax at every answer position is the answer token, so
   ``exact_match`` here is greedy exact match of the whole answer, computed as
   ``benchmarks/bench_kvpress.py`` computes it for interp-seal.

Presses, per condition of ``--conditions`` (``sink``, ``window``, ``streaming``: the
``[layer, kv_head]`` pairs that stream):

- ``none``: no press (the uncompressed reference);
- ``streaming_llm``: ``StreamingLLMPress(n_sink=sink)`` with ``compression_ratio`` chosen per
  record so that the context keeps exactly ``sink + recent`` positions in every KV head;
- ``duo_attention``: ``DuoAttentionPress`` given its head pattern by hand. kvpress loads
  DuoAttention's trained patterns from GitHub (``load_attention_pattern``; unreachable here, and
  none exists for SmolLM2) or scores heads itself on BookSum (``on_the_fly_scoring``, a dataset
  download). Its ``post_init_from_model`` only sets ``sink_size``, ``recent_size`` and
  ``streaming_mask`` (a ``(layers, kv_heads)`` boolean tensor, True = streaming); here a
  subclass sets those three from the conditions file instead, and ``compress`` and kvpress's
  attention patch run unchanged. kvpress masks a streaming head's middle keys during decoding
  (fake keys whose weight underflows to 0) rather than dropping them, so its cache still holds
  every position: ``kv_bytes_held`` says so, ``kv_bytes`` counts only the unmasked keys.

``recent`` is ``window - len(question)``: the last prompt token, which predicts the first answer
token, then sees the same key positions as under interp-seal's sink + window attention (the
sinks and the last ``window`` positions, itself included).

Writes one JSON line per (condition, record): ``condition``, ``record`` (its id), ``hash`` (of
the ids received, as ``bench_kvpress.record_hash`` computes it), ``exact_match``, ``predicted``
(argmax ids at the answer positions), ``kept`` (positions a streaming head keeps after the
prompt; all of them for a full head), ``kv_bytes`` and ``kv_bytes_held``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import time
from importlib.metadata import version

import torch


def record_hash(context: list[int], question: list[int], answer: list[int]) -> str:
    """The same digest as ``bench_kvpress.record_hash``: sha256 of the three id lists."""
    text = json.dumps([context, question, answer], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def given_pattern_duo_attention(mask: torch.Tensor, sink: int, recent: int):
    """A ``DuoAttentionPress`` with ``sink_size``, ``recent_size`` and ``streaming_mask`` set
    here: its ``post_init_from_model`` (which would download DuoAttention's trained pattern) is
    replaced by a check that they are set."""
    from kvpress import DuoAttentionPress

    class GivenPatternDuoAttentionPress(DuoAttentionPress):
        def post_init_from_model(self, model):
            if self.streaming_mask is None or self.sink_size is None or self.recent_size is None:
                raise ValueError("set sink_size, recent_size and streaming_mask before use")

    press = GivenPatternDuoAttentionPress(head_compression_ratio=mask.float().mean().item())
    press.sink_size, press.recent_size, press.streaming_mask = sink, recent, mask
    return press


def make_press(condition: dict, n_layers: int, n_kv: int, context: int, question: int):
    """The press of ``condition`` for one record (None: no press), and ``recent``."""
    from kvpress import StreamingLLMPress

    kind, sink = condition["press"], condition["sink"]
    recent = condition["window"] - question
    if kind == "none":
        return None, recent
    if recent < 1 or sink + recent > context:
        raise ValueError(
            f"{condition['name']}: window {condition['window']} leaves {recent} recent context "
            f"positions after a {question}-token question (context {context}, sink {sink})"
        )
    if kind == "streaming_llm":
        if len(condition["streaming"]) != n_layers * n_kv:
            raise ValueError("StreamingLLMPress streams every KV head")
        kept = sink + recent
        # kvpress keeps int(k_len * (1 - ratio)) positions: aim half a position above
        return StreamingLLMPress(compression_ratio=1 - (kept + 0.5) / context, n_sink=sink), recent
    if kind == "duo_attention":
        mask = torch.zeros(n_layers, n_kv, dtype=torch.bool)
        for layer, head in condition["streaming"]:
            mask[layer, head] = True
        return given_pattern_duo_attention(mask, sink, recent), recent
    raise ValueError(f"unknown press {kind!r}")


def cache_bytes(cache, model) -> tuple[int, int]:
    """``(bytes of the unmasked keys and values, bytes the cache holds)``."""
    held = unmasked = 0
    for i, layer in enumerate(cache.layers):
        k = layer.keys
        per_position = 2 * k.shape[-1] * k.element_size() * k.shape[0]
        positions = k.shape[1] * k.shape[2]
        masked = getattr(model.model.layers[i].self_attn, "masked_key_indices", None)
        n_masked = 0 if masked is None else int(masked[0].numel())
        held += positions * per_position
        unmasked += (positions - n_masked) * per_position
    return unmasked, held


@torch.no_grad()
def score(model, record: dict, condition: dict) -> dict:
    """One record under one condition, kvpress's protocol (module docstring)."""
    from transformers import DynamicCache

    cfg = model.config
    context, question, answer = record["context_ids"], record["question_ids"], record["answer_ids"]
    C, Q = len(context), len(question)
    press, recent = make_press(condition, cfg.num_hidden_layers, cfg.num_key_value_heads, C, Q)
    cache = DynamicCache()
    with press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=torch.tensor([context]), past_key_values=cache)
    lengths = {layer.keys.shape[2] for layer in cache.layers}
    if condition["press"] == "streaming_llm" and lengths != {condition["sink"] + recent}:
        raise AssertionError(
            f"StreamingLLMPress kept {lengths}, wanted {condition['sink'] + recent}"
        )
    positions = torch.arange(C, C + Q).unsqueeze(0)
    first = model(input_ids=torch.tensor([question]), past_key_values=cache, position_ids=positions)
    kv_bytes, held = cache_bytes(cache, model)
    logits = [first.logits[0, -1]]
    if len(answer) > 1:
        positions = torch.arange(C + Q, C + Q + len(answer) - 1).unsqueeze(0)
        rest = model(
            input_ids=torch.tensor([answer[:-1]]), past_key_values=cache, position_ids=positions
        )
        logits += list(rest.logits[0])
    predicted = [int(x.argmax()) for x in logits]
    streams = condition["press"] != "none" and bool(condition["streaming"])
    return {
        "condition": condition["name"],
        "record": record["id"],
        "hash": record_hash(context, question, answer),
        "exact_match": predicted == answer,
        "predicted": predicted,
        "kept": condition["sink"] + recent + Q if streams else C + Q,
        "kv_bytes": kv_bytes,
        "kv_bytes_held": held,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face checkpoint directory")
    parser.add_argument("--records", required=True, help="records.jsonl of bench_kvpress.py")
    parser.add_argument("--conditions", required=True, help="conditions.json of bench_kvpress.py")
    parser.add_argument("--out", required=True, help="JSONL file to write")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import kvpress  # noqa: F401  (on import, patches transformers' attention functions)
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    records = [json.loads(line) for line in open(args.records, encoding="utf-8")]
    conditions = json.load(open(args.conditions, encoding="utf-8"))
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    print(
        f"kvpress {version('kvpress')}, transformers {version('transformers')}, torch "
        f"{torch.__version__}",
        file=sys.stderr,
    )
    start = time.process_time()
    with open(args.out, "w", encoding="utf-8") as out:
        for condition in conditions:
            for record in records:
                if record["task"] != condition["task"]:
                    continue
                out.write(json.dumps(score(model, record, condition)) + "\n")
            out.flush()
            print(f"kvpress: {condition['name']} done", file=sys.stderr)
    print(f"kvpress side: {time.process_time() - start:.0f} CPU s", file=sys.stderr)


if __name__ == "__main__":
    main()
