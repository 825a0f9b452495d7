"""The one reader of a session's documents: the manifest, a job record, an event line and a result
come back as their dataclasses (`Manifest`, `JobRecord`, the event's class, the result's class), read
with bounds (engine.core.untrusted `loads`, through engine.disk.atomic `read_json`) and checked field
by field (engine.core.codec `from_doc`). A document that does not fit is `Damaged`: one line that
names the file and the field, so a front end says which file to fix and what is wrong in it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union

from engine.core.codec import ABSENT, FieldError, from_doc
from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, event_from_json, result_class, upgrade_result
from engine.core.process import valid_pid
from engine.core.untrusted import MAX_DOCUMENT_BYTES, has_control, loads
from engine.disk.atomic import read_json

T = TypeVar("T")
if TYPE_CHECKING:
    from engine.atlas.table import AtlasDocument
Typed = Union[ResultDocument, "AtlasDocument"]  # what a results/<name>.json reads back as
ATLAS_RESULT = "atlas"  # results/atlas.json: an atlas session's table (sessions/atlas.py)
MANIFEST_SCHEMA_VERSION = 1
# interrupted: stopped by SIGTERM/SIGHUP (or its process died); resumed: a later --resume run finished it
JOB_STATUSES = frozenset({"running", "done", "failed", "cancelled", "interrupted", "resumed"})


class SessionError(Exception):
    """A session problem the user can fix; the message is one line that says how."""


class Damaged(SessionError):
    """A document of a session that cannot be used: `where` (the file, or the file and the line)
    and why, naming the field; one line."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


def _plain(name: str, value: Any) -> None:
    """A name shown on a terminal: a newline, an escape sequence or a bidi override in a forged
    file is damage."""
    if not isinstance(value, str) or has_control(value):
        raise ValueError(f"field {name!r} must be a string without control characters, not {_short(value)}")


def _time(name: str, value: Any) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0):
        raise ValueError(f"field {name!r} must be a time in seconds, not {_short(value)}")


def _not_null(document: Any, *names: str) -> None:
    """A field a document has must hold a value: null (which `from_doc` lets through, a NaN's
    spelling) is no pid, time or list."""
    for name in names:
        if getattr(document, name) is None:
            raise ValueError(f"field {name!r} must not be null")


@dataclass(frozen=True)
class Manifest:
    """manifest.json: what the session is of (its model, the settings it was made with: an atlas's
    spec), the versions that made it and when."""

    schema_version: int
    name: str = ""
    model: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.schema_version != MANIFEST_SCHEMA_VERSION:
            raise ValueError(f"field 'schema_version' must be {MANIFEST_SCHEMA_VERSION}, "
                             f"not {_short(self.schema_version)}")
        _not_null(self, "settings", "versions")
        _plain("name", self.name)
        _plain("model", self.model)
        _time("created", self.created)
        _time("updated", self.updated)


@dataclass(frozen=True)
class JobRecord:
    """jobs/<id>.json: one run, as sessions/job_runner.py writes it: its experiment, the settings
    and model it ran with (resume reads these, never an old argv), the proof of its process
    (engine.core.process: pid, group, start tick, command line; ABSENT in a file that records none)
    and how it ended. `stale` is the store's finding (a 'running' pid that is no longer this job),
    never written."""

    status: str
    id: str = ""
    experiment: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    resume: bool = False
    resumes: str = ""
    resumed_by: str = ""
    pid: int = ABSENT
    pgid: int = ABSENT
    start_time: int = ABSENT
    cmdline: list[str] = ABSENT
    argv: list[str] = ABSENT
    started: float = 0.0
    ended: float = ABSENT
    error: str = ""
    stale: str = ""

    def __post_init__(self) -> None:
        if self.status not in JOB_STATUSES and not (self.status == "stale" and self.stale):  # the store's finding
            statuses = ", ".join(sorted(JOB_STATUSES))
            raise ValueError(f"field 'status' must be one of {statuses}, not {_short(self.status)}")
        _not_null(self, "spec", "resumes", "resumed_by", "pid", "pgid", "start_time", "cmdline", "argv", "error")
        _plain("id", self.id)
        _plain("experiment", self.experiment)
        for name in ("pid", "pgid"):
            value = getattr(self, name)
            if value is not ABSENT and not valid_pid(value):
                raise ValueError(f"field {name!r} must be a process id, not {_short(value)}")
        if self.start_time is not ABSENT and self.start_time < 0:
            raise ValueError(f"field 'start_time' must be a tick count, not {_short(self.start_time)}")
        _time("started", self.started)
        if self.ended is not ABSENT:
            _time("ended", self.ended)


