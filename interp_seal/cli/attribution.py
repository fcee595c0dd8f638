"""``interp-seal attribution``: direct logit attribution and activation patching on line retrieval.

    interp-seal attribution dla --model organism --num-lines 20 --seed 0 --out runs/dla
    interp-seal attribution patch --model organism --num-lines 20 --corrupt key --atp --out runs/patch

Both build one LongEval record (``--num-lines``, ``--seed``, ``--sample``) whose prompt ends
right before the number.

``dla`` attributes the logits of the correct first answer token and of the model's strongest
other token, and their difference (SEAL Fig. 4: the correct vs the wrong digit), to every head,
MLP and the embedding at the last position; it writes ``OUT/dla.csv`` and ``OUT/dla.html``.

``patch`` makes a clean/corrupted pair (``--corrupt key``: ask for another line; ``value``:
change the queried number), patches every head (all positions, then by position) and the
residual stream (layer x position), and writes ``OUT/patching.csv`` and ``OUT/patching.html``.
By-position patching covers the positions where the prompts differ and the last ``--last``
positions (``--last 0``: every position). ``--atp`` adds attribution patching next to exact
head patching and head ablation (``OUT/atp.csv``, ``OUT/atp.html``) with Spearman correlations.

Every CSV ends with the columns ``model``, ``seed``, ``n`` (1: one record) and ``sample``
(``interp_seal.provenance``); the HTML pages load ``plotly.min.js``, written once into ``OUT``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp_seal.cli.common import (
    index_style_argument,
    line_count,
    model_options,
    nonnegative_int,
    positive_int,
)
from interp_seal.defaults import CORRUPTIONS, DLA_VARIANTS
from interp_seal.outputs import write_html, write_table


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "attribution", help="direct logit attribution and activation / attribution patching"
    )
    sub = parser.add_subparsers(dest="attribution_command", required=True)

    dla = sub.add_parser("dla", help="direct logit attribution of heads, MLPs and embedding")
    _common(dla)
    dla.add_argument(
        "--variant",
        choices=DLA_VARIANTS,
        default="frozen_norm",
        help="frozen_norm: the final norm's 1/rms frozen from the run (components sum to the "
        "logit); seal: without 1/rms (SEAL Eq. 1)",
    )
    dla.set_defaults(func=run_dla)

    patch = sub.add_parser("patch", help="activation patching (and --atp attribution patching)")
    _common(patch)
    patch.add_argument(
        "--corrupt",
        choices=CORRUPTIONS,
        default="key",
        help="corrupted prompt: another line asked for (key) or another number stored (value)",
    )
    patch.add_argument(
        "--last",
        type=nonnegative_int,
        default=8,
        help="by-position patching: last N positions (0: all)",
    )
    patch.add_argument("--batch-size", type=positive_int, default=16, help="patches per forward")
    patch.add_argument("--atp", action="store_true", help="also run attribution patching")
    patch.set_defaults(func=run_patch)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="organism", help="'organism', a checkpoint dir or hub name"
    )
    parser.add_argument("--num-lines", type=line_count, default=20, help="lines in the record")
    index_style_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated record")
    parser.add_argument(
        "--sample", type=nonnegative_int, default=0, help="which record of the seed"
    )
    parser.add_argument(
        "--threads", type=positive_int, help="torch threads (default: torch's choice)"
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")


def _setup(args: argparse.Namespace):
    """The model handle and the chosen line-retrieval sample."""
    import torch

    from interp_seal.models import load_model
    from interp_seal.tasks.line_retrieval import LineRetrievalConfig, generate

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cfg = LineRetrievalConfig(num_lines=args.num_lines, index_style=args.index_style)
    sample = generate(cfg, args.sample + 1, seed=args.seed)[args.sample]
    return load_model(args.model, **model_options(args)), sample


def _provenance(table, args: argparse.Namespace):
    """``table`` with ``model``, ``seed``, ``n`` (1: one record) and ``sample`` (which record
    of the seed) appended (``interp_seal.provenance``)."""
    from interp_seal.provenance import with_provenance

    return with_provenance(table, model=args.model, seed=args.seed, n=1).assign(sample=args.sample)


def run_dla(args: argparse.Namespace) -> int:
    import pandas as pd

    from interp_seal.analysis.logit_attribution import (
        logit_attribution,
        logit_diff_attribution,
        strongest_wrong_token,
    )
    from interp_seal.viz.attribution import dla_figure

    handle, sample = _setup(args)
    encoded = sample.encode(handle.tokenizer)
    ids, correct = encoded.prompt_ids, int(encoded.answer_ids[0])
    _, wrong = strongest_wrong_token(handle, ids, correct)
    single = logit_attribution(handle, ids, [correct, wrong], variant=args.variant)
    diff = logit_diff_attribution(handle, ids, correct, wrong, variant=args.variant)
    table = pd.concat([single.table, diff.table], ignore_index=True)
    write_table(_provenance(table, args), args.out / "dla.csv")
    figures = [dla_figure(diff)] + [dla_figure(single, t) for t in single.logits]
    write_html(figures, args.out / "dla.html")
    print(f"{handle.name_or_path}: line retrieval, {args.num_lines} lines, seed {args.seed}")
    for result in (single, diff):
        for name, logit in result.logits.items():
            top = result.table[result.table.target == name].nlargest(3, "value")
            best = ", ".join(
                f"{c}{'' if pd.isna(lay) else f' L{lay}'}{'' if pd.isna(h) else f'H{h}'}={v:.3f}"
                for c, lay, h, v in zip(
                    top.component, top.layer, top["head"], top.value, strict=True
                )
            )
            print(
                f"  {name!r}: model {logit:.4f}, sum of effects {result.totals()[name]:.4f}; top: {best}"
            )
    print(f"wrote {args.out / 'dla.csv'} and {args.out / 'dla.html'}")
    return 0


def run_patch(args: argparse.Namespace) -> int:
    import pandas as pd

    from interp_seal.analysis.attribution_patching import compare_with_exact
    from interp_seal.analysis.patching import line_retrieval_pair, patch_heads, patch_residual
    from interp_seal.viz.attribution import attribution_scatter, patching_figure
    from interp_seal.viz.tokens import pair_labels

    handle, sample = _setup(args)
    pair = line_retrieval_pair(sample, handle.tokenizer, corrupt=args.corrupt, seed=args.seed)
    T = pair.clean_ids.shape[0]
    differ = (pair.clean_ids != pair.corrupted_ids).nonzero().flatten().tolist()
    positions = None if args.last == 0 else sorted({*differ, *range(max(T - args.last, 0), T)})
    batch = {"batch_size": args.batch_size}
    whole = patch_heads(handle, pair, **batch)
    table = pd.concat(
        [
            whole,
            patch_heads(handle, pair, by_position=True, positions=positions, **batch),
            patch_residual(handle, pair, positions=positions, **batch),
        ],
        ignore_index=True,
    )
    write_table(_provenance(table, args), args.out / "patching.csv")
    clean_ld, corrupted_ld = whole.attrs["clean_logit_diff"], whole.attrs["corrupted_logit_diff"]
    title = (
        f"Activation patching ({args.corrupt} corruption): clean LD {clean_ld:.3f}, "
        f"corrupted LD {corrupted_ld:.3f}"
    )
    tokens = pair_labels(handle.tokenizer, pair.clean_ids.tolist(), pair.corrupted_ids.tolist())
    figure = patching_figure(table, title=title, tokens=tokens)
    write_html(figure, args.out / "patching.html")
    print(f"{handle.name_or_path}: {T} tokens, prompts differ at positions {differ}")
    print(f"  logit difference clean {clean_ld:.4f}, corrupted {corrupted_ld:.4f}")
    best = table[table.site == "head"].nlargest(5, "value")
    print(best.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {args.out / 'patching.csv'} and {args.out / 'patching.html'}")
    if args.atp:
        comparison = compare_with_exact(handle, pair, batch_size=args.batch_size)
        write_table(_provenance(comparison.table, args), args.out / "atp.csv")
        write_html(
            attribution_scatter(comparison.table, comparison.spearman), args.out / "atp.html"
        )
        rho = ", ".join(f"{m} {r:.3f}" for m, r in comparison.spearman.items())
        print(f"  attribution patching vs exact, Spearman: {rho}")
        print(f"wrote {args.out / 'atp.csv'} and {args.out / 'atp.html'}")
    return 0
