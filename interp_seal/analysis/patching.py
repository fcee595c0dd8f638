"""Activation patching: which activations carry the information that decides the answer.

Run the model on two prompts of equal token length (Meng et al. 2022; Wang et al. 2022; the
TransformerLens ``patching`` module): a *clean* one, whose answer is ``a``, and a *corrupted*
one that differs in one key detail and whose answer is ``b``. For line retrieval (LongEval)
the corruption is either

- ``"key"``: the same record, but the question asks for another line, or
- ``"value"``: the same question, but the queried line holds another number.

The metric is the logit difference ``LD = logit[a] - logit[b]`` at the last position. Run the
corrupted prompt again but overwrite one activation (a head's output ``z`` at every position or
at one position, or the residual stream at one layer and position) with its value from the
clean run, and report how much of the clean behaviour comes back::

    value = (LD_patched - LD_corrupted) / (LD_clean - LD_corrupted)

0 means the activation carries nothing the corruption changed; 1 means it alone restores the
clean answer. Patches are batched: each batch row of one forward pass carries its own patch.

Each patched run does only the work its answer needs, with the same numbers as a full forward:

- **only the positions after the shared prefix** (``interp_seal.engine.SharedPrefix``). Attention is causal, so
  every activation before the first token where the prompts differ is the same in both runs:
  patching it changes nothing, and every patched run shares the prefix's keys and values. The
  prefix runs once; each patched run continues from its key/value cache (the model's own
  ``DynamicCache``, as in chunked prefill). For a key corruption of line retrieval the prompts
  differ only in the question, so a patched run covers a few dozen positions, not the record;
- **only the layers from the patched one up**, like the ablation sweeps
  (``interp_seal.engine``): the corrupted run records what enters each layer,
  and a head patch at layer ``l`` starts at ``l``'s ``o_proj``;
- **not at all** where the answer is known: inside the shared prefix, and at positions other
  than the last in the last layer's heads or the final norm's input (no attention follows).

Sites (``Patch.site``):

- ``"head"``: head ``h``'s output ``z`` at layer ``l`` (the ``o_proj`` input, the same place
  SEAL's scales act), at every position (``position=None``) or at one position;
- ``"resid"``: the residual stream entering block ``l`` (``l = n_layers`` is the stream
  entering the final norm), at one position (or every position).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_seal.engine import (
    WHOLE_PROMPT,
    LayerInputs,
    SharedPrefix,
    attn_half,
    mlp_half,
    run_layers,
)
from interp_seal.interventions import HeadEdit
from interp_seal.models.handle import ModelHandle
from interp_seal.tasks import line_retrieval
from interp_seal.tasks.sample import Sample

SITES = ("head", "resid")
CORRUPTIONS = line_retrieval.CORRUPTIONS
COLUMNS = ["site", "layer", "head", "position", "logit_diff", "value"]


@dataclass(frozen=True, kw_only=True)
class PatchingPair:
    """A clean and a corrupted prompt of equal length, read out at their last position.

    Attributes:
        clean_ids: the clean prompt's token ids.
        corrupted_ids: the corrupted prompt's token ids.
        clean_token: the token the clean prompt should produce next.
        corrupted_token: the token the corrupted prompt should produce next.
    """

    clean_ids: Int[Tensor, " pos"]
    corrupted_ids: Int[Tensor, " pos"]
    clean_token: int
    corrupted_token: int

    def __post_init__(self):
        if self.clean_ids.dim() != 1 or self.clean_ids.shape != self.corrupted_ids.shape:
            raise ValueError(
                f"clean and corrupted prompts must be 1-D and of equal length, got shapes "
                f"{tuple(self.clean_ids.shape)} and {tuple(self.corrupted_ids.shape)}"
            )
        if self.clean_token == self.corrupted_token:
            raise ValueError("clean_token and corrupted_token are equal: the logit difference is 0")

    def logit_diff(self, logits: Float[Tensor, "batch vocab"]) -> Float[Tensor, " batch"]:
        """``logit[clean_token] - logit[corrupted_token]`` for each row."""
        return logits[:, self.clean_token] - logits[:, self.corrupted_token]


@dataclass(frozen=True, kw_only=True)
class Patch:
    """One activation to copy from the clean run into the corrupted run.

    Attributes:
        site: ``"head"`` or ``"resid"``.
        layer: the layer (``0..n_layers`` for ``"resid"``; ``n_layers`` = final norm input).
        head: the query head for ``"head"``; None for ``"resid"``.
        position: the position patched, or None for every position.
    """

    site: str
    layer: int
    head: int | None = None
    position: int | None = None

    def __post_init__(self):
        if self.site not in SITES:
            raise ValueError(f"unknown patch site {self.site!r}; choose one of {SITES}")
        if (self.site == "head") != (self.head is not None):
            raise ValueError(f"{self}: 'head' patches need a head, 'resid' patches none")


# -- prompt pairs ----------------------------------------------------------------------------
def line_retrieval_pair(
    sample: Sample, tokenizer, *, corrupt: str = "key", seed: int = 0
) -> PatchingPair:
    """A clean/corrupted pair from a LongEval line-retrieval sample.

    ``corrupt="key"`` asks for another line of the same record; ``"value"`` changes the first
    digit of the queried line's number. Both prompts must tokenise to the same length (true for
    the word-level organism tokenizer, where a line index is one token). The pair ends right
    before the first answer token where the two answers differ (the shared answer tokens before
    it are appended to both prompts). ``seed`` picks the other line or digit.
    """
    if sample.task != "line_retrieval" or not sample.meta.get("force_prefix"):
        raise ValueError(
            "line_retrieval_pair needs a line-retrieval sample generated with force_prefix=True, "
            "so that the prompt ends right before the number"
        )
    candidates = line_retrieval.corruptions(sample, corrupt, random.Random(seed))
    clean = sample.encode(tokenizer)
    for candidate in candidates:
        other = candidate.encode(tokenizer)
        if len(other.prompt_ids) == len(clean.prompt_ids):
            return _pair_at_divergence(clean, other)
    raise ValueError(
        f"no {corrupt!r} corruption of this sample tokenises to the clean prompt's length "
        f"({len(clean.prompt_ids)} tokens); use a tokenizer where line indices and digits are "
        "single tokens (the organism's word-level tokenizer) or another sample"
    )


def _pair_at_divergence(clean, other) -> PatchingPair:
    """Both prompts extended by the answer tokens they share, up to the first that differs."""
    a, b = clean.answer_ids.tolist(), other.answer_ids.tolist()
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if k is None:
        raise ValueError(f"the clean and corrupted answers tokenise identically ({a})")
    return PatchingPair(
        clean_ids=torch.cat([clean.prompt_ids, clean.answer_ids[:k]]),
        corrupted_ids=torch.cat([other.prompt_ids, other.answer_ids[:k]]),
        clean_token=a[k],
        corrupted_token=b[k],
    )


# -- running the model -----------------------------------------------------------------------
def _site_module(handle: ModelHandle, site: str, layer: int) -> torch.nn.Module:
    """The module whose input is the activation ``site`` at ``layer``."""
    if site == "head":
        return handle.proj(layer, "o_proj")
    return handle.final_norm() if layer == handle.spec.n_layers else handle.layers()[layer]


@contextmanager
def replace_inputs(
    handle: ModelHandle,
    site: str,
    edits: dict[int, Callable[[Tensor], Tensor]],
) -> Iterator[None]:
    """Replace the input activation of ``site`` at each layer in ``edits`` by ``edit(x)``.

    ``x`` is ``(batch, pos, head, d_head)`` for ``"head"`` and ``(batch, pos, d_model)`` for
    ``"resid"``. Hooks are removed on exit, exception or not.
    """
    H, D = handle.spec.n_heads, handle.spec.d_head

    def hook_for(edit):  # on o_proj before the handle's edit hooks: the heads' own outputs
        def hook(_mod, args):
            x = args[0]
            if site == "head":
                return (edit(x.view(*x.shape[:2], H, D)).reshape(x.shape), *args[1:])
            return (edit(x), *args[1:])

        return hook

    with ExitStack() as hooks:
        for layer, edit in edits.items():
            module = _site_module(handle, site, layer)
            hooks.enter_context(module.register_forward_pre_hook(hook_for(edit), prepend=True))
        yield


@contextmanager
def _kept_values(handle: ModelHandle, layers: Sequence[int], kept: dict[int, Tensor]):
    """Keep ``layers``' value vectors ``(pos, kv_head, d_head)`` of a one-prompt forward."""
    KV, D = handle.spec.n_kv_heads, handle.spec.d_head

    def keep(layer):
        def hook(out):
            kept[layer] = out[0].detach().view(-1, KV, D)

        return hook

    with ExitStack() as hooks:
        for layer in layers:
            hooks.enter_context(handle.on_projection(layer, "v", keep(layer)))
        yield


