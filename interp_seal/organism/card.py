"""Measure the organism's two required properties and write its model card.

Command (the numbers in ``interp_seal/organism/checkpoint/README.md``)::

    interp-seal organism evaluate --samples 200 --write-card

1. **Accuracy vs length.** Greedy exact match on LongEval line retrieval (``force_prefix``
   format: the prompt ends ``... in line humble-pebble is``, the answer is `` 45041.``) for a
   range of line counts. Exact match is computed by teacher forcing: one forward pass on
   prompt + answer ids; a sample is correct iff the argmax at every answer position is the next
   answer token, which is exactly what greedy decoding would produce.
2. **Per-head pruning.** Zero one head's output (its ``d_head`` input columns of ``o_proj``)
   and re-measure exact match at a long length. Heads whose removal *raises* exact match are
   the SEAL paper's harmful heads; heads whose removal lowers it are retrieval heads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate

SEED = 0


@dataclass(frozen=True, kw_only=True)
class EncodedSet:
    """Samples of one length, right-padded: ids ``(N, T)`` and answer spans per row."""

    num_lines: int
    input_ids: torch.Tensor
    spans: tuple[tuple[int, int], ...]


def encode_set(tokenizer, num_lines: int, n_samples: int, seed: int = SEED) -> EncodedSet:
    """``n_samples`` LongEval samples with ``num_lines`` lines, tokenised and right-padded."""
    encoded = [
        s.encode(tokenizer)
        for s in generate(LineRetrievalConfig(num_lines=num_lines), n_samples, seed)
    ]
    longest = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), longest), tokenizer.pad_token_id, dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, : len(e)] = e.input_ids
    spans = tuple((e.answer_start, len(e)) for e in encoded)
    return EncodedSet(num_lines=num_lines, input_ids=ids, spans=spans)


@torch.no_grad()
def exact_match(model, data: EncodedSet, batch_size: int = 16) -> torch.Tensor:
    """Per-sample greedy exact match (bool ``(N,)``) by teacher forcing.

    Right padding needs no attention mask: causal attention never lets a real token see the
    padding after it. The LM head is applied only at the positions that predict answer tokens.
    """
    correct = []
    for start in range(0, len(data.spans), batch_size):
        ids = data.input_ids[start : start + batch_size]
        spans = data.spans[start : start + batch_size]
        width = max(end for _, end in spans)
        hidden = model.model(input_ids=ids[:, :width]).last_hidden_state  # (B, T, D)
        for row, (a, end) in enumerate(spans):
            pred = model.lm_head(hidden[row, a - 1 : end - 1]).argmax(-1)
            correct.append(bool((pred == ids[row, a:end]).all()))
    return torch.tensor(correct)


@contextmanager
def pruned_head(model, layer: int, head: int) -> Iterator[None]:
    """Zero ``head``'s output in ``layer`` (its columns of ``o_proj``), restored on exit."""
    d_head = model.config.head_dim
    weight = model.model.layers[layer].self_attn.o_proj.weight
    cols = slice(head * d_head, (head + 1) * d_head)
    saved = weight.data[:, cols].clone()
    weight.data[:, cols] = 0
    try:
        yield
    finally:
        weight.data[:, cols] = saved


def accuracy_by_length(
    model, tokenizer, lengths: Sequence[int], n_samples: int, seed: int = SEED
) -> dict[int, float]:
    """Exact match for each number of lines in ``lengths``."""
    return {
        n: exact_match(model, encode_set(tokenizer, n, n_samples, seed)).float().mean().item()
        for n in lengths
    }


def pruning_sweep(
    model, tokenizer, num_lines: int, n_samples: int, seed: int = SEED
) -> tuple[float, torch.Tensor]:
    """Baseline exact match and the change (``(layers, heads)``) when each head is zeroed."""
    data = encode_set(tokenizer, num_lines, n_samples, seed)
    base = exact_match(model, data).float().mean().item()
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    delta = torch.zeros(n_layers, n_heads)
    for layer in range(n_layers):
        for head in range(n_heads):
            with pruned_head(model, layer, head):
                delta[layer, head] = exact_match(model, data).float().mean().item() - base
    return base, delta


@dataclass(frozen=True, kw_only=True)
class Report:
    """Everything the card states: accuracy by length and the pruning sweep."""

    n_samples: int
    seed: int
    accuracy: dict[int, float]
    prune_lines: int
    prune_base: float
    prune_delta: list[list[float]]
    threshold: float = 0.02

    def heads(self, sign: int) -> list[tuple[int, int, float]]:
        """(layer, head, delta) of heads whose pruning moves exact match by >= threshold in ``sign``."""
        found = [
            (layer, head, d)
            for layer, row in enumerate(self.prune_delta)
            for head, d in enumerate(row)
            if sign * d >= self.threshold - 1e-9
        ]
        return sorted(found, key=lambda x: -sign * x[2])

    def text(self) -> str:
        """The accuracy table and the pruning counts, as printed by ``evaluate``."""
        lines = ["| lines | " + " | ".join(str(n) for n in self.accuracy) + " |"]
        lines.append("|---|" + "---|" * len(self.accuracy))
        lines.append(
            "| exact match | " + " | ".join(f"{a:.3f}" for a in self.accuracy.values()) + " |"
        )
        lines.append("")
        lines.append(
            f"Pruning sweep at {self.prune_lines} lines ({self.n_samples} samples, baseline exact "
            f"match {self.prune_base:.3f}):"
        )
        for sign, verb in ((1, "raise"), (-1, "lower")):
            heads = self.heads(sign)
            listed = ", ".join(f"L{la}H{h} {d:+.3f}" for la, h, d in heads) or "none"
            lines.append(
                f"- {len(heads)} heads {verb} exact match by >= {self.threshold:.2f}: {listed}"
            )
        return "\n".join(lines)


def measure(
    model, tokenizer, *, lengths: Sequence[int], prune_lines: int, n_samples: int, seed: int = SEED
) -> Report:
    """Run both measurements (float32 forward passes, deterministic)."""
    accuracy = accuracy_by_length(model, tokenizer, lengths, n_samples, seed)
    base, delta = pruning_sweep(model, tokenizer, prune_lines, n_samples, seed)
    return Report(
        n_samples=n_samples,
        seed=seed,
        accuracy=accuracy,
        prune_lines=prune_lines,
        prune_base=base,
        prune_delta=[[round(x, 4) for x in row] for row in delta.tolist()],
    )


def write_card(checkpoint: Path, report: Report, command: str) -> Path:
    """Write ``report`` into the checkpoint's model card between the measurement markers.

    The card's prose (``README.md``, written by hand) keeps a ``<!-- measurements -->`` ...
    ``<!-- /measurements -->`` block that this replaces; the raw numbers also go to
    ``measurements.json`` next to it.
    """
    card = checkpoint / "README.md"
    block = f"<!-- measurements -->\nMeasured with `{command}`:\n\n{report.text()}\n<!-- /measurements -->"
    text = card.read_text() if card.exists() else "<!-- measurements -->\n<!-- /measurements -->\n"
    head, _, rest = text.partition("<!-- measurements -->")
    _, _, tail = rest.partition("<!-- /measurements -->")
    card.write_text(head + block + tail)
    raw = {k: v for k, v in report.__dict__.items()}
    raw["accuracy"] = {str(k): v for k, v in report.accuracy.items()}
    (checkpoint / "measurements.json").write_text(json.dumps(raw, indent=1))
    return card
