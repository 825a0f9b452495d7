"""The console at 80x24, the smallest terminal it is made for: every tab's essentials are drawn
inside the screen, whole (read from the rendered screen, not from the widgets' state), and the
Growth panel never shows an old run's table as the new run's."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest
from rich.text import Text
from test_tui import until
from test_tui_terminal import _wait_for, console_in_tmux
from tiny_models import save_tiny
from tui_fixtures import (
    BASELINE,
    CURVE,
    T0,
    analyses_session,
    dashboard_session,
    deep_session,
    growth_doc,
    growth_events,
    uniform_and_eval_events,
    write_events,
)

from engine.core.codec import json_safe
from engine.core.events import Event, Finished, Message, Started
from engine.experiments.ablation.vocabulary import AblationMap, AblationSettings
from engine.experiments.growth.design import planned_arms
from engine.experiments.growth.vocabulary import PRESETS, GrowthPhase, GrowthPlan, GrowthResult, GrowthStep
from engine.experiments.recovery.vocabulary import RecoveryPoint, RecoveryStart
from sessions.session import Session
from sessions.store import SessionStore
from tui.app import AnatomyApp
from tui.state import GrowthView
from tui.views import analyses
from tui.widgets.curve_plot import legend_rows
from tui.widgets.growth_timeline import comparison_table, timeline_text

SMALL = (80, 24)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def screen_rows(app: AnatomyApp) -> list[str]:
    """The screen as the terminal would show it, row by row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def assert_shown(app: AnatomyApp, *needles: str) -> None:
    """Each needle whole on one row of the screen (so neither scrolled away, wrapped nor cut)."""
    rows = screen_rows(app)
    missing = [needle for needle in needles if not any(needle in row for row in rows)]
    assert not missing, f"not on the {app.size.width}x{app.size.height} screen: {missing}\n" + "\n".join(rows)


def partial_session() -> Session:
    """A stopped map: the first 8 rows of a run set to map 30 layers."""
    session = deep_session(SessionStore())
    deep = AblationMap.from_json(session.load_result("ablation") or {})
    session.save_result("ablation", json_safe(dataclasses.replace(
        deep, layers=deep.layers[:8], settings=AblationSettings(layers=tuple(range(30))), partial=True)))
    return session


async def test_the_layer_maps_own_line_shows_under_a_map_longer_than_the_screen(isolated_home) -> None:
    """A stopped map of 8 of 30 layers: its line ('a completes it') sits under the map in the tabs."""
    partial_session()
    app = AnatomyApp(session="deep", load_model=False)
    async with app.run_test(size=SMALL) as pilot:
        await until(pilot, lambda: "partial" in str(app.screen.query_one("#layers").border_subtitle), 10)
        await pilot.pause()
        assert_shown(app, "partial: 8 of 30 layers · a completes it", "D% (log)", " 7  redundant")


def recovery_repeats(layer: int, repeats: int) -> list[Event]:
    """`repeats` interrupted runs on one layer (a sweep's repeats): as many curves in its plot."""
    events: list[Event] = []
    for repeat in range(repeats):
        job = f"recovery-{repeat}"
        events += [Started("recovery", {"sigma": 0.5, "lr": 1e-4, "steps": 40}, job=job, t=T0),
                   RecoveryStart(layer=layer, repeat=repeat, ppl_after_noise=90.0, baseline_ppl=BASELINE, steps=40,
                                 job=job, t=T0 + 1)]  # fmt: skip
        events += [RecoveryPoint(layer=layer, repeat=repeat, step=step, train_loss=3.0,
                                 eval_ppl=ppl * (1 + repeat / 10), ratio_to_baseline=ppl / BASELINE, job=job,
                                 t=T0 + 2 + step)
                   for step, ppl in CURVE]  # fmt: skip
    return events


async def test_the_recovery_legend_is_whole_with_four_curves(isolated_home) -> None:
    """Four curves and the four reference lines: longer than the plot's bottom border at 80 columns,
    the legend goes on rows under the plot, every label whole."""
    session = dashboard_session(SessionStore(), "map")
    write_events(session, recovery_repeats(1, 4))
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("down", "f3")
        await until(pilot, lambda: "layer 1" in str(app.screen.query_one("#recovery-layer").render()), 10)
        await pilot.pause()
        assert_shown(app, "━━ L1 σ=0.5 interrupted", "━━ L1 σ=0.5 #1 interrupted", "━━ L1 σ=0.5 #2 interrupted",
                     "━━ L1 σ=0.5 #3 interrupted", "━━ baseline", "━━ 2x", "━━ 1.5x", "━━ 1.1x",
                     "sigma", "steps", "lr", "step 40: ppl 27.95")  # fmt: skip
        assert not any("…" in row for row in screen_rows(app))


