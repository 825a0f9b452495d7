"""`anatomy-tui run EXPERIMENT`: one path for every experiment of the registry.

Everything that can fail fast is checked before the slow model load: the settings, every input
file, the --json path, the session name (and, for --resume, that the session exists). The session
is created only once the model is loaded and the run starts, so a failed start leaves nothing
behind. A cancelled run exits 130, a user error 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.atomic import atomic_write_json, check_writable_path
from engine.errors import UserError
from engine.events import Event, Finished, Message, Progress, Result
from engine.options import ModelOptions
from engine.registry import Experiment, RunContext
from engine.settings import Settings
from sessions.jobs import run_job
from sessions.store import Session, SessionStore
from tui.flags import model_options_from_args, settings_from_args

CANCELLED = 130


def _inputs(session: Session | None, experiment: Experiment) -> dict[str, dict[str, Any]]:
    if session is None:
        return {}
    found = {name: session.load_result(name) for name in experiment.reads}
    return {name: doc for name, doc in found.items() if doc is not None}


def _report(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_command(experiment: Experiment, args: argparse.Namespace) -> int:
    settings = settings_from_args(experiment, args)
    options = model_options_from_args(args) if experiment.needs_model else None
    settings.check_inputs()
    if args.json is not None:
        check_writable_path(args.json, "--json")
    store = SessionStore()
    resume = bool(getattr(args, "resume", False))
    session: Session | None = None
    if resume:
        if args.session is None:
            raise UserError(f"--resume needs --session NAME, the session of the interrupted {experiment.name} run")
        session = store.open(args.session)
    elif args.session is not None and store.exists(args.session):  # exists() also checks the name
        session = store.open(args.session)
    if session is not None:
        session.check_writable(experiment.writes)  # the event log and the result file: one line now
    source = settings.inputs_from()
    inputs = _inputs(store.open(source) if source else session, experiment)

    loaded = None
    if options is not None:
        loaded = options.load(_report)
        _report(f"model {loaded.name}: {loaded.n_layers} layers on {loaded.device} in {loaded.dtype_name}")
    if session is None:
        session = store.create(args.session, model=options.model if options else "", settings=settings.to_dict())
    context = RunContext(
        model=loaded, checkpoint_dir=session.checkpoint_dir(experiment.name) if experiment.resumable else None,
        output_dir=session.path, resume=resume, inputs=inputs,
    )  # fmt: skip
    events = experiment.run(settings, context)
    result = drive(session, experiment.name, settings, options, loaded, events, args.json, resume)
    if result is None:
        again = f"; continue with: anatomy-tui run {experiment.name} --session {session.name} --resume"
        print(f"{experiment.name} cancelled{again if experiment.resumable else ''}", file=sys.stderr)
        return CANCELLED
    from tui.printers import print_result

    print_result(experiment.name, result.data)
    return 0


def drive(
    session: Session,
    experiment: str,
    settings: Settings,
    options: ModelOptions | None,
    loaded: Any,
    events: Iterable[Event],
    json_path: Path | None,
    resume: bool = False,
) -> Result | None:
    """Runs the experiment into the session with a rich progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    console = Console(stderr=True)
    spec = {**settings.to_dict(), "model": loaded.describe() if loaded is not None else None}
    with Bar(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=False,
    ) as bar:  # fmt: skip
        task = bar.add_task(experiment, total=None)

        def show(event: Event) -> None:
            if isinstance(event, Progress):
                bar.update(task, completed=event.done, total=event.total, description=event.label or experiment)
            elif isinstance(event, Message):
                bar.console.print(f"[{event.level}] {event.text}", markup=False, highlight=False)
            elif isinstance(event, Finished) and event.status != "done":
                bar.console.print(f"{experiment} {event.status} {event.error}".rstrip(), markup=False)

        result = run_job(
            session, experiment, spec, events, on_event=show, settings=settings.to_dict(),
            model=options.to_dict() if options is not None else None, resume=resume,
        )  # fmt: skip
    if result is not None and json_path is not None:
        try:
            atomic_write_json(json_path, result.data, "--json")
        except (OSError, UserError) as exc:
            raise UserError(f"{exc}; the result is kept in session {session.name} ({session.path})") from None
        console.print(f"wrote {json_path}", highlight=False)
    console.print(f"session {session.name}: {session.path}", highlight=False)
    return result
