"""What every `anatomy-tui run` command shares: model and session flags, the progress display,
and writing the result document."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.atomic import atomic_write_json, check_writable_path
from engine.errors import UserError
from engine.events import Event, Finished, Message, Progress, Result
from sessions.jobs import run_job
from sessions.store import Session, SessionStore


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m (embedded default), a local HF folder, a .gguf file, or a hub id",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="default auto"
    )
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow a hub model's own code (off by default)"
    )


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session", default=None, help="session name (default: a new timestamped one)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the result here")


def add_text_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--eval-file", type=Path, default=None, help="UTF-8 file, one evaluation text per line")
    parser.add_argument("--train-file", type=Path, default=None, help="UTF-8 training text (default: built-in)")


def open_session(args: argparse.Namespace, settings: dict[str, Any]) -> Session:
    """The run's session, once every path the run will write is known to be writable (--json, the
    event log, the result file): a bad one costs one line now, not the result at the end."""
    check_outputs(args)
    store = SessionStore()
    model = getattr(args, "model", "")
    session = store.open_or_create(args.session, model=model, settings=settings)
    check_outputs(args, session)
    return session


def check_outputs(args: argparse.Namespace, session: Session | None = None) -> None:
    """Raises a one-line UserError for an output path that cannot be written (a device, directory,
    FIFO or socket; a missing or read-only folder): --json, and the session's files when given."""
    if getattr(args, "json", None) is not None:
        check_writable_path(args.json, "--json")
    if session is not None:
        session.check_writable(getattr(args, "experiment", None))


def load_model_from_args(args: argparse.Namespace):
    """Loads the model named by the flags, with a one-line status on stderr."""
    from engine.models import load_model

    def report(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    loaded = load_model(
        args.model,
        device=args.device,
        dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
        report=report,
    )
    report(f"model {loaded.name}: {loaded.n_layers} layers on {loaded.device} in {loaded.dtype_name}")
    return loaded


def prepare_run(
    args: argparse.Namespace, settings: Any, files: Iterable[tuple[Any, str]] = ()
) -> tuple[Session, Any, dict[str, Any]]:
    """Checks what can fail fast (settings, input files, the session name) before the slow model
    load, then loads the model; returns the session, the loaded model and the job's spec."""
    from dataclasses import asdict

    from engine.text import read_lines

    settings.validate()
    for path, what in files:
        if path:
            read_lines(path, what)
    session = open_session(args, asdict(settings))
    loaded = load_model_from_args(args)
    return session, loaded, {**asdict(settings), "model": loaded.describe()}


def drive(
    session: Session,
    experiment: str,
    spec: dict[str, Any],
    events: Iterable[Event],
    json_path: Path | None,
) -> Result | None:
    """Runs the experiment into the session with a rich progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    console = Console(stderr=True)
    with Bar(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=False,
    ) as bar:
        task = bar.add_task(experiment, total=None)

        def show(event: Event) -> None:
            if isinstance(event, Progress):
                bar.update(task, completed=event.done, total=event.total, description=event.label or experiment)
            elif isinstance(event, Message):
                bar.console.print(f"[{event.level}] {event.text}", markup=False, highlight=False)
            elif isinstance(event, Finished) and event.status != "done":
                bar.console.print(f"{experiment} {event.status} {event.error}".rstrip(), markup=False)

        result = run_job(session, experiment, spec, events, on_event=show)
    if result is not None and json_path is not None:
        try:
            atomic_write_json(json_path, result.data, "--json")
        except (OSError, UserError) as exc:
            raise UserError(f"{exc}; the result is kept in session {session.name} ({session.path})") from None
        console.print(f"wrote {json_path}", highlight=False)
    console.print(f"session {session.name}: {session.path}", highlight=False)
    return result


def print_json(doc: dict[str, Any]) -> None:
    print(json.dumps(doc, indent=2))


def comma_list(kind: type, what: str):
    """An argparse type for '1,3,9': a tuple of `kind`, with a one-line error naming the flag."""

    def parse(text: str) -> tuple:
        try:
            return tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: expected comma-separated values, not {text!r}") from None

    return parse
