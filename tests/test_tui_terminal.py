"""The console in real processes: the first screen paints before torch is imported, and the app
runs in a real terminal (tmux: send-keys, capture-pane) and draws the layer map."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_models import save_tiny
from tui_fixtures import demo_session

from sessions.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import sys
from tui.app import AnatomyApp

class Probe(AnatomyApp):
    def after_first_paint(self):
        self.heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
        super().after_first_paint()
        self.exit()

app = Probe(session="demo", load_model=False)
app.run(headless=True, size=(80, 24))
print("heavy at first paint:", app.heavy)
"""


def test_first_paint_comes_before_torch(isolated_home, tmp_path) -> None:
    demo_session(SessionStore())
    probe = tmp_path / "probe.py"  # a file: Textual finds app.tcss through the app class's source
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(probe)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "heavy at first paint: []" in out.stdout


# what the console's first paint does without: the panes out of view come after it (tui/screens/console_panes.py),
# the experiments' vocabularies with their first event or result (engine/registry.py), the model's loader and the
# memory plan with the model, the job launcher with the first job
AFTER_THE_PAINT = ("torch", "transformers", "plotext", "textual_plotext", "rich.pretty", "textual.widgets._rich_log",
                   "tui.screens.console_panes", "tui.screens.compare", "tui.views", "tui.widgets.curve_plot",
                   "tui.widgets.result_view", "engine.models.loading", "engine.models.memory", "engine.data.eval_data",
                   "engine.evaluation.accuracy", "engine.export.folder")
NOT_PAINTED = f"sorted(m for m in sys.modules if m in {AFTER_THE_PAINT!r} or m.endswith('.vocabulary'))"


def test_importing_the_console_leaves_what_the_first_paint_does_not_need() -> None:
    """`import tui.app` (what `anatomy-tui` imports before its first paint) brings in none of the
    modules behind the deferred panes (the plots, every experiment's view, RichLog's pretty-printer),
    the compare screen, no experiment's vocabulary (their hundred and more dataclasses), or torch;
    the console builds those panes after the paint."""
    code = f"import sys, tui.app; print({NOT_PAINTED})"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


PAINT_PROBE = f"""
import sys
from tui.app import AnatomyApp
from tui.screens.console import ConsoleScreen

build = ConsoleScreen.build_panes

async def build_panes(self):  # called just after the first paint, before the deferred panes' modules
    print("at the first paint:", {NOT_PAINTED})
    await build(self)

ConsoleScreen.build_panes = build_panes

class Probe(AnatomyApp):
    def after_first_paint(self):
        super().after_first_paint()
        self.exit()

Probe(session="new", load_model=False).run(headless=True, size=(80, 24))
"""


def test_a_new_session_paints_before_any_vocabulary_is_imported(isolated_home, tmp_path) -> None:
    """Opening a new session (the store made, the state built, the first screen composed and
    painted) imports no experiment's vocabulary and nothing else the paint does not need."""
    probe = tmp_path / "probe.py"  # a file: Textual finds app.tcss through the app class's source
    probe.write_text(PAINT_PROBE)
    out = subprocess.run([sys.executable, str(probe)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "at the first paint: []" in out.stdout


def _pane(name: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout


def _wait_for(name: str, *needles: str, limit: float = 60.0) -> str:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        screen = _pane(name)
        if all(needle in screen for needle in needles):
            return screen
        time.sleep(0.3)
    raise AssertionError(f"{needles} never appeared; the pane shows:\n{_pane(name)}")


@contextlib.contextmanager
def console_in_tmux(home: Path, flags: str, size: tuple[int, int]) -> Iterator[str]:
    """`anatomy-tui FLAGS` in a detached tmux session of this size; yields the session's name."""
    name = f"anatomy-tui-{os.getpid()}-{time.monotonic_ns()}"
    command = f"cd {ROOT} && ANATOMY_TUI_HOME={home} TERM=xterm-256color {sys.executable} -m cli.main {flags}"
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", str(size[0]), "-y", str(size[1]), command],
                   check=True)
    try:
        yield name
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


@pytest.mark.slow
@pytest.mark.terminal
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")
def test_console_in_a_real_terminal(isolated_home, tmp_path) -> None:
    demo_session(SessionStore())
    folder = save_tiny(tmp_path / "tiny")
    flags = f"--session demo --model {folder} --device cpu --dtype float32"
    with console_in_tmux(isolated_home, flags, (100, 30)) as name:
        _wait_for(name, "D% (log)", "critical", "important", "anti")
        screen = _wait_for(name, "tiny · cpu")  # the model loaded behind the console
        assert "Loading" not in screen and "Warning" not in screen  # nothing printed over the UI
        subprocess.run(["tmux", "send-keys", "-t", name, "Down", "Down", "d"], check=True)
        _wait_for(name, "Layer 2", "minor", "Block Influence")  # the detail view of the selected layer
        subprocess.run(["tmux", "send-keys", "-t", name, "Escape"], check=True)
        time.sleep(0.5)
        subprocess.run(["tmux", "send-keys", "-t", name, "q"], check=True)
        deadline = time.monotonic() + 30
        while subprocess.run(["tmux", "has-session", "-t", name], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "the console did not quit on q"
            time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.terminal
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")
def test_first_run_draws_the_map_unasked(isolated_home, tmp_path) -> None:
    """An empty store and no key pressed: the console opens a new session and maps its layers."""
    folder = save_tiny(tmp_path / "tiny")
    with console_in_tmux(isolated_home, f"--model {folder} --device cpu --dtype float32", (80, 24)) as name:
        deadline = time.monotonic() + 120
        while not list(Path(isolated_home).glob("*/results/ablation.json")):
            assert time.monotonic() < deadline, f"no map was computed; the pane shows:\n{_pane(name)}"
            time.sleep(0.3)
        classes = ("critical", "important", "minor", "redundant", "anti")
        deadline = time.monotonic() + 30
        while not any(word in _pane(name) for word in classes):
            assert time.monotonic() < deadline, f"the map was not drawn; the pane shows:\n{_pane(name)}"
            time.sleep(0.3)
        assert "Sessions:" not in _pane(name)  # no picker on a first run
