"""Where a result row came from: the columns every results table a command writes ends with.

A CSV outlives the terminal it was printed in. Opened weeks later, by someone else, or beside
another run's table, it has to say by itself what was measured and how precisely.
``with_provenance`` appends to a table, after its own columns (whose names and order stay as
they were, so code that reads them by name keeps working):

- ``model``: the model as the command was given it (``--model``: ``organism``, ``smollm2``,
  a hub name, a checkpoint directory), which runs the same model when given again;
- ``seed``: the seed the records were generated from (commands that read their records from a
  file have no seed, and no such column);
- ``n``: how many records each row's value is a mean over (a table that already counts them,
  like the accuracy table, keeps its own ``n``);
- ``<column>_ci_low`` and ``<column>_ci_high`` for each column holding a proportion (exact
  match: the fraction of ``n`` records answered right): its 95 % Wilson score interval
  (``analysis.statistics.wilson``, with ``k = round(p * n)`` successes), empty on rows whose
  value is not a proportion (the log-probability rows of a sweep's long table).

An exact match of 0.45 on 40 records reads ``exact_match 0.45, exact_match_ci_low 0.307,
exact_match_ci_high 0.602``: with 40 records, anything from about 0.3 to 0.6 fits the data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from interp_seal.analysis.statistics import wilson


def with_provenance(
    table: pd.DataFrame,
    *,
    model: str,
    seed: int | None = None,
    n: int | Sequence[int] | pd.Series | None = None,
    proportions: Sequence[str] = (),
    where: Sequence[bool] | pd.Series | None = None,
) -> pd.DataFrame:
    """``table`` with ``model``, ``seed``, ``n`` and Wilson intervals appended (a new frame).

    Args:
        model: the model's name or path, as the user gave it.
        seed: the seed of the generated records; None when they were read from a file.
        n: records per row, one number for every row or one per row; None when ``table``
            has an ``n`` column of its own.
        proportions: the columns holding a proportion of the ``n`` records; each gets
            ``<column>_ci_low`` and ``<column>_ci_high``.
        where: the rows on which ``proportions`` are proportions (a boolean mask; default
            every row): a sweep's ``value`` is one only on its ``exact_match`` rows.

    Raises ValueError if a column it would add is already there: provenance never overwrites.
    """
    added = ["model", *(["seed"] if seed is not None else []), *(["n"] if n is not None else [])]
    added += [f"{c}_ci_{side}" for c in proportions for side in ("low", "high")]
    clash = sorted(set(added) & set(table.columns))
    if clash:
        raise ValueError(f"the table already has the columns {clash}; provenance adds them")
    if n is None and "n" not in table:
        raise ValueError("give n (records per row): the table has no n column")
    out = table.assign(model=model)
    if seed is not None:
        out["seed"] = seed
    if n is not None:
        out["n"] = np.asarray(n) if not np.isscalar(n) else n
    counts = out["n"].to_numpy(dtype=float)
    rows = np.ones(len(out), dtype=bool) if where is None else np.asarray(where, dtype=bool)
    for column in proportions:
        bounds = np.full((len(out), 2), np.nan)
        for i in np.flatnonzero(rows & out[column].notna().to_numpy()):
            p, records = float(out[column].iloc[i]), counts[i]
            bounds[i] = wilson(round(p * records), records)
        out[f"{column}_ci_low"], out[f"{column}_ci_high"] = bounds[:, 0], bounds[:, 1]
    return out
