"""The console's main flows with Textual's Pilot, on a tiny model saved to a folder (no download)."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import Input
from textual.widgets.data_table import ColumnKey
from tui_fixtures import BASELINE, CURVE, MAP, cut, demo_session, prune_result, recovery_row

from engine.core.process import pid_alive
from engine.experiments.ablation.vocabulary import AblationProxies
from engine.experiments.prune.vocabulary import PruneResult
from engine.experiments.recovery.vocabulary import RecoveryLayer
from engine.experiments.variants import pruned_layers
from sessions.session import Session
from sessions.store import SessionStore
from tui import app as app_module
from tui.app import AnatomyApp, ModelOptions
from tui.console_settings import ConsoleSettings
from tui.jobs import BackgroundJob
from tui.screens.confirm import ConfirmScreen
from tui.screens.console import ConsoleScreen
from tui.screens.console_keys import ACTIONS
from tui.screens.help import HelpScreen
from tui.screens.layer_detail import LayerDetailScreen
from tui.state import GrowthView, SessionState, thin
from tui.widgets.growth_timeline import comparison_table, timeline_text
from tui.widgets.layer_detail import layer_detail_text
from tui.widgets.layer_map import LayerMap, log_bar
from tui.widgets.prompt_column import PromptColumn

SIZE = (120, 36)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def tiny_app(folder: Path, session: str = "s", load_model: bool = True, auto_map: bool = False) -> AnatomyApp:
    return AnatomyApp(
        session=session, options=ModelOptions(str(folder), "cpu", "float32"), load_model=load_model,
        console=ConsoleSettings(auto_map=auto_map),
    )


def console_of(app: AnatomyApp) -> ConsoleScreen:
    """The app's screen, where the test has the console on top (no modal open)."""
    return cast(ConsoleScreen, app.screen)


def stored(session: Session, name: str) -> dict[str, Any]:
    """Result `name` of `session`, which the test's session holds."""
    doc = session.load_result(name)
    assert doc is not None
    return doc


