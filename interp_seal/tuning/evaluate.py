"""Before/after evaluation of tuned models, reusing ``interp_seal.evaluation`` and retrieval scores.

- ``accuracy_by_method``: SEAL Table 1 / Fig. 1 data. Line-retrieval exact match (teacher
  forcing) per number of lines for the base model and each tuned variant, on the same records.
  A variant is either a ``HeadIntervention`` on the base model (unmerged SEAL scales) or another
  ``ModelHandle`` (a merged SEAL checkpoint, LoRA/DoRA, MuDAF, SFT).
- ``retrieval_by_method``: MuDAF Fig. 5 data. Each head's passage retrieval score ``R_h`` (and
  rank among all heads) for the base model and each tuned model, with MuDAF's target heads
  marked, so the gain of the targets under MuDAF can be compared with Vanilla SFT's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from interp_seal.analysis.retrieval_scores import PassageScoreConfig, passage_retrieval_scores
from interp_seal.defaults import RECORDS_PER_LENGTH
from interp_seal.evaluation.lengths import evaluate_line_retrieval
from interp_seal.interventions.head_edit import HeadIntervention
from interp_seal.models.handle import ModelHandle
from interp_seal.tasks.sample import Sample

Variant = ModelHandle | HeadIntervention


def accuracy_by_method(
    base: ModelHandle,
    variants: Mapping[str, Variant],
    lengths: Sequence[int],
    *,
    n: int = RECORDS_PER_LENGTH,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = True,
    chat_template: str = "none",
    index_style: str = "adjective-noun",
) -> pd.DataFrame:
    """``evaluate_line_retrieval``'s table for ``"base"`` and each variant, with a ``method`` column.

    ``chat_template`` (``interp_seal.tasks.chat``) wraps the records and ``index_style`` sets
    their line indices, as in tuning.
    """
    tables = []
    for method, variant in {"base": None, **variants}.items():
        handle = variant if isinstance(variant, ModelHandle) else base
        intervention = variant if isinstance(variant, HeadIntervention) else None
        table = evaluate_line_retrieval(
            handle,
            lengths,
            n=n,
            seed=seed,
            intervention=intervention,
            batch_size=batch_size,
            progress=progress,
            chat_template=chat_template,
            index_style=index_style,
        )
        tables.append(table.assign(method=method))
    frame = pd.concat(tables, ignore_index=True)
    return frame[["method", *[c for c in frame.columns if c != "method"]]]


def retrieval_by_method(
    handles: Mapping[str, ModelHandle],
    samples: Sequence[Sample],
    *,
    targets: Sequence[tuple[int, int]] = (),
    config: PassageScoreConfig | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Per-head retrieval scores for each model: ``method, layer, head, f1, em, rank, target``.

    ``config`` sets the attention threshold (default ``PassageScoreConfig()``: eps 0.3).
    """
    config = config or PassageScoreConfig()
    targets = {tuple(t) for t in targets}
    tables = []
    for method, handle in handles.items():
        heads = passage_retrieval_scores(handle, samples, config, progress=progress).heads
        is_target = [
            (int(layer), int(head)) in targets
            for layer, head in zip(heads["layer"], heads["head"], strict=True)
        ]
        tables.append(heads.assign(method=method, target=is_target))
    frame = pd.concat(tables, ignore_index=True)
    return frame[["method", "layer", "head", "f1", "em", "rank", "target"]]
