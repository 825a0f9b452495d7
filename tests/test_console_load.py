"""The console while its model loads and when it cannot (issue 43): the status line shows the
load's percentage live, and a session whose model cannot load says why in one line and offers a
field for another model, which the session then keeps."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from textual.widgets import Input, Static
from tui_fixtures import demo_session

from sessions.store import SessionStore
from tui.app import AnatomyApp, ModelOptions
from tui.screens.model_choice import ModelChoice
from tui.widgets.status_line import StatusLine

pytestmark = pytest.mark.anyio
SIZE = (120, 36)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def until(pilot, predicate, limit: float = 60.0, what: str = "") -> None:
    import time

    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {limit:g} s: {what or 'condition'}")
        await pilot.pause(0.05)


def status(app: AnatomyApp) -> str:
    console = app._console()
    assert console is not None
    return str(console.query_one(StatusLine).render())


async def test_the_status_line_shows_the_loads_percentage_while_it_runs(monkeypatch) -> None:
    """A slowed load (each tensor waits for the test) through the real progress: the status line
    shows 25%, then 50%, while the load is still running."""
    from engine.models import load_progress
    from engine.models.load_progress import LoadProgress

    monkeypatch.setattr(load_progress, "REPORT_EVERY_S", 0.0)
    go = [threading.Event() for _ in range(4)]

    def slowed_load(name, report, **kwargs):
        progress = LoadProgress(report)
        with progress.running():
            progress.step("dequantizing slow.gguf")
            for tensor in progress.counted(range(4)):
                go[tensor].wait(30)
        raise OSError("the test's load ends here")

    monkeypatch.setattr("engine.models.loading.load_model", slowed_load)
    demo_session(SessionStore())
    app = AnatomyApp(session="demo", options=ModelOptions("slow.gguf", "cpu", "float32"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app._console() is not None and "dequantizing slow.gguf…" in status(app),
                    what="the step shown")
        go[0].set()
        await until(pilot, lambda: "dequantizing slow.gguf: 25% (1/4 tensors)" in status(app), what="25%")
        assert "left" in status(app)  # an estimate, from the first tensor's rate
        go[1].set()
        await until(pilot, lambda: "dequantizing slow.gguf: 50% (2/4 tensors)" in status(app), what="50%")
        assert app.loaded is None  # still loading
        for event in go:
            event.set()
        await until(pilot, lambda: isinstance(app.screen, ModelChoice), what="the failure handled")


async def test_a_session_whose_model_cannot_load_says_why_and_takes_another(tiny_folder: Path) -> None:
    """The session's own model is a folder that is gone: the status line says so in one line, the
    model field opens; a path that is not there is refused in the field at once; the tiny model's
    folder loads and the session keeps it."""
    store = SessionStore()
    demo_session(store, model="/nowhere/gone-model")
    app = AnatomyApp(session="demo", options=ModelOptions(device="cpu", dtype="float32"), model_explicit=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ModelChoice), what="the model field offered")
        line = status(app)
        assert "model: /nowhere/gone-model could not load: no model at /nowhere/gone-model" in line
        assert "Traceback" not in line and "Error:" not in line
        reason = str(app.screen.query_one("#model-choice-reason", Static).render())
        assert reason.startswith("/nowhere/gone-model could not load: no model at /nowhere/gone-model")
        field = app.screen.query_one("#model-choice-input", Input)
        field.value = "./does-not-exist"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ModelChoice)  # refused where it was typed
        assert "no model at ./does-not-exist" in str(app.screen.query_one("#model-choice-problem", Static).render())
        assert store.open("demo").manifest["model"] == "/nowhere/gone-model"  # nothing changed
        field.value = str(tiny_folder)
        await pilot.press("enter")
        await until(pilot, lambda: app.loaded is not None, what="the tiny model loaded")
        await pilot.pause()
        assert not isinstance(app.screen, ModelChoice)
        assert "tiny · cpu · float32 · 4 layers" in status(app)
    assert store.open("demo").manifest["model"] == str(tiny_folder)  # the session reopens with it
