"""``interp-seal retrieval``: per-head retrieval scores and the head-masking experiment.

    interp-seal retrieval passage-scores --model organism --samples mdqa.jsonl --out runs/mudaf
    interp-seal retrieval passage-scores --samples hotpotqa.jsonl --golden golden.json --eps 0.3 \\
        --out runs/mudaf_hotpot
    interp-seal retrieval needle-scores --samples niah.jsonl --out runs/niah_heads
    interp-seal retrieval masking --samples mdqa.jsonl --scores runs/mudaf/head_scores.csv \\
        --niah-scores runs/niah_heads/head_scores.csv --ks 8 16 --seeds 0 1 2 --out runs/masking
    interp-seal retrieval qr-scores --samples mdqa_train.jsonl --rank-samples mdqa_test.jsonl \\
        --top-heads 16 --ks 1 2 5 --out runs/qrhead
    interp-seal retrieval duo-gates --samples lines_train.jsonl --window 64 --out runs/duo
    interp-seal retrieval compare --rankings passage=runs/mudaf/head_scores.csv \\
        qr=runs/qrhead/head_scores.csv copy_paste=runs/niah_heads/head_scores.csv \\
        --sweep causal=runs/sweep/results.csv --samples mdqa_fresh.jsonl --out runs/compare
    interp-seal retrieval compress --rankings qr=runs/qrhead/head_scores.csv \\
        --full-counts 1 2 4 --window 64 --lengths 40 120 200 --out runs/compress

Sample files are task JSONL files (``interp-seal tasks generate``; LongBench files with
``--golden``). ``passage-scores`` (MuDAF) and ``needle-scores`` (Retrieval Head copy-paste)
append each sample's result to ``OUT/per_sample.jsonl`` as it is computed and skip finished
samples when re-run with ``--resume`` on the same ``--out``; they write ``OUT/head_scores.csv`` (ranked heads),
``OUT/per_sample_scores.csv`` and ``OUT/head_scores.html``; ``passage-scores`` also writes
``OUT/passage_attention.html`` (MuDAF Fig. 10 for the first sample). ``masking`` (MuDAF Fig. 4)
appends each finished condition to ``OUT/conditions.jsonl`` and writes ``OUT/masking.csv`` and
``OUT/masking.html``. ``qr-scores`` (QRHead, ``interp_seal.analysis.qrhead``) writes the
same three head files as ``passage-scores``; with ``--rank-samples`` it ranks those samples'
passages by the top ``--top-heads`` heads' summed scores (QRRetriever) into ``OUT/ranking.csv``
and ``OUT/recall.csv`` (recall@k per ``--ks``). ``duo-gates`` (DuoAttention,
``interp_seal.tuning.duo_gates``) trains one gate per KV head on the samples' answers, resumable
from ``OUT/training``, and writes ``OUT/gates.csv`` (one row per KV head), ``OUT/head_scores.csv``
(each query head ranked by its KV head's gate) and ``OUT/head_scores.html``. ``compare`` (``analysis.head_definitions``) reads the
ranked tables of any of these commands and of ``analysis head-sweep`` and writes
``OUT/pairs.csv`` (Spearman's rho, top-5 % overlap and its p for every two), ``OUT/sets.csv`` and
``OUT/compare.html``; with ``--samples`` also ``OUT/masking.csv`` (each top set zeroed against
random sets). ``compress`` (``analysis.kv_compression``) keeps each ranking's top KV heads full
and streams the rest on line records, writing ``OUT/compression.csv`` (exact match and the KV
bytes kept, per definition, full KV heads and length) and ``OUT/compression.html``. The HTML pages load ``OUT/plotly.min.js``,
written once.
``head_scores.csv`` and ``masking.csv`` end with their provenance (``interp_seal.provenance``):
``model``, ``n`` (samples scored) and the 95 % Wilson interval of each proportion (``em``;
``exact_match``, ``first_token``). The samples come from a file, so there is no ``seed``
column (masking's own ``seed`` is the seed of its random head draws).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp_seal.cli.common import (
    add_resume_argument,
    chat_template_argument,
    finite_float,
    fraction,
    index_style_argument,
    line_records,
    model_options,
    positive_int,
    read_table,
)
from interp_seal.outputs import write_html, write_table
from interp_seal.shards import Shard


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="organism", help="'organism', a checkpoint dir or hub name"
    )
    parser.add_argument("--samples", type=Path, required=True, help="task JSONL file")
    parser.add_argument("--limit", type=positive_int, help="use only the first N samples")
    parser.add_argument(
        "--threads", type=positive_int, help="torch threads (default: torch's choice)"
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    add_resume_argument(parser)


def register(subparsers) -> None:
    parser = subparsers.add_parser("retrieval", help="retrieval scores of heads, head masking")
    sub = parser.add_subparsers(dest="retrieval_command", required=True)

    passages = sub.add_parser("passage-scores", help="MuDAF passage-level retrieval scores")
    _common(passages)
    passages.add_argument("--golden", type=Path, help="golden passage ids of a LongBench file")
    passages.add_argument("--eps", type=fraction, default=0.3, help="attended-passage threshold")
    passages.add_argument(
        "--em-attended-only",
        action="store_true",
        help="EM ranks only passages above eps (the official MuDAF code)",
    )
    passages.add_argument(
        "--backend",
        choices=("hf", "nnsight"),
        default="hf",
        help="how attention rows are captured (identical numbers)",
    )
    passages.set_defaults(func=run_passage_scores, torchrun="shards")

    needle = sub.add_parser("needle-scores", help="Retrieval Head copy-paste scores (NIAH)")
    _common(needle)
    needle.add_argument(
        "--threshold", type=finite_float, default=0.1, help="retrieval-head threshold"
    )
    needle.add_argument(
        "--max-new-tokens", type=positive_int, help="greedy steps (default: the answer's length)"
    )
    needle.set_defaults(func=run_needle_scores, torchrun="shards")

    masking = sub.add_parser("masking", help="mask top / random / NIAH heads (MuDAF Fig. 4)")
    _common(masking)
    masking.add_argument("--golden", type=Path, help="golden passage ids of a LongBench file")
    masking.add_argument("--scores", type=Path, required=True, help="ranked head_scores.csv")
    masking.add_argument("--niah-scores", type=Path, help="copy-paste head_scores.csv")
    masking.add_argument("--ks", type=positive_int, nargs="+", default=[16], help="heads to mask")
    masking.add_argument(
        "--modes",
        nargs="+",
        choices=("zero", "uniform"),
        default=["zero", "uniform"],
        help="how a masked head is ablated: output x 0, or uniform attention",
    )
    masking.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the random head draws"
    )
    masking.add_argument(
        "--pool",
        type=positive_int,
        help="draw the k masked heads from the top POOL (MuDAF Fig. 4: 50)",
    )
    masking.add_argument("--qa-f1", action="store_true", help="also greedy-decode and score QA F1")
    masking.add_argument(
        "--max-new-tokens", type=positive_int, default=32, help="greedy steps per answer"
    )
    masking.add_argument(
        "--batch-size", type=positive_int, default=1, help="questions decoded together"
    )
    masking.set_defaults(func=run_masking, torchrun="shards")

    qr = sub.add_parser("qr-scores", help="QRHead query-focused retrieval scores, QRRetriever")
    _common(qr)
    qr.add_argument(
        "--golden", type=Path, help="golden ids of LongBench files (--samples, --rank-samples)"
    )
    qr.add_argument("--null-query", default="N/A", help="the calibration query (QRHead: N/A)")
    qr.add_argument(
        "--no-calibrate", action="store_true", help="do not subtract the null query's attention"
    )
    qr.add_argument(
        "--outlier-std",
        type=float,
        help="drop per-token scores below mean - X std of their passage (QRHead's code: 2)",
    )
    qr.add_argument(
        "--rank-samples", type=Path, help="rank these samples' passages with the top heads"
    )
    qr.add_argument("--top-heads", type=positive_int, default=16, help="heads that rank passages")
    qr.add_argument("--ks", type=positive_int, nargs="+", default=[1, 2, 5], help="recall@k")
    qr.set_defaults(func=run_qr_scores, torchrun="shards")

    duo = sub.add_parser(
        "duo-gates",
        help="DuoAttention gates: one learned weight per KV head between full and sink + "
        "window attention",
    )
    _common(duo)
    duo.add_argument("--sink", type=int, default=4, help="attention sinks a streaming head sees")
    duo.add_argument(
        "--window", type=positive_int, default=256, help="recent positions a streaming head sees"
    )
    duo.add_argument(
        "--penalty", type=finite_float, default=0.05, help="weight of the L1 term (paper: 0.05)"
    )
    duo.add_argument(
        "--lr", type=finite_float, default=0.02, help="AdamW rate of the gates (paper: 0.02)"
    )
    duo.add_argument("--epochs", type=positive_int, default=1, help="passes over the samples")
    duo.add_argument("--seed", type=int, default=0, help="seed of the sample order")
    duo.set_defaults(func=run_duo_gates)

    compare = sub.add_parser(
        "compare",
        help="retrieval-head definitions side by side: rank correlations, top-5 %% overlaps, "
        "masking each top set",
    )
    _ranking_arguments(compare)
    compare.add_argument(
        "--share", type=fraction, default=0.05, help="top share of heads compared (papers: 5 %%)"
    )
    compare.add_argument(
        "--samples",
        type=Path,
        help="task JSONL: also mask each definition's top heads on these questions, against "
        "random heads",
    )
    compare.add_argument("--golden", type=Path, help="golden passage ids of a LongBench file")
    compare.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the random head draws"
    )
    compare.add_argument(
        "--model", default="organism", help="'organism', a checkpoint dir or hub name"
    )
    compare.add_argument("--limit", type=positive_int, help="use only the first N samples")
    compare.add_argument(
        "--threads", type=positive_int, help="torch threads (default: torch's choice)"
    )
    compare.add_argument("--out", type=Path, required=True, help="output directory")
    add_resume_argument(compare)
    compare.set_defaults(func=run_compare, torchrun="shards")

    compress = sub.add_parser(
        "compress",
        help="KV compression chosen by each ranking: top KV heads full, the rest on sink + "
        "window; exact match against the KV cache kept",
    )
    _ranking_arguments(compress)
    compress.add_argument(
        "--lengths", type=positive_int, nargs="+", default=[40, 120, 200], help="lines per record"
    )
    compress.add_argument("--n", type=positive_int, default=50, help="records per length")
    compress.add_argument("--seed", type=int, default=0, help="seed of the generated records")
    index_style_argument(compress)
    chat_template_argument(compress)
    compress.add_argument(
        "--full-counts",
        type=positive_int,
        nargs="+",
        required=True,
        help="numbers of KV heads kept full (0 and all are always added)",
    )
    compress.add_argument(
        "--sink", type=int, default=4, help="attention sinks a streaming head keeps"
    )
    compress.add_argument(
        "--window", type=positive_int, default=256, help="recent positions a streaming head keeps"
    )
    compress.add_argument(
        "--random-seeds", type=int, nargs="+", default=[0, 1, 2], help="random KV-head orders"
    )
    compress.add_argument(
        "--model", default="organism", help="'organism', a checkpoint dir or hub name"
    )
    compress.add_argument(
        "--threads", type=positive_int, help="torch threads (default: torch's choice)"
    )
    compress.add_argument("--out", type=Path, required=True, help="output directory")
    add_resume_argument(compress)
    compress.set_defaults(func=run_compress)


SCORED = {  # task -> (what its scores need in a sample, whether a sample has it)
    "passages": ("passages with golden ids", lambda s: bool(s.passages and s.golden)),
    "needle": ("a needle span", lambda s: s.needle is not None),
}


def _check_samples(args: argparse.Namespace, samples, needs: str) -> None:
    """Refuse, before the model loads, samples that lack what the command scores: passage spans
    and golden ids (``needs="passages"``) or a needle span (``needs="needle"``)."""
    what, has = SCORED[needs]
    for i, sample in enumerate(samples):
        if not has(sample):
            raise ValueError(
                f"--samples {args.samples}: sample {i} is a {sample.task} sample without {what}, "
                f"which this command scores; write one with `interp-seal tasks generate --task "
                f"{needs}`"
            )


def _setup(args: argparse.Namespace, needs: str | None = None):
    """The model and samples named by ``args`` (the samples checked to have what the command
    ``needs`` before the model loads); the output directory created."""
    import torch

    from interp_seal.inputs import check_input_file
    from interp_seal.models import load_model
    from interp_seal.tasks.jsonl import read_golden, read_samples

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    check_input_file(args.samples, "sample file")
    golden = read_golden(args.golden) if getattr(args, "golden", None) else None
    samples = read_samples(args.samples, golden=golden)[: args.limit]
    if not samples:
        raise ValueError(
            f"--samples {args.samples} holds no samples (it is empty); write one with "
            "`interp-seal tasks generate`"
        )
    if needs is not None:
        _check_samples(args, samples, needs)
    handle = load_model(args.model, **model_options(args))
    args.out.mkdir(parents=True, exist_ok=True)  # the per-sample record file is appended to
    return handle, samples


def _write_heads(args, heads, per_sample, value: str, title: str) -> None:
    from interp_seal.provenance import with_provenance
    from interp_seal.viz.passages import head_score_heatmap

    out, n = args.out, per_sample["sample"].nunique()  # samples scored
    proportions = ["em"] if "em" in heads else []  # passage scores' EM; copy-paste has none
    provenance = with_provenance(heads, model=args.model, n=n, proportions=proportions)
    write_table(provenance, out / "head_scores.csv")
    write_table(per_sample, out / "per_sample_scores.csv")
    write_html(head_score_heatmap(heads, value=value, title=title), out / "head_scores.html")
    print(heads.head(16).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {out / 'head_scores.csv'}, per_sample_scores.csv and head_scores.html")


def run_passage_scores(args: argparse.Namespace) -> int:
    from interp_seal.analysis.retrieval_scores import PassageScoreConfig, passage_retrieval_scores
    from interp_seal.viz.passages import passage_heatmap

    config = PassageScoreConfig(
        eps=args.eps, em_attended_only=args.em_attended_only, backend=args.backend
    )
    handle, samples = _setup(args, needs="passages")
    scores = passage_retrieval_scores(
        handle, samples, config, results=args.out / "per_sample.jsonl"
    )
    if not Shard.current().main:
        return 0  # rank 0 writes the outputs
    title = f"MuDAF retrieval score (F1, eps={args.eps}): {Path(handle.name_or_path).name}"
    _write_heads(args, scores.heads, scores.per_sample, "f1", title)
    write_html(passage_heatmap(scores.attention[0]), args.out / "passage_attention.html")
    return 0


def run_needle_scores(args: argparse.Namespace) -> int:
    from interp_seal.analysis.retrieval_scores import CopyPasteConfig, needle_retrieval_scores

    config = CopyPasteConfig(threshold=args.threshold, max_new_tokens=args.max_new_tokens)
    handle, samples = _setup(args, needs="needle")
    scores = needle_retrieval_scores(handle, samples, config, results=args.out / "per_sample.jsonl")
    if not Shard.current().main:
        return 0  # rank 0 writes the outputs
    title = f"Retrieval Head copy-paste score: {Path(handle.name_or_path).name}"
    _write_heads(args, scores.heads, scores.per_sample, "score", title)
    print(f"{int(scores.heads['retrieval_head'].sum())} heads score above {args.threshold}")
    return 0


def run_masking(args: argparse.Namespace) -> int:
    from interp_seal.analysis.masking import MaskingConfig, masking_experiment
    from interp_seal.provenance import with_provenance
    from interp_seal.viz.passages import masking_bars

    config = MaskingConfig(
        ks=tuple(args.ks),
        modes=tuple(args.modes),
        seeds=tuple(args.seeds),
        pool=args.pool,
        qa_f1=args.qa_f1,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
    )
    ranked = ("layer", "head", "rank")
    retrieval = read_table(args.scores, "--scores", ranked)
    others = {}
    if args.niah_scores:
        others["niah"] = read_table(args.niah_scores, "--niah-scores", ranked)
    handle, samples = _setup(args)
    frame = masking_experiment(
        handle,
        samples,
        retrieval,
        others=others,
        config=config,
        results=args.out / "conditions.jsonl",
    )
    if not Shard.current().main:
        return 0  # rank 0 writes the outputs
    table = frame.drop(columns="correct")
    proportions = ("exact_match", "first_token")
    table = with_provenance(table, model=args.model, n=table["n_samples"], proportions=proportions)
    write_table(table, args.out / "masking.csv")
    metric = "qa_f1" if args.qa_f1 else "exact_match"
    write_html(masking_bars(frame, metric=metric), args.out / "masking.html")
    print(frame.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {args.out / 'masking.csv'} and {args.out / 'masking.html'}")
    return 0


def run_qr_scores(args: argparse.Namespace) -> int:
    import pandas as pd

    from interp_seal.analysis.qrhead import (
        QRConfig,
        qr_scores,
        rank_passages,
        recall_at_k,
        top_heads,
    )
    from interp_seal.provenance import with_provenance
    from interp_seal.tasks.jsonl import read_golden, read_samples

    config = QRConfig(
        null_query=args.null_query,
        calibrate=not args.no_calibrate,
        outlier_std=args.outlier_std,
    )
    handle, samples = _setup(args, needs="passages")
    scores = qr_scores(handle, samples, config, results=args.out / "per_sample.jsonl")
    if Shard.current().main:
        title = f"QRHead score: {Path(handle.name_or_path).name}"
        _write_heads(args, scores.heads, scores.per_sample, "qr_score", title)
    if args.rank_samples is None:
        return 0
    golden = read_golden(args.golden) if args.golden else None  # ids of both files' records
    held_out = read_samples(args.rank_samples, golden=golden)
    _check_samples(argparse.Namespace(samples=args.rank_samples), held_out, "passages")
    heads = top_heads(scores.heads, args.top_heads)
    ranking = rank_passages(
        handle, held_out, heads, config, results=args.out / "ranking_per_sample.jsonl"
    )
    if not Shard.current().main:
        return 0  # rank 0 writes the outputs
    n = ranking["sample"].nunique()
    recall = pd.DataFrame(
        {"k": args.ks, "recall": [recall_at_k(ranking, k) for k in args.ks]}
    ).assign(heads=len(heads))
    write_table(ranking, args.out / "ranking.csv")
    write_table(with_provenance(recall, model=args.model, n=n), args.out / "recall.csv")
    print(recall.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {args.out / 'ranking.csv'} and recall.csv")
    return 0


def run_duo_gates(args: argparse.Namespace) -> int:
    from interp_seal.provenance import with_provenance
    from interp_seal.tuning import TrainConfig
    from interp_seal.tuning.duo_gates import DuoConfig, gate_ranking, gate_table, train_gates
    from interp_seal.viz.passages import head_score_heatmap

    config = DuoConfig(sink=args.sink, window=args.window, penalty=args.penalty)
    handle, samples = _setup(args)
    run = TrainConfig(lr=args.lr, epochs=args.epochs, seed=args.seed, checkpoint_every=10)
    gates, record = train_gates(handle, samples, config, run, out=args.out / "training")
    heads = gate_ranking(gates, handle.spec.n_heads)
    n = len(samples)
    write_table(with_provenance(heads, model=args.model, n=n), args.out / "head_scores.csv")
    write_table(gate_table(gates), args.out / "gates.csv")
    title = f"DuoAttention gate (sink {args.sink}, window {args.window}): {Path(handle.name_or_path).name}"
    write_html(head_score_heatmap(heads, value="gate", title=title), args.out / "head_scores.html")
    final = record.parts[-1] if record.parts else {}
    print(gate_table(gates).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(
        f"{record.steps} steps; last loss {record.losses[-1]:.4g} (distill "
        f"{final.get('distill', float('nan')):.4g}, mean gate {final.get('reg', float('nan')):.3f})"
    )
    print(f"wrote {args.out / 'head_scores.csv'}, gates.csv and head_scores.html")
    return 0


def _ranking_arguments(parser: argparse.ArgumentParser) -> None:
    """``--rankings`` / ``--sweep`` / ``--metric``: the named head rankings a command reads."""
    parser.add_argument(
        "--rankings",
        nargs="+",
        default=[],
        metavar="NAME=FILE",
        help="a named ranked head_scores.csv per definition (passage-scores, needle-scores, "
        "qr-scores, duo-gates)",
    )
    parser.add_argument(
        "--sweep",
        nargs="+",
        default=[],
        metavar="NAME=FILE",
        help="a named `analysis head-sweep` results.csv, ranked by what zeroing each head costs",
    )
    parser.add_argument(
        "--metric",
        choices=("answer_logprob", "exact_match", "first_token"),
        default="answer_logprob",
        help="the sweep's metric that ranks heads",
    )


def _read_rankings(args: argparse.Namespace, least: int) -> dict:
    """The rankings ``--rankings`` and ``--sweep`` name, read and checked before any work."""
    from interp_seal.analysis.head_definitions import sweep_ranking

    tables = _named_files(args.rankings, "--rankings")
    sweeps = _named_files(args.sweep, "--sweep")
    both = sorted(set(tables) & set(sweeps))
    if both:
        raise ValueError(f"--rankings and --sweep both name {both}: give each ranking its own name")
    rankings = {
        n: read_table(p, "--rankings", ("layer", "head", "rank")) for n, p in tables.items()
    }
    for name, path in sweeps.items():
        sweep = read_table(path, "--sweep", ("layer", "head", "channel", "metric", "delta"))
        rankings[name] = sweep_ranking(sweep, args.metric)
    if len(rankings) < least:
        raise ValueError(
            f"give at least {least} ranking{'s' if least > 1 else ''}: --rankings and / or --sweep"
        )
    return rankings


def _named_files(pairs: list[str], flag: str) -> dict[str, Path]:
    """``NAME=FILE`` arguments as a dict, checked before any work."""
    from interp_seal.analysis.masking import RESERVED

    named: dict[str, Path] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ValueError(
                f"{flag} {pair!r}: give NAME=FILE, e.g. {flag} qr=runs/qr/head_scores.csv"
            )
        if name in named or name in RESERVED:
            why = "is given twice" if name in named else "names a masking condition"
            raise ValueError(f"{flag}: the name {name!r} {why}; give each ranking its own name")
        named[name] = Path(path)
    return named


def run_compare(args: argparse.Namespace) -> int:
    import pandas as pd

    from interp_seal.analysis.head_definitions import (
        compare_rankings,
        mask_rankings,
        masking_effects,
    )
    from interp_seal.provenance import with_provenance
    from interp_seal.viz.passages import definition_comparison

    rankings = _read_rankings(args, least=2)
    comparison = compare_rankings(rankings, share=args.share)
    effects = None
    if args.samples is not None:
        handle, samples = _setup(args)
        frame = mask_rankings(
            handle,
            samples,
            rankings,
            k=comparison.k,
            seeds=args.seeds,
            results=args.out / "conditions.jsonl",
        )
        if not Shard.current().main:
            return 0  # rank 0 writes the outputs
        effects = masking_effects(frame)
        table = with_provenance(effects.drop(columns="n"), model=args.model, n=effects["n"])
        write_table(table, args.out / "masking.csv")
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = comparison.pairs()
    write_table(pairs, args.out / "pairs.csv")
    sets = [
        {"definition": name, "rank": i + 1, "layer": layer, "head": head}
        for name, heads in comparison.sets.items()
        for i, (layer, head) in enumerate(heads)
    ]
    write_table(pd.DataFrame(sets), args.out / "sets.csv")
    write_html(definition_comparison(comparison, effects), args.out / "compare.html")
    print(pairs.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if effects is not None:
        print(effects.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print(
        f"wrote pairs.csv, sets.csv{', masking.csv' if effects is not None else ''} and compare.html in {args.out}"
    )
    return 0


def run_compress(args: argparse.Namespace) -> int:
    import torch

    from interp_seal.analysis.kv_compression import compression_curve
    from interp_seal.models import load_model
    from interp_seal.provenance import with_provenance
    from interp_seal.viz.passages import compression_curves

    if args.sink < 0:
        raise ValueError(f"--sink must be >= 0, got {args.sink}")
    rankings = _read_rankings(args, least=1)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    handle = load_model(args.model, **model_options(args))
    samples = line_records(args, handle.tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    curve = compression_curve(
        handle,
        samples,
        rankings,
        full_counts=args.full_counts,
        sink=args.sink,
        window=args.window,
        random_seeds=args.random_seeds,
        results=args.out / "conditions.jsonl",
    )
    table = curve.drop(columns="correct").rename(columns={"n": "records"})
    written = with_provenance(
        table, model=args.model, seed=args.seed, n=table["records"], proportions=("exact_match",)
    )
    write_table(written.drop(columns="records"), args.out / "compression.csv")
    write_html(compression_curves(curve), args.out / "compression.html")
    summary = table.groupby(["definition", "full_kv_heads", "length"]).exact_match.mean()
    print(summary.unstack().to_string(float_format=lambda x: f"{x:.3f}"))
    print(f"wrote {args.out / 'compression.csv'} and compression.html")
    return 0