def decode(cls: type[T], doc: Any, where: str) -> T:
    """`doc` read as dataclass `cls`, or `Damaged` naming `where` and the field that does not fit:
    one missing or of the wrong type (`from_doc`: `layers.ppl` for a row's), or out of its range
    (the class's own checks, whose message names the field)."""
    if not isinstance(doc, Mapping):
        raise Damaged(where, f"is {_json_type(doc)}, not a JSON object")
    try:
        return from_doc(cls, doc)
    except (TypeError, ValueError, KeyError) as exc:
        raise _damaged(where, exc) from None


def _damaged(where: str, exc: Exception) -> Damaged:
    """Why a document does not fit its class, in one line that names the field."""
    if isinstance(exc, FieldError):
        return Damaged(where, f"field {exc.field!r} is missing" if exc.why == "missing"
                       else f"field {exc.field!r}: {exc.why}")
    return Damaged(where, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def read_result(name: str, path: Path, where: str) -> Typed:
    """results/<name>.json as its class (`result_type`; a 0.1 session's fields renamed first), or
    `Damaged` naming the file and the field; a result no registered experiment writes is damage too."""
    try:
        doc = read_json(path, limit=MAX_DOCUMENT_BYTES)
    except (OSError, ValueError, UserError) as exc:
        raise Damaged(where, f"damaged ({reason(exc)}); delete it and run again") from None
    return typed_result(name, doc, where)


def typed_result(name: str, doc: Any, where: str) -> Typed:
    """Result document `doc` (as read from `where`: a file, a `job.result` event) as result `name`'s
    class (a 0.1 session's fields renamed first), or `Damaged` naming `where` and the field."""
    cls = result_type(name)
    if cls is None:
        raise Damaged(where, f"no experiment of this version writes a result named {name!r}")
    return decode(cls, upgrade_result(name, dict(doc)) if isinstance(doc, Mapping) else doc, where)


def result_type(name: str) -> type[Typed] | None:
    """The class of results/<name>.json: an experiment's result document (engine.core.events
    `result_class`), or an atlas session's table (engine.atlas.table, read only here and in the
    atlas's own code)."""
    if name == ATLAS_RESULT:
        from engine.atlas.table import AtlasDocument  # an atlas session's only: its vocabularies stay unimported

        return AtlasDocument
    return result_class(name)


def read_event(line: bytes | str, where: str) -> Event:
    """One line of events.jsonl as its event class (any schema version), or `Damaged` naming the
    line and the field."""
    try:
        doc = loads(line)
    except ValueError as exc:
        raise Damaged(where, str(exc)) from None
    if not isinstance(doc, Mapping):
        raise Damaged(where, f"is {_json_type(doc)}, not a JSON object")
    if not isinstance(doc.get("kind"), str):
        raise Damaged(where, "field 'kind' is missing")
    try:
        return event_from_json(dict(doc))
    except (TypeError, ValueError, KeyError) as exc:
        raise _damaged(where, exc) from None


def result_problem(doc: Any) -> str:
    """Why a result document cannot be shown at all ("" when its shape is fine): an object whose
    'layers', where it has them, are per-layer rows (objects) or layer numbers (manipulate's).
    A result of another version that fits this shape is kept as written (`Session.load_result`)."""
    if not isinstance(doc, Mapping):
        return f"it is {_json_type(doc)}, not a JSON object"
    rows = doc.get("layers")
    indices = isinstance(rows, list) and all(isinstance(row, int) and not isinstance(row, bool) for row in rows)
    if rows is not None and not indices and not (isinstance(rows, list) and all(isinstance(row, dict) for row in rows)):
        return "its 'layers' is neither a list of objects nor of layer numbers"
    return ""


def reason(exc: BaseException) -> str:
    """An exception as a short phrase for a one-line message."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
