"""Sessions on disk: the sessions folder (this module) and one session (sessions/session.py), whose
documents are read back typed by sessions/documents.py.

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
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.untrusted import MAX_SMALL_BYTES, has_control, printable
from engine.disk.atomic import atomic_write_json, is_no_space, locked, no_space, read_json
from engine.disk.session_layout import CHECKPOINTS, MANIFEST, RESULTS
from sessions.documents import (
    MANIFEST_SCHEMA_VERSION,
    Damaged,
    Manifest,
    SessionError,
    decode,
    reason,
)
from sessions.session import NAME_LIMIT, Session, _checked_name, _link_problem

__all__ = ["NAME_LIMIT", "Session", "SessionError", "SessionExists", "SessionInfo", "SessionStore", "default_home"]
_VERSIONED_PACKAGES = ("anatomy-tui", "torch", "transformers", "textual", "numpy", "scikit-learn")


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


def _unwritable(home: Path, where: Path, exc: OSError | None = None) -> str:
    """The one line for a sessions folder that cannot be written, saying why and what to do."""
    try:
        read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY) or (exc is not None and exc.errno == errno.EROFS)
    except OSError:
        read_only = False
    why = "on a read-only filesystem" if read_only else f"not writable ({reason(exc) if exc else 'permissions'})"
    return f"sessions folder {home} is {why}; make it writable or set ANATOMY_TUI_HOME to a folder you can write"



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

    def create(self, name: str | None = None, model: str = "", settings: dict[str, Any] | None = None) -> Session:
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
                f"session {name!r} is damaged: manifest.json does not parse ({reason(exc)})"
            ) from None
        try:
            decode(Manifest, manifest, f"session {name!r} is damaged: {MANIFEST}")
        except Damaged as exc:
            raise SessionError(f"{exc}; fix or delete it") from None
        return Session(path, manifest)

    def open_or_create(self, name: str | None, model: str = "", settings: dict[str, Any] | None = None
                       ) -> Session:
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
        infos: list[SessionInfo] = []
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
        jobs, header = session.job_records(), session.header
        results = session.results()
        session._check_events()
        return SessionInfo(
            name=session.name,
            path=session.path,
            model=header.model,
            created=header.created,
            updated=header.updated,
            results=sorted(results),
            running=[j for j, job in jobs.items() if job.status == "running"],
            interrupted=[j for j, job in jobs.items() if job.status == "interrupted"],
            stale=[j for j, job in jobs.items() if job.status == "stale"],
            damaged="; ".join(session.damage),
        )

    def most_recent(self) -> Session | None:
        """The newest session that opens (one with damaged parts opens with the rest)."""
        for info in self.list():
            if info.openable:
                return self.open(info.name)
        return None