async def until(pilot, predicate, limit: float = 120.0, what: str = "") -> None:
    """Lets the app run until `predicate()` holds (a job in another process gives no worker to await);
    fails saying `what` was not reached within `limit` seconds."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {limit:g} s: {what or 'condition'}")
        await pilot.pause(0.1)  # little CPU taken from a job in another process


def plain(renderable) -> str:
    console = Console(width=120, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


async def loaded(pilot) -> None:
    await until(pilot, lambda: pilot.app.loaded is not None, 60)
    await until(pilot, lambda: pilot.app.screen.query_one(LayerMap).row_count > 0, 10)


# pure parts ---------------------------------------------------------------------------------------
def test_log_bar_is_log_scaled() -> None:
    assert log_bar(0.1, width=12).plain == "█" + "·" * 11  # the floor of the scale: one cell
    assert log_bar(1e5, width=12).plain == "█" * 12  # the top: full
    assert log_bar(100.0, width=12).plain.count("█") == 6  # 10^2 is half way from 10^-1 to 10^5
    assert log_bar(-100.0, width=12).plain.count("◂") == 6  # a negative D points the other way
    assert log_bar(None, width=4).plain == "····"


def test_state_replays_the_stored_session(isolated_home) -> None:
    session = demo_session(SessionStore())
    state = SessionState()
    state.set_result("ablation", stored(session, "ablation"))
    for event in session.read_events(0)[0]:
        state.apply(event)
    assert [state.ablation[i].degradation_pct for i in range(6)] == [d for d, _, _ in MAP]
    (run,) = state.recovery
    assert (run.layer, run.sigma, run.baseline_ppl) == (1, 0.5, BASELINE)
    assert run.points == [(float(s), p) for s, p in CURVE]
    assert state.growth.step["growth_100"] == 14
    assert state.growth.current["growth_100"].phase == "minor"
    text = timeline_text(state.growth).plain
    assert "core" in text and "minor" in text and "full" in text
    assert "■■■··■" in text  # the minor phase: layers 0, 1, 2 and 5 exist


def test_layer_views_read_the_typed_rows(isolated_home) -> None:
    """The map and the detail draw from the ablation rows and recovery rows as the engine types them."""
    session = demo_session(SessionStore())
    state = SessionState()
    state.set_result("ablation", stored(session, "ablation"))
    for event in session.read_events(0)[0]:
        state.apply(event)
    detail = layer_detail_text(state, 1).plain
    assert "Layer 1  important" in detail and "recovery L1 σ=0.5" in detail and "difficulty" not in detail
    assert "Layer 4  anti" in layer_detail_text(state, 4).plain
    state.apply(RecoveryLayer(layer=1, result=recovery_row(difficulty=40.0), job="recovery-1"))
    assert "difficulty  40" in layer_detail_text(state, 1).plain
    cells = [str(cell) for cell in LayerMap._cells(state, 1)]
    assert cells[1] == "important" and cells[-1] == "40"
    assert state.recovery[0].status == "done"


def test_generated_text_replaces_only_its_own_column_of_its_own_run() -> None:
    from tui.messages import TextGenerated

    newer = TextGenerated(2, "left", "The layer is")
    assert newer.can_replace(TextGenerated(2, "left", "The layer"))  # the whole text: nothing is lost
    assert not newer.can_replace(TextGenerated(2, "right", "The layer"))
    assert not newer.can_replace(TextGenerated(1, "left", "The layer"))


def test_thin_keeps_the_newest_points_exact() -> None:
    points = [(float(i), float(i)) for i in range(10)]
    thinned = thin(points, limit=6)
    assert thinned[-5:] == points[-5:] and len(thinned) < len(points)
    assert thin(points, limit=10) == points


# panels over a stored session -------------------------------------------------------------------------
async def test_layer_map_select_and_detail(isolated_home) -> None:
    demo_session(SessionStore())
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = app.screen.query_one(LayerMap)
        assert table.row_count == len(MAP)
        assert [str(table.get_cell_at(Coordinate(i, 1))) for i in range(6)] == [
            "critical",
            "important",
            "minor",
            "redundant",
            "anti",
            "critical",
        ]
        await pilot.press("down", "down")
        assert console_of(app).selected_layer == 2
        await until(pilot, lambda: "Layer 2" in str(app.screen.query_one("#detail").render()), 5)
        await pilot.press("d")
        assert isinstance(app.screen, LayerDetailScreen)
        await pilot.press("escape")
        await pilot.press("f3")
        assert console_of(app).active_tab == "recovery"
        assert app.state.recovery[0].points[-1] == (40.0, 21.5)


class ReadyRecorder(AnatomyApp):
    """Records when the console said it was ready (every pane built)."""

    ready_at: float | None = None

    def after_first_paint(self) -> None:
        self.ready_at = time.perf_counter()
        super().after_first_paint()


async def test_the_panes_out_of_view_are_built_after_the_first_paint(isolated_home) -> None:
    """The console paints with the layer map alone; the other panes (console_panes.DEFERRED) are
    filled just after, before the app is told the console is ready: every widget the console
    draws into exists then, in its pane, whatever tab is shown."""
    from tui.screens import console_panes
    from tui.views import analyses

    demo_session(SessionStore())
    app = ReadyRecorder(session="demo", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.ready_at is not None, 10)
        assert app.first_paint is not None and app.ready_at is not None
        assert app.first_paint < app.ready_at  # painted first, then built
        screen = app.screen
        assert isinstance(screen, ConsoleScreen) and screen.built
        inside = {
            "recovery": ("recovery-form", "sigma", "steps", "lr", "recovery-layer", "recovery-info", "recovery-plot"),
            "growth": ("growth-left", "growth-flags", "growth-table", "timeline", "growth-plot"),
            "prompt": ("prompt-input", "prompt-columns", "left", "right"),
            "analyses": tuple(f"result-{name}" for name, _ in analyses()),
            "log": ("log-view",),
        }
        assert set(inside) == set(console_panes.DEFERRED)
        assert inside["analyses"]  # the registry has analyses: the pane is not empty by construction
        for pane, ids in inside.items():
            holder = screen.query_one(f"#{pane}")
            for widget_id in ids:
                assert holder.query_one(f"#{widget_id}").id == widget_id, (pane, widget_id)
        assert screen.query_one("#sigma", Input).value  # the forms hold their defaults
        assert len(screen.query(PromptColumn)) == 2
        await pilot.pause()  # the first redraw (every panel: Dirty.EVERY) drew into the deferred widgets
        for widget_id in inside["analyses"]:
            assert "anatomy-tui run" in str(screen.query_one(f"#{widget_id}").render())  # its summary, or how to run it
        assert "layer 0" in str(screen.query_one("#recovery-layer").render())  # the map's selection
        for key, tab in (("f3", "recovery"), ("f4", "growth"), ("f5", "prompt"), ("f6", "analyses"), ("f7", "log")):
            await pilot.press(key)
            assert screen.active_tab == tab


async def test_help_lists_every_key_and_the_palette_every_action(isolated_home) -> None:
    demo_session(SessionStore())
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert {title for _, action, title, _ in ACTIONS if action != "quit"} <= titles
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        assert len(app.screen.keys) == len(ACTIONS)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_picker_lists_sessions_and_opens_one(isolated_home) -> None:
    demo_session(SessionStore())
    app = AnatomyApp(load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert app.session_name == "demo"
        assert app.screen.query_one(LayerMap).row_count == len(MAP)


async def test_the_console_comes_back_to_its_session_layer_tab_and_forms(isolated_home) -> None:
    """Quit on layer 3 of the Recovery tab with sigma 0.25; a headless run then writes a newer
    session; --resume, and Enter in the picker, open the console's own session again, there."""
    store = SessionStore()
    demo_session(store)
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down", "down", "down", "f3")
        app.screen.query_one("#sigma", Input).value = "0.25"
        await pilot.pause()
        await pilot.press("q")
    store.create("cli-test", model="tiny")  # what `anatomy-tui run ... --session cli-test` leaves: the newest
    recent = store.most_recent()
    assert recent is not None and recent.name == "cli-test"
    for again in (AnatomyApp(resume=True, load_model=False), AnatomyApp(load_model=False)):
        async with again.run_test(size=SIZE) as pilot:
            await pilot.pause()
            if again.session is None:  # the picker, its cursor on the console's session
                await pilot.press("enter")
                await pilot.pause()
            screen = again.screen
            assert again.session_name == "demo" and isinstance(screen, ConsoleScreen)
            assert screen.selected_layer == 3 and screen.active_tab == "recovery"
            assert screen.query_one("#sigma", Input).value == "0.25"
            await pilot.press("q")


