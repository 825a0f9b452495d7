"""Issues 43 and 42: the console's panels never contradict the running job. While a map runs, the
layer detail says so (with its progress, what it measured, and the proxies the map's row shows); a
narrow status line cuts the model's description, never a job; a streamed map's wavefront shows live
in the layer map (the layer it reads, bytes and rate, each passed layer's proxies), its perplexities
at the end."""

from __future__ import annotations

import threading

import pytest
from test_tui import SIZE, console_of, loaded, tiny_app, until
from textual.geometry import Region

from engine.core.events import Progress, Result
from engine.experiments.ablation import run as ablation_run
from engine.experiments.ablation.vocabulary import AblationProxies, AblationSettings, LayerAblated, LayerProxies
from engine.models.loading import load_model
from engine.models.streaming import open_streamed
from tui.screens.layer_detail import LayerDetailScreen
from tui.state import JobView
from tui.widgets.layer_detail import LayerDetail
from tui.widgets.layer_map import LayerMap
from tui.widgets.status_line import StatusLine, status_text

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("one_thread")]

BI = [0.5, 0.25, 0.125, 0.0625]
ANGLE = [0.3, 0.2, 0.1, 0.05]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Gate:
    """Where a stand-in map waits: `paused` once it waits, until `release`."""

    def __init__(self) -> None:
        self.paused, self.release = threading.Event(), threading.Event()

    def wait(self) -> None:
        self.paused.set()
        self.release.wait(60)

    async def reached(self, pilot, what: str) -> None:
        """Presses `a` once the console's model is loaded; returns once the map waits here and the
        console has read its last event before (the progress of 2 units done)."""
        await loaded(pilot)
        await pilot.press("a")
        await until(pilot, lambda: self.paused.is_set() and at(pilot.app, 2), 60, what)
        await pilot.pause()


def half_a_map(gate: Gate):
    """A stand-in for the map: the first pass's proxies, rows 0 and 1 measured of 4 layers, then it
    waits at `gate` and ends."""

    def run_ablation(model, tokenizer, settings, cancel=None, *args, **kwargs):
        yield AblationProxies(BI, ANGLE, 20.0)
        yield Progress(0, 4, "ablation", phase="ablation", unit="layers")
        for layer, ppl in ((0, 200.0), (1, 30.0)):
            yield LayerAblated(layer, 4, ppl, 20.0, (ppl / 20.0 - 1) * 100, "critical" if ppl > 100 else "important")
            yield Progress(layer + 1, 4, "ablation", phase="ablation", unit="layers")
        gate.wait()

    return run_ablation


def at(app, done: int) -> bool:
    """Whether the console has read a running job's progress of `done` (the last event before its gate)."""
    return any(job.done == done for job in app.state.running_jobs())


def detail_plain(app) -> str:
    """The text of the `d` screen on top."""
    return str(app.screen.query_one("#detail-screen").query_one("Static").render())


async def test_the_detail_knows_a_running_map(isolated_home, tiny_folder, monkeypatch) -> None:
    """While the map runs (rows 0 and 1 of 4 measured), `d` on layer 3 says the map runs, how far
    (`layers 2/4`), which layers it measured, and the Block Influence and angle the layer's row in
    the map shows; never "not measured yet (press a ...)". Layer 1's live row shows its proxies too;
    an open `d` screen follows the map to its end."""
    gate = Gate()
    monkeypatch.setattr("engine.experiments.ablation.run.run_ablation", half_a_map(gate))
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await gate.reached(pilot, "rows 0 and 1 measured")
        table = console_of(app).query_one(LayerMap)
        await pilot.press("down", "down", "down", "d")
        assert isinstance(app.screen, LayerDetailScreen)
        text = detail_plain(app)
        assert "not measured yet (press a" not in text
        assert "ablation: running, layers 2/4" in text
        assert "measured: layers 0-1 (2 of 4)" in text
        assert "this layer: not measured yet, the running map reaches it" in text
        row = [str(cell) for cell in table.get_row_at(3)]
        assert row[table.COLUMNS.index("BI")] == "0.062" and row[table.COLUMNS.index("ang")] == "0.050"
        assert "Block Influence  0.0625" in text and "angular distance  0.0500" in text  # what the row shows
        await pilot.press("escape", "up", "up")
        await pilot.pause()
        beside = str(console_of(app).query_one(LayerDetail).render())
        assert "Layer 1  important" in beside and "Block Influence  0.2500" in beside  # the live row's proxies
        assert "ablation: running, layers 2/4" in beside
        await pilot.press("d")  # open while the map ends: the screen follows it
        gate.release.set()
        await app.workers.wait_for_complete()
        await until(pilot, lambda: not app.state.running_jobs(), 30, "the map ended")
        await until(pilot, lambda: "running" not in detail_plain(app), 5, "the d screen redrawn")
        assert "Layer 1  important" in detail_plain(app)
        await pilot.press("escape")
        await pilot.pause()
        assert "running" not in str(console_of(app).query_one(LayerDetail).render())


