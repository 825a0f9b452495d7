"""An atlas's measures, live (issue 32): each change of a measure's state is a `job.state` event of the
atlas's session, its job's own (start, progress, a cluster task's states, end) are in the session it
runs into; sessions/atlas.py AtlasWatch folds both (engine/atlas/tasks.py), reading only what the logs
gained, skipping what does not fit; the console's Compare view of an atlas's session shows them as
they change, before the atlas's table exists, and the curves once it does.

The serial atlas's states are checked in tests/test_atlas.py (its killed-and-resumed atlas), the
cluster's (queued, placed, running, retried, done) in tests/test_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.atlas.tasks import DETAIL_CHARS, TaskRow, counts
from engine.core.events import Finished, Progress, Started, TaskState
from sessions.atlas import AtlasWatch, atlas_tasks
from sessions.store import Session, SessionStore

A1, D1, A2, S2 = "m1|main|ablation", "m1|main|dynamics", "m2|main|ablation", "m2|seed-1|ablation"


def raw(session: Session, *lines: str) -> None:
    """Lines written into a session's log as they are (a forged or torn one too)."""
    with session.events_path.open("a", encoding="utf-8") as log:
        log.write("".join(lines))


def state(task: str, value: str, session: str = "", detail: str = "", since: int = 0) -> TaskState:
    return TaskState(value, detail, task, session, since)


def size(session: Session) -> int:
    return session.events_path.stat().st_size if session.events_path.exists() else 0


def by_task(rows: list[TaskRow]) -> dict[str, tuple[str, str]]:
    return {f"{r.model}|{r.variant}|{r.experiment}": (r.state, r.detail) for r in rows}


def test_the_states_of_an_atlas_folded_from_its_logs_as_they_grow():
    store = SessionStore()
    atlas = store.create("at", settings={"atlas": {"models": ["m1", "m2"]}})
    m1, m2 = store.create("at-m1", model="m1"), store.create("at-m2", model="m2")
    watch = AtlasWatch(store, "at")
    assert watch.tasks() == [] and watch.result() is None

    for task, member in ((A1, "at-m1"), (D1, "at-m1"), (A2, "at-m2"), (S2, "at-m2-seed-1")):
        atlas.append_event(state(task, "waiting", member))
    raw(atlas, "not json\n", "[1, 2]\n", '{"kind": "job.state", "task": 5, "state": "done"}\n',
        '{"kind": "job.state", "task": "m1|main", "state": "done"}\n',  # no experiment
        '{"kind": "job.state", "task": "m1|main|ablation", "state": "exploded"}\n',  # no such state
        '{"kind": "job.state", "task": "m1|main|ablation", "state": "done"')  # torn: no newline yet
    rows = watch.tasks()
    assert [f"{r.model}|{r.variant}|{r.experiment}" for r in rows] == [A1, D1, A2, S2]  # in the order written
    assert {r.state for r in rows} == {"waiting"} and rows[0].session == "at-m1"
    raw(atlas, "\n")  # the torn line ended by the next writer: it does not parse, and is skipped
    assert by_task(watch.tasks())[A1] == ("waiting", "")

    # a serial run: m1's ablation, into a session with an older ablation job (before `since`: not this one's)
    m1.append_event(Started(experiment="ablation", spec={}, job="old"))
    m1.append_event(Finished(status="failed", error="old", job="old"))
    atlas.append_event(state(A1, "running", "at-m1", "starting", since=size(m1)))
    atlas.append_event(state(D1, "running", "at-m1", "starting", since=size(m1)))
    assert by_task(watch.tasks())[A1] == ("running", "starting")
    m1.append_event(Started(experiment="dynamics", spec={}, job="d"))  # the other measure's job, same session
    m1.append_event(Started(experiment="ablation", spec={}, job="a"))
    m1.append_event(Progress(2, 4, "ablation", job="a"))
    m1.append_event(Progress(3, 9, "texts", job="d"))
    raw(m1, '{"kind": "job.progress", "job": "a", "done": "lots", "total": 4}\n', "{oops\n")
    got = by_task(watch.tasks())
    assert got[A1] == ("running", "ablation 2/4") and got[D1] == ("running", "texts 3/9")
    m1.append_event(Finished(status="done", job="a"))
    assert by_task(watch.tasks())[A1] == ("done", "")
    atlas.append_event(state(A1, "done", "at-m1"))
    m1.append_event(Finished(status="cancelled", job="d"))
    assert by_task(watch.tasks())[D1] == ("interrupted", "")

    # on a cluster: queued in the driver, then the task's own states; its worker dies, the retry finishes
    atlas.append_event(state(A2, "queued", "at-m2", "in the driver", since=size(m2)))
    assert by_task(watch.tasks())[A2] == ("queued", "in the driver")
    m2.append_event(Started(experiment="ablation", spec={}, job="t1"))
    m2.append_event(TaskState("queued", "1 GPU", job="t1"))
    assert by_task(watch.tasks())[A2] == ("queued", "1 GPU")
    m2.append_event(TaskState("placed", "node 0a1b2c3d (10.0.0.1) GPU 0, pid 7", job="t1"))
    assert by_task(watch.tasks())[A2] == ("placed", "node 0a1b2c3d (10.0.0.1) GPU 0, pid 7")
    m2.append_event(Finished(status="failed", error="TaskLost: its worker died", job="t1"))
    assert by_task(watch.tasks())[A2] == ("failed", "TaskLost: its worker died")
    m2.append_event(Started(experiment="ablation", spec={}, job="t2"))
    m2.append_event(TaskState("retried", "try 2 of 3: its worker died", job="t2"))
    assert by_task(watch.tasks())[A2] == ("retried", "try 2 of 3: its worker died")
    m2.append_event(TaskState("queued", "1 GPU", job="t2"))
    m2.append_event(TaskState("running", "ablation 1/4", job="t2"))
    assert by_task(watch.tasks())[A2] == ("running", "ablation 1/4 (try 2)")
    m2.append_event(TaskState("done", job="t2"))
    m2.append_event(Finished(status="done", job="t2"))
    atlas.append_event(state(A2, "done", "at-m2"))
    atlas.append_event(state(S2, "reused", "other", "from session other"))
    atlas.append_event(state(A1, "interrupted", "at-m1", "x" * 10_000))
    final = watch.tasks()
    got = by_task(final)
    assert got[A2] == ("done", "") and got[S2] == ("reused", "from session other")
    assert got[A1][0] == "interrupted" and len(got[A1][1]) == DETAIL_CHARS  # a forged megabyte stays one short line
    assert counts(final) == {"done": 1, "reused": 1, "interrupted": 2}
    assert atlas_tasks(store, "at") == final  # read at once from the start: the same