def test_a_console_view_that_does_not_check_is_left_at_its_defaults(isolated_home) -> None:
    """<session>/console.json and the home's .console.json are untrusted: wrong types, a session
    that is gone, a name that escapes the folder or marks that do not check are ignored."""
    import json

    from tui.console_view import FORMAT, LAST_SESSION, ConsoleView, last_session, load, remember_session, save
    from tui.marks import Marks

    store = SessionStore()
    session = demo_session(store)
    save(session, ConsoleView(2, "growth", {"sigma": "0.3"}))
    assert load(session) == ConsoleView(2, "growth", {"sigma": "0.3"})
    (session.path / "console.json").write_text(json.dumps(
        {"format": FORMAT, "layer": -1, "tab": "../x", "forms": {"sigma": 3, "lr": "1e-4"}}))
    assert load(session) == ConsoleView(None, "layers", {"lr": "1e-4"})
    (session.path / "console.json").write_text("[1, 2")
    assert load(session) == ConsoleView()
    marks = Marks(frozenset({2}), frozenset({(0, "attention"), (3, "mlp")}))
    save(session, ConsoleView(1, "prompt", {}, marks))
    assert load(session) == ConsoleView(1, "prompt", {}, marks)
    for bad in ({"layers": [2]}, {"layers": [True], "blocks": []}, {"layers": [-1], "blocks": []},
                {"layers": [2.0], "blocks": []}, {"layers": [], "blocks": [[1, "attn"]]},
                {"layers": [], "blocks": [[1, "mlp", 0]]}, {"layers": [], "blocks": [["1", "mlp"]]},
                {"layers": [], "blocks": [[1, ["mlp"]]]}, {"layers": [1], "blocks": [[1, "mlp"]]},
                {"layers": list(range(5000)), "blocks": []}, "L1"):
        (session.path / "console.json").write_text(json.dumps(
            {"format": FORMAT, "layer": 1, "tab": "prompt", "forms": {}, "marks": bad}))
        assert load(session) == ConsoleView(1, "prompt", {}), bad  # the marks alone left at none
    remember_session(store, "demo")
    assert last_session(store) == "demo"
    for name in ("gone", "../demo", 7):
        (store.home / LAST_SESSION).write_text(json.dumps({"format": FORMAT, "session": name}))
        assert last_session(store) is None


