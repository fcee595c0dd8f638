"""One colour meaning per concept, shared by every figure and widget.

- ``SIGNED``: signed effects (pruning deltas, direct logit attribution, patching effects):
  plotly's ``RdBu``, blue = positive (helps the answer), red = negative (hurts it), white = 0.
  Always centred on 0 with a symmetric range (``symmetric_range``), so that equal colours mean
  equal magnitudes within a figure and a figure does not change scale between views.
- ``EDITS``: head edit factors (the dashboard's grid): dark grey = pruned (factor 0), white =
  untouched (1), orange = amplified (2). Not red / blue, so that an edit is never read as an
  effect.
"""

from __future__ import annotations

import numpy as np

SIGNED = "RdBu"
EDITS = [[0.0, "#343a40"], [0.5, "#ffffff"], [1.0, "#e8590c"]]  # factor 0 .. 1 .. 2


def symmetric_range(*values, floor: float = 1e-9) -> float:
    """The largest absolute finite value among ``values`` (arrays or numbers): the half-width
    of a colour range centred on 0 (at least ``floor``, so an all-zero map still draws)."""
    finite = [np.abs(a[np.isfinite(a)]) for a in (np.asarray(v, float).ravel() for v in values)]
    return max([float(a.max()) for a in finite if a.size] + [floor])