def test_nothing_in_the_folders_breaks_the_watch(tmp_path):
    store = SessionStore()
    atlas = store.create("at", settings={"atlas": {}})
    atlas.append_event(state(A1, "running", "../elsewhere", since=5))  # not a session name
    atlas.append_event(state(D1, "running", "at-none", since=-3))  # no such session
    atlas.append_event(state(A2, "running", "at", since=10**12))  # past the log's end
    raw(atlas, json.dumps({"kind": "job.state", "task": A1, "state": "running", "session": ["x"]}) + "\n")
    rows = atlas_tasks(store, "at")
    assert [r.state for r in rows] == ["running"] * 3 and rows[0].session == ""
    # an atlas from before its log held the states: its state file's finished steps
    old = store.create("old", settings={"atlas": {}})
    folder = old.checkpoint_dir("atlas")
    (folder / "state.json").write_text(json.dumps({"steps": {A1: {"session": "old-m1", "status": "run"},
                                                             A2: {"session": "x", "status": "reused"}, "bad": 3}}))
    assert by_task(atlas_tasks(store, "old")) == {A1: ("done", ""), A2: ("reused", "")}


def test_a_measure_whose_process_is_gone_reads_interrupted():
    """An atlas killed -9 writes no end: its measure's job file still says running, with the pid of a
    process that is gone (Session.jobs reads it interrupted), so the measure reads interrupted."""
    store = SessionStore()
    atlas, member = store.create("at", settings={"atlas": {}}), store.create("at-m1", model="m1")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    atlas.append_event(state(A1, "running", "at-m1", "starting"))
    member.append_event(Started(experiment="ablation", spec={}, job="a"))
    member.write_job("a", {"id": "a", "experiment": "ablation", "status": "running", "pid": os.getpid()})
    watch = AtlasWatch(store, "at")
    assert by_task(watch.tasks())[A1] == ("running", "started")  # its process (this one) is alive
    member.write_job("a", {"id": "a", "experiment": "ablation", "status": "running", "pid": gone.pid})
    watch.next_check = 0.0  # the next read checks the job files again (every JOB_CHECK_SECONDS)
    assert by_task(watch.tasks())[A1] == ("interrupted", "its process is gone")


def test_a_measure_that_fails_one_after_another_reads_failed(capsys):
    """A serial atlas stops at a measure that fails (here before any model loads); the measure reads
    failed with its run's exit code, the line on stderr as before."""
    from cli.main import main

    assert main(["atlas", "--models", "/no/such/model", "--name", "broken", "--measures", "map"]) == 2
    assert "atlas broken: ablation of /no/such/model failed (exit 2)" in capsys.readouterr().err
    assert atlas_tasks(SessionStore(), "broken") == [TaskRow("/no/such/model", "main", "ablation", "failed", "exit 2",
                                                             "broken-model")]