async def test_first_run_opens_a_session_and_draws_the_map_unasked(isolated_home, tiny_folder) -> None:
    app = AnatomyApp(options=ModelOptions(str(tiny_folder), "cpu", "float32"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.session is not None and isinstance(app.screen, ConsoleScreen)  # no picker
        await until(pilot, lambda: "ablation" in app.state.results)
        assert app.state.proxies is not None and len(app.state.proxies.block_influence) == app.lab.n_layers
        table = app.screen.query_one(LayerMap)
        assert table.row_count == app.lab.n_layers
        assert table.get_cell("0", "ang") != ""


async def test_dashboard_switches_live_and_keeps_selection_and_inputs(isolated_home) -> None:
    demo_session(SessionStore())
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        screen = console_of(app)
        assert screen.dashboard
        assert all(screen.query_one(f"#{tab}").display for tab in ("layers", "recovery", "growth", "prompt"))
        assert screen.query_one("#recovery").border_title == "Recovery"
        await pilot.press("down", "down")
        screen.query_one("#sigma", Input).value = "0.25"
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert not screen.dashboard and not screen.query_one("#recovery").display
        assert console_of(app).selected_layer == 2 and screen.query_one("#sigma", Input).value == "0.25"
        await pilot.press("w")
        await pilot.pause()
        assert screen.dashboard  # forced, whatever the size
        await pilot.press("f6")
        await pilot.pause()
        assert screen.has_class("-overlay") and screen.query_one("#analyses").display
        await pilot.press("f2")
        await pilot.pause()
        assert not screen.has_class("-overlay") and console_of(app).selected_layer == 2


# work in the console ------------------------------------------------------------------------------
async def test_map_in_console_then_reopen_shows_the_same(isolated_home, tiny_folder) -> None:
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: len(app.state.ablation) == 4 and "ablation" in app.state.results)
        first = {i: row.degradation_pct for i, row in app.state.ablation.items()}
        table = app.screen.query_one(LayerMap)
        assert table.row_count == 4
        # columns widened as the numbers arrived: every D % value is shown whole
        widest = max(len(str(table.get_cell(str(i), "D %"))) for i in range(4))
        assert table.columns[ColumnKey("D %")].content_width >= widest
    again = tiny_app(tiny_folder, load_model=False)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert {i: row.degradation_pct for i, row in again.state.ablation.items()} == first
        assert again.screen.query_one(LayerMap).row_count == 4
        assert not again.state.running_jobs()


async def test_an_engine_error_becomes_a_notification(isolated_home, tiny_folder, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("boom from the engine")
        yield  # pragma: no cover - a generator that fails on its first step

    monkeypatch.setattr("engine.experiments.ablation.run.run_ablation", broken)
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert any("boom from the engine" in text for _, text in app.state.log)
        assert any("boom from the engine" in n.message for n in app._notifications)
        assert app.is_running
        await pilot.press("down")  # still answering keys
        assert console_of(app).selected_layer == 1
    log_text = (isolated_home / "s" / "app.log").read_text()
    assert "boom from the engine" in log_text


@pytest.fixture
def waiting_map(monkeypatch) -> threading.Event:
    """The map replaced by one that runs (checking its cancel) until the event returned is set."""
    release = threading.Event()

    def slow(model, tokenizer, settings, cancel=None, model_name="", turns=None, done=None, keep=None, stream=None,
             stream_state=None):
        while not release.wait(0.02):
            cancel.check()
        yield from ()

    monkeypatch.setattr("engine.experiments.ablation.run.run_ablation", slow)
    return release


async def map_running(app, pilot) -> None:
    """The model loaded, then `a`: the map is running in the console."""
    await loaded(pilot)
    await pilot.press("a")
    await until(pilot, lambda: "ablation" in app.lab.cancels and app.state.running_jobs())


async def test_keys_are_handled_while_a_job_runs_and_quit_asks(isolated_home, tiny_folder, waiting_map) -> None:
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await map_running(app, pilot)
        await pilot.press("down", "down", "f4")
        assert console_of(app).selected_layer == 2 and console_of(app).active_tab == "growth"
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert app.is_running and not isinstance(app.screen, ConfirmScreen)
        await pilot.press("f2", "c")  # cancel from the job's tab
        await app.workers.wait_for_complete()
        await until(pilot, lambda: not app.state.running_jobs())
        assert [job.status for job in app.state.jobs.values()] == ["cancelled"]
        assert not waiting_map.is_set()


async def test_quitting_with_a_job_running_keeps_the_view(isolated_home, tiny_folder, waiting_map) -> None:
    """q, then y to stop the map running in the console: the layer and tab are kept as on any quit."""
    from tui.console_view import load

    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await map_running(app, pilot)
        await pilot.press("down", "down", "f4", "q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        session = app.lab.session
    assert session is not None
    view = load(session)
    assert (view.layer, view.tab) == (2, "growth")


async def test_cancel_says_cancelling_at_once(isolated_home, tiny_folder, monkeypatch) -> None:
    """F2 then c: the status line and the layer map's panel say `cancelling` before the map has
    stopped (it stops at its next check, here only once released); then the job reads cancelled."""
    from tui.widgets.status_line import StatusLine

    release = threading.Event()

    def deaf(model, tokenizer, settings, cancel=None, model_name="", turns=None, done=None, keep=None, stream=None,
             stream_state=None):
        release.wait(60)
        cancel.check()
        yield from ()

    monkeypatch.setattr("engine.experiments.ablation.run.run_ablation", deaf)
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("a")
        await until(pilot, lambda: app.state.running_jobs() and app.state.running_jobs()[0].experiment)
        await until(pilot, lambda: "map in console" in (app.screen.query_one("#layers").border_subtitle or ""), 30,
                    "the layer map's subtitle says the map runs in the console")
        await pilot.press("f2", "c")
        await pilot.pause()
        assert "cancelling" in str(app.screen.query_one(StatusLine).render())
        assert "cancelling" in (app.screen.query_one("#layers").border_subtitle or "")
        assert not release.is_set() and app.state.running_jobs()  # said before the map has stopped
        release.set()
        await app.workers.wait_for_complete()
        await until(pilot, lambda: not app.state.running_jobs())
        assert [job.status for job in app.state.jobs.values()] == ["cancelled"]
        assert "cancelling" not in str(app.screen.query_one(StatusLine).render())


# the prompt pane ------------------------------------------------------------------------------------------
async def test_generation_streams_the_greedy_text(isolated_home, tiny_folder) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    ids = torch.tensor([tokenizer.encode("The layer")])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=app_module.GENERATE_TOKENS,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=None,
    )
    expected = tokenizer.decode(out[0, ids.shape[1] :].tolist())

    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("f5")
        app.screen.query_one("#prompt-input").focus()
        await pilot.press(*"The layer", "enter")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: app.lab.generation is None, 30, "the generation's end handled")
        await pilot.pause()  # its last text drawn
        left, right = app.screen.query(PromptColumn)
        assert left.text == expected
        assert right.text == expected  # nothing marked: the modified model is the original


async def test_marked_blocks_change_the_modified_column(isolated_home, tiny_folder) -> None:
    """On the layer map t marks the selected layer's attention block and m its MLP block: the map
    shows the marks in its blocks' columns (before any map with parts), the modified column's hint
    names them, and its text is the greedy text of the model without those blocks (a block cut),
    the original column's the original's. Quit and open again: the marks are back."""
    import torch
    from textual.widgets import Static
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.pruning import cut_removed

    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    ids = torch.tensor([tokenizer.encode("The layer")])

    def greedy() -> str:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=app_module.GENERATE_TOKENS,
                             do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
        text = tokenizer.decode(out[0, ids.shape[1]:].tolist())
        assert isinstance(text, str)  # one sequence decodes to one string
        return text

    original = greedy()
    with cut_removed(model, ((1, "attention"), (2, "mlp"))):
        without = greedy()
    assert without != original

    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        right = app.screen.query(PromptColumn).last()
        hint = right.query_one(".marks-hint", Static)
        assert str(hint.content).startswith("nothing marked (map: x layer, t attn, m mlp)")
        await pilot.press("down", "t", "down", "m", "down", "x", "x")  # x twice: layer 3 marked, then not
        table = app.screen.query_one(LayerMap)
        assert [str(table.get_cell(str(i), "attn D%")) for i in range(4)] == ["", "✕", "", ""]
        assert [str(table.get_cell(str(i), "mlp D%")) for i in range(4)] == ["", "", "✕", ""]
        await pilot.press("f5")
        assert str(hint.content) == "L1.attn, L2.mlp removed"
        app.screen.query_one("#prompt-input").focus()
        await pilot.press(*"The layer", "enter")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: app.lab.generation is None, 30, "the generation's end handled")
        await pilot.pause()  # its last text drawn
        left = app.screen.query(PromptColumn).first()
        assert (left.text, right.text) == (original, without)
        app.screen.query_one(LayerMap).focus()  # q in the prompt's field would be a letter of the prompt
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0  # quit by its key, which saves the view (not torn down by the pilot)
    again = tiny_app(tiny_folder, load_model=False)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f5")
        assert str(again.screen.query(PromptColumn).last().query_one(".marks-hint", Static).content) == \
            "L1.attn, L2.mlp removed"


