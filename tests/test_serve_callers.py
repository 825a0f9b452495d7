"""The served console answers only its own page on localhost (issue 27): a real `anatomy-tui --serve`
process on 127.0.0.1, asked with forged headers. A page on another site can make a browser send
requests to localhost (with its own name as Host through DNS rebinding) and open websockets there
(with its own Origin); both are refused with 403 and no upgrade, with and without --serve-token."""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser  # textual-serve: CI fails a skip (tests/required_skips.py)
pytest.importorskip("textual_serve", reason="textual-serve is not installed (pip install 'anatomy-tui[serve]')")

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def status(port: int, path: str, headers: dict[str, str]) -> int:
    """The status code 127.0.0.1:`port` answers a GET of `path` with exactly these headers."""
    lines = [f"GET {path} HTTP/1.1", *(f"{name}: {value}" for name, value in headers.items()),
             "Connection: close", "", ""]  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall("\r\n".join(lines).encode())
        head = b""
        while b"\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
    return int(head.split(b" ", 2)[1])


def websocket(host: str, origin: str | None = None) -> dict[str, str]:
    """The headers of a browser's websocket handshake (Host, Origin as given)."""
    headers = {"Host": host, "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()}
    if origin is not None:
        headers["Origin"] = origin
    return headers


class Served:
    def __init__(self, home: Path, token: bool) -> None:
        self.port = free_port()
        self.log = home.parent / f"serve-{self.port}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "ANATOMY_TUI_HOME": str(home)}
        with self.log.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "--serve", "--port", str(self.port),
                 *(["--serve-token"] if token else [])],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )  # fmt: skip
        self.token = ""
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, self.log.read_text()
            found = re.search(r"\?token=([\w-]+)", self.log.read_text())
            if found:
                self.token = found.group(1)
            try:
                status(self.port, "/", {"Host": f"localhost:{self.port}"})
                if self.token or not token:
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.3)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=30)


@pytest.fixture
def served(isolated_home, request):
    server = Served(isolated_home, request.param)
    yield server
    server.stop()


@pytest.mark.parametrize("served", [False], indirect=True)
def test_without_a_token_only_the_page_on_localhost_gets_the_console(served):
    port = served.port
    page = f"http://localhost:{port}"
    assert status(port, "/", {"Host": "attacker.example"}) == 403
    assert status(port, "/", {"Host": f"attacker.example:{port}"}) == 403  # DNS rebinding
    assert status(port, "/static/", {"Host": "attacker.example"}) == 403
    assert status(port, "/", {}) == 400  # no Host at all: aiohttp refuses an HTTP/1.1 request without it
    assert status(port, "/ws", websocket(f"localhost:{port}", "http://attacker.example")) == 403
    assert status(port, "/ws", websocket(f"attacker.example:{port}", f"http://attacker.example:{port}")) == 403
    assert status(port, "/ws", websocket(f"localhost:{port}", f"http://localhost:{port + 1}")) == 403
    assert status(port, "/ws", websocket(f"localhost:{port}", "null")) == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"127.0.0.2:{port}", f"[::1]:{port}", "localhost"):
        assert status(port, "/", {"Host": host}) == 200, host
    assert status(port, "/", {"Host": f"localhost:{port}", "Origin": page}) == 200
    assert status(port, "/ws", websocket(f"localhost:{port}", page)) == 101


@pytest.mark.parametrize("served", [True], indirect=True)
def test_with_a_token_the_same_checks_and_the_token(served):
    port, token = served.port, served.token
    page = f"http://localhost:{port}"
    assert status(port, f"/?token={token}", {"Host": "attacker.example"}) == 403
    assert status(port, f"/ws?token={token}", websocket(f"localhost:{port}", "http://attacker.example")) == 403
    assert status(port, "/", {"Host": f"localhost:{port}"}) == 403  # no token
    assert status(port, "/ws", websocket(f"localhost:{port}", page)) == 403
    assert status(port, f"/?token={token}", {"Host": f"localhost:{port}"}) == 200
    cookie = {"Cookie": f"anatomy_tui_token_{port}={token}"}
    assert status(port, "/", {"Host": f"attacker.example:{port}", **cookie}) == 403
    assert status(port, "/ws", {**websocket(f"localhost:{port}", "http://attacker.example"), **cookie}) == 403
    assert status(port, "/ws", {**websocket(f"localhost:{port}", page), **cookie}) == 101


@pytest.mark.parametrize(("host", "origin", "allowed"), [
    ("localhost:8000", None, True),
    ("LOCALHOST:8000", "http://localhost:8000", True),
    ("127.0.0.1:8000", "http://localhost:8000", True),  # the page's own URLs say localhost
    ("[::1]:8000", "http://[::1]:8000", True),
    ("localhost", "http://localhost", True),
    ("localhost:80", "http://localhost", True),
    ("localhost:8000", "https://localhost:8000", True),
    ("localhost:8000", "http://localhost:8001", False),
    ("localhost:8000", "http://localhost", False),
    ("localhost:8000", "http://127.0.0.1.attacker.example:8000", False),
    ("localhost:8000", "http://localhost.attacker.example:8000", False),
    ("localhost:8000", "file://", False),
    ("localhost:8000", "", False),
    ("localhost.attacker.example:8000", None, False),
    ("127.0.0.1.nip.io:8000", None, False),
    ("10.0.0.1:8000", None, False),
    ("0.0.0.0:8000", None, False),
    ("localhost:notaport", None, False),
    ("user@localhost:8000", None, False),
    ("", None, False),
    (None, None, False),
])  # fmt: skip
def test_who_may_ask(host, origin, allowed):
    from tui.serve import caller_allowed

    assert caller_allowed(host, origin) is allowed