def record_inputs(
    handle: ModelHandle,
    ids: Int[Tensor, " pos"],
    layers: Mapping[str, Sequence[int]],
    *,
    prefix: SharedPrefix = WHOLE_PROMPT,
) -> tuple[dict[str, dict[int, Tensor]], Float[Tensor, " vocab"]]:
    """One forward of one prompt: the input activations ``{site: {layer: x}}`` of the sites
    and layers in ``layers`` (without the batch axis; positions from ``prefix.start`` on), and
    the last position's logits."""
    seen: dict[str, dict[int, Tensor]] = {site: {} for site in layers}

    def keep(site, layer):
        def edit(x):
            seen[site][layer] = x[0].detach()
            return x

        return edit

    with torch.no_grad(), ExitStack() as stack:
        for site, site_layers in layers.items():
            edits = {layer: keep(site, layer) for layer in site_layers}
            stack.enter_context(replace_inputs(handle, site, edits))
        logits = prefix.last_logits(handle, prefix.suffix(ids)[None])[0]
    return seen, logits


def normalisation(
    pair: PatchingPair,
    clean_logits: Float[Tensor, " vocab"],
    corrupted_logits: Float[Tensor, " vocab"],
) -> tuple[float, float]:
    """``(LD_clean, LD_corrupted)`` from the two runs' last logits; refuses pairs the
    normalised metric cannot divide by."""
    clean_ld, corrupted_ld = pair.logit_diff(torch.stack([clean_logits, corrupted_logits])).tolist()
    if abs(clean_ld - corrupted_ld) < 1e-6:
        raise ValueError(
            f"the clean and corrupted runs have the same logit difference ({clean_ld:.4g}); the "
            "normalised metric is undefined. Pick a pair the model tells apart."
        )
    return clean_ld, corrupted_ld


