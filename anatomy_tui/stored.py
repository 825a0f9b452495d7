"""The notebook API's view of a session of the store: its results (as RunResults), events and job
records, each read typed by the one reader (sessions/documents.py)."""

from __future__ import annotations

from pathlib import Path

from anatomy_tui.results import InputError, RunResult, one_line, typed
from engine import registry
from engine.core.events import Event
from sessions.documents import JobRecord
from sessions.store import Session as StoredSession
from sessions.store import SessionStore


class Session:
    """A session of the store (`$ANATOMY_TUI_HOME`, the console's and the CLI's): its results,
    events and jobs, read afresh at each access, so a run still going in the console shows as it
    goes."""

    def __init__(self, stored: StoredSession) -> None:
        self.stored = stored

    @property
    def name(self) -> str:
        return self.stored.name

    @property
    def path(self) -> Path:
        return self.stored.path

    @property
    def model(self) -> str:
        """The model the session was made with (its manifest's)."""
        return self.stored.header.model

    @property
    def results(self) -> dict[str, RunResult]:
        """Every readable result by name (results/<name>.json: the experiment's name, or
        ablation-proxies), typed; one that cannot be read is left out and said in `damage`."""
        writers = {row.writes: row.name for row in registry.EXPERIMENTS}
        found = {}
        for name, data in self.stored.results().items():
            try:
                found[name] = typed(writers.get(name, name), name, data, session=self.name)
            except InputError as exc:
                self.stored.damage.append(str(exc))
        return found

    def events(self, kind: str | None = None, job: str | None = None) -> list[Event]:
        """The event log, typed: all of it, or the events of one `kind` (`ablation.layer`) or of one
        experiment or family (`ablation`, `job`: every `ablation.*`), of one `job`. A line of the log
        that cannot be read (torn by a crash, too large or too deeply nested: engine/core/untrusted.py)
        is skipped and logged; the lines around it are read."""
        return [event for event in self.stored.events()
                if (kind is None or event.kind == kind or event.kind.startswith(kind + "."))
                and (job is None or event.job == job)]

    @property
    def jobs(self) -> dict[str, JobRecord]:
        """Each job's record by id: its experiment, settings, model and status (done, cancelled, ...)."""
        return self.stored.job_records()

    @property
    def damage(self) -> list[str]:
        """A line for each part of the session that could not be read."""
        return self.stored.damage

    def __repr__(self) -> str:
        return f"Session({self.name!r}: {', '.join(self.stored.result_names()) or 'no results'})"


def open_session(name: str) -> Session:
    """The session `name` of the store the console and `anatomy-tui sessions list` use
    (`$ANATOMY_TUI_HOME`); InputError when there is none or it cannot be opened."""
    with one_line():
        return Session(SessionStore().open(name))
