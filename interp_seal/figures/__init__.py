"""Paper figure regeneration: every SEAL / MuDAF figure and table for one model, and a gallery.

- ``registry.py``: the figures (``FIGURES``), each computed in ``seal.py`` / ``mudaf.py`` /
  ``definitions.py`` (issue 41: retrieval heads by five definitions, accuracy vs KV budget)
  and drawn through ``interp_seal.viz``, with the papers' numbers;
- ``run.py``: the model and the resumable shared steps; ``sizes.py``: default and quick sizes;
- ``driver.py``: ``regenerate`` (data, HTML, PNG per figure); ``export.py``: kaleido PNGs;
- ``plan.py``: the pre-registered plan and its dated amendments (figures and claims added
  later, each written before its data);
- ``claims.py``: the claims table's computed verdicts; ``gallery.py``: the README page.

Command: ``interp-seal figures --model organism --out figures/organism``.
"""

from interp_seal.figures.driver import GalleryResult, regenerate
from interp_seal.figures.registry import FIGURES, FigureSpec
from interp_seal.figures.sizes import DEFAULT, QUICK, FigureSizes
from interp_seal.figures.tables import load_tables

__all__ = [
    "DEFAULT",
    "FIGURES",
    "QUICK",
    "FigureSizes",
    "FigureSpec",
    "GalleryResult",
    "load_tables",
    "regenerate",
]