def test_an_atlas_session_in_the_console_loads_no_model_and_runs_nothing():
    """The console's lab on an atlas's session: no model (its status says so), and a map, a job or a
    generation is refused in one line instead of running a default model into the atlas."""
    from engine.models.options import ModelOptions
    from tui.lab import Lab
    from tui.lab_base import NO_MODEL_IN_AN_ATLAS

    store, said = SessionStore(), []
    store.create("at", settings={"atlas": {}})
    lab = Lab(store, ModelOptions(), model_explicit=False, tell=lambda text, level: said.append(text))
    lab.open("at")
    assert lab.atlas and "atlas" in lab.model_status
    assert lab.map_in_console() is None and lab.map_job() is None
    assert said == [NO_MODEL_IN_AN_ATLAS] * 2 and not store.open("at").jobs()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def wait_for(pilot, check, what: str) -> None:
    for _ in range(200):
        if check():
            return
        await pilot.pause(0.05)
    pytest.fail(f"the Compare view never showed {what}")


@pytest.mark.anyio
async def test_the_compare_view_of_an_atlas_shows_its_measures_live_then_its_curves(isolated_home):
    """The console opened on an atlas's session (no model of its own) opens its Compare view at
    once, before its table exists; a measure's progress and its end come in without reopening, and
    the curves when the atlas saves its table."""
    from textual.widgets import DataTable
    from tui_fixtures import atlas_session

    from engine.atlas import table as A
    from tui.app import AnatomyApp
    from tui.screens.compare import CompareScreen

    store = SessionStore()
    atlas = store.create("live", settings={"atlas": {"models": ["tiny-llama"]}})
    member = store.create("live-tiny-llama", model="tiny-llama")
    for task in ("tiny-llama|main|ablation", "tiny-llama|seed-1|ablation"):
        atlas.append_event(state(task, "waiting", "live-tiny-llama"))
    atlas.append_event(state("tiny-llama|main|ablation", "running", "live-tiny-llama", "starting", size(member)))
    app = AnatomyApp(session="live", load_model=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.rows, "itself")
        screen = app.screen
        assert isinstance(screen, CompareScreen)  # waited for above
        table = screen.query_one("#compare-tasks", DataTable)
        assert app.lab.loaded is None and "atlas" in app.lab.model_status
        assert [table.get_row_at(i)[3] for i in range(table.row_count)] == ["running", "waiting"]
        assert "the table comes when the atlas ends" in str(screen.query_one("#compare-note").render())
        assert not screen.query_one("#compare-plot").display

        member.append_event(Started(experiment="ablation", spec={}, job="j"))
        member.append_event(Progress(3, 4, "ablation", job="j"))
        await wait_for(pilot, lambda: table.get_row_at(0)[3:] == ["running", "ablation 3/4"], "the progress")
        member.append_event(Finished(status="done", job="j"))
        atlas.append_event(state("tiny-llama|main|ablation", "done", "live-tiny-llama"))
        await wait_for(pilot, lambda: table.get_row_at(0)[3] == "done", "the measure done")
        assert "Atlas live · 1 waiting, 1 done" in str(screen.query_one("#compare-title").render())
        await pilot.press("k")  # open already: not a second one
        assert len([s for s in app.screen_stack if isinstance(s, CompareScreen)]) == 1

        (atlas.path / "results").mkdir(exist_ok=True)
        (atlas.path / "results" / "atlas.json").write_text("{")  # a table that does not read: said, the rows stay
        note = screen.query_one("#compare-note")
        await wait_for(pilot, lambda: "damaged" in str(note.render()), "why the table does not read")
        assert table.row_count == 2 and not screen.query_one("#compare-plot").display
        done = atlas_session(store, "finished")  # an atlas's table, saved as the atlas saves it
        table_doc = done.load_result("atlas")
        assert table_doc is not None
        atlas.save_result("atlas", table_doc)
        await wait_for(pilot, lambda: screen.criteria == ["d_pct", "block_influence", "angular_distance",
                                                          "removal_ppl"], "the curves")
        assert screen.query_one("#compare-plot").display and not screen.query_one("#compare-note").display
        assert isinstance(screen.doc, A.AtlasDocument) and table.row_count == 2
        await pilot.press("n")
        assert screen.index == 1 and "block_influence (2/4)" in str(screen.query_one("#compare-title").render())
        await pilot.press("right", "right", "left")  # the arrows turn the criteria, not the measures' table
        assert screen.index == 2