async def test_at_80_columns_the_status_line_cuts_the_model_never_the_job(isolated_home, tiny_folder,
                                                                          monkeypatch) -> None:
    """A long session name and a running map at 80x24: the job reads whole (name, count, where it
    runs), and the model's description gives way."""
    gate = Gate()
    monkeypatch.setattr("engine.experiments.ablation.run.run_ablation", half_a_map(gate))
    name = "a-session-named-at-length-for-the-narrow-terminal"  # 49 characters
    app = tiny_app(tiny_folder, session=name)
    async with app.run_test(size=(80, 24)) as pilot:
        await gate.reached(pilot, "rows 0 and 1 measured")
        model = app.lab.model_status
        line = console_of(app).query_one(StatusLine)
        shown = "\n".join(strip.text for strip in line.render_lines(Region(0, 0, *line.size)))  # as on screen
        assert " ablation " in shown and "2/4 (in console)" in shown
        assert model not in shown  # the description gave way first
        gate.release.set()
        await app.workers.wait_for_complete()


def test_a_status_line_that_must_cut_cuts_the_description_first() -> None:
    """The description is cut to its last column while each job keeps its bar, count and place;
    narrower, the bars go, then the units; a job that does not fit the line goes on to the next."""
    jobs = [(JobView("j1", "ablation", done=12, total=30, unit="layers"), "in console"),
            (JobView("j2", "recovery", done=3, total=200, unit="steps", pid=7), "own process")]
    model = "smollm2-135m · cpu · float32 · 30 layers"
    full = " s  ablation ████······ layers 12/30 (in console) recovery ·········· steps 3/200 (own process)"
    assert status_text("s", model, jobs, 200).plain == f"{full}  {model}"
    assert status_text("s", model, jobs, len(full) + 10).plain == f"{full}  smollm2…"
    assert status_text("s", model, jobs, 90).plain.startswith(
        " s  ablation layers 12/30 (in console) recovery steps 3/200 (own process)")
    assert status_text("s", model, jobs, 70).plain.startswith(" s  ablation 12/30 (in console) recovery 3/200 (own")
    assert status_text("s", model, jobs, 40).plain.split("\n")[:2] == [" s  ablation 12/30 (in console)",
                                                                       " recovery 3/200 (own process)  smollm2-…"]


def streamed_in_console(folder, gate: Gate, at: int):
    """The real streamed map of `folder` (the console's own model ignored), waiting at `gate` once
    its wavefront has passed `at` layers."""
    real = ablation_run.run_ablation

    def run_ablation(model, tokenizer, settings, cancel=None, *args, **kwargs):
        opened = open_streamed(str(folder), device="cpu", dtype="float32")
        assert opened.stream is not None
        try:
            for event in real(opened.model, opened.tokenizer, AblationSettings(eval_set="paper"), cancel,
                              stream=opened.stream):
                yield event
                if isinstance(event, Progress) and event.phase == "streaming" and event.done == at:
                    gate.wait()
        finally:
            opened.stream.close()

    return run_ablation


def in_memory_map(folder) -> dict:
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    events = ablation_run.run_ablation(loaded.model, loaded.tokenizer, AblationSettings(eval_set="paper"))
    return [event for event in events if isinstance(event, Result)][-1].data


async def test_the_layer_map_shows_the_streamed_wavefront_live(isolated_home, tiny_folder, monkeypatch) -> None:
    """A streamed map stopped after 2 of 4 layers: the map's line says the layer read, the bytes
    and the rate; layer 2 is marked and `reading`, layers 0 and 1 `passed` with the Block
    Influence and angle the in-memory map measures for them, no D% yet; the detail says where the
    wavefront is. Released, every row gets its class and D%, and the mark goes."""
    want = {row["layer"]: row for row in in_memory_map(tiny_folder)["layers"]}
    gate = Gate()
    monkeypatch.setattr("engine.experiments.ablation.run.run_ablation", streamed_in_console(tiny_folder, gate, 2))
    app = tiny_app(tiny_folder)
    async with app.run_test(size=SIZE) as pilot:
        await gate.reached(pilot, "the wavefront past layer 1")
        screen = console_of(app)
        line = screen.query_one("#layers").border_subtitle or ""
        assert line.startswith("map in console: streaming: wavefront at layer 2, layers 2/4 passed (")
        assert " MB read, " in line and line.endswith(" GB/s) · c cancels")
        table = screen.query_one(LayerMap)
        rows = [[str(cell) for cell in table.get_row_at(index)] for index in range(4)]
        column = table.COLUMNS.index
        assert [row[column("class")] for row in rows] == ["passed", "passed", "reading", "?"]
        assert [row[column("L")] for row in rows] == ["0", "1", "2»", "3"]
        for index in (0, 1):
            assert rows[index][column("BI")] == f"{want[index]['block_influence']:.3f}"
            assert rows[index][column("ang")] == f"{want[index]['angular_distance']:.3f}"
            assert rows[index][column("D %")] == ""  # perplexities at the end
        assert rows[2][column("BI")] == "" and rows[3][column("BI")] == ""
        table.move_cursor(row=1)
        await pilot.pause(0.3)
        detail = str(screen.query_one(LayerDetail).render())
        assert "wavefront at layer 2" in detail and "this layer: passed, its perplexity comes at the end" in detail
        gate.release.set()
        await app.workers.wait_for_complete()
        await until(pilot, lambda: len(app.state.ablation) == 4 and not app.state.running_jobs(), 60)
        await pilot.pause()
        rows = [[str(cell) for cell in table.get_row_at(index)] for index in range(4)]
        assert [row[column("L")] for row in rows] == ["0", "1", "2", "3"]
        for index in range(4):
            assert rows[index][column("class")] == ("anti" if want[index]["anti"] else want[index]["layer_class"])
            assert rows[index][column("D %")] == f"{want[index]['degradation_pct']:+,.1f}"


