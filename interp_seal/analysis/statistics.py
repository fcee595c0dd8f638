"""Statistics for accuracy comparisons: intervals for error bars, paired tests for claims.

Every accuracy in this project is a mean of 0/1 exact-match outcomes over a fixed set of
records, so its uncertainty is binomial. ``wilson`` gives the Wilson score interval (Wilson
1927), which stays inside [0, 1] and keeps its coverage near 0 and 1, where the normal
approximation ``p +- z sqrt(p (1 - p) / n)`` collapses to a point.
"""

from __future__ import annotations

import math


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``k / n`` (95 % by default).

    ``n <= 0`` (no records) gives the uninformative ``(0, 1)``."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))
