"""Snapshots of the main screens at 80x24 and 160x48 over a stored session (no model, no clock on
screen, no notifications), so they are stable. Update with `pytest --snapshot-update` after a
deliberate change of the look, and review the SVGs in tests/__snapshots__/."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from tui_fixtures import (
    analyses_session,
    dashboard_session,
    deep_session,
    demo_session,
    older_analyses_session,
    parts_session,
)

from sessions.store import SessionStore
from tui.app import AnatomyApp

SIZES = [(80, 24), (160, 48)]
SMALL_AND_DASHBOARD = [(80, 24), (200, 50)]  # the tabs at their smallest, and the dashboard


@pytest.fixture
def demo(isolated_home) -> None:
    demo_session(SessionStore())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("tab", ["f2", "f3", "f4", "f5"], ids=["layers", "recovery", "growth", "prompt"])
def test_console_tabs(snap_compare, demo, tab: str, size: tuple[int, int]) -> None:
    assert snap_compare(AnatomyApp(session="demo", load_model=False), press=[tab, "_"], terminal_size=size)


def test_help_screen(snap_compare, demo) -> None:
    app = AnatomyApp(session="demo", load_model=False)
    assert snap_compare(app, press=["f1", "_"], terminal_size=(80, 24))


def test_session_picker(snap_compare, demo, monkeypatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()

    async def settle(pilot) -> None:
        pilot.app.screen.query_one("#picker-home").update("in HOME")  # the temporary folder differs per run
        await pilot.pause()

    assert snap_compare(AnatomyApp(load_model=False), run_before=settle, terminal_size=(80, 24))


def _ready(app) -> bool:
    """The console built and its startup handled (its first poll drawn, its growth preview asked for
    and planned when it wants one); an atlas's session, its Compare view shown instead."""
    from tui.screens.compare import CompareScreen

    if app.lab.atlas:
        return isinstance(app.screen, CompareScreen)
    screen = app._console()
    return screen is not None and (not app.lab.growth_preview_wanted() or app.state.growth_preview is not None)


async def _settled(pilot) -> None:
    """Waits for the console's startup and its workers (the growth preview) so the picture does not race them."""
    from test_tui import until  # here: the snapshots' collection (see the last test) imports no torch

    app = pilot.app
    await until(pilot, lambda: _ready(app), 60, "the console ready, its growth preview planned")
    await app.workers.wait_for_complete()
    await pilot.pause()


def pressed(keys: list[str]):
    """Once settled, the keys pressed and what they changed drawn: their workers done, and what the
    next poll would draw (the selected layer's detail) drawn now."""

    async def run(pilot) -> None:
        await _settled(pilot)
        await pilot.press(*keys)
        await pilot.app.workers.wait_for_complete()
        pilot.app.poll()
        await pilot.pause()

    return run


@pytest.mark.parametrize("stage", ["empty", "map", "recovery", "growth"])
def test_dashboard(snap_compare, isolated_home, stage: str) -> None:
    dashboard_session(SessionStore(), stage)
    settle = pressed(["down"]) if stage == "recovery" else _settled  # the selection is drawn by the poll
    app = AnatomyApp(session=stage, load_model=False)
    assert snap_compare(app, press=["_"], run_before=settle, terminal_size=(200, 50))


@pytest.mark.parametrize(
    "keys", [["f6"], *(["f6", *["pagedown"] * n] for n in (1, 2, 3)), ["f6", "end"]],
    ids=["top", "page2", "page3", "page4", "bottom"],
)
def test_analyses_views(snap_compare, isolated_home, keys: list[str]) -> None:
    analyses_session(SessionStore())
    app = AnatomyApp(session="map", load_model=False)
    assert snap_compare(app, press=[*keys, "_"], run_before=_settled, terminal_size=(200, 50))


def test_analyses_views_of_older_results(snap_compare, isolated_home) -> None:
    """Results without the data a plot needs, and analyses not run: each view says which command fills it."""
    older_analyses_session(SessionStore())
    app = AnatomyApp(session="map", load_model=False)
    assert snap_compare(app, press=["f6", "pagedown", "_"], run_before=_settled, terminal_size=(200, 50))


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_layer_map_with_parts(snap_compare, isolated_home, size: tuple[int, int]) -> None:
    """A map with parts (`run ablation --part both`): each layer's attention and MLP D% beside the
    whole layer's, each in its own class's colour (a layer-only map keeps its columns)."""
    parts_session(SessionStore())
    app = AnatomyApp(session="parts", load_model=False)
    assert snap_compare(app, press=["_"], run_before=_settled, terminal_size=size)


def pressed_quietly(keys: list[str]):
    """The keys pressed, then the notifications they raised cleared (they would cover the panel) and
    the form fields' cursors held still (a blinking one is drawn or not by the clock)."""
    from textual.widgets import Input

    async def run(pilot) -> None:
        await pressed(keys)(pilot)
        pilot.app.clear_notifications()
        for field in pilot.app.screen.query(Input):
            field.cursor_blink = False
        await pilot.pause()

    return run


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_layer_map_marks(snap_compare, isolated_home, size: tuple[int, int]) -> None:
    """A map with parts, layer 1 marked whole (x), layer 2's MLP (m) and layer 4's attention (t):
    the whole layer's mark beside its number, a block's in its own column beside its D%."""
    parts_session(SessionStore())
    app = AnatomyApp(session="parts", load_model=False)
    press = ["down", "x", "down", "m", "down", "down", "t"]
    assert snap_compare(app, run_before=pressed_quietly(press), terminal_size=size)


