"""Where things live in each supported model family, and a model's geometry.

Per-architecture support is *data*, not code branches (the pyvene idea): every family that
interp-seal understands is one ``Family`` row naming the modules the analyses touch and the
family's other particulars (its llama.cpp architecture name, its RoPE function, its attention
window). Adding a family means one row, here or from user code with ``register_family``,
nothing else: the analyses, the forward engine, both row-wise attention capture routes, GGUF
loading and the random test checkpoints all read these rows (``tests/unit/test_families.py``
registers families, one with renamed attention and MLP modules, and runs the parity checks).

Rows are data wherever a family's particulars are: norms on the queries and keys before RoPE
(``q_norm`` / ``k_norm``, over each head or the whole projection) are a row field applied in one
place (``ModelHandle.split_heads``), and so is where a decoder layer's norms sit (before and / or
after each sublayer: pre-norm Llama, post-sublayer OLMo 2, both for sandwich norms), applied by
``ModelHandle.apply_norm`` in the engine's restarted layers (``engine.layers``) and in DLA.
A fused projection whose output is ``[q | k | v]`` (Phi-3's ``qkv_proj``) is a row field too,
sliced in one place (``Family.projection``). So are Gemma 2's particulars: the attention-logit
soft-cap (``attn_softcap``, applied by the row capture and the engine's last layer, where
sdpa cannot: ``ModelHandle.attn_softcap``), the final-logit soft-cap (``final_softcap``,
``ModelHandle.cap_logits``), the ``1 + w`` RMSNorm (``norm_offset``, ``norm_eps``: DLA reads
norms through ``ModelHandle.norm_terms``), the attention implementation it needs
(``attn_implementation=CAPPED_ATTENTION``: soft-capped attention by blocks of query rows,
``models.capped_attention``), sandwich norms (all four norm sites) and alternating
sliding windows (read per layer from each attention module). Its embedding scale
(``sqrt(d_model)``) lives inside the embedding module, whose output is all the analyses read,
and ``query_pre_attn_scalar`` inside the attention module's ``scaling``, which they read too.

GPT-NeoX's particulars are row fields too: its ``query_key_value`` interleaved per head
(``[q_h | k_h | v_h]``, ``qkv_interleaved``: ``projection`` gives index tensors), the parallel
residual (``parallel_residual``, read by the engine's ``mlp_half``), LayerNorms with mean and
bias (``layer_norm``: DLA centres the parts and attributes the final norm's bias on its own,
``ModelHandle.norm_scale`` / ``center``) and its layers' cache keyword (``layer_cache``).

GPT-2's are too: transformers' ``Conv1D`` projections, whose weights are stored input-major
``(in, out)`` (``conv1d``: every weight the analyses read or merge into goes through
``ModelHandle.linear_weight``, an ``(out, in)`` view), its ``c_attn`` fused as ``[q | k | v]``
blocks (``qkv_proj``, as Phi-3's), learned absolute position embeddings added to the token
embeddings before the first layer (``pos_embed``: a component of its own in DLA) and no RoPE at
all (``rope_function=None``: queries and keys are the projections, ``ModelHandle.rotate``
leaves them as they are; NTK scaling and Self-Extend are refused). Its attention scale
(``scale_attn_weights``, ``scale_attn_by_inverse_layer_idx``) lives in the attention module's
``scaling``, which the analyses read; ``reorder_and_upcast_attn`` only makes eager attention
compute its scores in float32. The code reads these three fields in few places:
``conv1d`` in ``linear_weight`` and LoRA's ``fan_in_fan_out``; ``rope_function=None`` in
``rope_tables`` / ``rotate``, the nnsight row route and the NTK / Self-Extend refusal;
``pos_embed`` in DLA's parts and ``ModelHandle.pos_embed``. Not covered by the row: GPT-2
with cross-attention blocks (``add_cross_attention``) and ``token_type_ids`` (embedded by
``wte`` again and added to the stream; no analysis passes them).

What a row cannot express, and every supported family shares: a decoder-only causal LM with
``nn.Linear`` or ``Conv1D`` projections, q / k / v separate, fused as ``[q | k | v]``
blocks or interleaved per head without GQA, a separate ``o_proj``, attention then MLP in
sequence or in parallel from the same stream, RMSNorms ``(offset + w) * x / rms(x)`` or
LayerNorms (none on a sublayer's output: DLA refuses one there), RoPE applied by one
module-level function of the modeling file to the first channels of each head (all of them,
or a ``partial_rotary_factor`` share) or learned absolute position embeddings added once to
the token embeddings (no ALiBi, no relative position biases), with one ``(cos, sin)``
pair for every layer (not Gemma 3's separate local and global RoPE bases), softmax attention
scaled by the module's ``scaling``, optionally soft-capped, over the causal prefix or a
per-layer sliding window (no attention sinks), an MLP module called on the residual stream
alone (dense, or mixture-of-experts routing inside it), logits ``lm_head(final_norm(x))``
optionally soft-capped, and GQA query head ``i`` reading KV head ``i // group_size``. Self-Extend
refuses soft-capped attention (its kernel does not cap).

``ModelSpec`` holds the numbers every analysis needs: layers, query heads, KV heads (GQA when
``n_kv_heads < n_heads``), head dimension, model dimension and vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from interp_seal.models.capped_attention import ATTENTION_NAME as CAPPED_ATTENTION

QK_NORM_SCOPES = ("head", "projection")
# class-name endings of causal LMs (GPT-2's is GPT2LMHeadModel)
CAUSAL_LM_CLASSES = ("ForCausalLM", "LMHeadModel")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", CAPPED_ATTENTION)


@dataclass(frozen=True, kw_only=True)
class Family:
    """Module paths (dotted, relative to the ``*ForCausalLM`` object) for one model family.

    Attributes:
        name: the ``config.model_type`` this row describes.
        layers: the ``nn.ModuleList`` of decoder layers.
        attn: the attention module inside one decoder layer.
        q_proj, k_proj, v_proj, o_proj: projections inside ``attn``; ``o_proj``'s input is the
            concatenation of per-head outputs ``z`` (head ``h`` is columns ``h*d_head:(h+1)*d_head``).
        qkv_proj: a fused projection inside ``attn`` whose output is ``[q | k | v]`` (Phi-3's
            ``qkv_proj``: ``H*D`` query rows, then ``KV*D`` key rows, then ``KV*D`` value rows),
            used instead of ``q_proj`` / ``k_proj`` / ``v_proj``; None where they are separate.
            ``ModelHandle.project`` / ``projection_weights`` / ``on_projection`` slice it.
        qkv_interleaved: the fused projection's rows are per head, ``[q_h | k_h | v_h]`` for
            head ``h`` in turn (GPT-NeoX's ``query_key_value``: head ``h``'s query is rows
            ``3hD : 3hD + D``), not ``[all q | all k | all v]``; ``projection`` then gives
            index tensors instead of slices.
        parallel_residual: dotted path, relative to the ``*ForCausalLM`` object, of the flag
            that makes a decoder layer compute ``x + attn(pre_attn(x)) + mlp(pre_mlp(x))``
            (GPT-NeoX's ``config.use_parallel_residual``): the MLP reads the stream *entering*
            the layer, not the stream after attention; None: always sequential.
        layer_norm: the family's norms are LayerNorms ``w * (x - mean(x)) / std(x) + b`` (mean
            and bias), not RMSNorms; DLA centres each part and attributes the final norm's
            bias as its own component (``analysis.logit_attribution``).
        layer_cache: the keyword a decoder layer takes its KV cache by (GPT-NeoX's
            ``layer_past``); None: the model's own keyword (``models.kv_cache.CACHE_ARG``).
        conv1d: the projections are transformers' ``Conv1D`` (GPT-2): ``y = x @ W + b`` with
            ``W`` stored ``(in, out)``, the transpose of ``nn.Linear``'s; read and edit weights
            through ``ModelHandle.linear_weight``, which gives the ``(out, in)`` view either way.
        mlp: the MLP inside one decoder layer.
        pre_attn_norm, post_attn_norm, pre_mlp_norm, post_mlp_norm: the norms inside one
            decoder layer, by where they sit (None where the family has none there): a decoder
            layer computes ``h += post_attn(attn(pre_attn(h))); h += post_mlp(mlp(pre_mlp(h)))``.
            Llama-style pre-norm layers have the two ``pre_`` norms; OLMo 2 only the two
            ``post_`` norms, on the sublayer outputs before they join the residual stream.
        final_norm: the norm applied to the residual stream before the unembedding.
        unembed: the unembedding (``lm_head``).
        embed: the token embedding.
        pos_embed: learned absolute position embeddings (GPT-2's ``wpe``), relative to the
            ``*ForCausalLM`` object, added to the token embeddings before the first layer;
            DLA attributes them as the component ``pos_embed`` (TransformerLens's name). None:
            positions enter through RoPE only.
        sliding_window: dotted path, relative to the attention module, of the layer's attention
            window (None where the family always attends to the whole causal prefix); a
            window of None there means full attention.
        rope_function: the modeling file's function that rotates q and k; the nnsight capture
            route reads its first call's output inside the attention module's source. None: the
            family has no RoPE (GPT-2); q and k are the projections as they are.
        q_norm, k_norm: dotted paths, relative to the attention module, of norms the family
            applies to the queries / keys before RoPE (Qwen3, OLMo 2); None: no such norm.
        qk_norm_over: what those norms normalise: ``"head"`` (each head's ``d_head`` channels
            after the head split: Qwen3) or ``"projection"`` (the whole ``q_proj`` / ``k_proj``
            output before the split: OLMo 2). ``ModelHandle.split_heads`` applies them, the
            one place the engine turns projections into per-head queries and keys.
        attn_implementation: the transformers attention the HF model runs (``load_model``):
            ``"sdpa"`` (memory linear in length) where the family supports it, or
            ``CAPPED_ATTENTION`` (``models.capped_attention``: eager attention's soft-capped
            arithmetic by blocks of query rows, linear in length too) where sdpa cannot
            compute it (Gemma 2: sdpa has no logit soft-capping); ``"eager"`` builds the
            ``T x T`` pattern per head (quadratic memory in the length).
        attn_softcap: dotted path, relative to the attention module, of the attention-logit
            soft-cap ``c`` (Gemma 2: scores become ``c * tanh(s / c)`` before the mask and the
            softmax); None, or a cap of None there: no soft-capping.
        final_softcap: dotted path, relative to the ``*ForCausalLM`` object, of the final-logit
            soft-cap (Gemma 2: ``logits = c * tanh(lm_head(x) / c)``); None: none.
        norm_offset: the RMSNorms compute ``(norm_offset + weight) * x / rms(x)`` (Gemma's
            ``1 + w``: 1.0); DLA and every place that reads a norm's weight add it.
        norm_eps: the attribute of the family's RMSNorm modules holding epsilon.
        gguf_architecture: llama.cpp's ``general.architecture`` for GGUF files of this family
            (None: not loadable from GGUF; llama.cpp writes Mistral models as "llama").
        gguf_config: GGUF metadata that transformers' GGUF loader drops, as pairs of a key
            (after ``"<gguf_architecture>."``) and the config field it sets when a GGUF file is
            converted (``models.gguf``): Gemma 2's soft-caps; ``attention.key_length`` as
            ``query_pre_attn_scalar``, the scale llama.cpp applies to every Gemma 2 but the
            27B (which it scales by ``hidden / heads``, recorded nowhere in the file);
            ``rope.dimension_count`` as ``partial_rotary_factor`` (Phi-3: rotated channels per
            head, which ``models.gguf`` divides by the head width into ``rope_parameters``);
            ``expert_weights_norm`` as ``norm_topk_prob`` (Qwen3-MoE, where a file has it).
        random_config: config overrides for random test checkpoints, given to the config
            class (e.g. no sliding window, so that every family computes the same kind of
            attention in parity tests; a few small experts); sequences as tuples.
        mlp_width: the config field holding the MLP's width ``I`` (its hidden units per token);
            where it is None, ``4 * hidden_size`` (GPT-2's ``n_inner``). Read by the memory
            planner (``analysis.plan``) only, as is ``mlp_peak``.
        mlp_peak: per token, how many ``I``-wide tensors the MLP module holds at once at its
            peak (no gradients): 3 for a gated MLP with separate projections (``act(gate)``,
            ``up``, their product), 4 with a fused ``gate_up_proj`` (Phi-3: the fused output
            stays alive beside ``act(gate)`` and the product), 2 for ``fc -> act -> proj`` with
            a one-kernel activation (GPT-NeoX's exact GELU), 4 for GPT-2's ``gelu_new`` (``c_fc``'s
            output and three temporaries of its tanh formula).
        experts_per_token: the config field holding how many experts each token is routed to
            (mixture-of-experts MLPs; None: a dense MLP), and ``expert_width`` the field
            holding one expert's width; for the memory planner, which counts transformers'
            grouped experts (``integrations.moe``): per token and expert, a copy of the token
            and the experts' fused ``gate_up`` output, ``act(gate)`` and their product.

    Attention applies the family's q / k norms and ``rope_function`` (looked up in the
    attention module's modeling file) to q and k, and GQA query head ``i`` reads KV head
    ``i // group_size``.
    """

    name: str
    layers: str = "model.layers"
    attn: str = "self_attn"
    q_proj: str = "q_proj"
    k_proj: str = "k_proj"
    v_proj: str = "v_proj"
    o_proj: str = "o_proj"
    qkv_proj: str | None = None
    qkv_interleaved: bool = False
    parallel_residual: str | None = None
    layer_norm: bool = False
    layer_cache: str | None = None
    conv1d: bool = False
    mlp: str = "mlp"
    final_norm: str = "model.norm"
    unembed: str = "lm_head"
    embed: str = "model.embed_tokens"
    pos_embed: str | None = None
    pre_attn_norm: str | None = "input_layernorm"
    post_attn_norm: str | None = None
    pre_mlp_norm: str | None = "post_attention_layernorm"
    post_mlp_norm: str | None = None
    sliding_window: str | None = None
    rope_function: str | None = "apply_rotary_pos_emb"
    q_norm: str | None = None
    k_norm: str | None = None
    qk_norm_over: str = "head"
    attn_implementation: str = "sdpa"
    attn_softcap: str | None = None
    final_softcap: str | None = None
    norm_offset: float = 0.0
    norm_eps: str = "variance_epsilon"
    gguf_architecture: str | None = None
    gguf_config: tuple[tuple[str, str], ...] = ()
    random_config: tuple[tuple[str, Any], ...] = ()
    mlp_width: str = "intermediate_size"
    mlp_peak: int = 3
    experts_per_token: str | None = None
    expert_width: str | None = None

    def projection(self, which: str, spec: ModelSpec) -> tuple[str, slice | torch.Tensor | None]:
        """Where ``which`` (``"q"``, ``"k"`` or ``"v"``) is computed: the module's path inside
        ``attn`` and its output rows (None: all; a fused ``qkv_proj`` is sliced ``[q | k | v]``;
        an interleaved one, ``qkv_interleaved``, gives the rows as an index tensor, head-major:
        ``out[..., rows]`` is ``(..., n*D)`` with head ``h`` in channels ``hD : (h+1)D``)."""
        if which not in ("q", "k", "v"):
            raise ValueError(f"unknown projection {which!r}; choose 'q', 'k' or 'v'")
        if self.qkv_proj is None:
            return getattr(self, f"{which}_proj"), None
        if self.qkv_interleaved:  # head h: rows [q_h | k_h | v_h] = 3hD + (0, D, 2D) + c
            if spec.n_kv_heads != spec.n_heads:
                raise ValueError(f"{self.name}: an interleaved qkv projection has no GQA")
            D, part = spec.d_head, "qkv".index(which)
            heads = torch.arange(spec.n_heads)[:, None] * 3 * D
            return self.qkv_proj, (heads + part * D + torch.arange(D)).flatten()
        q, kv = spec.n_heads * spec.d_head, spec.n_kv_heads * spec.d_head
        rows = {"q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv)}
        return self.qkv_proj, rows[which]

    def __post_init__(self):
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, got "
                f"{self.attn_implementation!r}"
            )
        if self.qk_norm_over not in QK_NORM_SCOPES:
            raise ValueError(
                f"qk_norm_over must be one of {QK_NORM_SCOPES}, got {self.qk_norm_over!r}"
            )


# Gemma 2: sandwich norms, soft-capped attention and logits, ``1 + w`` RMSNorms, every other
# layer windowed
GEMMA2 = Family(
    name="gemma2",
    # transformers' sdpa cannot soft-cap attention logits, and eager attention is quadratic
    attn_implementation=CAPPED_ATTENTION,
    # sandwich norms: before and after each sublayer
    post_attn_norm="post_attention_layernorm",
    pre_mlp_norm="pre_feedforward_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
    sliding_window="sliding_window",  # every other layer (config.layer_types)
    attn_softcap="attn_logit_softcapping",
    final_softcap="config.final_logit_softcapping",
    norm_offset=1.0,
    norm_eps="eps",
    gguf_architecture="gemma2",
    gguf_config=(
        ("attn_logit_softcapping", "attn_logit_softcapping"),
        ("final_logit_softcapping", "final_logit_softcapping"),
        ("attention.key_length", "query_pre_attn_scalar"),
    ),
    # caps the random test models' scores and logits reach, and a query_pre_attn_scalar
    # that is not d_head (16), so that each particular changes the numbers
    random_config=(
        ("attn_logit_softcapping", 10.0),
        ("final_logit_softcapping", 10.0),
        ("query_pre_attn_scalar", 10),
    ),
)


FAMILIES: dict[str, Family] = {
    "llama": Family(name="llama", gguf_architecture="llama"),
    "mistral": Family(
        name="mistral",
        sliding_window="config.sliding_window",
        random_config=(("sliding_window", None),),
    ),
    "qwen2": Family(name="qwen2", sliding_window="sliding_window", gguf_architecture="qwen2"),
    "qwen3": Family(
        name="qwen3",
        sliding_window="sliding_window",
        q_norm="q_norm",
        k_norm="k_norm",
        gguf_architecture="qwen3",
        # transformers' GGUF loader maps no key to Qwen3's head_dim (its config class's
        # default, 128, would be built); llama.cpp writes it as attention.key_length
        gguf_config=(("attention.key_length", "head_dim"),),
    ),
    "olmo2": Family(
        name="olmo2",
        # norms on the sublayer outputs, none on their inputs
        pre_attn_norm=None,
        post_attn_norm="post_attention_layernorm",
        pre_mlp_norm=None,
        post_mlp_norm="post_feedforward_layernorm",
        q_norm="q_norm",
        k_norm="k_norm",
        qk_norm_over="projection",
    ),
    "gemma2": GEMMA2,
    # Gemma 2 plus per-head q / k norms (``1 + w`` too); no attention soft-cap, so sdpa.
    # Its local and global layers rotate with different RoPE bases: each decoder layer receives
    # its own (cos, sin), which the engine and the row capture take from that layer's inputs.
    "gemma3_text": replace(
        GEMMA2,
        name="gemma3_text",
        attn_implementation="sdpa",
        attn_softcap=None,  # transformers' sdpa would ignore a cap: a row with none
        # llama.cpp's Gemma 3 files: its 5 : 1 local / global pattern and local RoPE base 1e4
        # are fixed in llama.cpp (no metadata), and so are transformers' defaults; its attention
        # scale is 1 / sqrt(key_length) (its converter requires query_pre_attn_scalar ==
        # head_dim), which transformers' loader drops
        gguf_architecture="gemma3",
        gguf_config=(("attention.key_length", "query_pre_attn_scalar"),),
        q_norm="q_norm",
        k_norm="k_norm",
        # local (RoPE base 1e4) and global (base 1e6) layers alternating, not 5 : 1 as in the
        # released models, so that a 2-layer test model has both
        random_config=(
            ("sliding_window_pattern", 2),
            ("query_pre_attn_scalar", 10),
        ),
    ),
    "phi3": Family(
        name="phi3",
        qkv_proj="qkv_proj",  # and a fused gate_up_proj, inside the MLP module
        mlp_peak=4,  # the fused gate_up_proj's output, act(gate) and the product
        sliding_window="config.sliding_window",
        gguf_architecture="phi3",
        # transformers' GGUF loader maps nothing from rope.dimension_count (rotated channels
        # per head), which models.gguf turns into partial_rotary_factor
        gguf_config=(("rope.dimension_count", "partial_rotary_factor"),),
        # partial RoPE, as Phi-4-mini's config has it (0.75): half of each head rotates
        random_config=(("partial_rotary_factor", 0.5),),
    ),
    # GPT-NeoX / Pythia: one fused query_key_value interleaved per head, biases on it and on
    # dense, a parallel residual, LayerNorms (mean and bias), partial RoPE (Pythia: 0.25)
    "gpt_neox": Family(
        name="gpt_neox",
        layers="gpt_neox.layers",
        attn="attention",
        qkv_proj="query_key_value",
        qkv_interleaved=True,
        o_proj="dense",
        parallel_residual="config.use_parallel_residual",
        layer_norm=True,
        layer_cache="layer_past",
        mlp_peak=2,  # dense_h_to_4h's output and its GELU (one kernel)
        final_norm="gpt_neox.final_layer_norm",
        embed="gpt_neox.embed_in",
        norm_eps="eps",
        # multi-head (no GQA); a quarter of each head rotates, as in Pythia
        random_config=(
            ("num_key_value_heads", None),
            ("use_parallel_residual", True),
            ("attention_bias", True),
            ("partial_rotary_factor", 0.25),
        ),
    ),
    # GPT-2: Conv1D projections (weights (in, out)), c_attn fused as [q | k | v] blocks, biases
    # on c_attn and c_proj, learned absolute positions (wpe) and no RoPE, LayerNorms, tied
    # embeddings
    "gpt2": Family(
        name="gpt2",
        layers="transformer.h",
        attn="attn",
        qkv_proj="c_attn",
        o_proj="c_proj",
        conv1d=True,
        layer_norm=True,
        pre_attn_norm="ln_1",
        pre_mlp_norm="ln_2",
        final_norm="transformer.ln_f",
        embed="transformer.wte",
        pos_embed="transformer.wpe",
        rope_function=None,
        norm_eps="eps",
        # c_fc's width is n_inner (None: 4 d); gelu_new's tanh formula keeps three temporaries
        mlp_width="n_inner",
        mlp_peak=4,
        gguf_architecture="gpt2",
        # transformers' GGUF loader reads llama.cpp's context length into n_ctx, which GPT-2's
        # config no longer reads: the position table's size is n_positions
        gguf_config=(("context_length", "n_positions"),),
        # multi-head (no GQA), the unembedding tied to wte as in every released GPT-2, and the
        # attention also scaled by 1 / (layer + 1) (scale_attn_by_inverse_layer_idx, off in the
        # released models), so that layer 1's scale is not 1 / sqrt(d_head) in the tests
        random_config=(
            ("num_key_value_heads", None),
            ("tie_word_embeddings", True),
            ("scale_attn_by_inverse_layer_idx", True),
        ),
    ),
    # mixture-of-experts MLPs: the analyses call a layer's MLP module as a whole (the router
    # picks each token's experts inside it), so an MoE block needs no row field
    "mixtral": Family(
        name="mixtral",
        sliding_window="config.sliding_window",
        random_config=(("sliding_window", None), ("num_local_experts", 4)),
        experts_per_token="num_experts_per_tok",
        expert_width="intermediate_size",
    ),
    "qwen3_moe": Family(
        name="qwen3_moe",
        sliding_window="sliding_window",
        q_norm="q_norm",
        k_norm="k_norm",
        gguf_architecture="qwen3moe",
        experts_per_token="num_experts_per_tok",
        expert_width="moe_intermediate_size",
        # transformers' GGUF loader maps nothing to the experts' width (its config class's
        # default would be built); llama.cpp writes it as expert_feed_forward_length. It sets
        # norm_topk_prob (renormalised expert weights) on, as llama.cpp's qwen3moe computes;
        # a file that records expert_weights_norm (llama.cpp's converter writes none for
        # qwen3moe) has its value kept. qwen3moe has no dense MLP tensors: a file with dense
        # layers (mlp_only_layers, decoder_sparse_step > 1) is refused (models.gguf)
        gguf_config=(
            ("expert_feed_forward_length", "moe_intermediate_size"),
            ("expert_weights_norm", "norm_topk_prob"),
        ),
        # a dense MLP in layer 0, experts from layer 1 on
        random_config=(
            ("num_experts", 4),
            ("num_experts_per_tok", 2),
            ("moe_intermediate_size", 32),
            ("mlp_only_layers", (0,)),
        ),
    ),
}


# model types a row cannot express yet: what is missing, and the closest supported family
NOT_YET: dict[str, tuple[str, str]] = {
    "bloom": (
        "ALiBi attention biases (no RoPE, no position embeddings) and a LayerNorm on the "
        "embeddings",
        "gpt_neox",
    ),
}


def register_family(row: Family, *, replace: bool = False) -> Family:
    """Support the ``config.model_type`` ``row.name``: every analysis reads the row from now on.

    The model type itself must be known to transformers (built in, or registered with
    ``AutoConfig.register`` / ``AutoModelForCausalLM.register``). An existing row is replaced
    only with ``replace=True``.
    """
    if row.name in FAMILIES and not replace:
        raise ValueError(
            f"the family {row.name!r} is registered already; pass replace=True to change its row"
        )
    FAMILIES[row.name] = row
    return row


def unregister_family(name: str) -> Family:
    """Remove the row of ``name`` (a ``KeyError`` if there is none) and return it."""
    return FAMILIES.pop(name)


class UnsupportedModelError(ValueError):
    """The checkpoint exists but is not a causal LM of a supported family."""


def family_for(config) -> Family:
    """The ``Family`` row for a transformers config, or a clear error naming what is supported."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES and model_type in NOT_YET:
        missing, closest = NOT_YET[model_type]
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by interp-seal yet ({missing}); the "
            f"closest supported family is {closest!r}; supported families: "
            f"{', '.join(sorted(FAMILIES))}."
        )
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by interp-seal; supported families: "
            f"{', '.join(sorted(FAMILIES))} (decoder-only causal LMs). Add a Family row in "
            "interp_seal/models/spec.py to support another architecture."
        )
    archs = getattr(config, "architectures", None) or []
    if archs and not any(a.endswith(CAUSAL_LM_CLASSES) for a in archs):
        raise UnsupportedModelError(
            f"checkpoint architectures {archs} are not causal LMs; interp-seal needs a "
            f"*ForCausalLM (GPT-2: *LMHeadModel) checkpoint of a supported family "
            f"({', '.join(sorted(FAMILIES))})."
        )
    return FAMILIES[model_type]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Geometry of a decoder-only transformer.

    Attributes:
        n_layers: decoder layers ``L``.
        n_heads: query heads per layer ``H``.
        n_kv_heads: key/value heads per layer; query head ``h`` reads KV head
            ``h // (n_heads // n_kv_heads)``.
        d_head: channels per head ``D``.
        d_model: residual stream width.
        vocab_size: rows of the unembedding.
        max_positions: the context window the config declares.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    vocab_size: int
    max_positions: int

    def __post_init__(self):
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )

    @property
    def group_size(self) -> int:
        """Query heads sharing one KV head (1 without GQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(L, H, D)``: the shape of a full per-channel head scale table."""
        return (self.n_layers, self.n_heads, self.d_head)

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_config(cls, config) -> ModelSpec:
        """The geometry a transformers config declares; ``ValueError`` naming the config's
        field when it is impossible (no heads, KV heads not dividing the heads, ...)."""
        n_heads = config.num_attention_heads
        if not isinstance(n_heads, int) or n_heads < 1:
            raise ValueError(f"config: num_attention_heads must be >= 1, got {n_heads!r}")
        try:
            return cls(
                n_layers=config.num_hidden_layers,
                n_heads=n_heads,
                n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
                d_head=getattr(config, "head_dim", None) or config.hidden_size // n_heads,
                d_model=config.hidden_size,
                vocab_size=config.vocab_size,
                max_positions=config.max_position_embeddings,
            )
        except ValueError as err:
            raise ValueError(f"config: impossible geometry ({err})") from None


def get_module(root: nn.Module, path: str) -> nn.Module:
    """``root.a.b.c`` for the dotted ``path`` ``"a.b.c"``."""
    return root.get_submodule(path)


def get_attribute(root: object, path: str) -> Any:
    """``root.a.b`` for the dotted ``path`` ``"a.b"`` (None where an attribute is missing)."""
    for name in path.split("."):
        root = getattr(root, name, None)
    return root