# -- exact patching --------------------------------------------------------------------------
def patch(
    handle: ModelHandle,
    pair: PatchingPair,
    patches: Sequence[Patch],
    *,
    batch_size: int = 16,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """The generic driver: the normalised logit difference for every patch in ``patches``.

    ``batch_size`` patched runs of one site and layer share a forward; each holds its own copy
    of the prefix's key/value cache, so lower it for long prompts on large models.
    ``intervention`` edits the model every run of the call sees (clean, corrupted and patched),
    composed with the handle's active edits (``handle.edit``); head patches replace the heads'
    own outputs, which the edits then act on.

    Returns a tidy table ``site, layer, head, position, logit_diff, value`` in the order of
    ``patches``; its ``attrs`` hold ``clean_logit_diff`` and ``corrupted_logit_diff``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for p in patches:
        _check_patch(handle, pair, p)
    with handle.edit(intervention):
        return _patch(handle, pair, patches, batch_size, progress)


def _patch(
    handle: ModelHandle,
    pair: PatchingPair,
    patches: Sequence[Patch],
    batch_size: int,
    progress: bool,
) -> pd.DataFrame:
    layers = {site: sorted({p.layer for p in patches if p.site == site}) for site in SITES}
    prefix = SharedPrefix.of(handle, pair.clean_ids, pair.corrupted_ids)
    clean, clean_logits = record_inputs(handle, pair.clean_ids, layers, prefix=prefix)
    L, T = handle.spec.n_layers, pair.clean_ids.shape[0]
    live = [i for i, p in enumerate(patches) if _can_matter(p, prefix.start, T, L)]
    first = min([patches[i].layer for i in live], default=L)
    edit = handle.active_edit()
    uniform = [layer for layer in layers["head"] if edit is not None and edit.uses_values(layer)]
    values: dict[int, Tensor] = {}
    with LayerInputs(handle, range(first, L)) as inputs, _kept_values(handle, uniform, values):
        wanted = {"head": layers["head"], "resid": [L]}
        corrupted, corrupted_logits = record_inputs(
            handle, pair.corrupted_ids, wanted, prefix=prefix
        )
    corrupted["resid"].update({layer: x[0] for layer, x in inputs.resid.items()})
    inputs.check_shared()
    clean_ld, corrupted_ld = normalisation(pair, clean_logits, corrupted_logits)
    ld = torch.full((len(patches),), corrupted_ld, dtype=torch.float64)
    groups: dict[tuple[str, int], list[int]] = {}
    for i in live:
        groups.setdefault((patches[i].site, patches[i].layer), []).append(i)
    chunks = [
        (site, layer, rows[lo : lo + batch_size])
        for (site, layer), rows in groups.items()
        for lo in range(0, len(rows), batch_size)
    ]
    n_positions = T - prefix.start
    for site, layer, rows in tqdm(chunks, desc="activation patching", disable=not progress):
        mask = _mask(handle, [patches[i] for i in rows], n_positions, prefix.start)
        x = torch.where(mask[..., None], clean[site][layer], corrupted[site][layer])
        with torch.no_grad():
            logits = _run_from(handle, site, layer, x, inputs, prefix, values.get(layer))
        ld[rows] = pair.logit_diff(logits).double().cpu()
    return patch_table(patches, ld, clean_ld, corrupted_ld)


def _can_matter(p: Patch, start: int, T: int, L: int) -> bool:
    """False for patches whose run is the corrupted run itself (LD stays LD_corrupted): inside
    the shared prefix (clean and corrupted activations are equal there), or at a position other
    than the last where no attention follows (the last layer's heads, the final norm's input)
    and nothing carries the patch to the last position's logits."""
    if p.position is None:
        return True
    last_stage = (p.site, p.layer) in {("head", L - 1), ("resid", L)}
    return p.position >= start and (p.position == T - 1 or not last_stage)


def _run_from(
    handle: ModelHandle,
    site: str,
    layer: int,
    x: Float[Tensor, "row pos *act"],
    inputs: LayerInputs,
    prefix: SharedPrefix,
    v: Float[Tensor, "pos kv_head d_head"] | None = None,
) -> Float[Tensor, "row vocab"]:
    """Last-position logits of runs whose activation ``site`` at ``layer`` is ``x`` (one run per
    row), started there from the corrupted run: nothing below it changes. A head patch starts
    at the layer's ``o_proj`` (the residual stream entering the layer, plus the patched heads'
    output, then the layer's MLP); a residual patch at the layer's input. The layers above run
    as the model runs them (its kwargs, recorded in ``inputs``) on a fresh copy of the prefix's
    key/value cache. ``v``: the corrupted run's values at ``layer``, for a uniform-attention
    edit there."""
    L = handle.spec.n_layers
    if site == "head":
        v = None if v is None else v.expand(len(x), *v.shape)
        resid = attn_half(handle, layer, inputs.resid[layer], x, v)
        hidden, first = mlp_half(handle, layer, resid, inputs.resid[layer]), layer + 1
    else:
        hidden, first = x, layer
    hidden = run_layers(handle, hidden, range(first, L), inputs.kwargs, prefix.fresh_cache(len(x)))
    return handle.cap_logits(handle.unembed()(handle.final_norm()(hidden[:, -1])))


def patch_table(
    patches: Sequence[Patch],
    logit_diff: Float[Tensor, " patch"],
    clean_ld: float,
    corrupted_ld: float,
) -> pd.DataFrame:
    """The tidy result table of ``patches`` given each patched run's logit difference."""
    ld = logit_diff.detach().double().cpu()
    table = pd.DataFrame(
        {
            "site": [p.site for p in patches],
            "layer": [p.layer for p in patches],
            "head": pd.array([p.head for p in patches], dtype="Int64"),
            "position": pd.array([p.position for p in patches], dtype="Int64"),
            "logit_diff": ld.double().cpu().numpy(),
            "value": ((ld - corrupted_ld) / (clean_ld - corrupted_ld)).double().cpu().numpy(),
        },
        columns=COLUMNS,
    )
    table.attrs.update(clean_logit_diff=clean_ld, corrupted_logit_diff=corrupted_ld)
    return table


def _check_patch(handle: ModelHandle, pair: PatchingPair, p: Patch) -> None:
    """Layer, head and position inside this model and pair."""
    L, H, T = handle.spec.n_layers, handle.spec.n_heads, pair.clean_ids.shape[0]
    top = L if p.site == "resid" else L - 1
    if not 0 <= p.layer <= top:
        raise ValueError(f"{p}: layer must be in 0..{top} for site {p.site!r}")
    if p.head is not None and not 0 <= p.head < H:
        raise ValueError(f"{p}: head must be in 0..{H - 1}")
    if p.position is not None and not 0 <= p.position < T:
        raise ValueError(f"{p}: position must be in 0..{T - 1} or None (every position)")


def _mask(
    handle: ModelHandle, chunk: Sequence[Patch], n_positions: int, start: int
) -> Bool[Tensor, "row pos *head"]:
    """Which (row, position[, head]) entries, of the ``n_positions`` positions from ``start``
    on, take the clean value; every patch of ``chunk`` has the same site and layer."""
    head_site = chunk[0].site == "head"
    shape = (len(chunk), n_positions, handle.spec.n_heads)
    mask = torch.zeros(shape if head_site else shape[:2], dtype=torch.bool)
    for row, p in enumerate(chunk):
        pos = slice(None) if p.position is None else p.position - start
        if head_site:
            mask[row, pos, p.head] = True
        else:
            mask[row, pos] = True
    return mask.to(handle.device)


# -- named wrappers --------------------------------------------------------------------------
def head_patches(
    handle: ModelHandle,
    n_positions: int,
    *,
    by_position: bool = False,
    positions: Sequence[int] | None = None,
) -> list[Patch]:
    """Every head, whole (layer-major) or at each of ``positions`` (layer, position, head order)."""
    L, H = handle.spec.n_layers, handle.spec.n_heads
    if not by_position:
        return [Patch(site="head", layer=layer, head=h) for layer in range(L) for h in range(H)]
    pos = range(n_positions) if positions is None else positions
    return [
        Patch(site="head", layer=layer, head=h, position=t)
        for layer in range(L)
        for t in pos
        for h in range(H)
    ]


def patch_heads(
    handle: ModelHandle,
    pair: PatchingPair,
    *,
    by_position: bool = False,
    positions: Sequence[int] | None = None,
    batch_size: int = 16,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """Patch every head's output, at every position at once or (``by_position``) one at a time.

    ``positions`` restricts ``by_position`` to some positions (default: all).
    """
    patches = head_patches(
        handle, pair.clean_ids.shape[0], by_position=by_position, positions=positions
    )
    return patch(
        handle, pair, patches, batch_size=batch_size, progress=progress, intervention=intervention
    )


def patch_residual(
    handle: ModelHandle,
    pair: PatchingPair,
    *,
    positions: Sequence[int] | None = None,
    batch_size: int = 16,
    progress: bool = True,
    intervention: HeadEdit | None = None,
) -> pd.DataFrame:
    """Patch the residual stream at every layer ``0..n_layers`` x position (default: all)."""
    pos = range(pair.clean_ids.shape[0]) if positions is None else positions
    patches = [
        Patch(site="resid", layer=layer, position=t)
        for layer in range(handle.spec.n_layers + 1)
        for t in pos
    ]
    return patch(
        handle, pair, patches, batch_size=batch_size, progress=progress, intervention=intervention
    )
