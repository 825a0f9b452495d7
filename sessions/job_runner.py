"""Runs one experiment into a session: every event to the log, the result to results/, and the
job's status to jobs/, so any front end (or a later one) can follow and resume it."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from engine.events import Cancelled, Event, Finished, Result, Started
from engine.process import process_identity
from sessions.store import Session


def new_job_id(experiment: str) -> str:
    return f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


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
) -> Result | None:
    """Drains `events` into the session and returns the final Result (None if cancelled).

    The job file records the experiment's `settings` (Settings.to_dict()) and `model` options
    (ModelOptions.to_dict()) as data: a resume rebuilds its command from them, never from an argv.
    Exceptions from the experiment are logged as a `Finished(status="failed")` event and
    re-raised, so the caller decides how to show them.
    """
    job_id = job_id or new_job_id(experiment)
    job = {
        "id": job_id,
        "experiment": experiment,
        "spec": spec,
        "settings": settings,
        "model": model,
        "resume": resume,
        **process_identity(),  # pid, pgid, start time, command line: the proof a signal needs
        "status": "running",
        "started": time.time(),
    }
    session.write_job(job_id, job)

    def emit(event: Event) -> None:
        event = dataclasses.replace(event, job=job_id)
        session.append_event(event)
        if on_event is not None:
            on_event(event)

    emit(Started(experiment=experiment, spec=spec))
    result: Result | None = None
    status, error = "done", ""
    try:
        for event in events:
            emit(event)  # first: a result that cannot be saved below is still in the event log
            if isinstance(event, Result):
                session.save_result(event.name, event.data)
                result = event
    except (Cancelled, KeyboardInterrupt):
        status = "cancelled"
    except Exception as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        emit(Finished(status=status, error=error))
        session.write_job(job_id, {**job, "status": status, "error": error, "ended": time.time()})
    return result
