"""ipywidgets + plotly ``FigureWidget`` compositions of ``interp_seal.viz``: the head-pruning
dashboard, the head quadrant explorer and the passage attention explorer.

A widget holds state and wires events; the numbers come from ``interp_seal.analysis`` and the
figures from ``interp_seal.viz``. ``interp-seal dashboard`` serves the dashboard as a web page
(Voila, locked down in ``app.py``); the same widgets display inline in JupyterLab.
"""

from interp_seal.widgets.dashboard import Dashboard
from interp_seal.widgets.passages import PassageExplorer
from interp_seal.widgets.quadrants import QuadrantExplorer
from interp_seal.widgets.state import DashboardState

__all__ = ["Dashboard", "DashboardState", "PassageExplorer", "QuadrantExplorer"]