async def test_a_prompt_is_answered_during_the_map(isolated_home, tiny_folder, monkeypatch, record_property) -> None:
    """The map in the console takes the model a batch at a time: a prompt typed during it streams
    its text before the map ends, exactly the unchanged model's greedy text (the time to its first
    token is recorded, not asserted)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.evaluation.generation import generate_text
    from engine.evaluation.perplexity import Evaluator

    expected = generate_text(AutoModelForCausalLM.from_pretrained(tiny_folder),
                             AutoTokenizer.from_pretrained(tiny_folder), "The layer", app_module.GENERATE_TOKENS)
    forward = Evaluator._forward_nll
    answered = threading.Event()

    def slow_forward(self, batch):  # a map of many seconds on the tiny model, until the prompt is answered
        if not answered.is_set():
            time.sleep(0.2)
        return forward(self, batch)

    monkeypatch.setattr(Evaluator, "_forward_nll", slow_forward)
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("a")
        await until(pilot, lambda: app.state.running_jobs())
        await pilot.press("f5")
        app.screen.query_one("#prompt-input").focus()
        asked = time.perf_counter()
        await pilot.press(*"The layer", "enter")
        left, right = app.screen.query(PromptColumn)
        await until(pilot, lambda: left.text != "")
        record_property("seconds_to_first_token_during_map", time.perf_counter() - asked)
        assert "ablation" in app.lab.cancels  # the map still runs
        await until(pilot, lambda: right.text == expected and app.lab.generation is None)
        assert left.text == expected
        answered.set()
        await app.workers.wait_for_complete()
        await until(pilot, lambda: "ablation" in app.state.results)


async def test_stop_generation(isolated_home, tiny_folder, monkeypatch) -> None:
    def endless(model, tokenizer, prompt, max_new_tokens, *, stop, on_text):
        while not stop():
            time.sleep(0.01)
            on_text("x")

    monkeypatch.setattr("engine.evaluation.generation.generate_text", endless)
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("f5")
        app.screen.query_one("#prompt-input").focus()
        await pilot.press("h", "i", "enter")
        left, right = app.screen.query(PromptColumn)
        await until(pilot, lambda: len(left.text) >= 3)
        await pilot.press("f9")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: app.lab.generation is None, 30, "the generation's end handled")
        await pilot.pause()  # its last text drawn
        assert "stopped" in str(left.query_one(".generated").render())
        assert right.text == ""  # the second model never started


# jobs in their own process ---------------------------------------------------------------------------
@pytest.mark.slow
async def test_jobs_run_live_cancel_and_survive_the_console(isolated_home, tiny_folder) -> None:
    """From the console: a recovery run whose points arrive live and that a key cancels, and a growth
    run that keeps going after the console quits; reopening shows both from the store."""
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.screen.query_one(
            "#growth-flags", Input
        ).value = "--preset tiny --steps 8 --eval-every 4 --arms growth_100,uniform_100 --gen-tokens 4"
        await pilot.press("g")
        assert console_of(app).active_tab == "growth"
        await pilot.press("f2", "down")
        app.screen.query_one("#steps", Input).value = "50000"  # minutes: the cancel, not the end, must stop it
        await pilot.press("i")
        assert console_of(app).active_tab == "recovery"
        await until(pilot, lambda: app.state.recovery and len(app.state.recovery[-1].points) >= 2, 180)
        assert app.state.recovery[-1].layer == 1
        await pilot.press("c")
        await until(pilot, lambda: app.state.recovery[-1].status == "cancelled", 60)
        growth, recovery = app.lab.background
        assert (growth.experiment, recovery.experiment) == ("growth", "recovery")
    assert recovery.process is not None and growth.process is not None  # both started as processes
    recovery.process.wait(30)
    deadline = time.monotonic() + 240
    while pid_alive(growth.pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    growth.process.wait(5)
    assert growth.process.returncode == 0, growth.log_path.read_text()[-2000:]

    again = tiny_app(tiny_folder, load_model=False)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        (run,) = again.state.recovery
        assert run.layer == 1 and run.status == "cancelled" and len(run.points) >= 2
        state = again.state.growth
        assert set(state.arm_done) == {"growth_100", "uniform_100"} and state.status == "done"
        assert len({e.phase for e in state.phase_done["growth_100"]}) > 1  # it grew phase by phase
        table = plain(comparison_table(again.state.growth_arms))
        assert "growth_100" in table and "uniform_100" in table
        statuses = {job.experiment: job.status for job in again.state.jobs.values()}
        assert statuses == {"growth": "done", "recovery": "cancelled"}


# sessions, resume, colour, serving ------------------------------------------------------------------------
async def test_an_interrupted_job_offers_to_resume(isolated_home, monkeypatch) -> None:
    """The resume is rebuilt from the job's recorded experiment and settings; the argv a (possibly
    hostile) job file carries is never run, and --trust-remote-code never comes from it."""
    from engine.experiments.growth.vocabulary import PRESETS

    session = demo_session(SessionStore())
    hostile = ["/x/cli/main.py", "run", "growth", "--model", "/evil", "--trust-remote-code"]
    session.write_job("growth-1", {"id": "growth-1", "experiment": "growth", "pid": 2**22 + 7, "argv": hostile,
                                   "settings": PRESETS["tiny"].to_dict(), "model": None,
                                   "status": "running", "started": 1.0})  # fmt: skip
    started = []

    def fake_launch(session, experiment, argv):
        started.append((experiment, argv))
        return BackgroundJob(experiment, 1, Path("fake.log"), argv)

    monkeypatch.setattr("tui.lab_jobs.launch_job", fake_launch)
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10)
        assert isinstance(app.screen, ConfirmScreen)
        assert "growth-1" in app.screen.question and "--preset=tiny" in app.screen.question
        await pilot.press("y")
        await pilot.pause()
    [(experiment, argv)] = started
    assert experiment == "growth" and argv[3:5] == ["run", "growth"]
    assert argv[-3:] == ["--session", "demo", "--resume"] and "--preset=tiny" in argv
    assert "--trust-remote-code" not in argv and "/evil" not in argv


async def test_no_color_keeps_the_classes_readable(isolated_home, monkeypatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    demo_session(SessionStore())
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.no_color
        table = app.screen.query_one(LayerMap)
        assert str(table.get_cell_at(Coordinate(4, 1))) == "anti"  # the class is a word, not only a colour


def test_serve_command_runs_the_same_console() -> None:
    import argparse
    import shlex

    from cli.launch import serve_command

    args = argparse.Namespace(model="m", device="cpu", dtype="auto", trust_remote_code=False, session="s",
                              resume=False, deterministic=False, cluster=None)  # fmt: skip
    parts = shlex.split(serve_command(args))
    assert parts[1] == "-c" and parts[3:] == ["--model=m", "--device=cpu", "--no-deterministic",
                                              "--session", "s"]  # fmt: skip


async def test_noised_and_recovered_models_in_the_prompt_pane(isolated_home, tiny_folder) -> None:
    """noised: the marked layer with Gaussian noise; recovered: the layer a recovery run saved.
    Both differ from the original, and the loaded model is bit-identical afterwards."""
    import torch
    from textual.widgets import Select

    from engine.experiments.recovery.checkpoints import save_layer_weights
    from engine.models.anatomy import LayerStack

    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        before = {k: v.clone() for k, v in app.loaded.model.state_dict().items()}
        stack = LayerStack(app.loaded.model)
        scrambled = {name: torch.randn_like(param) for name, param in stack.matrices(2).items()}
        assert app.session is not None
        save_layer_weights(app.session.checkpoint_dir("recovery") / "weights", 2, scrambled, app.loaded.name)
        app.lab.toggle_mark(1)
        await pilot.press("f5")
        left, right = app.screen.query(PromptColumn)
        texts = {}
        for choice in ("noised", "recovered"):
            left.query_one(Select).value = "original"
            right.query_one(Select).value = choice
            await pilot.pause()
            app.screen.query_one("#prompt-input").focus()
            await pilot.press(*"The layer", "enter")
            await app.workers.wait_for_complete()
            await until(pilot, lambda: app.lab.generation is None, 30, "the generation's end handled")
            await pilot.pause()  # its last text drawn
            texts[choice] = (left.text, right.text)
        for choice, (original, changed) in texts.items():
            assert original and changed and original != changed, choice
        for key, value in app.loaded.model.state_dict().items():
            assert torch.equal(value, before[key]), key


# messages up from the workers ------------------------------------------------------------------------------
async def test_the_model_worker_posts_model_loaded_and_the_status_line_shows_it(isolated_home, monkeypatch) -> None:
    from engine.models.loading import LoadedModel
    from tui.messages import ModelLoaded
    from tui.widgets.status_line import StatusLine

    stub = LoadedModel(None, None, "stub-model", "here", "cpu", "float32", "llama", 6)
    asked = []

    def fake_load(name, **kwargs):
        asked.append((name, kwargs["device"], kwargs["dtype"]))
        return stub

    monkeypatch.setattr("engine.models.loading.load_model", fake_load)
    demo_session(SessionStore())
    seen: list[Message] = []
    app = AnatomyApp(session="demo", options=ModelOptions("stub-model", "cpu", "float32"))
    async with app.run_test(size=SIZE, message_hook=seen.append) as pilot:
        await until(pilot, lambda: app.loaded is stub and app._console() is not None, 10)
        await pilot.pause()
        console = app._console()
        assert console is not None
        status = str(console.query_one(StatusLine).render())
        assert "stub-model · cpu · float32 · 6 layers" in status
    assert asked == [("stub-model", "cpu", "float32")]
    assert [m.loaded for m in seen if isinstance(m, ModelLoaded)] == [stub]


async def test_a_failed_load_is_a_message_not_a_crash(isolated_home, monkeypatch) -> None:
    from tui.widgets.status_line import StatusLine

    def broken(name, **kwargs):
        raise OSError("no such model folder")

    monkeypatch.setattr("engine.models.loading.load_model", broken)
    demo_session(SessionStore())
    app = AnatomyApp(session="demo", options=ModelOptions("nowhere", "cpu", "float32"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: any("no such model folder" in t for _, t in app.state.log) and app._console(), 10)
        await pilot.pause()
        console = app._console()
        assert console is not None
        assert "nowhere could not load: OSError: no such model folder" in str(console.query_one(StatusLine).render())
        assert app.is_running and app.loaded is None


async def test_generation_streams_through_messages(isolated_home, tiny_folder) -> None:
    """Every TextGenerated carries the column's whole text so far (so a newer one may replace an
    older one in the queue); the last one is the column's text, and GenerationDone closes the run."""
    from tui.messages import GenerationDone, TextGenerated

    seen: list[Message] = []
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE, message_hook=seen.append) as pilot:
        await loaded(pilot)
        await pilot.press("f5")
        app.screen.query_one("#prompt-input").focus()
        await pilot.press(*"The layer", "enter")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: app.lab.generation is None, 10)
        left, right = app.screen.query(PromptColumn)
    texts = [m.text for m in seen if isinstance(m, TextGenerated) and m.column == "left"]
    assert len(texts) > 1 and texts[-1] == left.text and left.text
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    assert [m.run for m in seen if isinstance(m, GenerationDone)] == [1]