def test_the_streamed_map_tells_each_layers_proxies_as_its_wavefront_passes(tmp_path) -> None:
    """One `ablation.layer_proxies` per layer, in order, each before the wavefront reads on (before
    its layer's progress), equal to the in-memory map's Block Influence and angle of that layer."""
    from tiny_models import save_tiny

    folder = save_tiny(tmp_path / "qwen2", "qwen2")
    want = in_memory_map(folder)["layers"]
    opened = open_streamed(str(folder), device="cpu", dtype="float32")
    assert opened.stream is not None
    events = list(ablation_run.run_ablation(opened.model, opened.tokenizer, AblationSettings(eval_set="paper"),
                                            stream=opened.stream))
    opened.stream.close()
    told = [(e.layer, e.n_layers) for e in events if isinstance(e, LayerProxies)]
    assert told == [(layer, 4) for layer in range(4)]
    order = [("proxies", e.layer) if isinstance(e, LayerProxies) else ("passed", e.done - 1) for e in events
             if isinstance(e, LayerProxies) or (isinstance(e, Progress) and e.phase == "streaming" and e.done)]
    assert order == [pair for layer in range(4) for pair in (("proxies", layer), ("passed", layer))]
    first_row = next(i for i, e in enumerate(events) if isinstance(e, LayerAblated))
    assert all(i < first_row for i, e in enumerate(events) if isinstance(e, LayerProxies))  # live, before any D
    for event in (e for e in events if isinstance(e, LayerProxies)):
        assert event.block_influence == pytest.approx(want[event.layer]["block_influence"], rel=1e-5)
        assert event.angular_distance == pytest.approx(want[event.layer]["angular_distance"], rel=1e-5)


def test_the_consoles_map_job_streams_when_its_plan_says_so(isolated_home, tiny_folder) -> None:
    """`b` starts the map as the command a user would type, with the console's model flags, its
    --max-memory too, and no --stream of its own: that command's plan streams the map by itself when
    the whole model does not fit the budget while the streamed map does (here 6 MiB: the in-memory
    plan needs about 10, the streamed one about 5), so the console sees its wavefront."""
    from cli.argv import job_argv
    from cli.main import main
    from engine.models.options import ModelOptions
    from sessions.store import SessionStore

    options = ModelOptions(str(tiny_folder), device="cpu", dtype="float32", max_memory="cpu=6MiB")
    argv = job_argv("ablation", AblationSettings(eval_set="paper"), options, "s", False)
    assert "--max-memory=cpu=6MiB" in argv and "--stream" not in argv
    assert main(argv[argv.index("run"):]) == 0
    events = SessionStore().open("s").events()
    assert [e.layer for e in events if isinstance(e, LayerProxies)] == [0, 1, 2, 3]
    assert any(isinstance(e, Progress) and e.phase == "streaming" for e in events)


def test_a_new_map_over_a_whole_one_counts_only_its_own_rows() -> None:
    """A session's whole map (6 layers) and a new map started over it: the detail counts only the
    rows the new map measured, says a layer still to come shows the previous map's row, and a layer
    its wavefront passed shows the new Block Influence, not the previous map's."""
    from tui_fixtures import ablation_doc

    from engine.core.events import Started
    from tui.state import SessionState
    from tui.widgets.layer_detail import layer_detail_text

    state = SessionState()
    state.set_result("ablation", ablation_doc())
    old = state.ablation[1].block_influence
    state.apply(Started("ablation", {}, job="j"))
    state.apply(Progress(1, 6, "streaming layer 1 of 6 (1.0 MB read, 0.5 GB/s)", phase="streaming", unit="layers",
                         job="j"))
    state.apply(LayerProxies(0, 6, 0.75, 0.4, job="j"))
    state.apply(LayerAblated(5, 6, 30.0, 20.0, 50.0, "important", job="j"))
    text = layer_detail_text(state, 1).plain
    assert "measured: layers 5 (1 of 6)" in text and "wavefront at layer 1" in text
    assert "this layer: the previous map's row below, until the running map measures it again" in text
    assert f"{old:.4f}" in text  # the previous map's row, as the map shows it
    assert state.proxy(0) == (0.75, 0.4) and "this layer: passed" in layer_detail_text(state, 0).plain
