"""Static PNG export through kaleido 1.x, with one browser kept alive for the whole gallery.

kaleido 1.x renders plotly figures in a headless Chromium that it finds by itself (Debian's
``chromium`` package works). Starting the browser costs ~3 s; ``kaleido.start_sync_server()``
keeps one running so each further image costs ~0.2 s. When no browser can be started the
exporter says what to install, once, and the gallery goes on with HTML and data only.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import plotly.graph_objects as go

INSTALL_HINT = (
    "PNG export needs a Chromium-family browser for kaleido 1.x and none could be started. "
    "Install one and rerun the same command (data and HTML are reused, only images are drawn): "
    "on Debian / Ubuntu `sudo apt-get install chromium`, elsewhere Google Chrome, or "
    "`kaleido_get_chrome` (kaleido's own download, needs network). Error: {err}"
)


class PngExporter:
    """``with PngExporter() as png: png.write(fig, path)``; ``png.available`` after a failure is
    False and ``png.problem`` holds the message printed to stderr."""

    def __init__(self, *, enabled: bool = True):
        self.available = enabled
        self.problem: str | None = None if enabled else "PNG export turned off (--no-png)"
        self._server = False

    def __enter__(self) -> PngExporter:
        if self.available:
            try:
                import kaleido

                kaleido.start_sync_server(silence_warnings=True)
                self._server = True
            except Exception as err:  # noqa: BLE001 - any failure means: no images, say why
                self._fail(err)
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            import kaleido

            kaleido.stop_sync_server(silence_warnings=True)
            self._server = False

    def write(self, fig: go.Figure, path: str | Path) -> bool:
        """Write ``fig`` as a PNG at ``path``; False (and nothing written) when export is off."""
        if not self.available:
            return False
        path = Path(path)
        tmp = path.with_suffix(".tmp.png")
        try:
            with warnings.catch_warnings():  # plotly notes that the server ignores kopts
                warnings.simplefilter("ignore", UserWarning)
                fig.write_image(tmp, width=1100, height=fig.layout.height or 520, scale=1)
        except Exception as err:  # noqa: BLE001 - browser missing or crashed
            tmp.unlink(missing_ok=True)
            self._fail(err)
            return False
        tmp.replace(path)
        return True

    def _fail(self, err: Exception) -> None:
        self.available = False
        self.problem = INSTALL_HINT.format(err=f"{type(err).__name__}: {err}".strip()[:300])
        print(self.problem, file=sys.stderr)
