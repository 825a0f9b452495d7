"""A job the console starts is in its panel and the status line at once, as its own process (its pid
is known when it is spawned), then its first pass, then its curve; cancelling says so at once for
every job, also one still loading its model (issue 43)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import pytest
from test_lab import make_lab
from test_tui import SIZE, until
from tui_fixtures import dashboard_session, write_events

from engine.core.events import Progress, Started
from engine.core.process import process_identity
from engine.experiments.recovery.vocabulary import RecoveryPoint, RecoveryStart
from sessions.store import SessionStore
from tui.app import AnatomyApp
from tui.jobs import BackgroundJob, launch_job
from tui.lab import Lab
from tui.lab_jobs import STARTING
from tui.widgets.status_line import StatusLine


def recovery_job(lab: Lab, job_id: str, pid: int) -> None:
    """What a recovery job's process writes once its model is loaded: its job file, then its first events."""
    assert lab.session is not None
    lab.session.write_job(job_id, {"id": job_id, "experiment": "recovery", "status": "running", "started": 1.0,
                                   **process_identity(pid)})
    write_events(lab.session, [Started("recovery", {"layers": [3]}, job=job_id, t=1.0),
                               Progress(12, 48, "baseline", phase="baseline", unit="texts", job=job_id, t=1.0)])


# the policy, without a terminal -------------------------------------------------------------------------
def test_a_launched_job_is_its_own_process_in_its_panel_at_once_then_its_own_job(monkeypatch):
    lab, _, _ = make_lab(monkeypatch)
    assert lab.inject(3, 0.5, 10, 1e-3) is not None
    ((job, where),) = lab.running_jobs()
    assert (job.experiment, job.label, job.pid, where) == ("recovery", STARTING, 4242, "own process")
    (run,) = lab.state.recovery
    assert (run.job, run.layer, run.sigma, run.steps, run.lr) == (job.id, 3, 0.5, 10, 1e-3)
    recovery_job(lab, "recovery-1", os.getpid())
    assert lab.session is not None  # make_lab opens one
    lab.session.write_job("recovery-1", {**lab.session.jobs()["recovery-1"], "pid": 4242, "pgid": 4242})
    lab.next_reconcile = 10**9  # the fake pid is no live process: its job file is not judged here
    lab.poll()
    ((job, where),) = lab.running_jobs()
    assert (job.id, job.pid, where, job.label) == ("recovery-1", 4242, "own process", "baseline")
    assert [run.job for run in lab.state.recovery] == ["recovery-1"]  # the panel's run is the job's now
    write_events(lab.session, [RecoveryStart(3, 0, 90.0, 20.0, 10, job="recovery-1", t=2.0),
                               RecoveryPoint(3, 0, 0, None, 90.0, 4.5, 48, job="recovery-1", t=2.0)])
    lab.poll()
    (run,) = lab.state.recovery  # one run, the same one: its first point in
    assert run.points == [(0.0, 90.0)] and run.noised_ppl == 90.0


def test_a_job_of_another_process_is_never_said_to_run_in_the_console(monkeypatch):
    """A job whose job file is not read yet runs in the console only when the console runs one of
    its experiment (the status line said `in console` for 27 s of a job in its own process)."""
    lab, _, _ = make_lab(monkeypatch)
    write_events(lab.session, [Started("recovery", {}, job="recovery-7", t=1.0)])  # type: ignore[arg-type]
    lab.state.apply(Started("recovery", {}, job="recovery-7", t=1.0))
    assert lab.running_jobs()[0][1] == "own process"
    lab.cancels["recovery"] = object()  # type: ignore[assignment]  # the console runs one itself
    assert lab.running_jobs()[0][1] == "in console"


def test_a_job_that_ends_before_its_first_word_reads_failed_with_its_logs_last_line(monkeypatch, tmp_path):
    lab, console, _ = make_lab(monkeypatch)
    job = lab.inject(2, 0.5, 10, 1e-3)
    assert job is not None
    log = tmp_path / "recovery.log"
    log.write_text("loading smollm2-135m\nerror: out of memory in loading; try --dtype float16\n")
    job.log_path = log
    job.process.ended = True  # type: ignore[union-attr]  # the fake process ends
    lab.poll()
    assert lab.running_jobs() == []
    assert [run.status for run in lab.state.recovery] == ["failed"]
    assert console.said("recovery failed before it began: error: out of memory in loading", "error")


# the console, with Textual's pilot -----------------------------------------------------------------------
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