def three_seeds(previous: bool = False) -> dict:
    """results/growth.json with three seeds and the long numbers of a real run (seconds in the
    thousands, tens of thousands of tokens a second): the table at its widest."""
    result = GrowthResult.from_json(growth_doc())
    losses = {"growth_100": [1.25, 1.5, 1.75], "uniform_100": [2.0, 2.5, 3.0]}  # means 1.5 and 2.5
    arms = {name: dataclasses.replace(arm, val_loss=losses[name], mean=sum(losses[name]) / 3, sd=0.25,
                                      seconds=1234.5, tokens_per_s=52345.0)
            for name, arm in result.arms.items()}  # fmt: skip
    return json_safe(dataclasses.replace(result, arms=arms))


async def test_the_final_comparisons_numbers_are_whole(isolated_home) -> None:
    """The widest table (three seeds: an sd column; four-digit seconds; five-digit tokens/s) in the
    Growth tab's left column: the columns that do not fit go (seconds), the numbers stay whole."""
    session = dashboard_session(SessionStore(), "grown")
    session.save_result("growth", three_seeds())
    app = AnatomyApp(session="grown", load_model=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        assert_shown(app, "final comparison (n=3 seeds)", "growth_100", "1.5000", "uniform_100", "2.5000",
                     "0.2500", "52,345", "growth_100  step 30/30", "uniform_100  step 30/30")
        assert not any("…" in row for row in screen_rows(app))


def tiny_run(job: str, step: int) -> list[Event]:
    """A growth run of the tiny preset (three arms, thirteen phases, twelve layers) at `step` of
    the growth_100 arm: the timeline at its tallest and widest."""
    arms = planned_arms(PRESETS["tiny"])
    assert arms is not None
    events: list[Event] = [Started("growth", {}, job=job, t=T0),
                           GrowthPlan(arms=arms, seeds=[0], params={"growth": 1, "uniform": 1}, profile=[],
                                      batch_tokens=64, job=job, t=T0)]  # fmt: skip
    phase = next(p for p in arms["growth_100"]["phases"] if p["start"] <= step < p["start"] + p["steps"])
    events.append(GrowthPhase(arm="growth_100", seed=0, phase=phase["name"], phase_index=1,
                              start_step=phase["start"], steps=phase["steps"], layers=phase["layers"], added=[],
                              job=job, t=T0 + 1))  # fmt: skip
    events.append(GrowthStep(arm="growth_100", seed=0, phase=phase["name"], step=step, total_steps=400,
                             train_loss=3.0, tokens_per_s=1000.0, lr=1e-3, n_layers=4, job=job, t=T0 + 2))
    return events


async def test_a_new_run_labels_the_old_table_and_its_timeline_fits(isolated_home) -> None:
    """A finished run's table, then a new run of the tiny preset starts while the console is open:
    the table says it is the previous run's, and every arm's line and the phase it is in fit the
    80x24 screen beside it, their network drawings whole (not wrapped)."""
    session = dashboard_session(SessionStore(), "grown")
    app = AnatomyApp(session="grown", load_model=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        assert_shown(app, "final comparison (n=1 seed: no sd)", "1.2000")
        assert not any("previous run" in row for row in screen_rows(app))
        write_events(session, tiny_run("growth-2", 130))  # 130: growth_100's second phase, neurulation
        await until(pilot, lambda: app.state.growth.job == "growth-2", 10, "the new run read")
        await pilot.pause()
        assert_shown(app, "previous run's final", "1.2000", "growth_100  step 130/400", "neurulation",
                     "·■■·■■······ 4L", "growth_50  step 0/200", "uniform_100  step 0/400", "■■■■■■■■■■■■ 12L")


async def test_the_tiny_presets_whole_timeline_fits_a_taller_terminal(isolated_home) -> None:
    """With the rows for it (80x40), every phase of every arm, each on one row."""
    session = dashboard_session(SessionStore(), "map")
    write_events(session, tiny_run("growth-1", 130))
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=(80, 40)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        assert_shown(app, "gastrulation", "····■■······ 2L", "organogenesis", "·■■·■■··■■·· 6L", "maturation",
                     "growth_50  step 0/200", "uniform_100  step 0/400", "uniform")


async def test_the_prompt_pane_fits(isolated_home) -> None:
    dashboard_session(SessionStore(), "map")
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("f5")
        await pilot.pause()
        assert_shown(app, "type a prompt and press Enter (F9 stops)", "original", "modified (x/t/m marks)",
                     "nothing marked")


async def test_the_analyses_pane_cuts_nothing(isolated_home) -> None:
    """Every analysis scrolled through at 80 columns: each title shown, no cell, header or legend
    cut (a table too wide wraps or folds its cells, as `anatomy-tui run` prints them)."""
    analyses_session(SessionStore())
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        pane = app.screen.query_one("#analyses")
        seen: list[str] = []
        while True:
            seen += screen_rows(app)[3:-1]  # below the status line and the tabs, above the footer
            if pane.scroll_y >= pane.max_scroll_y:
                break
            await pilot.press("pagedown")
            await pilot.pause()
        assert [title for _, view in analyses() if not any((title := view.ANALYSIS.title) in row for row in seen)] == []
        assert [row for row in seen if "…" in row] == []


async def test_a_long_log_line_wraps_whole(isolated_home) -> None:
    session = dashboard_session(SessionStore(), "map")
    long = "the texts are read again " + "and again " * 12 + "until the last word: END"
    write_events(session, [Message(long, job="recovery-1", t=T0)])
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("f7")
        await pilot.pause()
        assert_shown(app, "recovery-1: the texts are read again", "until the last word: END")


def tiny_plan_view() -> GrowthView:
    arms = planned_arms(PRESETS["tiny"])
    assert arms is not None
    return GrowthView(plan=GrowthPlan(arms=arms, seeds=[0], params={}, profile=[], batch_tokens=64))


# the first phase's row at each width (indent, name column, length, bar, network, count): 47 the full
# row; 40 and 38 without the length, a 4-cell bar; 30 indented by one, the names cut to 7 cells; 24 the
# network under the name, which is whole again
FIRST_PHASE = {47: "  gastrulation    116 ", 40: "  gastrulation  ····", 38: "  gastrulation  ····",
               30: " gastru… ····", 24: " gastrulation  ···· 2L"}  # fmt: skip


@pytest.mark.parametrize("width", sorted(FIRST_PHASE, reverse=True))
def test_the_timeline_fits_its_width_with_its_drawings_whole(width: int) -> None:
    """The tiny preset's rows are 47 cells at full size: narrower, no row is longer than `width` and
    each phase's network drawing (twelve cells) is still whole on one row."""
    rows = timeline_text(tiny_plan_view(), width=width).plain.splitlines()
    assert max(map(len, rows)) <= width, rows
    for drawing in ("····■■······", "·■■·■■······", "·■■·■■··■■··", "·■■·■■·■■■■·", "■■■■■■■■■■■■"):
        assert any(drawing in row for row in rows), (drawing, rows)
    assert rows[1].startswith(FIRST_PHASE[width]), rows[1]


def test_too_few_rows_show_the_phase_each_arm_is_in() -> None:
    view = tiny_plan_view()
    view.step["growth_100"] = 130
    rows = timeline_text(view, width=40, height=8).plain.splitlines()
    assert [row.split("  ")[0] for row in rows[::2]] == ["growth_100", "growth_50", "uniform_100"]
    assert "phase 1/6" in rows[0] and rows[1].startswith("  gastrulation")  # no phase event yet: its first
    assert len(rows) == 6


def test_a_table_too_wide_for_any_column_set_becomes_a_line_per_arm() -> None:
    arms = GrowthResult.from_json(three_seeds()).arms
    text = comparison_table(arms, width=20)
    assert isinstance(text, Text)
    assert text.plain.splitlines()[1:] == [
        "growth_100: val loss 1.5000  ± sd 0.2500  s 1234.5  tok/s 52,345",
        "uniform_100: val loss 2.5000  ± sd 0.2500  s 1234.5  tok/s 52,345",
    ]


def test_a_legend_too_long_for_its_width_goes_on_rows_each_label_whole() -> None:
    entries = [("baseline", "white"), ("2x", "red"), ("1.5x", "orange"), ("1.1x", "orange+")]
    assert [row.plain for row in legend_rows(entries, 24)] == ["━━ baseline  ━━ 2x", "━━ 1.5x  ━━ 1.1x"]
    assert [row.plain for row in legend_rows(entries, 36)] == ["━━ baseline  ━━ 2x  ━━ 1.5x  ━━ 1.1x"]


@pytest.mark.slow
@pytest.mark.terminal
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")
def test_a_real_80x24_terminal_shows_the_map_line_and_the_whole_table(isolated_home, tmp_path) -> None:
    """In tmux at 80x24: the partial map's line under the map, then (F4) the widest final table with
    every number whole and nothing cut."""
    session = partial_session()
    write_events(session, [*growth_events(upto=30), *uniform_and_eval_events(),
                           Finished(status="done", job="growth-1", t=T0 + 31)])
    session.save_result("growth", three_seeds())
    folder = save_tiny(tmp_path / "tiny")
    with console_in_tmux(isolated_home, f"--session deep --model {folder} --device cpu --dtype float32",
                         SMALL) as name:
        _wait_for(name, "partial: 8 of 30 layers · a completes it", "D% (log)")
        subprocess.run(["tmux", "send-keys", "-t", name, "F4"], check=True)
        screen = _wait_for(name, "final comparison (n=3 seeds)", "growth_100  step 30/30")
        assert all(number in screen for number in ("1.5000", "2.5000", "0.2500", "52,345")), screen
        assert not any("…" in row for row in screen.splitlines()[1:]), screen  # the status line cuts the model's path
        subprocess.run(["tmux", "send-keys", "-t", name, "C-q"], check=True)