async def test_the_noised_model_uses_the_sigma_of_the_request(isolated_home, tiny_folder, monkeypatch) -> None:
    """The sigma is read when Enter is pressed: a modal on top, or the form edited while the first
    column generates, does not change the noise of the second."""
    from textual.widgets import Select

    import engine.experiments.variants

    release = threading.Event()
    used = []
    real_applied = engine.experiments.variants.applied

    def recording(model, variant):
        used.append((variant.name, variant.sigma, variant.layers))
        return real_applied(model, variant)

    def held(model, tokenizer, prompt, max_new_tokens, *, stop, on_text):
        release.wait(30)  # the first column waits until the test has changed the form
        on_text("x")
        return "x"

    monkeypatch.setattr("engine.experiments.variants.applied", recording)
    monkeypatch.setattr("engine.evaluation.generation.generate_text", held)
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.lab.toggle_mark(1)
        app.screen.query_one("#sigma", Input).value = "1.5"
        await pilot.press("f5")
        right = app.screen.query(PromptColumn).last()
        right.query_one(Select).value = "noised"
        await pilot.pause()
        app.screen.query_one("#prompt-input").focus()
        await pilot.press("h", "i", "enter")
        await until(pilot, lambda: used, 10)  # the first column is generating
        await pilot.press("f1")  # a modal on top
        assert isinstance(app.screen, HelpScreen)
        app.screen_stack[-2].query_one("#sigma", Input).value = "3.0"  # and the form changed meanwhile
        release.set()
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert [(name, sigma) for name, sigma, _ in used] == [("original", 1.5), ("noised", 1.5)]
    assert used[1][2] == (1,)  # the x-marked layer


