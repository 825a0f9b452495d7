"""The served console keeps its token to the link printed at start (issue 40): a real `anatomy-tui
--serve --serve-token` process on 127.0.0.1, everything it writes (stdout and stderr) captured while
it is asked with the token (a good request, an oversized one, malformed ones), and a half-sent
request, which it must close within a bounded time rather than wait for forever."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_serve_callers import free_port, status

pytestmark = pytest.mark.browser  # textual-serve: CI fails a skip (tests/required_skips.py)
pytest.importorskip("textual_serve", reason="textual-serve is not installed (pip install 'anatomy-tui[serve]')")

ROOT = Path(__file__).resolve().parent.parent


def exchange(port: int, raw: bytes) -> bytes:
    """What 127.0.0.1:`port` answers to `raw` before it closes the connection."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(raw)
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.fixture
def served(isolated_home):
    """(port, token, output file) of a served console with a token; stopped after the test."""
    port = free_port()
    output = isolated_home.parent / "served.out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ANATOMY_TUI_HOME": str(isolated_home), "COLUMNS": "300"}
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "--serve", "--port", str(port), "--serve-token"],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (found := re.search(r"\?token=([\w-]+)", output.read_text())):
        assert process.poll() is None and time.monotonic() < deadline, output.read_text()
        time.sleep(0.3)
    while True:
        try:
            status(port, "/", {"Host": f"localhost:{port}"})
            break
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.3)
    yield port, found.group(1), output
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=30)


def test_the_token_is_written_once_in_the_link_and_never_again(served):
    port, token, output = served
    host = f"localhost:{port}"
    cookie = f"anatomy_tui_token_{port}={token}"
    assert status(port, f"/?token={token}", {"Host": host}) == 200
    assert status(port, "/static/", {"Host": host, "Cookie": cookie, "Referer": f"http://{host}/?token={token}"}) in (
        200, 403, 404)  # fmt: skip
    assert status(port, f"/?token={token}&pad={'x' * 20_000}", {"Host": host}) in (400, 414)  # too long a line
    assert status(port, "/", {"Host": host, "Cookie": cookie, "X-Pad": "y" * 20_000}) in (400, 431)  # too long a field
    malformed = [
        f"GET /?token={token} HTTP/1.1\r\nHost: {host}\r\nContent-Length: nope\r\n\r\n",
        f"GET /?token={token} HTTP/9.9\r\nHost: {host}\r\n\r\n",
        f"G\x00T /?token={token} HTTP/1.1\r\nHost: {host}\r\n\r\n",
        f"GET /?token={token} HTTP/1.1\r\nHost: {host}\r\nBad Header: {token}\r\n\r\n",
    ]
    for raw in malformed:
        answer = exchange(port, raw.encode())
        assert re.match(rb"HTTP/1\.[01] 4\d\d ", answer), (raw, answer[:200])
    time.sleep(1)  # the last records flushed
    written = output.read_text()
    assert written.count(token) == 1, written  # the link printed at start, and nothing else
    assert "Error handling request" in written  # the bad requests were logged, masked


def test_a_half_sent_request_is_closed_within_the_timeout(served):
    port, token, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(f"GET /?token={token} HT".encode())
        start = time.monotonic()
        conn.settimeout(15)
        assert conn.recv(4096) == b""  # closed (a timeout here raises), not waiting for the rest
        assert time.monotonic() - start < 15


def test_a_traceback_through_the_log_has_the_token_masked_and_no_locals():
    """A handler's error (aiohttp logs it with its traceback): the record that reaches the handler
    carries the traceback as text, the token in its message and in the exception's masked."""
    from tui.serve import TokenMask  # here: after the importorskip of textual-serve

    token = "s3cret-TOKEN_value"
    try:
        raise RuntimeError(f"GET /?token={token} failed")
    except RuntimeError:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling %s",
                                   (f"/?token={token}",), sys.exc_info())  # fmt: skip
    assert TokenMask(token).filter(record)
    text = logging.Formatter().format(record)
    assert token not in text and "/?token=***" in text
    assert "Traceback (most recent call last)" in text and "RuntimeError: GET /?token=*** failed" in text
    assert record.exc_info is None  # nothing left for rich to print with its locals
