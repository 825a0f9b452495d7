"""The console in a real browser: `anatomy-tui --serve` on localhost, Debian's Chromium driven by
Playwright (no browser is downloaded). xterm.js draws on a canvas, so the page's DOM holds no text:
what the console did is read from the session's app.log, and screenshots before and after a key
must differ."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tui_fixtures import demo_session

from sessions.store import SessionStore

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytest.importorskip("textual_serve", reason="textual-serve is not installed (pip install 'anatomy-tui[serve]')")
if not CHROMIUM.exists() and shutil.which("chromium") is None:
    pytest.skip("chromium is not installed (.ci/run installs Debian's)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_log(path: Path, needle: str, limit: float = 90.0) -> str:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if needle in text:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} never reached {path}:\n{path.read_text() if path.exists() else '(none)'}")


@pytest.mark.slow
def test_console_in_chromium(isolated_home, tmp_path) -> None:
    session = demo_session(SessionStore())
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ANATOMY_TUI_HOME": str(isolated_home)}
    server = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "--serve", "--port", str(port), "--session", "demo"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    app_log = session.path / "app.log"
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            deadline = time.monotonic() + 30
            while True:
                try:
                    page.goto(f"http://localhost:{port}/")
                    break
                except sync_api.Error:
                    assert time.monotonic() < deadline, "the server never answered"
                    time.sleep(0.3)
            wait_for_log(app_log, "layer map: 6 rows")
            wait_for_log(app_log, "loading tiny failed:")  # the demo's model is no model: the console asks for
            page.wait_for_timeout(1000)                      # another (tui/screens/model_choice.py)
            page.mouse.click(800, 450)
            page.keyboard.press("Escape")  # on without a model
            page.wait_for_timeout(500)
            before = page.screenshot(path=str(tmp_path / "layers.png"))
            page.keyboard.press("F3")
            wait_for_log(app_log, "panel: recovery")
            page.wait_for_timeout(1000)
            after = page.screenshot(path=str(tmp_path / "recovery.png"))
            browser.close()
        assert before != after
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