def test_proxies_fill_the_map_before_any_ablation() -> None:
    state = SessionState()
    state.apply(AblationProxies([0.5, 0.1, 0.2], [0.3, 0.05, 0.1], 12.0))
    assert state.n_layers == 3 and state.ablation_baseline == 12.0
    assert state.proxy(1) == (0.1, 0.05) and state.proxy(5) == (None, None)
    cells = LayerMap._cells(state, 2, recovering=True)
    assert str(cells[0]) == "2⟳" and cells[5:7] == ["0.200", "0.100"]


def test_growth_panel_plans_the_tiny_preset_before_any_run() -> None:
    from engine.experiments.growth.design import planned_arms
    from engine.experiments.growth.vocabulary import PRESETS

    arms = planned_arms(PRESETS["tiny"])
    assert arms is not None and arms["growth_100"]["phases"][0]["name"] == "gastrulation"
    assert sum(p["steps"] for p in arms["growth_100"]["phases"]) == PRESETS["tiny"].steps
    text = timeline_text(GrowthView(), ("--preset tiny", arms)).plain
    assert "planned (--preset tiny)" in text and "gastrulation" in text


def test_console_settings_pick_the_layout() -> None:
    auto = ConsoleSettings()
    assert auto.dashboard(200, 50) and auto.dashboard(160, 45)
    assert not auto.dashboard(159, 50) and not auto.dashboard(200, 44)
    assert ConsoleSettings(layout="dashboard").dashboard(80, 24)
    assert not ConsoleSettings(layout="tabs").dashboard(200, 50)


