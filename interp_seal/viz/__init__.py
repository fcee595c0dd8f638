"""Pure functions from analysis results to plotly figures."""
