"""Sessions on disk.

    $ANATOMY_TUI_HOME/<name>/manifest.json   schema version, model, settings, versions, times
                            events.jsonl     every event, appended and flushed line by line
                            results/<x>.json one document per finished experiment
                            jobs/<id>.json   each job's command, pid and status
                            checkpoints/     whatever a resumable job needs (safetensors + JSON)
                            app.log          the console's log file
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.atomic import atomic_write_json
from engine.events import Event, event_from_json, upgrade_result

MANIFEST_SCHEMA_VERSION = 1
log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_VERSIONED_PACKAGES = ("anatomy-tui", "torch", "transformers", "textual", "numpy", "scikit-learn")


class SessionError(Exception):
    """A session problem the user can fix; the message is one line that says how."""


def default_home() -> Path:
    """$ANATOMY_TUI_HOME, else the XDG data dir + anatomy-tui/sessions."""
    env = os.environ.get("ANATOMY_TUI_HOME")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "anatomy-tui" / "sessions"


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child counts as gone
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


@dataclass
class SessionInfo:
    """One row of `sessions list`; `damaged` holds the reason when the session cannot be read."""

    name: str
    path: Path
    model: str = ""
    created: float = 0.0
    updated: float = 0.0
    results: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    damaged: str = ""


class Session:
    """An open session directory."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def results_dir(self) -> Path:
        return self.path / "results"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    def checkpoint_dir(self, job: str) -> Path:
        folder = self.path / "checkpoints" / _checked_name(job)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    # manifest -----------------------------------------------------------------------------
    def update_manifest(self, **changes: Any) -> None:
        self.manifest.update(changes)
        self.manifest["updated"] = time.time()
        atomic_write_json(self.path / "manifest.json", self.manifest)

    # events -------------------------------------------------------------------------------
    def append_event(self, event: Event) -> None:
        """Appends one JSON line and flushes it, so a reader tailing the file sees it at once."""
        line = json.dumps(event.to_json(), allow_nan=False) + "\n"
        with open(self.events_path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()

    def read_event_docs(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Event JSON documents from byte `offset` on, and the offset to continue from.

        A last line still being written (no newline yet) is left for the next call; a line that
        does not parse (a torn write after a crash) is skipped. The documents are as written (any
        schema version); `read_events` decodes them.
        """
        if not self.events_path.exists():
            return [], offset
        with open(self.events_path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        docs = []
        for raw in data[:end].splitlines():
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if isinstance(doc, dict):
                docs.append(doc)
        return docs, offset + end

    def read_events(self, offset: int = 0) -> tuple[list[Event], int]:
        """Like `read_event_docs`, rebuilt as typed events (version 1 lines upgraded); a kind this
        version does not know, or a line that does not fit its class, is logged and skipped."""
        docs, end = self.read_event_docs(offset)
        events = []
        for doc in docs:
            try:
                events.append(event_from_json(doc))
            except (ValueError, TypeError) as exc:
                log.warning("skipped an event in %s: %s", self.events_path, exc)
        return events, end

    def events(self) -> list[Event]:
        return self.read_events(0)[0]

    # results ------------------------------------------------------------------------------
    def save_result(self, name: str, doc: dict[str, Any]) -> Path:
        path = self.results_dir / f"{_checked_name(name)}.json"
        atomic_write_json(path, doc)
        self.update_manifest()
        return path

    def load_result(self, name: str) -> dict[str, Any] | None:
        """The saved document, its rows in the current field names (a 0.1 session's are upgraded)."""
        path = self.results_dir / f"{_checked_name(name)}.json"
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SessionError(f"result {path} is damaged ({exc}); delete it and run again") from exc
        return upgrade_result(name, doc) if isinstance(doc, dict) else doc

    def result_names(self) -> list[str]:
        if not self.results_dir.exists():
            return []
        return sorted(p.stem for p in self.results_dir.glob("*.json"))

    # jobs ---------------------------------------------------------------------------------
    def write_job(self, job_id: str, doc: dict[str, Any]) -> None:
        atomic_write_json(self.path / "jobs" / f"{_checked_name(job_id)}.json", doc)

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Every job with its status; a 'running' job whose process is gone reads 'interrupted'."""
        folder = self.path / "jobs"
        found: dict[str, dict[str, Any]] = {}
        for path in sorted(folder.glob("*.json")) if folder.exists() else []:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if doc.get("status") == "running" and not pid_alive(doc.get("pid")):
                doc["status"] = "interrupted"
            found[path.stem] = doc
        return found


def _checked_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise SessionError(
            f"bad name {name!r}: use letters, digits, '.', '_' or '-' (no slashes), "
            "starting with a letter or digit"
        )
    return name


class SessionStore:
    """All sessions under one home folder."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = Path(home) if home is not None else default_home()

    def _path(self, name: str) -> Path:
        path = (self.home / _checked_name(name)).resolve()
        if path.parent != self.home.resolve():
            raise SessionError(f"session name {name!r} escapes {self.home}; pick a plain name")
        return path

    def exists(self, name: str) -> bool:
        return (self._path(name) / "manifest.json").exists()

    def create(self, name: str | None = None, model: str = "", settings: dict | None = None) -> Session:
        """A new session; the default name is a timestamp."""
        if name is None:
            name = time.strftime("%Y%m%d-%H%M%S")
            suffix = 1
            while self._path(name).exists():
                suffix += 1
                name = f"{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
        path = self._path(name)
        if (path / "manifest.json").exists():
            raise SessionError(f"session {name!r} already exists; open it or choose another name")
        (path / "results").mkdir(parents=True, exist_ok=True)
        now = time.time()
        manifest = {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "name": name,
            "model": model,
            "settings": settings or {},
            "versions": package_versions(),
            "created": now,
            "updated": now,
        }
        atomic_write_json(path / "manifest.json", manifest)
        return Session(path, manifest)

    def open(self, name: str) -> Session:
        path = self._path(name)
        manifest_path = path / "manifest.json"
        if not manifest_path.exists():
            raise SessionError(f"no session {name!r} in {self.home}; see `anatomy-tui sessions list`")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SessionError(f"session {name!r} is damaged: manifest.json does not parse ({exc})") from exc
        if not isinstance(manifest, dict) or manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
            raise SessionError(f"session {name!r} is damaged: manifest.json has no schema_version 1")
        return Session(path, manifest)

    def open_or_create(self, name: str | None, model: str = "", settings: dict | None = None) -> Session:
        if name is not None and self.exists(name):
            return self.open(name)
        return self.create(name, model=model, settings=settings)

    def list(self) -> list[SessionInfo]:
        """Every session, newest first; unreadable ones are listed as damaged with the reason."""
        infos = []
        if not self.home.exists():
            return infos
        for path in self.home.iterdir():
            if not path.is_dir() or path.name.startswith("."):
                continue
            try:
                session = self.open(path.name)
            except SessionError as exc:
                infos.append(SessionInfo(path.name, path, damaged=str(exc)))
                continue
            jobs = session.jobs()
            damaged = ""
            for result in session.result_names():
                try:
                    session.load_result(result)
                except SessionError as exc:
                    damaged = str(exc)
            infos.append(
                SessionInfo(
                    name=path.name,
                    path=path,
                    model=str(session.manifest.get("model", "")),
                    created=float(session.manifest.get("created", 0.0)),
                    updated=float(session.manifest.get("updated", 0.0)),
                    results=session.result_names(),
                    running=[j for j, d in jobs.items() if d.get("status") == "running"],
                    interrupted=[j for j, d in jobs.items() if d.get("status") == "interrupted"],
                    damaged=damaged,
                )
            )
        infos.sort(key=lambda info: info.updated, reverse=True)
        return infos

    def most_recent(self) -> Session | None:
        for info in self.list():
            if not info.damaged:
                return self.open(info.name)
        return None
