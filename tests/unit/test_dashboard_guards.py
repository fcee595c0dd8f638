"""The served page's guards that need no server: the token redacted from log text and log
records, and which request headers mark a request made by another page.

The served page itself (these guards installed, real requests, a real browser) is
``tests/acceptance/test_dashboard_server.py``'s and ``test_dashboard_browser.py``'s.
"""

from __future__ import annotations

import logging
import sys
import uuid
from urllib.parse import quote

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from interp_seal.widgets.app import cross_site
from interp_seal.widgets.redact import HideToken, hide_token, redact

TOKEN = "a-token-0123456789abcdef/+="  # quoted in URLs as a-token-0123456789abcdef%2F%2B%3D


def test_redact_hides_the_token_as_written_or_quoted_and_every_token_value():
    text = (
        f"GET /?token={TOKEN} Authorization: token {TOKEN} "
        f"/login?next=%2F%3Ftoken%3Dwr0ng&x=1 {quote(TOKEN, safe='')}"
    )
    assert redact(text, TOKEN) == (
        "GET /?token=[redacted] Authorization: token [redacted] "
        "/login?next=%2F%3Ftoken%3D[redacted]&x=1 [redacted]"
    )


def test_hide_token_redacts_a_records_message_arguments_and_traceback():
    record = logging.LogRecord(
        "tornado.access",
        logging.WARNING,
        __file__,
        1,
        "404 GET %s (%s)",
        (f"/?token={TOKEN}", "127.0.0.1"),
        None,
    )
    try:
        raise ValueError(f"bad {TOKEN}")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert HideToken(TOKEN).filter(record)
    text = logging.Formatter().format(record)
    assert TOKEN not in text
    assert text.startswith("404 GET /?token=[redacted] (127.0.0.1)\n")
    assert text.endswith("ValueError: bad [redacted]")


def test_a_logger_without_handlers_gets_a_redacting_stderr_one(capsys):
    logger = logging.getLogger(f"test-hide-token-{uuid.uuid4()}")
    logger.propagate = False
    hide_token(TOKEN, logger)
    try:
        logger.warning("403 GET /?token=%s", TOKEN)
        logger.info("not shown: warnings and worse, as logging.lastResort")
    finally:
        logger.handlers.clear()
    assert capsys.readouterr().err == "403 GET /?token=[redacted]\n"


def request(headers: dict) -> HTTPServerRequest:
    headers = HTTPHeaders({"Host": "127.0.0.1:8888", **headers})
    return HTTPServerRequest(start_line=RequestStartLine("GET", "/", "HTTP/1.1"), headers=headers)


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a script: curl, the tests' own client
        {"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:8888"},  # the page itself
        {"Sec-Fetch-Site": "none"},  # a typed URL, a bookmark
        {"Referer": "http://127.0.0.1:8888/?token=x"},
    ],
)
def test_requests_from_the_page_itself_or_no_page_are_not_cross_site(headers):
    assert cross_site(request(headers)) is None


@pytest.mark.parametrize(
    "headers, reason",
    [
        ({"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site: cross-site"),
        ({"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site: same-site"),  # another port
        ({"Origin": "http://127.0.0.1:9999"}, "Origin: http://127.0.0.1:9999"),
        ({"Origin": "null"}, "Origin: null"),  # a sandboxed frame
        ({"Referer": "http://evil.example.com/a?token=secret"}, "Referer: http://evil.example.com"),
    ],
)
def test_requests_from_another_page_are_cross_site(headers, reason):
    assert cross_site(request(headers)) == reason
