"""Keeping the served page's token out of its logs.

The token is the page's only credential: whoever reads it can run code in the dashboard's
kernels. Tornado logs each refused or failed request with its URL (``404 GET
/api/kernels/...?token=...``), and logs end up in terminals, CI output and bug reports.
``hide_token`` filters every record the server process prints: the token, as written or
URL-quoted, and the value of any ``token=`` (also ``token%3D`` inside an encoded ``next=``
URL; a wrong token may be a typo of the right one) become ``[redacted]``.

The one line that does show the token is the URL ``app.serve`` prints at start, as ``jupyter
lab`` does: the user needs it to open the page.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import quote

REDACTED = "[redacted]"
TOKEN_VALUE = re.compile(r"(token(?:=|%3D))[^&\s'\"]+", re.IGNORECASE)


def redact(text: str, token: str) -> str:
    """``text`` with ``token`` and every ``token=`` value replaced by ``[redacted]``."""
    for form in (token, quote(token, safe="")):
        if form:
            text = text.replace(form, REDACTED)
    return TOKEN_VALUE.sub(lambda match: match.group(1) + REDACTED, text)


class HideToken(logging.Filter):
    """A handler filter that redacts a record's message and traceback in place (so every
    handler the record reaches afterwards prints the redacted text)."""

    def __init__(self, token: str):
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage(), self.token), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.token)
        return True


def hide_token(token: str, *loggers: logging.Logger) -> None:
    """Redact ``token`` in everything ``loggers``' handlers print.

    A logger without handlers gets a stderr one printing warnings and worse, as
    ``logging.lastResort`` would have (tornado's records reach the root logger with no handler
    on the way, and no filter reaches ``lastResort``)."""
    hide = HideToken(token)
    for logger in loggers:
        if not logger.handlers:
            stderr = logging.StreamHandler()
            stderr.setLevel(logging.WARNING)
            logger.addHandler(stderr)
        for handler in logger.handlers:
            handler.addFilter(hide)