def test_every_snapshot_belongs_to_a_test() -> None:
    """syrupy fails a run that leaves a snapshot unused, but not under pytest-xdist (./test runs
    there): a snapshot whose test was renamed or dropped is found here instead."""
    here = Path(__file__)
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
               "--noconftest", str(here)]  # the test ids only: no fixtures, no torch  # fmt: skip
    # from the project's root, so the modules the file imports are this checkout's (from tests/, `tui`
    # would be whichever copy is installed)
    listed = subprocess.run(command, capture_output=True, text=True, cwd=here.parent.parent)
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    tests = {line.partition("::")[2] for line in listed.stdout.splitlines() if "::" in line}
    snapshots = {path.stem for path in (here.parent / "__snapshots__" / here.stem).glob("*.svg")}
    assert snapshots and snapshots <= tests, f"snapshots of no test: {sorted(snapshots - tests)}"


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("keys", [["k"], ["k", "n"]], ids=["compare-d", "compare-bi"])
def test_compare_view(snap_compare, isolated_home, keys: list[str], size: tuple[int, int]) -> None:
    """The Compare view (k) of an atlas session: one criterion's curves on relative depth per model
    (D % on a log axis, then Block Influence), the class bands and the agreement under them."""
    from tui_fixtures import atlas_session

    atlas_session(SessionStore())
    app = AnatomyApp(session="atlas", load_model=False)
    assert snap_compare(app, press=[*keys, "_"], run_before=_settled, terminal_size=size)


@pytest.mark.parametrize("size", SMALL_AND_DASHBOARD, ids=lambda s: f"{s[0]}x{s[1]}")
def test_growth_finished(snap_compare, isolated_home, size: tuple[int, int]) -> None:
    """A finished growth run: its final comparison above the timeline (in view in the dashboard
    too), no sd for a single seed (n=1 said in its title), every curve in the loss plot's legend."""
    dashboard_session(SessionStore(), "grown")
    app = AnatomyApp(session="grown", load_model=False)
    assert snap_compare(app, press=["_"], run_before=pressed(["f4"]), terminal_size=size)


@pytest.mark.parametrize("size", SMALL_AND_DASHBOARD, ids=lambda s: f"{s[0]}x{s[1]}")
def test_running_job_and_footer(snap_compare, isolated_home, size: tuple[int, int]) -> None:
    """A growth job running: the status line names it before the model (a narrow terminal cuts the
    model's description, never the job), and every footer key fits 80 columns."""
    dashboard_session(SessionStore(), "growth")
    app = AnatomyApp(session="growth", load_model=False)
    assert snap_compare(app, press=["f4", "_"], run_before=_settled, terminal_size=size)


@pytest.mark.parametrize("size", SMALL_AND_DASHBOARD, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(
    "keys", [["f5"], ["f2", "down", "x", "f5"], ["f2", "down", "x", "down", "m", "down", "t", "f5"]],
    ids=["none-marked", "layer-1-marked", "layer-and-blocks-marked"],
)
def test_prompt_marks(snap_compare, demo, keys: list[str], size: tuple[int, int]) -> None:
    """The modified column says which layers and blocks it changes, and that nothing is marked (it
    answers as the original, and which keys mark) until x, t or m marks something."""
    app = AnatomyApp(session="demo", load_model=False)
    assert snap_compare(app, run_before=pressed_quietly(keys), terminal_size=size)


@pytest.mark.parametrize("size", SMALL_AND_DASHBOARD, ids=lambda s: f"{s[0]}x{s[1]}")
def test_deep_map_scrolls(snap_compare, isolated_home, size: tuple[int, int]) -> None:
    """A 30-layer map taller than the terminal: its scrollbar's thumb fills whole cells (no ▆
    glyph beside the rows)."""
    deep_session(SessionStore())
    app = AnatomyApp(session="deep", load_model=False)
    assert snap_compare(app, press=["f2", "_"], run_before=_settled, terminal_size=size)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("finished", [False, True], ids=["running", "finished"])
def test_compare_view_of_an_atlas_under_way(snap_compare, isolated_home, finished: bool,
                                            size: tuple[int, int]) -> None:
    """The console opened on an atlas's session: its Compare view at once, the measures in each state
    (done, reused, running with its progress, placed after a retry, queued, waiting), and the line
    saying the table comes when the atlas ends; once it is saved, the curves under the measures."""
    from tui_fixtures import atlas_under_way

    atlas_under_way(SessionStore(), finished=finished)
    app = AnatomyApp(session="live", load_model=False)
    assert snap_compare(app, press=["_"], run_before=_settled, terminal_size=size)
