"""Large sessions (issue 20, "Load held"): the event index (tui/event_index.py) reopens a session to
exactly the state a fold of every line gives, from far fewer lines; a forged or stale index changes
nothing; the Log tab pages back through the log (tui/log_pager.py); and a job writing events as
fast as it can, followed by the console, loses and reorders none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import cast

import pytest
from tui_fixtures import T0, ablation_doc, demo_session, write_events

from engine.core.events import Event, Finished, Message, Progress, Started
from engine.experiments.ablation.vocabulary import LayerAblated
from engine.experiments.growth.vocabulary import GrowthEval, GrowthStep
from engine.experiments.manipulate.vocabulary import TrialDone
from engine.experiments.recovery.vocabulary import RecoveryPoint, RecoveryStart
from engine.models.options import ModelOptions
from sessions.store import Session, SessionStore
from tui import event_index
from tui.lab import Lab
from tui.log_pager import LogPager
from tui.state import MAX_POINTS, SessionState

ROOT = Path(__file__).resolve().parent.parent


def long_history(rounds: int = 2) -> list[Event]:
    """Every kind the index treats apart, past every bound: curves thinned (more than MAX_POINTS
    points), more messages than the log panel keeps, progress, two growth runs (the second
    replaces the first's view), job ends, and a kind no panel draws."""
    events: list[Event] = []
    for r in range(rounds):
        job, growth = f"recovery-{r}", f"growth-{r}"
        events += [Started("recovery", {"sigma": 0.5, "lr": 1e-4, "steps": 900}, job=job, t=T0),
                   Started("growth", {}, job=growth, t=T0)]  # fmt: skip
        for layer in (1, 3):
            events.append(RecoveryStart(layer, 0, 80.0, 20.0, 900, job=job, t=T0))
            for step in range(900):
                ppl = float("nan") if step == 7 else 80.0 - step / 20  # a NaN point: no point, a line still
                events += [RecoveryPoint(layer, 0, step, 3.0, ppl, ppl / 20, job=job, t=T0 + step),
                           Progress(step, 900, f"layer {layer}", job=job, t=T0 + step),
                           GrowthStep("growth_100", 0, "x", step + 1, 900, 5.0 - step / 900, 1e3, 1e-3, 2,
                                      job=growth, t=T0),
                           TrialDone((1,), "mean", None, 30.0, 20.0, 50.0, "", job=job, t=T0)]  # fmt: skip
                if step % 3 == 0:
                    events.append(Message(f"r{r} layer {layer} step {step}", job=job, t=T0))
                if step % 50 == 0:
                    events.append(GrowthEval("growth_100", 0, "x", step + 1, 4.0 - step / 900, job=growth, t=T0))
        events += [LayerAblated(2, 6, 30.0, 20.0, 50.0, "important", job=job, t=T0),
                   Finished("done", job=job, t=T0), Finished("cancelled", job=growth, t=T0)]  # fmt: skip
    return events


def full_fold(session: Session) -> SessionState:
    """The straightforward state: the results, then every event of the log, in order, then the jobs'
    files (a job the log does not end, with no process: interrupted)."""
    state = SessionState()
    for name, doc in session.results().items():
        state.set_result(name, doc)
    for event in session.read_events(0)[0]:
        state.apply(event)
    state.follow_job_files(session.job_records())  # as the console does once it has read the log
    return state


def drawn(state: SessionState) -> dict:
    """Everything a panel can draw from (all but what is pending a redraw)."""
    return {key: value for key, value in vars(state).items() if key not in ("dirty", "new_log")}


def opened(name: str = "big") -> Lab:
    """A lab that opened session `name` and folded its whole log."""
    lab = Lab(SessionStore(), ModelOptions("tiny"))
    lab.open(name)
    before = -1
    while lab.offset != before:
        before = lab.offset
        lab.poll()
    return lab


def big_session(name: str = "big", rounds: int = 2) -> Session:
    session = SessionStore().create(name, model="tiny")
    session.save_result("ablation", ablation_doc())
    write_events(session, long_history(rounds))
    return session


def index_lines(session: Session) -> list[list[int]]:
    return json.loads(session.part("events.index.json").read_text())["lines"]


@pytest.mark.slow
def test_the_index_reopens_the_same_state_from_far_fewer_lines(isolated_home):
    session = big_session()
    expected = drawn(full_fold(session))
    assert MAX_POINTS / 2 < len(expected["recovery"][0].points) <= MAX_POINTS < 900  # the curves were thinned
    first = opened()
    assert drawn(first.state) == expected
    first.closing()  # writes the index up to the end
    n_lines = session.events_path.read_bytes().count(b"\n")
    assert len(index_lines(session)) < n_lines / 5
    again = Lab(SessionStore(), ModelOptions("tiny"))
    again.open("big")  # the index alone, nothing of the log read past it
    assert again.offset == session.events_path.stat().st_size
    assert drawn(again.state) == expected
    # the log goes on: the index and the new tail still fold to what every line gives
    write_events(session, long_history(1))
    assert drawn(opened().state) == drawn(full_fold(session))


def test_reading_is_bounded_per_poll_and_the_index_follows_the_log(isolated_home, monkeypatch):
    session = big_session(rounds=1)
    monkeypatch.setattr("tui.lab.READ_LIMIT", 100_000)
    monkeypatch.setattr("tui.lab.INDEX_EVERY", 300_000)
    lab = opened()
    assert lab.polls > session.events_path.stat().st_size / 100_000 - 1
    assert 0 < lab.indexed <= lab.offset  # written along the way, not only on quitting
    assert drawn(lab.state) == drawn(full_fold(session))


def forged_indexes(session: Session) -> dict[str, bytes]:
    """Index files that must not be used as they are, each with the reason."""
    good = json.loads(session.part("events.index.json").read_text())
    size = session.events_path.stat().st_size
    lines = good["lines"]

    def doc(**changes) -> bytes:
        return json.dumps({**good, **changes}).encode()

    return {
        "not JSON": b"\x00\xffnot json{",
        "a list": b"[1, 2, 3]",
        "deeply nested": b"[" * 100_000 + b"]" * 100_000,
        "another format": doc(format="anatomy-tui event index 99"),
        "covers past the end": doc(covers=size + 10),
        "covers a string": doc(covers="12"),
        "covers negative": doc(covers=-1),
        "a bool for a number": doc(lines=[[True, lines[0][1]], *lines[1:]]),
        "lines out of order": doc(lines=[lines[1], lines[0], *lines[2:]]),
        "lines overlapping": doc(lines=[[lines[0][0], lines[1][1]], *lines[1:]]),
        "a line not starting a line": doc(lines=[[lines[0][0] + 1, lines[0][1]], *lines[1:]]),
        "a line not ending a line": doc(lines=[[lines[0][0], lines[0][1] - 1], *lines[1:]]),
        "a huge number": doc(lines=[[0, 10**30]]),
        "the wrong hash": doc(sha256="0" * 64),
        "no hash": doc(sha256=None),
        "a line that is not a pair": doc(lines=[[1, 2, 3]]),
    }


@pytest.mark.slow
def test_a_forged_or_stale_index_is_not_used_and_never_crashes(isolated_home):
    session = big_session(rounds=1)
    expected = drawn(full_fold(session))
    opened().closing()
    index = session.part("events.index.json")
    for what, data in forged_indexes(session).items():
        index.write_bytes(data)
        lab = Lab(SessionStore(), ModelOptions("tiny"))
        lab.open("big")
        assert lab.offset == 0 and not lab.state.jobs and not lab.state.recovery, what  # not used: all read
    assert drawn(opened().state) == expected
    # a line the index uses rewritten (same length): noticed by the hash; one it does not use (a
    # superseded progress line) changes nothing the panels draw
    opened().closing()
    data = session.events_path.read_bytes()
    session.events_path.write_bytes(data.replace(b'"layer 3"', b'"layer 4"', 1))
    assert drawn(opened().state) == expected
    session.events_path.write_bytes(data.replace(b"layer 3 step 897", b"layer 3 step 8X7"))
    lab = Lab(SessionStore(), ModelOptions("tiny"))
    lab.open("big")
    assert lab.offset == 0
    assert drawn(opened().state) == drawn(full_fold(session))
    session.events_path.write_bytes(data)
    # the log cut short and written again: the index covers more than there is
    opened().closing()
    session.events_path.write_bytes(data[: data.index(b"\n", len(data) // 2) + 1] + b'{"v": 2, "kind": "job.mess')
    assert drawn(opened().state) == drawn(full_fold(session))
    # an index that is a folder: read past, and writing it again fails quietly
    index.unlink()
    index.mkdir()
    lab = opened()
    lab.closing()
    assert drawn(lab.state) == drawn(full_fold(session))


def test_an_index_with_a_matching_hash_can_only_select_lines_the_log_has(isolated_home):
    """A forger who recomputes the hash can choose which lines are folded, never what they say."""
    session = SessionStore().create("big", model="tiny")
    write_events(session, [Started("recovery", {}, job="r", t=T0), Message("said in the log", job="r", t=T0),
                           Finished("done", job="r", t=T0)])  # fmt: skip
    size = session.events_path.stat().st_size
    data = session.events_path.read_bytes()
    first = data.index(b"\n") + 1
    assert event_index.write(session, [(0, first)], size)  # only the Started line
    lab = Lab(SessionStore(), ModelOptions("tiny"))
    lab.open("big")
    assert list(lab.state.jobs) == ["r"] and not lab.state.log  # the message and the end were skipped, not made up
    assert lab.offset == size


FORGED = [
        {"v": 2, "kind": "job.started", "experiment": "recovery", "spec": "not an object", "job": "r"},
        {"v": 2, "kind": "recovery.point", "layer": [1], "repeat": 0, "step": "x", "train_loss": None,
         "eval_ppl": 3.0, "ratio_to_baseline": 1.0, "job": "r"},
        {"v": 2, "kind": "recovery.point", "layer": 1, "repeat": 0, "step": "x", "train_loss": None,
         "eval_ppl": 3.0, "ratio_to_baseline": 1.0, "job": "r"},
        {"v": 2, "kind": "recovery.layer", "layer": 1, "result": 5, "job": "r"},
        {"v": "2", "kind": "job.progress", "done": 1, "total": 2},
        {"v": 2, "kind": "growth.step", "arm": ["a"], "seed": 0, "phase": "x", "step": 1, "total_steps": 2,
         "train_loss": "low", "tokens_per_s": 1.0, "lr": 1.0, "n_layers": 1, "job": "g"},
        {"v": 2, "kind": "job.message", "text": {"no": "string"}, "job": 5},
        {"v": 2, "kind": "job.finished", "status": ["done"], "job": "r"},
    ]


def forged_session(lines: list[dict]) -> int:
    """Session "big" whose log is `lines` and a 50 000-deep JSON array; the log's size."""
    session = SessionStore().create("big", model="tiny")
    with open(session.events_path, "w") as log:
        log.writelines(json.dumps(doc) + "\n" for doc in lines)
        log.write("[" * 50_000 + "\n")
    return session.events_path.stat().st_size


def test_forged_event_lines_are_skipped_not_fatal(isolated_home):
    size = forged_session(FORGED)
    lab = opened()
    lab.closing()
    assert lab.offset == size  # read to the end: no line stopped the fold
    again = Lab(SessionStore(), ModelOptions("tiny"))
    again.open("big")  # and from the index written over them
    assert again.offset == size
    for state in (lab.state, again.state):  # every forged line skipped: no job, point, result or log line
        assert not state.jobs and not state.log and not state.results and not state.growth.train
        assert not state.recovery  # not even an empty run: a line that does not fit its class is not decoded
    assert LogPager(SessionStore().open("big"), size).older(1) == []  # the Log tab pages back: nothing to show


def test_forged_message_and_end_lines_are_skipped(isolated_home):
    size = forged_session(FORGED)
    lab = opened()
    assert lab.offset == size  # not fatal either way
    assert drawn(lab.state) == drawn(SessionState())


def test_the_log_tab_pages_back_through_every_line_in_order(isolated_home):
    session = SessionStore().create("big", model="tiny")
    events: list[Event] = [Started("recovery", {}, job="r", t=T0)]
    for n in range(1234):
        events.append(Message(f"seq {n}", job="r", t=T0))
        events += [Progress(n, 1234, "x" * 2000, job="r", t=T0)] * (n % 3)  # lines the pager reads past
    write_events(session, [*events, Finished("done", job="r", t=T0)])
    size = session.events_path.stat().st_size
    assert size > 2 * (1 << 20)  # more than one chunk read backwards
    pager = LogPager(session, size, page=100)
    pages = [pager.older(back) for back in range(1, 15)]
    assert pages[-1] == []  # past the start
    seen = [text for page in reversed(pages) for _, text in page]
    assert seen == [f"r: seq {n}" for n in range(1234)] + ["r done"]
    assert [len(page) for page in pages[:12]] == [100] * 12 and len(pages[12]) == 35
    assert pager.older(3) == pages[2]  # a page read once is kept


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_log_tab_shows_older_pages_on_demand(isolated_home):
    from textual.widgets import RichLog

    from tui.app import AnatomyApp
    from tui.screens.console import ConsoleScreen

    session = demo_session(SessionStore())
    write_events(session, [Message(f"old line {n}", job="r", t=T0) for n in range(800)])
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=(120, 40)) as pilot:
        view = app.screen.query_one("#log-view", RichLog)
        await pilot.press("f7")  # the Log tab: its view renders once shown
        for _ in range(100):
            await pilot.pause(0.05)
            if view.lines:
                break
        live = [str(line.text) for line in view.lines]
        assert live[-1] == "[info] r: old line 799"
        assert "[info] r: old line 0" not in "\n".join(live)  # beyond what the live view keeps
        await pilot.press("o")
        await pilot.pause()
        console = cast(ConsoleScreen, app.screen)
        assert console.active_tab == "log" and "page 1 back" in str(console.query_one("#log").border_title)
        await pilot.press("o", "o", "o", "o")
        await pilot.pause()
        text = "\n".join(str(line.text) for line in view.lines)
        assert "[info] r: old line 0" in text and "[info] r: old line 300" not in text
        await pilot.press("n", "n", "n", "n", "n")
        await pilot.pause()
        assert console.log_back == 0 and app.screen.query_one("#log").border_title == "Log"
        assert [str(line.text) for line in view.lines][-3:] == live[-3:]


SOAK_WRITER = """
import sys, time
from pathlib import Path
from engine.core.events import Message, Progress, Started, Finished
from sessions.store import SessionStore
session = SessionStore(Path(sys.argv[1])).open("soak")
session.append_event(Started("soak", {}, job="soak"))
seconds, n = float(sys.argv[2]), 0
end = time.time() + seconds
while time.time() < end:
    session.append_event(Progress(n, 0, "soak", job="soak") if n % 2 else Message(f"seq {n}", job="soak"))
    n += 1
session.append_event(Finished("done", job="soak"))
print(n)
"""


@pytest.mark.slow
def test_soak_a_job_writing_as_fast_as_it_can_loses_and_reorders_nothing(isolated_home, monkeypatch):
    """A job appends events as fast as it can for a few seconds while the console follows at its
    poll rate, its index written along the way: every sequence number reaches the state once, in
    order; the pager reads them all back in order; a reopened console agrees."""
    monkeypatch.setattr("tui.lab.INDEX_EVERY", 200_000)
    store = SessionStore()
    session = store.create("soak", model="tiny")
    lab = Lab(store, ModelOptions("tiny"))
    lab.open("soak")
    seen: list[int] = []
    fold = lab.keeper.fold

    def counting(span, event):
        if isinstance(event, Message | Progress) and event.job == "soak":
            seen.append(int(event.text.split()[1]) if isinstance(event, Message) else event.done)
        fold(span, event)

    lab.keeper.fold = counting  # type: ignore[method-assign]  # counts each event, then folds it
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen([sys.executable, "-c", SOAK_WRITER, str(store.home), "5"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    while writer.poll() is None:
        lab.poll()
        time.sleep(0.05)
    assert writer.stdout is not None  # stdout=PIPE
    written = int(writer.stdout.read())
    lab.poll()
    while lab.offset < session.events_path.stat().st_size:
        lab.poll()
    assert written > 1000
    assert seen == list(range(written))
    assert lab.state.jobs["soak"].status == "done" and lab.state.jobs["soak"].done == written - 1 - (written % 2 == 1)
    assert lab.state.log[-2] == ("info", f"soak: seq {written - 1 - (written - 1) % 2}")
    assert 0 < lab.indexed
    pager = LogPager(session, lab.offset, page=1000)
    pages = [pager.older(back) for back in range(1, written // 1000 + 3)]
    texts = [text for page in reversed(pages) for _, text in page]
    assert texts == [f"soak: seq {n}" for n in range(0, written, 2)] + ["soak done"]
    lab.closing()
    again = Lab(store, ModelOptions("tiny"))
    again.open("soak")
    assert drawn(again.state) == drawn(lab.state)


def footprint(*holders: object) -> dict[str, int]:
    """The length of every collection each object holds as an attribute: what grows if something
    keeps a line (a span, a number) for every event."""
    return {f"{type(holder).__name__}.{name}": len(value) for holder in holders for name, value in vars(holder).items()
            if isinstance(value, list | dict | set | deque | tuple)}  # fmt: skip


def test_what_the_console_keeps_while_it_follows_a_job_stays_bounded(isolated_home):
    """Issue 29's soak: following a job that writes messages and progress, the console's state, its
    line keeper and the lab hold collections of the same sizes after 3,000 more events as before them
    (the log panel's 500 lines, the job, its last progress line): nothing is kept per event."""
    store = SessionStore()
    session = store.create("soak", model="tiny")
    lab = Lab(store, ModelOptions("tiny"))
    lab.open("soak")
    session.append_event(Started("soak", {}, job="soak"))

    def burst(first: int) -> dict[str, int]:
        for n in range(first, first + 3000):
            session.append_event(Progress(n, 0, "soak", job="soak") if n % 2 else Message(f"seq {n}", job="soak"))
        while lab.offset < session.events_path.stat().st_size:
            lab.poll()
        return footprint(lab, lab.state, lab.keeper)

    before = burst(0)
    assert len(lab.state.log) == lab.state.log.maxlen  # full already: 1,500 messages for 500 lines
    assert burst(3000) == before
    assert lab.state.jobs["soak"].done == 5999 and lab.state.log[-1] == ("info", "soak: seq 5998")


def test_the_soak_benchmark_checks_its_numbers_in_constant_memory():
    """The soak's own harness once kept every number it saw in a list (about 40 bytes an event): that
    list was the 'console memory growth' of the 10-minute soak. It keeps a count and a flag now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "soak.py")
    assert spec is not None and spec.loader is not None  # a .py file's location always has a loader
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    sequence = soak.Sequence()
    for n in range(10_000):
        sequence.add(n)
    assert vars(sequence) == {"count": 10_000, "in_order": True}  # nothing per number
    sequence.add(10_001)  # 10,000 skipped
    sequence.add(10_002)
    assert vars(sequence) == {"count": 10_002, "in_order": False}