SLEEPER = """
import signal, sys, time
signal.signal(signal.SIGINT, lambda *_: (time.sleep(5), sys.exit(130)))
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def sleepers(monkeypatch) -> Iterator[list[BackgroundJob]]:
    """The console's jobs launched for real, as their own process group, each a process that waits
    (what a job does while its model loads) and, as a job does, takes a moment to stop on Ctrl-C;
    killed at the end."""
    started: list[BackgroundJob] = []

    def launch(session, experiment, argv):
        job = launch_job(session, experiment, [sys.executable, "-c", SLEEPER])
        started.append(job)
        return job

    monkeypatch.setattr("tui.lab_jobs.launch_job", launch)
    yield started
    for job in started:
        if job.process is not None and job.process.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.process.wait()


def info(app: AnatomyApp) -> str:
    return str(app.screen.query_one("#recovery-info").render())


def timeline(app: AnatomyApp) -> str:
    from tui.widgets.growth_timeline import GrowthTimeline

    return str(app.screen.query_one(GrowthTimeline).render())


def status(app: AnatomyApp) -> str:
    return str(app.screen.query_one(StatusLine).render())


@pytest.mark.anyio
async def test_i_shows_the_job_starting_then_its_first_pass_then_its_curve(isolated_home, sleepers) -> None:
    dashboard_session(SessionStore(), "map")
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: bool(app.screen.query("#recovery-info")), 30, "the panes built")
        await pilot.press("down", "down", "down", "f3", "i")
        await until(pilot, lambda: bool(sleepers), 30, "the job launched")
        await pilot.pause()
        assert "L3 σ=0.5" in info(app) and STARTING in info(app)  # at once, not "no run yet"
        assert "(own process)" in status(app) and "in console" not in status(app)
        recovery_job(app.lab, "recovery-1", sleepers[0].pid)
        await until(pilot, lambda: "baseline: texts 12/48" in info(app), 30, "the first pass in the panel")
        assert "(own process)" in status(app)
        write_events(app.lab.session, [RecoveryStart(3, 0, 90.0, 20.0, 10, job="recovery-1", t=2.0),  # type: ignore[arg-type]
                                       RecoveryPoint(3, 0, 0, None, 90.0, 4.5, 48, job="recovery-1", t=2.0)])
        await until(pilot, lambda: "step 0: ppl 90.00" in info(app), 30, "the curve's first point")
        await pilot.press("c")  # the job file proves the process: SIGINT to its group
        await pilot.pause()
        assert "cancelling" in status(app) and "cancelling" in info(app)
        await until(pilot, lambda: not sleepers[0].alive(), 30, "the job stopped")


@pytest.mark.anyio
async def test_cancelling_a_job_still_loading_its_model_says_so_at_once(isolated_home, sleepers) -> None:
    """Before its job file exists, `c` stops the process this console launched (its group), the
    panel and the status line say `cancelling` at once, and `cancelled` once it has ended."""
    dashboard_session(SessionStore(), "map")
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: bool(app.screen.query("#recovery-info")), 30, "the panes built")
        await pilot.press("down", "f3", "i")
        await until(pilot, lambda: bool(sleepers) and "ready" in sleepers[0].log_path.read_text(), 60,
                    "the job's process under way")
        await pilot.press("c")
        await pilot.pause()
        assert "cancelling" in status(app) and "cancelling" in info(app)
        await until(pilot, lambda: "cancelled" in info(app), 30, "the job read cancelled once it ended")
        assert "no jobs running" in status(app)


@pytest.mark.anyio
@pytest.mark.parametrize("key, tab, experiment", [("b", "f2", "ablation"), ("g", "f4", "growth")])
async def test_every_job_the_console_starts_is_shown_and_cancelled_at_once(isolated_home, sleepers, key, tab,
                                                                           experiment) -> None:
    dashboard_session(SessionStore(), "map")
    app = AnatomyApp(session="map", load_model=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: bool(app.screen.query("#recovery-info")), 30, "the panes built")
        await pilot.press(tab, key)
        await until(pilot, lambda: bool(sleepers) and "ready" in sleepers[0].log_path.read_text(), 60,
                    "the job's process under way")
        assert experiment in status(app) and "(own process)" in status(app)
        if experiment == "ablation":  # the layer map's own line
            assert "map own process: starting" in (app.screen.query_one("#layers").border_subtitle or "")
        else:  # the growth panel, not "no growth run in this session yet"
            await until(pilot, lambda: "starting its own process" in timeline(app), 15, "the growth panel says so")
        await pilot.press("c")
        await pilot.pause()
        assert "cancelling" in status(app)
        if experiment == "ablation":
            assert "cancelling" in (app.screen.query_one("#layers").border_subtitle or "")
        await until(pilot, lambda: "no jobs running" in status(app), 30, "the job ended")
        assert app.lab.state.jobs and all(job.status == "cancelled" for job in app.lab.state.jobs.values())

