"""Runs one experiment into a session: every event to the log, the result to results/, and the
job's status to jobs/, so any front end (or a later one) can follow and resume it."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from engine.core.errors import UserError
from engine.core.events import Cancelled, Cancelling, CancelToken, Event, Finished, Result, Started
from engine.core.process import Stopped, process_identity
from engine.disk.atomic import is_no_space, no_space
from sessions.store import Session

log = logging.getLogger(__name__)

UNFINISHED = ("interrupted", "cancelled", "failed")  # a job that a --resume run may continue


_GIVEN: set[str] = set()  # the job ids this process gave out
_GIVING = threading.Lock()


def new_job_id(experiment: str) -> str:
    """`<experiment>-<time>-<pid>`; a second job of one process in the same second (a notebook's, the
    console's threads) gets `-2`, `-3` after it, so no job file is written over."""
    base = f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    with _GIVING:
        job_id, count = base, 1
        while job_id in _GIVEN:
            count += 1
            job_id = f"{base}-{count}"
        _GIVEN.add(job_id)
    return job_id


def started_at(doc: Mapping[str, Any]) -> float:
    """When the job of job file `doc` started (0 when its file does not say)."""
    try:
        return float(doc.get("started") or 0)
    except (TypeError, ValueError):
        return 0.0


def resumed_job(session: Session, experiment: str) -> str | None:
    """The job a --resume run of `experiment` continues: the newest job of that experiment in the
    session, when it did not finish (None when there is none or it finished)."""
    mine = [(job_id, job) for job_id, job in session.job_records().items() if job.experiment == experiment]
    if not mine:
        return None
    job_id, job = max(mine, key=lambda item: item[1].started)
    return job_id if job.status in UNFINISHED else None


def _mark_resumed(session: Session, job_id: Any, by: str) -> None:
    """The job `by` resumed, and the ones that job resumed in turn, now read 'resumed', so neither
    the console nor `sessions show` offers them again."""
    jobs, seen = session.jobs(), set()
    while isinstance(job_id, str) and job_id in jobs and job_id not in seen:
        seen.add(job_id)
        doc = jobs[job_id]
        if doc.get("status") in UNFINISHED:
            session.write_job(job_id, {**doc, "status": "resumed", "resumed_by": by})
        job_id = doc.get("resumes")


def run_job(
    session: Session,
    experiment: str,
    spec: dict[str, Any],
    events: Iterable[Event],
    job_id: str | None = None,
    on_event: Callable[[Event], None] | None = None,
    *,
    settings: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    resume: bool = False,
    cancel: CancelToken | None = None,
) -> Result | None:
    """Drains `events` into the session and returns the final Result (None if cancelled).

    The job file records the experiment's `settings` (Settings.to_dict()) and `model` options
    (ModelOptions.to_dict()) as data: a resume rebuilds its command from them, never from an argv;
    a `resume` records the job it continues (`resumes`), marked 'resumed' once this one is done.
    A full disk is one line (UserError): the log is left with whole lines, the Result (when the
    run got that far) kept where there was room and named, the job marked failed as far as the
    disk still allows. Exceptions from the experiment are logged as a `Finished(status="failed")`
    event and re-raised, so the caller decides how to show them; so is `Stopped` (SIGTERM, SIGHUP), after a
    `Finished(status="interrupted")` naming the signal: the caller exits with its code.
    With the run's `cancel` token, a cancel is logged at once (`Cancelling`, from the thread that
    cancels), before the run reaches its next check and ends as cancelled.
    """
    job_id = job_id or new_job_id(experiment)
    resumes = resumed_job(session, experiment) if resume else None
    job = {
        "id": job_id,
        "experiment": experiment,
        "spec": spec,
        "settings": settings,
        "model": model,
        "resume": resume,
        **({"resumes": resumes} if resumes else {}),
        **process_identity(),  # pid, pgid, start time, command line: the proof a signal needs
        "status": "running",
        "started": time.time(),
    }
    session.update_manifest()  # the session was used now (and a run that joined it keeps it whole)
    session.write_job(job_id, job)

    def emit(event: Event) -> None:
        event = dataclasses.replace(event, job=job_id)
        session.append_event(event)
        if on_event is not None:
            on_event(event)

    emit(Started(experiment=experiment, spec=spec))
    forget = cancel.on_cancel(lambda: emit(Cancelling())) if cancel is not None else None
    result: Result | None = None
    status, error = "done", ""
    try:
        for event in events:
            if isinstance(event, Result):
                result = event
                _keep(session, event, emit)
            else:
                emit(event)
    except Stopped as stop:  # resumable like a job that died, and the console offers it
        status, error = "interrupted", f"stopped by {stop.name}"
        _last_words(events, stop, lambda event: _keep(session, event, emit))
        raise
    except (Cancelled, KeyboardInterrupt) as stop:
        status = "cancelled"
        _last_words(events, stop, lambda event: _keep(session, event, emit))
    except Exception as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        if not is_no_space(exc):
            raise
        full = UserError(no_space(getattr(exc, "filename", None) or session.path,  # a checkpoint, the log
                                  f"the run stopped; what it wrote before is in {session.path}"))
        error = f"UserError: {full}"
        raise full from None
    finally:
        if forget is not None:
            forget()
        try:  # on a full disk these may fail too: as much as can be written
            emit(Finished(status=status, error=error))
        except (OSError, UserError) as exc:
            log.info("could not log the end of job %s: %s", job_id, exc)  # the error line says why
        try:
            session.write_job(job_id, {**job, "status": status, "error": error, "ended": time.time()})
        except (OSError, UserError) as exc:
            log.info("could not mark job %s %s: %s", job_id, status, exc)
    if resumes and status == "done":
        _mark_resumed(session, resumes, job_id)
    return result if status == "done" else None


def _last_words(events: Iterable[Event], stop: BaseException, keep: Callable[[Result], None]) -> None:
    """A stop that came between two of the run's events (while one was written) is passed into the
    run where it waits, so it can still hand over what it finished (the ablation map's partial
    Result), as it does when the stop reaches it in its own work; the Results it yields are kept,
    its other events dropped. A run that ended already (the stop came from inside it), or that is
    no generator, is left as it is."""
    if not inspect.isgenerator(events) or inspect.getgeneratorstate(events) != inspect.GEN_SUSPENDED:
        return
    try:
        event = events.throw(stop)
        while True:
            if isinstance(event, Result):
                keep(event)
            event = next(events)
    except (Exception, KeyboardInterrupt) as exc:  # the stop again (or the run's end): the stop goes on as it was
        if exc is not stop and not isinstance(exc, StopIteration):
            log.info("the run ended with %r after the stop %r", exc, stop)


def _keep(session: Session, event: Result, emit: Callable[[Event], None]) -> None:
    """The Result to the log, then to results/: when the log cannot take it (a full disk) it is
    still saved (or kept elsewhere by `save_result`), and the one line says where."""
    try:
        emit(event)  # first: a result that cannot be saved below is still in the event log
    except OSError as exc:
        if not is_no_space(exc):
            raise
        saved = session.save_result(event.name, event.data)  # a UserError naming the spare when this fails too
        raise UserError(no_space(session.events_path, f"kept the result at {saved}")) from None
    session.save_result(event.name, event.data)
