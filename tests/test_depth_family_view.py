"""The depth family in the console (tui/views/depth_family.py, fed by tui/state.py through
tui/depth_family_records.py): from a sequence of `depth-family.*` events the Analyses view draws a
line per member (coloured by depth) with its held-out points, a table that fills in as members
finish, the fit when it comes; once the result is there, any member's layer map by a selector; and
`anatomy-tui run depth-family` prints through the view."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table
from textual.app import App, ComposeResult
from textual.widgets import Select, Static

from engine.core.codec import json_safe
from engine.core.events import Finished, Started
from engine.experiments.depth_family.vocabulary import FamilyFit, FamilyPlan, MemberDone, MemberStep, sample
from tui.state import Dirty, SessionState
from tui.views import depth_family
from tui.views.depth_family import FamilyPanel, FamilyPlot

JOB = "depth-family-1"
TOKENS = sample().settings.tokens[0]
SPEC: dict[str, Any] = dict(width=64, tokens=TOKENS, job=JOB)


def name(depth: int, seed: int = 0) -> str:
    """A member's name as the sample's plan has it."""
    return f"l{depth}-w64-t{TOKENS}-s{seed}"


def step(member: str, depth: int, at: int, loss: float, heldout: float | None = None) -> MemberStep:
    return MemberStep(member=member, depth=depth, seed=0, step=at, steps=3, train_loss=loss, heldout_loss=heldout,
                      lr=1e-3, **SPEC)


def done(member: str, depth: int, loss: float, number: int) -> MemberDone:
    return MemberDone(member=member, depth=depth, seed=0, params=49152 * depth, heldout_loss=loss, seconds=1.5,
                      redundant_share=0.0, mean_angle=30.0, neighbour_similarity=None, done=number, total=8, **SPEC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class ViewApp(App[None]):
    def compose(self) -> ComposeResult:
        yield from depth_family.plots()


def started_state() -> SessionState:
    state = SessionState()
    state.apply(Started(experiment="depth-family", spec={}, job=JOB))
    state.apply(FamilyPlan(plan=sample().plan, job=JOB))
    return state


def text_of(table: Any) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(table)
    return console.export_text()


@pytest.mark.anyio
async def test_member_lines_and_the_table_fill_in_from_the_events(anyio_backend) -> None:
    state = started_state()
    for at, loss in ((1, 4.0), (2, 3.5), (3, 3.2)):
        state.apply(step(name(1), 1, at, loss, 3.3 if at == 3 else None))
    state.apply(done(name(1), 1, 3.3, 1))
    state.apply(step(name(2), 2, 1, 3.9))
    state.apply(step(name(2), 2, 2, 3.1, 3.0))
    assert Dirty.RESULTS in state.take_dirty()  # the Analyses pane is redrawn
    app = ViewApp()
    async with app.run_test(size=(120, 80)) as pilot:
        depth_family.show(app.screen, state)
        await pilot.pause()
        plot = app.query_one(FamilyPlot)
        lines = [(c.label, list(c.points), c.colour) for c in plot.curves if not c.scatter]
        assert [(label, points) for label, points, _ in lines] == [
            ("l=1", [(1.0, 4.0), (2.0, 3.5), (3.0, 3.2)]), ("l=2", [(1.0, 3.9), (2.0, 3.1)])]
        assert lines[0][2] != lines[1][2]  # a colour a depth
        assert [(c.label, list(c.points)) for c in plot.curves if c.scatter] == [("l=1", [(3.0, 3.3)]),
                                                                                  ("l=2", [(2.0, 3.0)])]
        table = app.query_one("#family-done", Static).content
        assert isinstance(table, Table) and table.row_count == 1
        assert "members finished: 1 of 8" in text_of(table) and name(1) in text_of(table)
        assert "plan: 8 members" in str(app.query_one("#family-lines", Static).content)

        state.apply(done(name(2), 2, 3.0, 2))
        state.apply(FamilyFit(alpha_l=1.07, ci95=[0.8, 1.4], c_l=1.5, L0=2.0, loo_rmse=0.01, weakly_identified=True,
                              job=JOB))
        depth_family.show(app.screen, state)
        await pilot.pause()
        table = app.query_one("#family-done", Static).content
        assert isinstance(table, Table) and table.row_count == 2
        assert "a_l = 1.07 [0.80, 1.40]" in str(app.query_one("#family-lines", Static).content)


def test_a_resumed_member_continues_its_curve_and_a_new_run_starts_it_again() -> None:
    state = started_state()
    member = name(1)  # one the plan has: its curve kept across the resumed job's plan
    for at in (1, 2, 3):
        state.apply(step(member, 1, at, 5.0 - at))
    state.apply(done(member, 1, 2.0, 1))
    state.apply(Started(experiment="depth-family", spec={}, job="depth-family-2"))
    state.apply(FamilyPlan(plan=sample().plan, job="depth-family-2"))
    assert state.family.done == {}  # the resumed job's table starts again (it says its restored members)
    state.apply(dataclasses.replace(step(member, 1, 3, 1.5), job="depth-family-2"))  # continued from step 2
    assert state.family.curves[member].train == [(1.0, 4.0), (2.0, 3.0), (3.0, 1.5)]
    state.apply(step(member, 1, 1, 9.0))  # a new run of it
    assert state.family.curves[member].train == [(1.0, 9.0)]


@pytest.mark.anyio
async def test_once_finished_the_summary_has_the_members_and_a_selector_shows_any_members_map(anyio_backend):
    state = started_state()
    state.apply(step(name(1), 1, 1, 4.0))
    state.apply(Finished(status="done", job=JOB))
    state.set_result("depth-family", json_safe(sample()))
    app = ViewApp()
    async with app.run_test(size=(120, 80)) as pilot:
        depth_family.show(app.screen, state)
        await pilot.pause()
        assert not app.query_one("#family-done", Static).display  # the summary below has the members now
        select = app.query_one("#family-member", Select)
        member = sample().members[-1]  # depth 8
        select.value = member.name
        await pilot.pause()
        shown = app.query_one("#family-map", Static).content
        assert isinstance(shown, Table) and shown.row_count == member.depth == 8
        assert "redundant" in text_of(shown) and f"{member.name}: layer map" in text_of(shown)


@pytest.mark.anyio
async def test_without_a_run_or_a_result_the_panel_is_hidden(anyio_backend) -> None:
    app = ViewApp()
    async with app.run_test(size=(120, 40)) as pilot:
        depth_family.show(app.screen, SessionState())
        await pilot.pause()
        assert not app.query_one(FamilyPanel).display


def test_the_headless_print_is_the_views(capsys) -> None:
    from cli.printers import print_result

    print_result("depth-family", json_safe(sample()))
    out = capsys.readouterr().out
    assert "a_l = 1.10 [0.90, 1.35]" in out and "paper B (Chinchilla runs): a_l = 1.2 [0.9, 1.5]" in out
    assert out.count(name(8, 0)) == out.count(name(8, 1)) == 1