async def test_quitting_during_the_first_model_load_does_not_wait_for_it(isolated_home, monkeypatch) -> None:
    """The load runs on a daemon thread, not a Textual worker the app (and the interpreter) would
    wait for: Ctrl+Q during a first dequantisation quits at once."""
    release = threading.Event()

    def slow_load(name, **kwargs):
        release.wait(30)
        raise RuntimeError("never mind")

    monkeypatch.setattr("engine.models.loading.load_model", slow_load)
    demo_session(SessionStore())
    app = AnatomyApp(session="demo", options=ModelOptions("slow", "cpu", "float32"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: any(t.name == "load model" for t in threading.enumerate()), 10)
            assert all(t.daemon for t in threading.enumerate() if t.name == "load model")
            assert not [w for w in app.workers if w.name == "load model"]
            await pilot.press("ctrl+q")
            await pilot.pause()
        assert not app.is_running  # the app closed while the load still runs
    finally:
        release.set()


def test_the_map_marks_the_layers_the_prune_run_removes(isolated_home) -> None:
    session = demo_session(SessionStore())
    state = SessionState()
    state.set_result("ablation", stored(session, "ablation"))
    state.set_result("prune", prune_result([cut("bi", [1])], exported_point=cut("bi", [2, 4])))
    pruned = set(pruned_layers(state.result(PruneResult)))  # as LayerMap.show reads it
    assert pruned == {2, 4}
    marks = [str(LayerMap._cells(state, index, pruned=index in pruned)[0]) for index in range(5)]
    assert [LayerMap.PRUNED in mark for mark in marks] == [False, False, True, False, True]


async def test_a_result_the_console_cannot_draw_is_reported_as_damage(isolated_home) -> None:
    session = SessionStore().create("odd")
    session.save_result("recovery", {"layers": [{"layer": 1}]})  # passes the store, not the decoder
    app = AnatomyApp(session="odd", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app._console(), 10)
        assert app.session is not None
        assert any(line.startswith("result recovery cannot be shown") for line in app.session.damage)
        assert app.state.results["recovery"] == {"layers": [{"layer": 1}]}  # kept raw
