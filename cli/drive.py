"""A run driven into its session (sessions/job_runner.py run_job): its progress shown, its --json
written, and a run stopped before its end said in one line with the command that continues it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cli.argv import job_argv, typed
from cli.progress import progress_display
from engine.core.errors import UserError
from engine.core.events import Event, Result
from engine.core.process import Stopped, say
from engine.core.settings import Settings
from engine.disk.atomic import atomic_write_json
from engine.models.options import ModelOptions
from engine.registry import Experiment
from sessions.job_runner import run_job
from sessions.store import Session

CANCELLED = 130


def drive(
    session: Session,
    experiment: str,
    settings: Settings,
    options: ModelOptions | None,
    loaded: Any,
    events: Iterable[Event],
    json_path: Path | None,
    resume: bool = False,
    memory: dict[str, Any] | None = None,
    progress_bar: bool = True,
) -> Result | None:
    """Runs the experiment into the session, its progress on stderr: on a terminal one line that
    updates (phase, count, time left at the measured rate), otherwise plain lines (`ProgressLines`);
    without `progress_bar`, only the events' own lines (a cluster's task states). `memory` is the
    memory plan, recorded in the job file with the model."""
    from rich.console import Console

    console = Console(stderr=True)
    spec = {**settings.to_dict(), "model": loaded.describe() if loaded is not None else None}
    if memory is not None:
        spec["memory_plan"] = memory
    job: dict[str, Any] = {"settings": settings.to_dict(), "model": options.to_dict() if options is not None else None,
           "resume": resume}
    kept: list[Result] = []  # a stopped run's partial Result (the ablation map's finished layers)

    def seen(event: Event, show: Callable[[Event], None] | None = None) -> None:
        if isinstance(event, Result):
            kept.append(event)
        if show is not None:
            show(event)

    try:
        if not progress_bar:
            result = run_job(session, experiment, spec, events, on_event=seen, **job)
        else:
            with progress_display(console, experiment) as show:
                result = run_job(session, experiment, spec, events, on_event=functools.partial(seen, show=show), **job)
    except Stopped:
        _print_partial(experiment, kept)
        raise
    if result is None:
        _print_partial(experiment, kept)
    if result is not None and json_path is not None:
        try:
            atomic_write_json(json_path, result.data, "--json")
        except (OSError, UserError) as exc:
            raise UserError(f"{exc}; the result is kept in session {session.name} ({session.path})") from None
        console.print(f"wrote {json_path}", highlight=False)
    console.print(f"session {session.name}: {session.path}", highlight=False)
    return result


def _print_partial(experiment: str, kept: list[Result]) -> None:
    """What a stopped run handed over before it stopped (kept in the session too), printed as its
    result is (the ablation map says `partial: 12 of 30 layers`)."""
    if kept:
        from cli.printers import print_result

        print_result(experiment, kept[-1].data)


def stopped(experiment: Experiment, settings: Settings, options: ModelOptions | None, session: Session,
             what: str, code: int, cluster: str | None = None) -> int:
    """One line for a run stopped before its end: what stopped it and, where it resumes from its
    checkpoint, the exact command that continues it (the settings as flags, as the console offers it;
    on the cluster it ran on)."""
    line = f"{experiment.name} {what}"
    if experiment.resumable:
        argv = job_argv(experiment.name, settings, options, session.name, resume=True, cluster=cluster)
        line += f"; continue with: {typed(argv)}"
    say(line)
    return code
