"""Memory plans: will an analysis fit on a device, with which batch, in how many forwards?

From a model's config alone (the model is built on the ``meta`` device: no weight is read or
allocated), ``plan`` predicts the peak memory of one analysis at one context length and batch
size, the largest batch that fits a memory budget, and the number of forward passes it runs.
Nothing here measures: it is arithmetic on the geometry (``ModelSpec``, the MLP width), on the
family's row (``models.spec.Family``: its norms, MLP, experts, attention implementation and
position embeddings) and on how this library's code runs each analysis.
``tests/integration/test_plan.py`` checks it against the peak of torch's allocations measured
on the CPU (organism and SmolLM2, three lengths each, and a random checkpoint of every
supported family at 512 and 2,048 tokens: within 25%; the table is in ``docs/scale.md``, with
the plans of LongChat-7B-32K at 31K tokens).

**What is counted.** At any moment memory holds the weights, the key/value cache, activations
and the analysis' own buffers. An analysis goes through phases (a clean forward, then edited
forwards; a forward, then the attribution); its peak is its largest phase, and the plan reports
that phase's parts. Sizes are in bytes of the model's dtype ``b`` unless a tensor is float32
(norm upcasts, attention rows, answer log-probabilities) or float64 (direct logit attribution).
With ``d`` the model width, ``q = H * D`` and ``k = KV * D`` the query and key widths, ``I``
the MLP width, ``V`` the vocabulary, ``T`` the tokens of a record and ``L`` the layers:

- **weights**: the parameters of the model built on ``meta`` (tied embeddings once), times ``b``;
- **KV cache**: ``2 * L * KV * D * tokens * b`` per row, wherever a run keeps a cache:
  decoding, shared-prefix patching, and forwards that leave ``use_cache`` at the config's
  default (direct logit attribution, the screen). The engine's teacher-forced and edited runs
  keep none (``use_cache=False``): their keys and values live one layer at a time;
- **activations**: a decoder layer without gradients holds, per token and row, the larger of
  its attention step, ``2d + 4q + 2k`` (its input and norm, ``q``, ``k``, ``v`` and the rotary
  embedding's three ``q``-sized temporaries) and its MLP step, ``3d + 3I`` (input, mid-layer
  residual, its norm, then ``act(gate)``, ``up`` and their product); the model's forward also
  keeps the embeddings (``d``) to its end. One layer is alive at a time: sdpa never builds
  ``T x T`` attention (rows only, where attention weights are read), and the engine unembeds
  answer positions only (``logits_to_keep``): ``rows x answer_tokens x V`` logits with their
  float32 log-softmax, after the layers are done, never ``T x V``. That is a Llama layer; the
  family's row changes it where its layer keeps other tensors (``Geometry``):

  - a norm is counted (``d``) only where the row has one before the sublayer (OLMo 2 has
    none: its norms are on the sublayer outputs, computed after the MLP's tensors are freed);
  - the MLP holds ``Family.mlp_peak`` tensors of its width, read from the config field the
    row names (``Family.mlp_width``): 3 gated, 4 with a fused ``gate_up_proj`` (Phi-3), 2 for
    GPT-NeoX's ``fc -> gelu -> proj``, 4 for GPT-2's (``c_fc`` of ``n_inner`` or ``4d`` and
    ``gelu_new``'s three temporaries);
  - a mixture-of-experts layer (``Family.experts_per_token``, ``expert_width``; the layers
    whose MLP holds stacked expert weights) runs transformers' grouped experts: per token
    and routed expert a copy of the token beside the fused ``gate_up`` output (``2I``),
    ``act(gate)`` and the product, or beside three ``d``-sized tensors (the expert's output,
    weighted, put back in token order): ``K (d + max(4I, 3d))`` for ``K`` experts per token;
  - soft-capped attention (Gemma 2's ``attn_implementation``, ``models.capped_attention``)
    adds one block of float32 scores and their softmax beside the attention step: up to
    ``2 x SCORES_PER_BLOCK`` numbers (32 MiB), whatever the length;
  - learned position embeddings (``Family.pos_embed``, GPT-2): the model's forward keeps the
    token embeddings of every row and the position embeddings (one row) beside the stream.

  The engine's runs take the last layer at the answer positions only: its MLP is left out of
  their step (a 2-layer Qwen3-MoE test model routes in its last layer only);
- **analysis buffers**: what an analysis keeps beyond a forward, listed below.

**Per analysis** (``batch`` is what the analysis batches; the code followed in brackets):

- ``teacher-forcing`` (``evaluation.teacher_forcing``, ``evaluate lines``): ``batch`` records
  per forward, one forward per batch, no buffer.
- ``head-sweep`` / ``channel-sweep`` (``analysis.sweeps.run_sweep``): per chunk of ``batch``
  records, one clean forward (``engine.clean_run``) caches the residual stream entering every
  layer (``L d``; all from the embeddings up, as every plan has a unit at layer 0) and, at each
  start layer below the last, the head outputs and values (``q + k``): buffer ``batch * T * (L
  d + starts (q + k))``. Then edited forwards (``engine.run_from_layer``) of ``batch *
  min(max(1, batch_rows // batch), units at the start layer)`` rows; each row keeps its edited
  head outputs and (measured, not traced to a line) one more residual-stream tensor: ``q + d``
  on top of a layer's step (an edited run takes the start layer's MLP, and whole layers,
  attention included, only between it and the last: in a model of 3 layers or more).
  Forwards per chunk: ``1 + sum over start layers of ceil(units / max(1, batch_rows //
  batch))``, as ``sweeps._plan``. A head sweep's ``n_units`` heads fill layers in order
  (default: every head). A channel sweep opens ``n_units`` heads (default 1) of ``D``
  channels, the screen confirms ``n_units`` heads (default 20: ``--screen 10``): where such heads sit is unknown, so
  memory takes the worst of both (as many start layers as heads, and as many units at one
  layer as heads) and the count of forwards one head per layer.
- ``screen`` (``analysis.screening``, ``head-sweep --screen K``): per record one forward and
  one backward pass (counted as one forward), without a KV cache, the backward recomputing
  each layer from its input (``screening.recomputed_layers``). The forward keeps each layer's
  input (``d``) and head outputs (``q``); during the backward of layer ``l`` the inputs up to
  ``l`` and the gradients of the head outputs above it are alive (``L max(d, q) + d`` in
  all; and, measured, not traced to a line, one more ``d`` per layer), with one layer's
  recomputed activations (the two norms' float32 inputs, ``8d``
  bytes; attention's ``q``, ``k``, ``v``, output and log-sum-exp, ``4H`` bytes; the MLP's
  ``mlp_peak`` tensors of width ``I``) and its backward's as many gradients (experts: the
  routed tensors and the gradient of the fused ``gate_up`` output, measured); soft-capped
  attention adds one recomputed block: its ``tanh`` and softmax, kept by autograd, and two
  gradients of their size. Head outputs and
  gradients then go to host memory (not counted). Then the exact sweep of the confirmed
  heads. This is the default screen; AtP*'s fixes (``analysis.atp_star``) are not planned:
  ``--grad-drop`` keeps every layer's activations for its ``L - 1`` partial backward passes
  (an uncheckpointed backward: 2.8x the default screen's peak on the organism at 512 and
  1,024 tokens) and ``--qk-fix`` adds each layer's values and batches of first-order query
  and key changes (6.5x), both measured with ``testing.allocated_peak``.
- ``passage-scores`` (``retrieval_scores.passage_attention``): one record per forward. The
  row-capture hooks keep each layer's ``q`` and ``k`` projections (``q + k`` on top of the
  attention step; copies where the projection is interleaved, GPT-NeoX) and re-apply the
  rotary embedding after attention: ``3d + 4q + k`` (and ``k`` in float32 for other dtypes)
  when that exceeds the layer's step. Buffer: one layer's float32 rows (``H x T``, scores and
  softmax).
- ``needle-scores`` (``retrieval_scores.copy_paste_score``): the same, with a cache of ``T +
  answer_tokens - 1`` positions by the last of ``answer_tokens`` greedy steps;
  ``1 + answer_tokens`` forwards per record.
- ``patching`` (``analysis.patching.patch``, ``attribution patch``): the prompt runs once into
  a cache (the corrupted run's own cache is dropped once it has recorded its layer inputs);
  each forward of ``rows = min(batch, patches per layer)`` patched runs continues a
  ``rows``-fold copy of the prompt's (``1 + rows`` caches in all), and its masked sdpa repeats grouped keys and
  values to every query head (``2q`` per row and token; without GQA, ``k`` for the cache's
  concatenation). The suffix after the prompts' shared prefix is taken as empty (a key
  corruption's is the question: a few dozen tokens). ``n_units`` whole-head patches (default
  all), layer-major; ``3 + sum over layers of ceil(patches / batch)`` forwards per ``patch``
  call (the command makes three: heads, heads by position, residual stream).
- ``dla`` (``attribution dla``): a forward that unembeds the last position only (the strongest
  wrong token), then two attribution forwards with a cache; after each, ``W_U`` and one
  layer's ``W_O`` in float64 and every component's ``d``-vector. Three forwards.

**Decoding** (``plan_decode``, not one of ``ANALYSES``: ``engine.greedy_decode`` of one record,
the prompt into a KV cache, then ``answer_tokens`` steps): the cache of ``T + answer_tokens -
1`` positions beside the prompt forward's layer step and embeddings, ``T b (d + layer)``. With
streaming heads (``interp_seal.models.streaming_heads``, DuoAttention / RazorAttention) a
streaming KV head keeps ``sink + window - 1`` positions (``kv_budget_bytes``), and where the
last layer (the peak: every other layer's cache is full) has a streaming head, its attention
step holds one block's float32 mask and scores beside ``q``, ``k`` and ``v``: ``8 block (block
+ window - 1)`` bytes. Measured on the CPU (``allocated_peak``, 2 tokens decoded, sink 4,
window 256): SmolLM2 at 8,192 tokens 580 / 406 / 232 MiB with 0 / 45 / 90 of its 90 KV heads
streaming, planned 0.99 / 0.99 / 0.98 of that; the organism at 2,048 tokens 15.5 / 14.3 / 12.9
MiB (0 / 4 / 8 of 8), planned 1.03 / 1.00 / 1.05; a toy with the cache outweighing a layer's
step (``tests/unit/test_streaming_heads.py``) 0.95-0.98, 0.86-0.95 all streaming, 1K-8K.

**Not modelled**: the float32 upcast inside a norm in half precision (below the MLP step),
allocator fragmentation and caching (a CUDA allocator reserves more than it holds: leave ~10%
of the budget), the CUDA context (~0.5 GiB), the ``T x T`` mask and repeated keys of layers
with a sliding window (Mistral, Qwen2 with ``sliding_window`` set), padding masks, host memory,
the attention step's particulars beyond its norm (fused or interleaved projections, partial
or no RoPE, q / k norms: in the families tested the MLP step is larger), and experts run
another way than transformers' grouped experts (``set_experts_implementation``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from interp_seal.defaults import PLANNED_ANALYSES
from interp_seal.models.capped_attention import ATTENTION_NAME as CAPPED_ATTENTION
from interp_seal.models.capped_attention import block_bytes
from interp_seal.models.gguf import gguf_target
from interp_seal.models.load import load_config
from interp_seal.models.spec import Family, ModelSpec, family_for
from interp_seal.models.streaming_heads import StreamingHeads, kv_budget_bytes

ANALYSES = PLANNED_ANALYSES
ONE_RECORD = ("passage-scores", "needle-scores", "dla")
"""Analyses that run one record per forward: their ``batch`` is 1."""
SCREEN_UNITS = 20  # heads the exact sweep confirms by default: --screen 10, each way
MiB, GiB = 2**20, 2**30
MAX_BATCH = 2**20  # the search for the largest batch stops here
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> int:
    """``"80GiB"`` -> 85899345920; also ``"80 GB"`` (powers of 1000), ``"512MiB"``, ``"1e9"``."""
    found = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    unit = found and (found.group(2).upper() or "B")
    if not found or unit not in _UNITS:
        raise ValueError(f"cannot read a memory size from {text!r}; write e.g. 80GiB or 512MB")
    try:
        value = float(found.group(1)) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"cannot read a number from {text!r}; write e.g. 80GiB") from None
    if not 0 < value < 2**63:
        raise ValueError(f"memory size must be positive, got {text!r}")
    return int(value)


def model_config(model) -> transformers.PretrainedConfig:
    """The config of ``model``: a config object, a ``config.json`` file, or what ``load_model``
    accepts (``"organism"``, ``"smollm2"``, a checkpoint or config directory, a cached hub name)."""
    if isinstance(model, transformers.PretrainedConfig):
        return model
    path = Path(str(model)).expanduser()
    if path.is_file() and path.suffix == ".json":
        return transformers.AutoConfig.from_pretrained(path)
    return load_config(gguf_target(model))[1]


def meta_model(config: transformers.PretrainedConfig) -> torch.nn.Module:
    """The model ``config`` describes, built on ``meta``: no memory, no weights."""
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def parameter_count(config: transformers.PretrainedConfig | torch.nn.Module) -> int:
    """Parameters of the model ``config`` describes (or of a model built from it, such as
    ``meta_model``'s); tied embeddings count once, as in ``model.parameters()``."""
    model = config if isinstance(config, torch.nn.Module) else meta_model(config)
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(spec: ModelSpec, tokens: int, itemsize: int, rows: int = 1) -> int:
    """Keys and values of every layer for ``tokens`` positions of ``rows`` rows."""
    return 2 * spec.n_layers * spec.n_kv_heads * spec.d_head * tokens * rows * itemsize


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """What the arithmetic needs of a model: its spec, family row, MLP width and dtype size."""

    spec: ModelSpec
    family: Family
    d_mlp: int
    itemsize: int
    experts_per_token: int = 0
    d_expert: int = 0
    sparse: tuple[bool, ...] = ()

    @classmethod
    def of(
        cls,
        config: transformers.PretrainedConfig,
        spec: ModelSpec,
        itemsize: int,
        model: torch.nn.Module,
    ) -> Geometry:
        """The geometry of ``config`` and ``model`` (built from it on ``meta``): the MLP width
        from the config field its family's row names (``Family.mlp_width``; None there: ``4 d``,
        GPT-2's default); with experts, the experts per token and their width
        (``Family.experts_per_token``, ``expert_width``) and which layers route to experts
        (``sparse``: the layers whose MLP module holds stacked, 3-D, expert weights)."""
        family = family_for(config)
        width = getattr(config, family.mlp_width, None) or 4 * spec.d_model
        experts = {}
        if family.experts_per_token is not None:
            layers = model.get_submodule(family.layers)
            experts = dict(
                experts_per_token=getattr(config, family.experts_per_token),
                d_expert=getattr(config, family.expert_width),
                sparse=tuple(
                    any(p.dim() == 3 for p in layer.get_submodule(family.mlp).parameters())
                    for layer in layers
                ),
            )
        return cls(spec=spec, family=family, d_mlp=width, itemsize=itemsize, **experts)

    @property
    def q(self) -> int:
        return self.spec.n_heads * self.spec.d_head

    @property
    def k(self) -> int:
        return self.spec.n_kv_heads * self.spec.d_head

    def attention_step(self) -> int:
        """Elements per token and row at a layer's attention: its input, its norm (where the
        family has one before attention), q, k, v and the rotary embedding's temporaries."""
        d = self.spec.d_model
        return d + (d if self.family.pre_attn_norm else 0) + 4 * self.q + 2 * self.k

    def _mlps(self, dense: int, routed: int, last: bool) -> int:
        """The larger of ``dense`` and ``routed`` over the layers a run takes at full length
        (``last``: the last layer too), ``routed`` where a layer routes to experts."""
        layers = range(self.spec.n_layers if last else self.spec.n_layers - 1)
        sparse = self.sparse or (False,) * self.spec.n_layers
        return max((routed if sparse[layer] else dense for layer in layers), default=0)

    def mlp_tensors(self, *, last: bool = True) -> int:
        """Elements per token the MLP module holds at its peak: ``Family.mlp_peak`` tensors of
        its width; with experts (transformers' grouped experts), per token and routed expert, a
        copy of the token beside the fused ``gate_up`` output, ``act(gate)`` and the product,
        or beside the expert's output, weighted, then put back in token order. The largest
        over the layers a run takes at full length (``last``: the last layer too; the engine's
        runs take it at the answer positions only)."""
        d = self.spec.d_model
        routed = self.experts_per_token * (d + max(4 * self.d_expert, 3 * d))
        return self._mlps(self.family.mlp_peak * self.d_mlp, routed, last)

    def mlp_backward(self) -> int:
        """Elements per token of a recomputed MLP's backward pass: its tensors and their
        gradients; with experts, the routed tensors and the gradient of the fused ``gate_up``
        output (measured on the CPU, ``screen``: the other gradients come after it is freed)."""
        d, width = self.spec.d_model, self.d_expert
        routed = self.experts_per_token * (d + max(4 * width, 3 * d) + 2 * width)
        return self._mlps(2 * self.family.mlp_peak * self.d_mlp, routed, last=True)

    def mlp_step(self, *, last: bool = True) -> int:
        """Elements per token and row at a layer's MLP: the layer's input, the mid-layer stream
        (GPT-NeoX: the attention output), the norm before the MLP where the family has one, and
        the MLP's own tensors (``mlp_tensors``)."""
        d = self.spec.d_model
        norm = d if self.family.pre_mlp_norm else 0
        return 2 * d + norm + self.mlp_tensors(last=last)

    def blocks(self, rows: int, tokens: int, *, backward: bool = False) -> int:
        """Bytes of one block of soft-capped attention (``Family.attn_implementation``, Gemma
        2: ``capped_attention.block_bytes``), which stop growing with the length once a block
        is full; 0 for other attention."""
        if self.family.attn_implementation != CAPPED_ATTENTION:
            return 0
        return block_bytes(rows, self.spec.n_heads, tokens, tokens, backward=backward)

    def layer(self, rows: int, tokens: int, *, attention: bool = True, last: bool = True) -> int:
        """Bytes one decoder layer holds at its peak (no gradients) for ``rows`` rows of
        ``tokens`` tokens: the larger of its attention step (with a capped attention block)
        and its MLP step; the MLP step alone where a run has no whole layer (``attention``
        False); ``last``: whether the run takes the last layer at full length."""
        per_element = rows * tokens * self.itemsize
        mlp = per_element * self.mlp_step(last=last)
        if not attention:
            return mlp
        return max(per_element * self.attention_step() + self.blocks(rows, tokens), mlp)

    def embeddings(self, rows: int, tokens: int) -> int:
        """Bytes the model's forward keeps besides the residual stream to its end: with learned
        positions (``Family.pos_embed``, GPT-2) the token embeddings of every row and the
        position embeddings (one row), which it adds into the stream's first tensor."""
        if self.family.pos_embed is None:
            return 0
        return (rows + 1) * tokens * self.spec.d_model * self.itemsize

    def forward(
        self, rows: int, tokens: int, answers: int, held: int = 0, *, attention: bool = True
    ) -> int:
        """Bytes at the peak of an engine forward of ``rows`` rows (no gradients, answer logits
        only, the last layer at the answer positions): a decoder layer's step, or the logits at
        the end (float32 copy and log-softmax included) beside the last residual stream;
        ``held`` elements per token stay alive; ``attention``: whether the run has a whole
        layer (``layer``)."""
        per_element = rows * tokens * self.itemsize
        upcast = 4 if self.itemsize != 4 else 0
        logits = rows * answers * self.spec.vocab_size * (self.itemsize + 4 + upcast)
        return max(
            per_element * held + self.layer(rows, tokens, attention=attention, last=False),
            per_element * (held + self.spec.d_model) + logits,
        )

    def kv(self, tokens: int, rows: int = 1) -> int:
        return kv_cache_bytes(self.spec, tokens, self.itemsize, rows)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What is asked of the analysis, besides the batch (``plan``'s arguments)."""

    length: int
    n_units: int | None
    records: int | None
    batch_rows: int
    answer_tokens: int


@dataclass(frozen=True, kw_only=True)
class Phase:
    """Bytes alive at one moment of an analysis."""

    kv: int = 0
    activations: int = 0
    buffers: int = 0

    @property
    def total(self) -> int:
        return self.kv + self.activations + self.buffers


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A memory plan (bytes) for one analysis of one model at one length and batch.

    Attributes:
        model: the model's name or path as given.
        analysis: one of ``ANALYSES``.
        length: tokens per record.
        batch: what the analysis batches (records per forward; patched runs for ``patching``).
        dtype: the parameter and activation dtype.
        budget_bytes: the device memory the plan must fit in.
        parameters: the model's parameter count.
        weights_bytes: parameters x dtype size.
        kv_cache_bytes: keys and values kept across layers at the peak.
        activation_bytes: forward (and backward) intermediates at the peak.
        buffer_bytes: the analysis' own tensors at the peak.
        peak_bytes: the sum of the four above.
        max_batch: the largest batch whose peak fits the budget (0: none).
        forwards: forward passes the analysis runs (for ``records`` records at this length).
    """

    model: str
    analysis: str
    length: int
    batch: int
    dtype: str
    budget_bytes: int
    parameters: int
    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    buffer_bytes: int
    peak_bytes: int
    max_batch: int
    forwards: int

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget_bytes

    def table(self) -> str:
        """This plan as a one-row table (``table`` renders several)."""
        return table([self])

    def __str__(self) -> str:
        return self.table()


COLUMNS = ("analysis", "batch", "weights", "KV cache", "activations", "buffers", "peak")
COLUMNS += ("fits", "max batch", "forwards")


def table(plans: Sequence[Plan]) -> str:
    """Plans as a text table: a line naming the model and setting, then one row per plan, sizes
    in GiB (MiB when every peak is under 1 GiB)."""
    first = plans[0]
    unit, name = (GiB, "GiB") if max(p.peak_bytes for p in plans) >= GiB else (MiB, "MiB")
    count = first.parameters
    size = f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"
    head = (
        f"{first.model}: {size} parameters, {first.dtype}, {first.length:,} tokens, budget "
        f"{first.budget_bytes / GiB:.2f} GiB (sizes in {name})"
    )
    rows = [COLUMNS]
    for p in plans:
        sizes = (p.weights_bytes, p.kv_cache_bytes, p.activation_bytes, p.buffer_bytes)
        rows.append(
            (
                p.analysis,
                str(p.batch),
                *(f"{x / unit:.2f}" for x in (*sizes, p.peak_bytes)),
                "yes" if p.fits else "no",
                str(p.max_batch),
                f"{p.forwards:,}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(
            [
                row[0].ljust(widths[0]),
                *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)),
            ]
        )
        for row in rows
    ]
    return "\n".join([head, *lines])


# -- units and chunks ----------------------------------------------------------------------


def _layer_major(units: int, per_layer: int, n_layers: int) -> list[int]:
    """Units per start layer when ``units`` fill layers in order, ``per_layer`` at most each."""
    if units > per_layer * n_layers:
        raise ValueError(f"n_units={units} is more than the model has ({per_layer * n_layers})")
    full, rest = divmod(units, per_layer)
    return [per_layer] * full + ([rest] if rest else [])


def _chunks(records: int, batch: int) -> list[int]:
    """Sizes of the chunks ``records`` records split into, ``batch`` at most each."""
    full, rest = divmod(records, batch)
    return [batch] * full + ([rest] if rest else [])


@dataclass(frozen=True, kw_only=True)
class SweepUnits:
    """A sweep's edits by the layer their edited runs start at.

    Attributes:
        per_layer: units per start layer from layer 0, for the count of forwards: a head
            sweep's heads fill layers in order; named heads (channel-sweep, screen) one per
            layer, as far as the layers go.
        starts: start layers whose head outputs the clean run caches (named heads: as many
            layers as heads, the most memory).
        most: most units at one start layer (named heads: all on one layer, the most rows).
    """

    per_layer: list[int]
    starts: int
    most: int


def _sweep_units(g: Geometry, analysis: str, n_units: int | None) -> SweepUnits:
    """The units of a head sweep, a channel sweep or the screen's exact sweep."""
    L, H, D = g.spec.n_layers, g.spec.n_heads, g.spec.d_head
    if analysis == "head-sweep":
        per_layer = _layer_major(L * H if n_units is None else n_units, H, L)
        return SweepUnits(per_layer=per_layer, starts=len(per_layer), most=max(per_layer))
    heads = (1 if analysis == "channel-sweep" else SCREEN_UNITS) if n_units is None else n_units
    _layer_major(heads, H, L)  # no more heads than the model has
    size = D if analysis == "channel-sweep" else 1  # units per head
    per_layer = [n * size for n in _layer_major(heads, math.ceil(heads / L), L)]
    return SweepUnits(per_layer=per_layer, starts=min(heads, L), most=min(heads, H) * size)


# -- phases and forwards per analysis --------------------------------------------------------


def _teacher_forcing(g: Geometry, w: Workload, batch: int) -> list[Phase]:
    rows = min(batch, w.records or batch)
    act = g.forward(rows, w.length, w.answer_tokens, held=g.spec.d_model)  # + embeddings
    return [Phase(activations=act + g.embeddings(rows, w.length))]


def _sweep(g: Geometry, w: Workload, batch: int, units: SweepUnits) -> list[Phase]:
    """The clean forward, then an edited one, beside the cached residuals and head outputs."""
    L, d, T, b = g.spec.n_layers, g.spec.d_model, w.length, g.itemsize
    chunk = min(batch, w.records or batch)
    starts = min(units.starts, L - 1)  # z and v are cached below the last layer only
    buffers = chunk * T * b * (L * d + starts * (g.q + g.k))
    clean = g.forward(chunk, T, w.answer_tokens) + g.embeddings(chunk, T)
    rows = chunk * min(max(1, w.batch_rows // chunk), units.most)
    # an edited run from layer s: s's o_proj and MLP, whole layers s + 1 .. L - 2, the last
    # layer's answer rows: whole layers (their attention) only in a model of 3 layers or more
    edited = g.forward(rows, T, w.answer_tokens, held=g.q + d, attention=L > 2)
    return [Phase(activations=clean, buffers=buffers), Phase(activations=edited, buffers=buffers)]


def _sweep_forwards(w: Workload, batch: int, units: SweepUnits) -> int:
    """``sweeps._plan``'s steps: per chunk of records, the clean forward and the edited ones."""
    total = 0
    for chunk in _chunks(w.records or batch, batch):
        per_forward = max(1, w.batch_rows // chunk)
        total += 1 + sum(math.ceil(n / per_forward) for n in units.per_layer)
    return total


def _screen(g: Geometry, w: Workload, batch: int, units: SweepUnits) -> list[Phase]:
    """The backward pass of one record (every layer's input and head outputs, the gradients
    so far, one layer recomputed), then the exact sweep."""
    L, d, T, b = g.spec.n_layers, g.spec.d_model, w.length, g.itemsize
    layer = 8 * d + b * (2 * g.q + g.mlp_backward()) + 4 * g.spec.n_heads  # recomputed, per token
    act = T * (b * (L * (g.q + max(d, g.q) + d) + d) + layer) + g.blocks(1, T, backward=True)
    return [Phase(activations=act), *_sweep(g, w, batch, units)]


def _row_capture(g: Geometry, w: Workload) -> int:
    """Activations of a forward with the row-capture hooks (one record): the embeddings, and a
    layer's step, with the ``q`` and ``k`` projections the hooks keep during its attention, or
    the hook's (after attention: the layer's input, its norm and output, the kept ``q`` and
    ``k``, the rotary embedding's temporaries again, ``k`` in float32)."""
    d, b, T = g.spec.d_model, g.itemsize, w.length
    hook = T * (b * (3 * d + 4 * g.q + g.k) + (4 * g.k if b != 4 else 0))
    attention = T * b * (g.attention_step() + g.q + g.k) + g.blocks(1, T)
    return T * b * d + g.embeddings(1, T) + max(g.layer(1, T), attention, hook)


def _rows(g: Geometry, tokens: int) -> int:
    """One layer's attention rows of one query, float32 scores and softmax."""
    return 2 * g.spec.n_heads * tokens * 4


def _passage_scores(g: Geometry, w: Workload, batch: int) -> list[Phase]:
    return [Phase(activations=_row_capture(g, w), buffers=_rows(g, w.length))]


def _needle_scores(g: Geometry, w: Workload, batch: int) -> list[Phase]:
    tokens = w.length + w.answer_tokens - 1
    return [Phase(kv=g.kv(tokens), activations=_row_capture(g, w), buffers=_rows(g, tokens))]


def _patch_units(g: Geometry, w: Workload) -> list[int]:
    """Whole-head patches per layer, layer-major."""
    L, H = g.spec.n_layers, g.spec.n_heads
    return _layer_major(L * H if w.n_units is None else w.n_units, H, L)


def _patching(g: Geometry, w: Workload, batch: int) -> list[Phase]:
    """The prompt's forward into its cache, then patched runs on copies of the cache."""
    T, b = w.length, g.itemsize
    rows = min(batch, max(_patch_units(g, w)))
    attention = 2 * g.q if g.spec.group_size > 1 else g.k  # repeated k, v; or the cache's cat
    return [
        Phase(kv=g.kv(T), activations=T * b * g.spec.d_model + g.embeddings(1, T) + g.layer(1, T)),
        Phase(kv=g.kv(T, 1 + rows), activations=rows * T * b * attention),
    ]


def _dla(g: Geometry, w: Workload, batch: int) -> list[Phase]:
    """An attribution forward, then the float64 projections."""
    s, T, b = g.spec, w.length, g.itemsize
    components = (s.n_layers * s.n_heads + 2 * s.n_layers + 1) * s.d_model
    float64 = 8 * (s.vocab_size * s.d_model + s.d_model * g.q + components)
    return [
        Phase(kv=g.kv(T), activations=T * b * s.d_model + g.embeddings(1, T) + g.layer(1, T)),
        Phase(buffers=float64),  # after the forward: its cache is gone
    ]


def _phases(g: Geometry, w: Workload, analysis: str, batch: int) -> list[Phase]:
    if analysis in ("head-sweep", "channel-sweep"):
        return _sweep(g, w, batch, _sweep_units(g, analysis, w.n_units))
    if analysis == "screen":
        return _screen(g, w, batch, _sweep_units(g, analysis, w.n_units))
    simple: dict[str, Callable[[Geometry, Workload, int], list[Phase]]] = {
        "teacher-forcing": _teacher_forcing,
        "passage-scores": _passage_scores,
        "needle-scores": _needle_scores,
        "patching": _patching,
        "dla": _dla,
    }
    return simple[analysis](g, w, batch)


def _forwards(g: Geometry, w: Workload, analysis: str, batch: int) -> int:
    records = w.records or batch
    if analysis in ("head-sweep", "channel-sweep"):
        return _sweep_forwards(w, batch, _sweep_units(g, analysis, w.n_units))
    if analysis == "screen":
        return records + _sweep_forwards(w, batch, _sweep_units(g, analysis, w.n_units))
    if analysis == "patching":
        return 3 + sum(math.ceil(n / batch) for n in _patch_units(g, w))
    per_record = {"passage-scores": 1, "needle-scores": 1 + w.answer_tokens}
    if analysis in per_record:
        return records * per_record[analysis]
    if analysis == "dla":
        return 3
    return math.ceil(records / batch)  # teacher forcing


def _peak(g: Geometry, w: Workload, analysis: str, batch: int) -> Phase:
    return max(_phases(g, w, analysis, batch), key=lambda phase: phase.total)


def _largest_batch(fits: Callable[[int], bool], scan: int, cap: int) -> int:
    """The largest batch ``1..cap`` that fits: every batch up to ``scan`` is tried (a sweep's
    rows per forward jump with the batch), then doubling and bisection (monotone beyond)."""
    scan = min(scan, cap)
    best = max((b for b in range(1, scan + 1) if fits(b)), default=0)
    if best < scan:
        return best
    low = best
    while low < cap and fits(min(2 * low, cap)):
        low = min(2 * low, cap)
    high = min(2 * low, cap)  # low fits; high does not, unless low == cap
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _max_batch(g: Geometry, w: Workload, analysis: str, room: int) -> int:
    """The largest batch whose peak, weights aside, fits in ``room`` bytes."""

    def fits(batch: int) -> bool:
        return _peak(g, w, analysis, batch).total <= room

    if analysis in ONE_RECORD:
        return int(fits(1))
    cap = max(_patch_units(g, w)) if analysis == "patching" else w.records or MAX_BATCH
    return _largest_batch(fits, max(64, w.batch_rows), cap)


def _model_geometry(model, dtype) -> tuple[torch.dtype, transformers.PretrainedConfig, ModelSpec]:
    """``dtype`` as a floating-point torch dtype, and ``model``'s config and geometry (its
    family checked), before anything is planned."""
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype, got {dtype!r}")
    config = model_config(model)
    family_for(config)
    return dtype, config, ModelSpec.from_config(config)


def plan(
    model,
    analysis: str,
    *,
    length: int,
    batch: int = 1,
    budget_bytes: int,
    dtype: torch.dtype | str = torch.float32,
    n_units: int | None = None,
    records: int | None = None,
    batch_rows: int = 8,
    answer_tokens: int = 8,
) -> Plan:
    """The memory plan of ``analysis`` on ``model`` (see the module docstring for the model).

    Args:
        model: a transformers config, a ``config.json`` path, or a name ``load_model`` takes
            (``"organism"``, ``"smollm2"``, a checkpoint or config directory, a hub name).
        analysis: one of ``ANALYSES``.
        length: tokens per record (prompt and answer).
        batch: records per forward (patched runs per forward for ``patching``; the exact
            sweep's records per clean forward for ``screen``; 1 for ``ONE_RECORD`` analyses).
        budget_bytes: device memory available (``parse_bytes("80GiB")``).
        dtype: parameter dtype (``torch.bfloat16`` or ``"bfloat16"``).
        n_units: heads swept (head-sweep, default all), heads opened (channel-sweep, default
            1), heads confirmed (screen, default 20), whole-head patches (patching, default all).
        records: records per length (default: one batch), for the count of forwards.
        batch_rows: a sweep's most rows per edited forward (``SweepOptions.batch_rows``).
        answer_tokens: answer positions unembedded, or tokens decoded (needle-scores).
    """
    if analysis not in ANALYSES:
        raise ValueError(f"unknown analysis {analysis!r}; choose one of {', '.join(ANALYSES)}")
    if analysis in ONE_RECORD and batch != 1:
        raise ValueError(f"{analysis} runs one record per forward: batch must be 1, got {batch}")
    sizes = dict(length=length, batch=batch, batch_rows=batch_rows, answer_tokens=answer_tokens)
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    dtype, config, spec = _model_geometry(model, dtype)
    if length > spec.max_positions:
        raise ValueError(
            f"length {length} is past the model's context window ({spec.max_positions} positions)"
        )
    meta = meta_model(config)
    g = Geometry.of(config, spec, dtype.itemsize, meta)
    w = Workload(
        length=length,
        n_units=n_units,
        records=records,
        batch_rows=batch_rows,
        answer_tokens=answer_tokens,
    )
    parameters = parameter_count(meta)
    weights = parameters * g.itemsize
    peak = _peak(g, w, analysis, batch)
    return Plan(
        model=config.model_type if isinstance(model, transformers.PretrainedConfig) else str(model),
        analysis=analysis,
        length=length,
        batch=batch,
        dtype=str(dtype).removeprefix("torch."),
        budget_bytes=budget_bytes,
        parameters=parameters,
        weights_bytes=weights,
        kv_cache_bytes=peak.kv,
        activation_bytes=peak.activations,
        buffer_bytes=peak.buffers,
        peak_bytes=weights + peak.total,
        max_batch=_max_batch(g, w, analysis, budget_bytes - weights),
        forwards=_forwards(g, w, analysis, batch),
    )


def plan_decode(
    model,
    *,
    length: int,
    budget_bytes: int,
    streaming_heads: StreamingHeads | None = None,
    dtype: torch.dtype | str = torch.float32,
    answer_tokens: int = 8,
) -> Plan:
    """The memory plan of greedy decoding one record (``engine.greedy_decode``): the prompt's
    forward into a KV cache beside the cache of ``length + answer_tokens - 1`` positions, under
    ``streaming_heads`` when given (see the module docstring). ``analysis`` reads ``"decode"``;
    ``batch`` and ``max_batch`` are 1 (0 when it does not fit)."""
    if length < 1 or answer_tokens < 1:
        raise ValueError(f"length and answer_tokens must be >= 1, got {length}, {answer_tokens}")
    dtype, config, spec = _model_geometry(model, dtype)
    if streaming_heads is not None:
        streaming_heads.check_model(spec, str(model))
    meta = meta_model(config)
    g = Geometry.of(config, spec, dtype.itemsize, meta)
    kv = kv_budget_bytes(streaming_heads, spec, length + answer_tokens - 1, itemsize=dtype.itemsize)
    layer = g.layer(1, length)
    last = spec.n_layers - 1
    if streaming_heads is not None and streaming_heads.streaming(last, spec.n_kv_heads):
        cfg = streaming_heads  # a block's additive mask and the kernel's scores, float32
        attention = length * g.itemsize * g.attention_step()
        attention += 2 * 4 * cfg.block_size * (cfg.block_size + cfg.window - 1)
        layer = max(layer, attention)
    activations = length * g.itemsize * spec.d_model + g.embeddings(1, length) + layer
    weights = parameter_count(meta) * g.itemsize
    peak = weights + kv + activations
    return Plan(
        model=config.model_type if isinstance(model, transformers.PretrainedConfig) else str(model),
        analysis="decode",
        length=length,
        batch=1,
        dtype=str(dtype).removeprefix("torch."),
        budget_bytes=budget_bytes,
        parameters=weights // g.itemsize,
        weights_bytes=weights,
        kv_cache_bytes=kv,
        activation_bytes=activations,
        buffer_bytes=0,
        peak_bytes=peak,
        max_batch=int(peak <= budget_bytes),
        forwards=1 + answer_tokens,
    )
