"""ipywidgets + plotly ``FigureWidget`` compositions of ``interp_seal.viz``: the head-pruning
dashboard, the head quadrant explorer, the passage attention explorer and the attention-over-tokens
explorer (``tokens.py``: hover a token to see one head's attention row, click to lock).

A widget holds state and wires events; the numbers come from ``interp_seal.analysis`` and the
figures from ``interp_seal.viz``. ``interp-seal dashboard`` serves the dashboard as a web page
(Voila, locked down in ``app.py``); the same widgets display inline in JupyterLab.
"""

from interp_seal.widgets.dashboard import Dashboard
from interp_seal.widgets.passages import PassageExplorer
from interp_seal.widgets.quadrants import QuadrantExplorer
from interp_seal.widgets.state import DashboardState
from interp_seal.widgets.tokens import AttentionExplorer, TokenAttention

__all__ = [
    "AttentionExplorer",
    "Dashboard",
    "DashboardState",
    "PassageExplorer",
    "QuadrantExplorer",
    "TokenAttention",
]
