"""An open session folder (sessions/store.py finds, makes and lists them): its parts named and
guarded (nothing below it read or written through a link), the manifest updated under a lock, the
event log appended line by line and read back from an offset, results and job files written
atomically and read back as their dataclasses by sessions/documents.py, the one reader; a part that
cannot be read is one line in `damage`, and the rest stays usable."""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from engine.core.errors import UserError
from engine.core.events import Event, upgrade_result
from engine.core.process import identity_problem, pid_alive
from engine.core.untrusted import MAX_DOCUMENT_BYTES, MAX_SMALL_BYTES, DamagedJSON, loads
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
from sessions.documents import (
    Damaged,
    JobRecord,
    Manifest,
    SessionError,
    Typed,
    decode,
    read_event,
    read_result,
    reason,
    result_problem,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
NAME_LIMIT = 100  # characters in a session's (or a result's, a job's) name
NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_LIMIT - 1}}}$")


class Session:
    """An open session directory."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        guard(path)  # from now on no read or write below it follows a symbolic link (engine.disk.atomic)
        self.manifest = manifest  # as written (update_manifest changes it); `header` is it read typed
        self.damage: list[str] = []  # one line per part that could not be read, for front ends to show

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def header(self) -> Manifest:
        """The manifest as its dataclass (checked when the session was opened, and at each update)."""
        return decode(Manifest, self.manifest, f"session {self.name!r}: {MANIFEST}")

    @property
    def is_atlas(self) -> bool:
        """Whether `anatomy-tui atlas` made this session (sessions/atlas.py): its manifest's settings
        hold the atlas's spec; it has no model of its own."""
        return "atlas" in self.header.settings

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
                decode(Manifest, current, MANIFEST)
            except (Damaged, OSError, ValueError, UserError):
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
            self._note(f"events.jsonl cannot be read ({reason(exc)}); move it away to log new events")
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
        """Like `read_event_docs`, each line read as its event class by the one reader
        (sessions/documents.py `read_event`, version 1 lines upgraded); a line that does not parse,
        of a kind this version does not know or that does not fit its class is logged, naming the
        line and the field, and skipped."""
        data, end = self.read_event_bytes(offset)
        events, start = [], offset
        for raw in data.split(b"\n")[:-1]:
            try:
                events.append(read_event(raw, f"{self.events_path} at byte {start}"))
            except Damaged as exc:
                log.warning("skipped an event: %s", exc)
            start += len(raw) + 1
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
            raise UserError(f"could not write {path} ({reason(exc)}); the result is kept in {spare}") from None
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
            raise SessionError(f"result {path} is damaged ({reason(exc)}); delete it and run again") from None
        problem = result_problem(doc)
        if problem:
            raise SessionError(f"result {path} is damaged: {problem}; delete it and run again")
        return upgrade_result(name, doc)

    def result(self, name: str) -> Typed | None:
        """results/<name>.json as its class (sessions/documents.py `read_result`), None when there
        is none; a one-line `Damaged` naming the file and the field when it cannot be read as one."""
        path = self.path / RESULTS / f"{_checked_name(name)}.json"
        try:
            path = self.part(RESULTS, path.name)
        except SessionError as exc:
            raise Damaged(str(path), str(exc)) from None
        if not path.exists() and not path.is_symlink():
            return None
        return read_result(name, path, str(path))

    def typed_results(self) -> dict[str, Typed]:
        """Every result this version reads, as its class, by name; each one it cannot read (damaged,
        of another version, or written by no registered experiment) is a line in `damage`."""
        return self._each_result(self.result)

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
        """Every readable result by name, as written; each one that is not readable is noted in `damage`."""
        return self._each_result(self.load_result)

    def _each_result(self, read: Callable[[str], T | None]) -> dict[str, T]:
        found = {}
        for name in self.result_names():
            try:
                value = read(name)
            except SessionError as exc:
                self._note(str(exc))
                continue
            if value is not None:
                found[name] = value
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
            return sorted(p.stem for p in folder.glob("*.json") if NAME.match(p.stem))
        except (OSError, SessionError) as exc:
            self._note(f"results cannot be listed ({reason(exc)})")
            return []

    # jobs ---------------------------------------------------------------------------------
    def write_job(self, job_id: str, doc: dict[str, Any]) -> None:
        atomic_write_json(self.part(JOBS, f"{_checked_name(job_id)}.json"), doc, "job file")

    def job_records(self) -> dict[str, JobRecord]:
        """Every valid job as its record (sessions/documents.py), its status as `jobs` finds it."""
        return {job_id: decode(JobRecord, doc, f"job file {JOBS}/{job_id}.json") for job_id, doc in self.jobs().items()}

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Every valid job as its file has it (`sessions show --json` prints it), with its status. A
        'running' job whose process is gone reads 'interrupted'; one whose pid is alive but cannot
        be proven to be that job (pid reused, or the file does not record its identity) reads
        'stale' and is never signalled. A job file that does not parse or does not fit `JobRecord`
        (sessions/documents.py) is left out and noted in `damage`, naming the file and the field."""
        found: dict[str, dict[str, Any]] = {}
        try:
            folder = self.part(JOBS)
            paths = sorted(p for p in folder.glob("*.json") if NAME.match(p.stem)) if folder.is_dir() else []
        except (OSError, SessionError) as exc:
            self._note(f"jobs cannot be listed ({reason(exc)})")
            return found
        for path in paths:
            where = f"job file {JOBS}/{path.name}"
            try:
                doc = read_json(path, limit=MAX_SMALL_BYTES)  # never through a link, a FIFO, too large or deep
                record = decode(JobRecord, doc, where)  # the one check of its fields
            except Damaged as exc:
                self._note(f"{exc}; it is ignored")
                continue
            except (OSError, ValueError, UserError) as exc:
                self._note(f"{where} is damaged ({reason(exc)}); it is ignored")
                continue
            if record.status == "running":
                if not pid_alive(record.pid):
                    doc["status"] = "interrupted"
                elif stale := identity_problem(doc):
                    doc["status"], doc["stale"] = "stale", stale
            found[path.stem] = doc
        return found


def _checked_name(name: str) -> str:
    if not NAME.match(name or ""):
        shown = repr(name) if len(name or "") <= NAME_LIMIT else f"{name[:40]!r}... ({len(name)} characters)"
        raise SessionError(
            f"bad name {shown}: use at most {NAME_LIMIT} letters, digits, '.', '_' or '-' (no slashes), "
            "starting with a letter or digit"
        )
    return name


def _link_problem(path: Path) -> str:
    """Why the session folder is refused: an entry of it (any part, the console's too: tui/session_files.py)
    is a symbolic link; empty when none is."""
    for entry in sorted(path.iterdir()) if path.is_dir() else ():
        if entry.is_symlink():
            return f"{entry.name} is a symbolic link (sessions never follow links; replace it with a real one)"
    return ""
