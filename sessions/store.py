"""Sessions on disk.

    $ANATOMY_TUI_HOME/<name>/manifest.json   schema version, model, settings, versions, times
                            events.jsonl     every event, appended and flushed line by line
                            results/<x>.json one document per finished experiment
                            jobs/<id>.json   each job's command, pid and status
                            checkpoints/     whatever a resumable job needs (safetensors + JSON)
                            logs/            the output of jobs the console started
                            app.log          the console's log file
                            growth_models/   the growth run's final models
    (each part's name: engine/disk/session_layout.py)

Nothing in a session folder is trusted: every JSON document is read with bounds on its size and
nesting (engine.core.untrusted: a manifest or job file of at most 1 MiB, a result or an event line
of at most 64 MiB, 100 levels), every field read is checked (a bad one, or a name holding a control
character, is reported as the session's damage, one line each, and the rest stays usable),
nothing in it is read or written through a symbolic link (the session folder itself included:
engine.disk.atomic.unlinked, the one check, made by every read and write of the store and of
engine.disk.atomic below a session it opened), and a pid is signalled only with proof that it still
is the job that wrote it (engine.core.process).

The machine's faults: a sessions folder that is a file or cannot be written is one line
(`SessionStore.check_home`) before anything runs. A session appears whole or not at all (made in a
hidden folder and renamed into place: of two runs creating the same name, the first wins and the
other joins it). Several processes may write one session at once: each event is one locked append
(engine.disk.atomic.append_line, cut back on failure, so a full disk leaves no torn line), the manifest is
read, changed and written under a lock on the session folder, results and job files are atomic
renames. A result that cannot be written (a full disk) is kept elsewhere, under the temp folder if
nothing else has room, and the one-line error says where.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from engine.core.errors import UserError
from engine.core.events import Event, event_from_json, upgrade_result
from engine.core.process import identity_problem, pid_alive, valid_pid
from engine.core.untrusted import MAX_DOCUMENT_BYTES, MAX_SMALL_BYTES, DamagedJSON, has_control, loads, printable
from engine.disk.atomic import (
    append_line,
    atomic_write_json,
    guard,
    is_no_space,
    locked,
    no_space,
    open_unlinked,
    read_json,
    unlinked,
)
from engine.disk.session_layout import CHECKPOINTS, EVENTS, FOLDERS, JOBS, LOGS, MANIFEST, RESULTS

MANIFEST_SCHEMA_VERSION = 1
log = logging.getLogger(__name__)
NAME_LIMIT = 100  # characters in a session's (or a result's, a job's) name
_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_LIMIT - 1}}}$")
_VERSIONED_PACKAGES = ("anatomy-tui", "torch", "transformers", "textual", "numpy", "scikit-learn")
# interrupted: stopped by SIGTERM/SIGHUP (or its process died); resumed: a later --resume run finished it
JOB_STATUSES = frozenset({"running", "done", "failed", "cancelled", "interrupted", "resumed"})


class SessionError(Exception):
    """A session problem the user can fix; the message is one line that says how."""


class SessionExists(SessionError):
    """The session was there already (or another run made it first)."""


def default_home() -> Path:
    """$ANATOMY_TUI_HOME, else the XDG data dir + anatomy-tui/sessions."""
    env = os.environ.get("ANATOMY_TUI_HOME")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "anatomy-tui" / "sessions"


def package_versions() -> dict[str, str]:
    from importlib import metadata  # here: a session is created far less often than the console starts

    versions = {}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


# a name shown on a terminal: a newline, an escape sequence or a bidi override in a forged file is damage
_PLAIN_TEXT = (lambda v: isinstance(v, str) and not has_control(v), "a string without control characters")
_MANIFEST_FIELDS: dict[str, tuple[Any, str]] = {
    "name": _PLAIN_TEXT,
    "model": _PLAIN_TEXT,
    "created": (lambda v: _number(v) and v >= 0, "a time in seconds"),
    "updated": (lambda v: _number(v) and v >= 0, "a time in seconds"),
    "settings": (lambda v: isinstance(v, dict), "an object"),
    "versions": (lambda v: isinstance(v, dict), "an object"),
}
_JOB_FIELDS: dict[str, tuple[Any, str]] = {
    "id": _PLAIN_TEXT,
    "experiment": _PLAIN_TEXT,
    "status": (lambda v: v in JOB_STATUSES, f"one of {', '.join(sorted(JOB_STATUSES))}"),
    "pid": (valid_pid, "a process id"),
    "pgid": (valid_pid, "a process group id"),
    "start_time": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a tick count"),
    "cmdline": (_string_list, "a list of strings"),
    "argv": (_string_list, "a list of strings"),
    "spec": (lambda v: isinstance(v, dict), "an object"),
    "started": (lambda v: _number(v) and v >= 0, "a time in seconds"),
    "ended": (lambda v: _number(v) and v >= 0, "a time in seconds"),
    "error": (lambda v: isinstance(v, str), "a string"),
    "resumes": (lambda v: isinstance(v, str), "a job id"),
    "resumed_by": (lambda v: isinstance(v, str), "a job id"),
}


def _field_problem(doc: Any, fields: dict[str, tuple[Any, str]], required: tuple[str, ...]) -> str:
    """The first field of `doc` that is missing or of the wrong type or range, as a phrase."""
    if not isinstance(doc, dict):
        return f"is {_json_type(doc)}, not a JSON object"
    for key in required:
        if key not in doc:
            return f"has no {key!r}"
    for key, (check, what) in fields.items():
        if key in doc and not check(doc[key]):
            return f"field {key!r} must be {what}, not {_short(doc[key])}"
    return ""


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def result_problem(doc: Any) -> str:
    """Why a result document cannot be shown ("" when its shape is fine): an object whose
    'layers', where it has them, are per-layer rows (objects) or layer numbers (manipulate's)."""
    if not isinstance(doc, dict):
        return f"it is {_json_type(doc)}, not a JSON object"
    rows = doc.get("layers")
    indices = isinstance(rows, list) and all(isinstance(row, int) and not isinstance(row, bool) for row in rows)
    if rows is not None and not indices and not (isinstance(rows, list) and all(isinstance(row, dict) for row in rows)):
        return "its 'layers' is neither a list of objects nor of layer numbers"
    return ""


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _link_problem(path: Path) -> str:
    """Why the session folder is refused: an entry of it (any part, the console's too: tui/session_files.py)
    is a symbolic link; empty when none is."""
    for entry in sorted(path.iterdir()) if path.is_dir() else ():
        if entry.is_symlink():
            return f"{entry.name} is a symbolic link (sessions never follow links; replace it with a real one)"
    return ""


@dataclass
class SessionInfo:
    """One row of `sessions list`. `damaged` holds the reasons (one line) when anything in the
    session cannot be read; `openable` is False when the session itself cannot be opened (bad
    manifest, linked parts), True when it opens with what is readable."""

    name: str
    path: Path
    model: str = ""
    created: float = 0.0
    updated: float = 0.0
    results: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # 'running' in a file, but no process proves it
    damaged: str = ""
    openable: bool = True


class Session:
    """An open session directory."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        guard(path)  # from now on no read or write below it follows a symbolic link (engine.disk.atomic)
        self.manifest = manifest
        self.damage: list[str] = []  # one line per part that could not be read, for front ends to show

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def is_atlas(self) -> bool:
        """Whether `anatomy-tui atlas` made this session (sessions/atlas.py): its manifest's settings
        hold the atlas's spec; it has no model of its own."""
        settings = self.manifest.get("settings")
        return isinstance(settings, dict) and "atlas" in settings

    def part(self, *names: str) -> Path:
        """`path/names...`, refusing any link on the way (the session folder itself included): reads
        and writes never leave the session folder."""
        path = self.path.joinpath(*names)
        try:
            return unlinked(path, self.path)
        except UserError as exc:
            raise SessionError(str(exc)) from None

    def _note(self, reason: str) -> None:
        if reason not in self.damage:
            self.damage.append(reason)

    @property
    def results_dir(self) -> Path:
        return self.part(RESULTS)

    @property
    def events_path(self) -> Path:
        return self.part(EVENTS)

    @property
    def logs_dir(self) -> Path:
        return self.part(LOGS)

    def checkpoint_dir(self, job: str) -> Path:
        folder = self.part(CHECKPOINTS, _checked_name(job))
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def writable_part(self, name: str) -> Path | None:
        """`path/name` when a file can be written there, else None with the reason in `damage`."""
        from engine.disk.atomic import check_writable_path

        try:
            return check_writable_path(self.part(name), name)
        except (UserError, SessionError) as exc:
            self._note(str(exc))
            return None

    def check_writable(self, result: str | None = None) -> None:
        """Raises a one-line UserError unless the event log, the jobs folder and the result file
        `result` can be written: called before a run, so no computation is lost at its end."""
        from engine.disk.atomic import check_writable_path

        check_writable_path(self.events_path, f"session {self.name!r}: events.jsonl")
        for name in FOLDERS:
            folder = self.part(name)
            if folder.exists() and not folder.is_dir():
                raise UserError(f"session {self.name!r}: {folder} is not a folder; move it away")
        if result is not None:
            check_writable_path(self.part(RESULTS, f"{_checked_name(result)}.json"), f"session {self.name!r}: result")

    # manifest -----------------------------------------------------------------------------
    def update_manifest(self, **changes: Any) -> None:
        """Read, changed and written under the session folder's lock, so two runs updating it at
        once both keep their changes. A manifest gone or unreadable is written from this one."""
        self.path.mkdir(parents=True, exist_ok=True)  # a run that joined a session its maker discarded
        with locked(self.path):
            try:
                current = read_json(self.part(MANIFEST), limit=MAX_SMALL_BYTES)
            except (OSError, ValueError, UserError):
                current = None
            if not isinstance(current, dict) or _field_problem(current, _MANIFEST_FIELDS, ()):
                current = dict(self.manifest)
            current.update(changes)
            current["updated"] = time.time()
            atomic_write_json(self.part(MANIFEST), current, "manifest")
            self.manifest = current

    # events -------------------------------------------------------------------------------
    def append_event(self, event: Event) -> None:
        """Appends one JSON line in one locked write, so a reader tailing the file sees it at once
        and two writers never interleave. A torn last line (a killed writer) is ended first; a
        write that fails (a full disk) is cut back, leaving the log as it was (append_line)."""
        line = (json.dumps(event.to_json(), allow_nan=False) + "\n").encode("utf-8")
        path = self.events_path
        try:
            append_line(path, line)
        except UserError:
            raise UserError(f"session {self.name!r}: {path} is not a regular file; move it away") from None

    def read_event_bytes(self, offset: int = 0, limit: int | None = None) -> tuple[bytes, int]:
        """The whole lines of the event log from byte `offset` on (about `limit` bytes of them at
        most, but always a whole line when there is one), and the offset to continue from.

        A last line still being written (no newline yet) is left for the next call; a line longer
        than any event may be (MAX_DOCUMENT_BYTES) is skipped unread, logged. A log that cannot be
        read (a directory, a link) reads as empty and is noted in `damage`.
        """
        try:
            path = self.events_path
            if not path.exists():
                return b"", offset
            with open_unlinked(path) as handle:  # a directory, or a FIFO that would block the reader: refused
                handle.seek(offset)
                data = handle.read(-1 if limit is None else limit)
                while limit is not None and b"\n" not in data and (more := handle.read(limit)):
                    cut = more.find(b"\n")
                    if len(data) + (cut if cut >= 0 else len(more)) > MAX_DOCUMENT_BYTES:
                        return b"", self._past_line(handle, offset, more)
                    data += more  # a line longer than the limit: read on to its end
        except (OSError, SessionError, UserError) as exc:
            self._note(f"events.jsonl cannot be read ({_reason(exc)}); move it away to log new events")
            return b"", offset
        end = data.rfind(b"\n") + 1
        return data[:end], offset + end

    def _past_line(self, handle: BinaryIO, offset: int, chunk: bytes) -> int:
        """The offset after the line that starts at `offset`, its newline looked for from `chunk` (the
        bytes just read) on, nothing kept (logged as skipped); `offset` itself when the log ends
        first: a line still being written."""
        start = handle.tell() - len(chunk)
        while chunk:
            cut = chunk.find(b"\n")
            if cut >= 0:
                log.info("skipped the line at byte %d of %s: %d bytes, longer than an event may be",
                         offset, self.events_path, start + cut - offset)
                return start + cut + 1
            start += len(chunk)
            chunk = handle.read(1 << 20)
        return offset

    def read_event_docs(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Event JSON documents from byte `offset` on, and the offset to continue from
        (`read_event_bytes`); a line that does not parse (a torn write after a crash, one too large
        or too deeply nested: engine.core.untrusted) is logged and skipped, the other lines read.
        The documents are as written (any schema version); `read_events` decodes them."""
        data, end = self.read_event_bytes(offset)
        docs = []
        start = offset
        for raw in data.split(b"\n")[:-1]:
            try:
                doc = loads(raw)
            except DamagedJSON as exc:
                log.info("skipped the line at byte %d of %s: %s", start, self.events_path, exc)
                doc = None
            start += len(raw) + 1
            if isinstance(doc, dict):
                docs.append(doc)
        return docs, end

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
        """Writes `results/<name>.json`. If that cannot be written (it became a directory, the
        folder a link, the disk is full), the result goes to a spare file (`keep_spare`) and the
        one-line error says where: a finished computation is never lost."""
        path = self.path / RESULTS / f"{_checked_name(name)}.json"
        try:
            path = self.part(RESULTS, path.name)  # a linked result file is refused, its target untouched
            atomic_write_json(path, doc, f"result {name!r}")
        except (OSError, UserError, SessionError) as exc:
            spare = self.keep_spare(name, doc)
            if is_no_space(exc):
                raise UserError(no_space(path, f"kept the result at {spare}")) from None
            raise UserError(f"could not write {path} ({_reason(exc)}); the result is kept in {spare}") from None
        self.update_manifest()
        return path

    def keep_spare(self, name: str, doc: dict[str, Any]) -> Path | str:
        """Writes a result that cannot go to results/ to the first place with room: the session
        folder, else `<temp dir>/anatomy-tui-unsaved/`, else the working folder. Returns where it
        went, or a phrase saying that no place could take it."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        places = (self.path / f"unsaved-{name}-{stamp}.json",
                  Path(tempfile.gettempdir()) / "anatomy-tui-unsaved" / f"{self.name}-{name}-{stamp}.json",
                  Path.cwd() / f"anatomy-tui-unsaved-{self.name}-{name}-{stamp}.json")
        for spare in places:
            try:
                atomic_write_json(spare, doc, "spare result")
                return spare
            except (OSError, UserError) as exc:
                log.info("could not keep the result at %s: %s", spare, exc)  # the error line names where it went
        return "nowhere (no place had room: " + ", ".join(str(place.parent) for place in places) + ")"

    def load_result(self, name: str) -> dict[str, Any] | None:
        """The result document, None when there is none, or a one-line SessionError saying why
        it cannot be used (unreadable, not JSON, or the wrong shape). A 0.1 session's rows come back
        in the current field names."""
        path = self.path / RESULTS / f"{_checked_name(name)}.json"
        try:
            path = self.part(RESULTS, path.name)
            if not path.exists() and not path.is_symlink():
                return None
            doc = read_json(path)  # never through a link, never a FIFO, never too large or deep
        except (OSError, ValueError, SessionError, UserError) as exc:
            raise SessionError(f"result {path} is damaged ({_reason(exc)}); delete it and run again") from None
        problem = result_problem(doc)
        if problem:
            raise SessionError(f"result {path} is damaged: {problem}; delete it and run again")
        return upgrade_result(name, doc)

    def check(self) -> list[str]:
        """Reads every part (jobs, results, the event log) and returns `damage`: one line for each
        thing that cannot be used, so a front end can open the session and say what is missing."""
        self.jobs()
        self.results()
        self._check_events()
        return self.damage

    def _check_events(self) -> None:
        events = self.path / EVENTS
        if events.exists() and not events.is_file():
            self._note("events.jsonl is not a regular file; move it away to log new events")

    def results(self) -> dict[str, dict[str, Any]]:
        """Every readable result by name; each one that is not readable is noted in `damage`."""
        found = {}
        for name in self.result_names():
            try:
                doc = self.load_result(name)
            except SessionError as exc:
                self._note(str(exc))
                continue
            if doc is not None:
                found[name] = doc
        return found

    def results_named(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Those of the results `names` (an experiment's `reads`) that the session has, by name; one
        that is damaged is a SessionError."""
        found = {name: self.load_result(name) for name in names}
        return {name: doc for name, doc in found.items() if doc is not None}

    def result_names(self) -> list[str]:
        try:
            folder = self.results_dir
            if not folder.is_dir():
                return []
            return sorted(p.stem for p in folder.glob("*.json") if _NAME.match(p.stem))
        except (OSError, SessionError) as exc:
            self._note(f"results cannot be listed ({_reason(exc)})")
            return []

    # jobs ---------------------------------------------------------------------------------
    def write_job(self, job_id: str, doc: dict[str, Any]) -> None:
        atomic_write_json(self.part(JOBS, f"{_checked_name(job_id)}.json"), doc, "job file")

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Every valid job with its status. A 'running' job whose process is gone reads
        'interrupted'; one whose pid is alive but cannot be proven to be that job (pid reused,
        or the file does not record its identity) reads 'stale' and is never signalled. A job
        file that does not parse or has a bad field is left out and noted in `damage`."""
        found: dict[str, dict[str, Any]] = {}
        try:
            folder = self.part(JOBS)
            paths = sorted(p for p in folder.glob("*.json") if _NAME.match(p.stem)) if folder.is_dir() else []
        except (OSError, SessionError) as exc:
            self._note(f"jobs cannot be listed ({_reason(exc)})")
            return found
        for path in paths:
            try:
                doc = read_json(path, limit=MAX_SMALL_BYTES)  # never through a link, a FIFO, too large or deep
            except (OSError, ValueError, UserError) as exc:
                self._note(f"job file jobs/{path.name} is damaged ({_reason(exc)}); it is ignored")
                continue
            problem = _field_problem(doc, _JOB_FIELDS, ("status",))
            if problem:
                self._note(f"job file jobs/{path.name} {problem}; it is ignored")
                continue
            if doc["status"] == "running":
                if not pid_alive(doc.get("pid")):
                    doc["status"] = "interrupted"
                elif stale := identity_problem(doc):
                    doc["status"], doc["stale"] = "stale", stale
            found[path.stem] = doc
        return found


def _reason(exc: BaseException) -> str:
    """An exception as a short phrase for a one-line message."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _unwritable(home: Path, where: Path, exc: OSError | None = None) -> str:
    """The one line for a sessions folder that cannot be written, saying why and what to do."""
    try:
        read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY) or (exc is not None and exc.errno == errno.EROFS)
    except OSError:
        read_only = False
    why = "on a read-only filesystem" if read_only else f"not writable ({_reason(exc) if exc else 'permissions'})"
    return f"sessions folder {home} is {why}; make it writable or set ANATOMY_TUI_HOME to a folder you can write"


def _checked_name(name: str) -> str:
    if not _NAME.match(name or ""):
        shown = repr(name) if len(name or "") <= NAME_LIMIT else f"{name[:40]!r}... ({len(name)} characters)"
        raise SessionError(
            f"bad name {shown}: use at most {NAME_LIMIT} letters, digits, '.', '_' or '-' (no slashes), "
            "starting with a letter or digit"
        )
    return name


class SessionStore:
    """All sessions under one home folder."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = Path(home) if home is not None else default_home()

    def _path(self, name: str) -> Path:
        """The session's folder: the sessions folder (resolved: it may be a link) and the name, which
        is not resolved: a session folder that is a link is refused when it is opened."""
        home = self.home.resolve()
        path = Path(os.path.normpath(home / _checked_name(name)))
        if path.parent != home:
            raise SessionError(f"session name {name!r} escapes {self.home}; pick a plain name")
        return path

    def exists(self, name: str) -> bool:
        return (self._path(name) / MANIFEST).exists()

    def check_home(self, writing: bool = True) -> None:
        """A one-line SessionError when the sessions folder is a file, or (`writing`) cannot be
        written: a read-only folder or filesystem. Front ends call it before anything slow."""
        home = self.home
        where = home
        while not where.exists() and not where.is_symlink() and where != where.parent:
            where = where.parent
        if not where.is_dir():
            what = "is a file" if where == home else f"cannot be made: {where} is a file"
            raise SessionError(f"sessions folder {home} {what}, not a folder; move it away or set "
                               "ANATOMY_TUI_HOME to a folder")
        if not os.access(where, os.R_OK | os.X_OK):
            raise SessionError(f"sessions folder {home} cannot be read ({where} is not yours); set "
                               "ANATOMY_TUI_HOME to a folder you can read and write")
        if writing and not os.access(where, os.W_OK | os.X_OK):
            raise SessionError(_unwritable(home, where))

    def create(self, name: str | None = None, model: str = "", settings: dict | None = None) -> Session:
        """A new session; the default name is a timestamp. It is made whole in a hidden folder and
        renamed into place, so it never shows half made, and of two runs creating the same name
        the first wins: the other gets SessionExists (`open_or_create` then opens the winner's).
        A model name with a control character is refused: the manifest holds only names a terminal
        can show as they are."""
        if has_control(model):
            raise SessionError(f"model name '{printable(model)}' holds a control character (a newline, an escape); "
                               "give the model's plain name or path")
        self.check_home()
        stamp, suffix = time.strftime("%Y%m%d-%H%M%S"), 1
        chosen = name if name is not None else stamp
        while True:
            path = self._path(chosen)
            now = time.time()
            manifest = {
                "schema_version": MANIFEST_SCHEMA_VERSION,
                "name": chosen,
                "model": model,
                "settings": settings or {},
                "versions": package_versions(),
                "created": now,
                "updated": now,
            }
            if self._place(path, manifest):
                return Session(path, manifest)
            if name is not None:
                if not (path / MANIFEST).exists() and not path.is_symlink() and path.is_dir():
                    raise SessionExists(f"{path} exists but holds no session (no manifest.json); move it away "
                                        "or choose another name")
                raise SessionExists(f"session {name!r} already exists; open it or choose another name")
            suffix += 1
            chosen = f"{stamp}-{suffix}"

    def _place(self, path: Path, manifest: dict[str, Any]) -> bool:
        """Writes the session's first files in a hidden folder and renames it to `path`: True, or
        False when something is at `path` already (rename does not replace a folder with files)."""
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            staging = self.home / f".{path.name}.new-{secrets.token_hex(6)}"  # hidden: `list` skips it
            staging.mkdir()
        except OSError as exc:
            raise SessionError(_unwritable(self.home, self.home, exc)) from None
        try:
            (staging / RESULTS).mkdir()
            atomic_write_json(staging / MANIFEST, manifest, "manifest")
            os.rename(staging, path)
            return True
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                return False
            if is_no_space(exc):
                raise SessionError(no_space(self.home, "made no session")) from None
            raise SessionError(_unwritable(self.home, self.home, exc)) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def discard_unused(self, session: Session) -> bool:
        """Removes a session this process created that nothing was written to (a run that failed
        before it started): True when removed. A session with anything more than what `create`
        wrote (an event, a job, a result, another run's files) is left as it is."""
        path = session.path
        with contextlib.suppress(OSError):
            with locked(path):
                if set(os.listdir(path)) <= {MANIFEST, RESULTS, CHECKPOINTS} and not any(
                    entry.is_file() or entry.is_symlink() for part in (RESULTS, CHECKPOINTS) if (path / part).is_dir()
                    for entry in (path / part).rglob("*")
                ):
                    (path / MANIFEST).unlink()
                    shutil.rmtree(path / CHECKPOINTS, ignore_errors=True)  # empty folders only, checked above
                    (path / RESULTS).rmdir()
                    path.rmdir()
                    return True
        return False

    def open(self, name: str) -> Session:
        """The session, or a one-line SessionError when it cannot be opened: no manifest, one that
        does not parse or has a bad field, or a part of the folder that is a symbolic link."""
        path = self._path(name)
        manifest_path = path / MANIFEST
        if not manifest_path.exists() and not manifest_path.is_symlink():
            raise SessionError(f"no session {name!r} in {self.home}; see `anatomy-tui sessions list`")
        if path.is_symlink():
            raise SessionError(f"session {name!r} is refused: its folder is a symbolic link (to "
                               f"{os.path.realpath(path)}); sessions never follow links (move the real folder "
                               "into the sessions folder in its place)")
        linked = _link_problem(path)
        if linked:
            raise SessionError(f"session {name!r} is refused: {linked}")
        try:
            manifest = read_json(manifest_path, path, MAX_SMALL_BYTES)  # a FIFO would block every reader: refused
        except (OSError, ValueError, UserError) as exc:
            raise SessionError(
                f"session {name!r} is damaged: manifest.json does not parse ({_reason(exc)})"
            ) from None
        if not isinstance(manifest, dict) or manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
            raise SessionError(f"session {name!r} is damaged: manifest.json has no schema_version 1")
        problem = _field_problem(manifest, _MANIFEST_FIELDS, ())
        if problem:
            raise SessionError(f"session {name!r} is damaged: manifest.json {problem}; fix or delete it")
        return Session(path, manifest)

    def open_or_create(self, name: str | None, model: str = "", settings: dict | None = None) -> Session:
        """The session `name`, made if there is none; when another run makes it at the same time,
        the one it made (both runs then write into it)."""
        if name is not None and self.exists(name):
            return self.open(name)
        try:
            return self.create(name, model=model, settings=settings)
        except SessionExists:
            if name is None or not self.exists(name):
                raise
            return self.open(name)

    def list(self) -> list[SessionInfo]:
        """Every session, newest first; unreadable ones are listed as damaged with the reason."""
        infos = []
        if not self.home.exists():
            return infos
        self.check_home(writing=False)  # a file: one line (a read-only folder lists)
        for path in self.home.iterdir():
            if not path.is_dir() or path.name.startswith("."):
                continue
            try:
                session = self.open(path.name)
            except SessionError as exc:
                infos.append(SessionInfo(path.name, path, damaged=str(exc), openable=False))
                continue
            infos.append(self._info(session))
        infos.sort(key=lambda info: info.updated, reverse=True)
        return infos

    def _info(self, session: Session) -> SessionInfo:
        jobs = session.jobs()
        results = session.results()
        session._check_events()
        return SessionInfo(
            name=session.name,
            path=session.path,
            model=str(session.manifest.get("model", "")),
            created=float(session.manifest.get("created", 0.0)),
            updated=float(session.manifest.get("updated", 0.0)),
            results=sorted(results),
            running=[j for j, d in jobs.items() if d.get("status") == "running"],
            interrupted=[j for j, d in jobs.items() if d.get("status") == "interrupted"],
            stale=[j for j, d in jobs.items() if d.get("status") == "stale"],
            damaged="; ".join(session.damage),
        )

    def most_recent(self) -> Session | None:
        """The newest session that opens (one with damaged parts opens with the rest)."""
        for info in self.list():
            if info.openable:
                return self.open(info.name)
        return None
