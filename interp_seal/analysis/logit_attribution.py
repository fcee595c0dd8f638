"""Direct logit attribution (DLA): how much each head, MLP and the embedding writes to a logit.

The residual stream entering the final norm at position ``p`` is a sum of what every component
wrote there::

    x = embed + sum_l ( sum_h W_O[:, h] z_{l,h} + b_O,l ) + sum_l mlp_l

where ``z_{l,h}`` is head ``h``'s output (the input of ``o_proj``, ``d_head`` channels) and
``W_O[:, h] = o_proj.weight[:, h*D:(h+1)*D]`` its block of output columns. The logit of token
``t`` is ``W_U[t] . (w * x / rms(x))`` (``w`` the final RMSNorm weight). Only ``1/rms(x)``
is non-linear, so each component ``c`` gets a *direct effect* on the logit by projecting it
alone through the rest of the model:

- ``"frozen_norm"``: ``W_U[t] . (w * c) / rms(x)``, with ``rms(x)`` frozen from the clean run
  (Lieberum et al. 2023; TransformerLens' ``cache.logit_attrs``). The components sum to the
  model's logit exactly (plus the unembedding bias, if the model has one, as its own row).
- ``"seal"``: ``W_U[t] . (w * c)``, SEAL's Eq. 1 ``Delta = W_head f(p)`` (SEAL, Sec. 5): "a
  form similar to the direct effect proposed in Lieberum et al. (2023), excluding the
  normalization term". We read "the normalization term" as ``1/rms(x)``, the one non-linear
  factor, and keep the norm's elementwise weight ``w`` inside ``W_head`` (it is a fixed linear
  map, as if folded into ``W_U``). SEAL's components therefore sum to ``rms(x)`` times the
  logit (bias excluded): a positive factor shared by every component and every token at that
  position, so signs, rankings and "which digit wins" (SEAL Fig. 4) are the same as in
  ``"frozen_norm"``; only the units differ.

Families that normalise a sublayer's output before it joins the residual stream (OLMo 2's
``post_attn`` / ``post_mlp`` norms, ``Family``) write ``n_l(o_l)`` instead of the attention
output ``o_l = sum_h W_O[:, h] z_{l,h} + b_O,l``. A head's part is then its block through that
RMSNorm with the RMS of ``o_l`` frozen from the clean run (``frozen_norm``: ``w_l * W_O[:, h]
z_{l,h} / rms(o_l)``), the same linearisation as the final norm's, so the parts still sum to
the stream exactly; the MLP's part is the post-MLP norm's output. Both variants freeze these
sublayer norms (``"seal"`` drops only the final norm's factor).

Families whose RMSNorms scale by ``1 + w`` (Gemma) are read through ``ModelHandle.norm_terms``,
so ``w`` above is always the norm's effective elementwise scale. Gemma 2's sandwich norms are
both kinds at once: the pre-sublayer norms sit inside a head's computation (before ``q``, ``k``,
``v``) and need nothing; the post-attention and post-MLP norms are frozen as above.

**Final soft-capping** (Gemma 2: the model returns ``c * tanh(l / c)`` of ``lm_head``'s output
``l``) is not linear in ``l`` and has no frozen form whose parts sum to anything useful, so DLA
attributes the *pre-cap* logit ``l`` (``LogitAttribution.logits`` holds it, not the returned
logit): the parts sum to ``l`` exactly, and the cap is monotone, so the ranking of tokens and
the sign of a logit difference are those of the capped logits. This is TransformerLens's
convention too: ``cache.logit_attrs`` projects components onto ``W_U`` and never applies
``output_logits_soft_cap``. A user comparing with ``model(...).logits`` sees the capped value,
``c * tanh(l / c)``, which is smaller in size (at most ``c``).

**LayerNorms** (GPT-NeoX: ``w * (x - mean(x)) / std(x) + b``): centring is linear, so each
part ``c`` is centred and divided by the final norm's standard deviation, frozen from the clean
run (``w * (c - mean(c)) / std(x)``), and the norm's bias ``b``, which no component writes, is a
component of its own, ``"final_norm_bias"`` (``W_U[t] . b``, the same in both variants): the
parts sum to the logit exactly. TransformerLens folds the same bias into the unembedding bias
``b_U`` (``fold_ln``), which ``cache.logit_attrs`` leaves out, and centres each component
(``apply_ln_to_stack``) as done here. A parallel residual (``x + attn(ln1(x)) + mlp(ln2(x))``)
changes nothing here: the stream is still the sum of what each head and MLP wrote.

**Learned position embeddings** (GPT-2: ``x_0 = wte[t] + wpe[p]``, no RoPE) are a component of
their own, ``"pos_embed"`` (``wpe[p]``, TransformerLens's ``hook_pos_embed`` /
``cache.decompose_resid``'s ``pos_embed``), beside ``"embed"`` (``wte[t]``): with it the parts
sum to the logit exactly. TransformerLens's ``decompose_resid`` lists the same two embedding
components; a decomposition that kept only ``embed`` would miss ``W_U[t] . wpe[p]`` (scaled by
the frozen norm) and no longer sum to the logit. GPT-2's final norm is a LayerNorm, so the
parts are centred and its bias is ``"final_norm_bias"`` as above.

For the difference between two tokens (SEAL Fig. 4: the correct vs the wrong digit) the
direction ``W_U[t]`` becomes ``W_U[correct] - W_U[wrong]``.

One forward pass on the Hugging Face model (sdpa attention, so long prompts are fine; Gemma 2's
soft-capped attention by blocks of query rows, linear too: ``models.capped_attention``) records the embedding (as the embedding module returns it: Gemma's is scaled by
``sqrt(d_model)`` inside it), every ``o_proj`` input and every MLP output at position ``p`` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_seal.defaults import DLA_VARIANTS
from interp_seal.engine import last_logits
from interp_seal.interventions import HeadEdit
from interp_seal.models.handle import ModelHandle

VARIANTS = DLA_VARIANTS
COLUMNS = ["target", "component", "layer", "head", "value"]
Token = int | str


@dataclass(frozen=True, kw_only=True)
class LogitAttribution:
    """Direct effects of every component on some logits at one position.

    Attributes:
        table: tidy rows ``target, component, layer, head, value``; ``component`` is
            ``"embed"``, ``"pos_embed"`` (learned position embeddings: GPT-2), ``"head"``,
            ``"attn_bias"`` (o_proj bias, if any), ``"mlp"``, ``"final_norm_bias"`` (a final
            LayerNorm's bias) or ``"unembed_bias"`` (lm_head bias, if any); ``layer``/``head``
            are null where they do not apply.
        logits: the model's own logit (or logit difference) per target at ``position``:
            ``lm_head``'s output, before a final soft-cap where the family has one (Gemma 2).
        rms: ``rms(x)`` of the residual stream entering the final norm at ``position``.
        variant: ``"frozen_norm"`` or ``"seal"``.
        position: the (non-negative) position attributed.
    """

    table: pd.DataFrame
    logits: dict[str, float]
    rms: float
    variant: str
    position: int

    def totals(self) -> pd.Series:
        """Sum of the direct effects per target: ``logits`` for ``"frozen_norm"``."""
        return self.table.groupby("target", sort=False)["value"].sum()


def token_id(tokenizer, token: Token) -> int:
    """The id of ``token``: an id, or a string that must be exactly one token."""
    if isinstance(token, int):
        if not 0 <= token < len(tokenizer):
            raise ValueError(f"token id {token} is outside the vocabulary (size {len(tokenizer)})")
        return token
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(
            f"{token!r} is {len(ids)} tokens ({ids}); give a single token (mind the leading "
            "space, e.g. ' 5') or a token id"
        )
    return ids[0]


def token_label(tokenizer, token: int) -> str:
    """The vocabulary entry of ``token`` (unique per id, leading-space markers kept)."""
    return tokenizer.convert_ids_to_tokens(token)


def logit_attribution(
    handle: ModelHandle,
    input_ids: Int[Tensor, " pos"],
    targets: Sequence[Token],
    *,
    position: int = -1,
    variant: str = "frozen_norm",
    intervention: HeadEdit | None = None,
) -> LogitAttribution:
    """Direct effect of every component on the logit of each token in ``targets``."""
    ids = dict.fromkeys(token_id(handle.tokenizer, t) for t in targets)
    contrasts = {token_label(handle.tokenizer, i): (i, None) for i in ids}
    return attribute(
        handle,
        input_ids,
        contrasts,
        position=position,
        variant=variant,
        intervention=intervention,
    )


def logit_diff_attribution(
    handle: ModelHandle,
    input_ids: Int[Tensor, " pos"],
    correct: Token,
    wrong: Token,
    *,
    position: int = -1,
    variant: str = "frozen_norm",
    intervention: HeadEdit | None = None,
) -> LogitAttribution:
    """Direct effect of every component on ``logit[correct] - logit[wrong]`` (SEAL Fig. 4)."""
    a, b = token_id(handle.tokenizer, correct), token_id(handle.tokenizer, wrong)
    name = f"{token_label(handle.tokenizer, a)} - {token_label(handle.tokenizer, b)}"
    return attribute(
        handle,
        input_ids,
        {name: (a, b)},
        position=position,
        variant=variant,
        intervention=intervention,
    )


def attribute(
    handle: ModelHandle,
    input_ids: Int[Tensor, " pos"],
    contrasts: Mapping[str, tuple[int, int | None]],
    *,
    position: int = -1,
    variant: str = "frozen_norm",
    intervention: HeadEdit | None = None,
) -> LogitAttribution:
    """The generic driver: direct effects on ``logit[a] - logit[b]`` for each named ``(a, b)``.

    ``b`` may be None for a plain logit. ``input_ids`` is one prompt (1-D).
    ``intervention`` edits the model analysed (composed with ``handle.edit``'s): heads are
    attributed through their edited outputs, as in the model with the edit merged.
    """
    with handle.edit(intervention):
        if variant not in VARIANTS:
            raise ValueError(f"unknown DLA variant {variant!r}; choose one of {VARIANTS}")
        if input_ids.dim() != 1:
            raise ValueError(
                f"input_ids must be one prompt (1-D), got shape {tuple(input_ids.shape)}"
            )
        n = input_ids.shape[0]
        if not -n <= position < n:
            raise ValueError(f"position {position} is outside the prompt (length {n})")
        position %= n
        parts, labels, x, logits = residual_parts(handle, input_ids, position)

        final = handle.final_norm()
        weight, _ = handle.norm_terms(final)
        rms = handle.norm_scale(final, x)  # a LayerNorm's std (GPT-NeoX)
        scale = 1 / rms if variant == "frozen_norm" else torch.ones((), dtype=torch.float64)
        unembed = handle.unembed()
        w_u = unembed.weight.detach().double()  # (vocab, d_model)
        normed = handle.center(parts) * weight * scale  # (component, d_model)
        norm_bias = None
        if handle.family.layer_norm and getattr(final, "bias", None) is not None:
            norm_bias = final.bias.detach().double()  # its own component: no input writes it

        rows, model_logits = [], {}
        for name, (a, b) in contrasts.items():
            direction = w_u[a] - (w_u[b] if b is not None else 0)
            values = (normed @ direction).tolist()
            rows += [(name, *label, v) for label, v in zip(labels, values, strict=True)]
            if norm_bias is not None:
                rows.append((name, "final_norm_bias", None, None, float(norm_bias @ direction)))
            if unembed.bias is not None:
                bias = unembed.bias.detach().double()
                rows.append(
                    (
                        name,
                        "unembed_bias",
                        None,
                        None,
                        float(bias[a] - (bias[b] if b is not None else 0)),
                    )
                )
            model_logits[name] = float(logits[a] - (logits[b] if b is not None else 0))
        table = pd.DataFrame(rows, columns=COLUMNS).astype({"layer": "Int64", "head": "Int64"})
        return LogitAttribution(
            table=table, logits=model_logits, rms=float(rms), variant=variant, position=position
        )


def residual_parts(
    handle: ModelHandle, input_ids: Int[Tensor, " pos"], position: int
) -> tuple[
    Float[Tensor, "component d_model"],
    list[tuple[str, int | None, int | None]],
    Float[Tensor, " d_model"],
    Float[Tensor, " vocab"],
]:
    """What each component wrote into the residual stream at ``position`` (float64).

    Returns the stacked parts, their ``(component, layer, head)`` labels, the residual stream
    entering the final norm and the model's logits, all at ``position``. Raises if the parts do
    not add up to the residual stream (an architecture with components this decomposition does
    not know about).
    """
    H, D, L = handle.spec.n_heads, handle.spec.d_head, handle.spec.n_layers
    seen: dict[str, Tensor] = {}

    def keep_output(key):
        def hook(_mod, _args, out):
            seen[key] = out[0, position].detach().double()

        return hook

    def keep_input(key):
        def hook(_mod, args):
            seen[key] = args[0][0, position].detach().double()

        return hook

    hooks = [(handle.embed(), "forward", keep_output("embed"))]
    pos_embed = handle.pos_embed()  # GPT-2's wpe: its (1, T, d) output, added to the embedding
    if pos_embed is not None:
        hooks.append((pos_embed, "forward", keep_output("pos_embed")))
    for layer in range(L):
        hooks.append((handle.proj(layer, "o_proj"), "pre", keep_input(f"z{layer}")))
        post_attn, post_mlp = handle.norm(layer, "post_attn"), handle.norm(layer, "post_mlp")
        if post_attn is not None:  # its input, o_proj's output, gives the RMS to freeze
            hooks.append((post_attn, "pre", keep_input(f"attn{layer}")))
        # what the MLP half writes: the MLP's output, through the family's post-MLP norm
        mlp_writes = handle.mlp(layer) if post_mlp is None else post_mlp
        hooks.append((mlp_writes, "forward", keep_output(f"mlp{layer}")))
    hooks.append((handle.final_norm(), "pre", keep_input("x")))

    def keep_logits(_mod, _args, out):  # lm_head's output: the logit before a final soft-cap
        seen["logits"] = out[0, -1].detach().double()

    hooks.append((handle.unembed(), "forward", keep_logits))
    with torch.no_grad(), ExitStack() as installed:
        for module, kind, fn in hooks:
            register = (
                module.register_forward_pre_hook if kind == "pre" else module.register_forward_hook
            )
            installed.enter_context(register(fn))
        keep = torch.tensor([position])  # unembed one position: no (T, vocab) logits
        handle.model(input_ids[None].to(handle.device), logits_to_keep=keep)
    logits = seen["logits"]

    parts, labels = [seen["embed"]], [("embed", None, None)]
    if pos_embed is not None:
        parts.append(seen["pos_embed"])
        labels.append(("pos_embed", None, None))
    for layer in range(L):
        o_proj = handle.proj(layer, "o_proj")
        w_o = handle.linear_weight(o_proj).detach().double().reshape(-1, H, D)  # (d_model, H, D)
        heads = torch.einsum("hd,mhd->hm", seen[f"z{layer}"].view(H, D), w_o)
        post_attn = handle.norm(layer, "post_attn")
        frozen = 1 if post_attn is None else frozen_norm(handle, post_attn, seen[f"attn{layer}"])
        parts += list(heads * frozen)
        labels += [("head", layer, h) for h in range(H)]
        if o_proj.bias is not None:
            parts.append(o_proj.bias.detach().double() * frozen)
            labels.append(("attn_bias", layer, None))
        parts.append(seen[f"mlp{layer}"])
        labels.append(("mlp", layer, None))
    parts = torch.stack(parts)
    x = seen["x"]
    if handle.dtype in (torch.float32, torch.float64):
        gap = float((parts.sum(0) - x).abs().max())
        if gap > 1e-4 * (1 + float(x.abs().max())):
            raise ValueError(
                f"the embeddings, head, o_proj-bias and MLP outputs do not add up to the residual "
                f"stream entering the final norm (max gap {gap:.3g}); this architecture has a "
                "component the decomposition does not know about, so DLA would be wrong"
            )
    return parts, labels, x, logits


def frozen_norm(
    handle: ModelHandle, norm: torch.nn.Module, x: Float[Tensor, " d_model"]
) -> Float[Tensor, " d_model"]:
    """``w / rms(x)``: an RMSNorm ``w * c / rms(c)`` as the linear map it is on its input ``x``
    (float64), so each part ``c`` of ``x`` maps to ``c * frozen_norm(handle, norm, x)`` and the
    parts map to ``norm(x)`` together (a family's post-sublayer norms; the final norm's own
    factor is split out in ``attribute`` for its variants). ``w`` includes the family's norm
    offset (Gemma's ``1 + w``, ``ModelHandle.norm_terms``)."""
    if handle.family.layer_norm:
        raise ValueError(
            f"{handle.family.name} has a LayerNorm on a sublayer's output; DLA freezes only "
            "RMSNorms there (OLMo 2 and Gemma 2 are the supported families with such norms)"
        )
    weight, eps = handle.norm_terms(norm)
    rms = torch.sqrt(x.double().pow(2).mean() + eps)
    return weight.to(x.device) / rms


def strongest_wrong_token(
    handle: ModelHandle, prompt_ids: Int[Tensor, " pos"], correct: int
) -> tuple[int, int]:
    """``(predicted, wrong)``: the model's top next token after ``prompt_ids``, and its top
    token other than ``correct`` (the contrast of a logit-difference attribution, SEAL Fig. 4).

    One forward that unembeds the last position only (no ``T x vocab`` logits).
    """
    with torch.no_grad():
        logits = last_logits(handle, prompt_ids[None])[0].float()
    predicted = int(logits.argmax())
    logits[correct] = -torch.inf
    return predicted, int(logits.argmax())
