"""The core of the vocabulary every experiment speaks: the event base and the job's own events,
the result document base, their JSON codec, the version 1 migrations, and the cancel token.

An experiment is a generator of `Event`s that ends by yielding a `Result`. Events are JSON lines
with a schema version, and each one carries enough to redraw the UI from it alone, so a console
that reopens a session replays the log instead of recomputing. This module names no experiment:
each experiment's events and result document live in its own torch-free vocabulary module
(`engine/experiments/<name>/vocabulary.py`), each class declared once by the `event(kind)` or
`result(name)` decorator (a frozen dataclass of its fields, its kind or file name, its version 1
spellings, registered) when it is imported. The registry hands each one's loader here
(`declare_vocabulary`) without calling it: the tables below import a vocabulary when one of its
kinds or its result is first looked up, so a front end that reads no event pays for none of the
experiments' dataclasses (the console's first paint, `anatomy-tui --help`).

Spelling: a kind is `<command>.<what>` with the command as typed (`scaling-fit.stage`), and the
generic ones are `job.*`. The same thing has the same field name everywhere, in events and in
result documents: a layer index is `layer`, an importance class is `layer_class`.

A result document is a frozen dataclass (a `ResultDocument`): the engine builds it and puts
`json_safe(doc)` in its Result; the printers, the console's views and state, the prompt pane's
variants and the test fixtures read it with `Class.from_json(doc)`, so a renamed field breaks the
tests on both sides. A key a document has in one shape and not another is a field that may be
`ABSENT`.

Version 1 (anatomy-tui 0.1) spelled some kinds with hyphens or without a command, and said `index`
and `class`; `upgrade_event` rewrites such documents on reading through each class's `v1_kind`,
`v1_fields` and `upgrade_v1`, so a 0.1 session still opens.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # Python 3.10
    from typing_extensions import dataclass_transform

from engine.core.codec import ABSENT, from_doc, json_safe

EVENT_SCHEMA_VERSION = 2

_EVENT_TYPES: dict[str, type[Event]] = {}
_V1_KINDS: dict[str, type[Event]] = {}  # a version 1 kind spelled otherwise -> its class
_RESULT_TYPES: dict[str, type[ResultDocument]] = {}
_VOCABULARIES: dict[str, Callable[[], object]] = {}  # a command -> what imports its vocabulary, not called yet
T = TypeVar("T")
E = TypeVar("E", bound="Event")
R = TypeVar("R", bound="ResultDocument")


class Cancelled(Exception):
    """Raised inside an experiment when its cancel flag is set."""


class CancelToken:
    """A flag the front end sets and the experiment checks between steps (and between the forwards
    of an evaluation). `on_cancel` callbacks run at once in the thread that cancels, so a job can say
    "cancelling" before the computation reaches its next check."""

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def cancel(self) -> None:
        with self._lock:
            first = not self._flag.is_set()
            self._flag.set()
            listeners = list(self._listeners) if first else []
        for listener in listeners:
            listener()

    def on_cancel(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Calls `listener` when the token is cancelled (at once when it is already); returns the
        function that takes it off again (a job that ended before the cancel)."""
        with self._lock:
            already = self._flag.is_set()
            if not already:
                self._listeners.append(listener)
        if already:
            listener()

        def forget() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return forget

    @property
    def cancelled(self) -> bool:
        return self._flag.is_set()

    def check(self) -> None:
        if self._flag.is_set():
            raise Cancelled()


def _register_event(cls: type[E]) -> type[E]:
    """Registers an event class under its `kind` (and its version 1 kind) for `event_from_json`."""
    if cls.kind in _EVENT_TYPES and _EVENT_TYPES[cls.kind] is not cls:
        raise ValueError(f"event kind {cls.kind!r} registered twice")
    _EVENT_TYPES[cls.kind] = cls
    if cls.v1_kind:
        _V1_KINDS[cls.v1_kind] = cls
    return cls


@dataclass_transform(frozen_default=True, field_specifiers=(field, dataclasses.Field))
def event(kind: str, v1_kind: str = "", v1_fields: Mapping[str, str] | None = None) -> Callable[[type[E]], type[E]]:
    """Class decorator, the one declaration of an event: the class made a frozen dataclass of the
    fields it declares, under `kind` (`<command>.<what>`), with version 1's kind and field names where
    they were spelled otherwise; registered for `event_from_json` and the event table."""

    def declare(cls: type[E]) -> type[E]:
        cls.kind, cls.v1_kind = kind, v1_kind
        if v1_fields is not None:
            cls.v1_fields = v1_fields
        return _register_event(dataclass(frozen=True)(cls))

    return declare


def event_types() -> dict[str, type[Event]]:
    """Every registered kind and its class, in the order they are declared here (every declared
    vocabulary imported first)."""
    _import_vocabularies()
    return dict(_EVENT_TYPES)


def declare_vocabulary(command: str, load: Callable[[], object]) -> None:
    """Gives the function that imports the module declaring `command`'s event kinds (`<command>.*`)
    and its result document (its package's `contract`), called when one of them is first looked up
    (or every kind is asked for)."""
    _VOCABULARIES[command] = load


def _import_vocabularies(command: str | None = None) -> None:
    """Imports the declared vocabulary of `command`, or with None every one not imported yet. A
    module counts as imported once its import returns: a thread that asks meanwhile waits on
    Python's import lock for the same module, never finds its kinds missing."""
    for name in [command] if command is not None else list(_VOCABULARIES):
        load = _VOCABULARIES.get(name)
        if load is not None:
            load()
            _VOCABULARIES.pop(name, None)


def _registered(table: dict[str, T], key: str) -> T | None:
    """`table[key]`, importing the vocabulary that may declare it when it is not there yet: its
    command's first (the kind's prefix, a result's name), then every other."""
    if key not in table and _VOCABULARIES:
        _import_vocabularies(key.split(".")[0])
        if key not in table:
            _import_vocabularies()
    return table.get(key)


# --- version 1 --------------------------------------------------------------------------------

V1_FIELDS = {"index": "layer", "class": "layer_class"}  # version 1's names of a row's fields, everywhere


def renamed_v1(row: Any, names: Mapping[str, str] = V1_FIELDS) -> Any:
    """A version 1 row (a dict) with its fields in version 2's names; anything else as it is."""
    return {names.get(k, k): v for k, v in row.items()} if isinstance(row, dict) else row


class ResultDocument:
    """Base of every result document (`results/<name>.json`): `name` is its file; an experiment
    whose version 1 documents were spelled differently overrides `upgrade_v1`."""

    name: ClassVar[str] = ""

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        """The document with version 1's names in version 2's; a version 2 document as it is."""
        return doc

    @classmethod
    def from_json(cls: type[R], doc: Mapping[str, Any]) -> R:
        return from_doc(cls, cls.upgrade_v1(dict(doc)))

    def tidy_rows(self) -> list[dict[str, Any]]:
        """The document as a tidy table, one dict a row with the same keys in each (what the notebook
        API's `to_pandas` makes a DataFrame of; the engine imports no pandas). Each experiment's
        document gives its own rows (a layer, a curve's point, a task); this default: one row of the
        top-level numbers, words and flags."""
        plain = (bool, int, float, str, type(None))
        return [{f.name: value for f in dataclasses.fields(self)  # type: ignore[arg-type]  # each subclass is a dataclass
                 if isinstance(value := getattr(self, f.name), plain)}]


def table_row(row: Any, *names: str) -> dict[str, Any]:
    """A row of a result document (a dataclass) as one row of its tidy table: its fields (`names`:
    these alone, in this order), a list as a tuple, an ABSENT field as None."""
    keys = names or tuple(f.name for f in dataclasses.fields(row))
    values = {name: getattr(row, name) for name in keys}
    return {name: None if value is ABSENT else tuple(value) if isinstance(value, list) else value
            for name, value in values.items()}


def decode_or_none(cls: type[R], doc: Any, on_error: Callable[[Exception], object] | None = None) -> R | None:
    """`doc` read as result document `cls`; None when it is missing or does not fit the class (an
    older, damaged or foreign file: the reader then shows or uses nothing of it). `on_error` hears
    why a document that is there does not fit (a caller that logs it, or says it)."""
    if doc is None:
        return None
    try:
        if not isinstance(doc, Mapping):
            raise TypeError(f"{cls.name or cls.__name__}: expected an object, not {type(doc).__name__}")
        return cls.from_json(doc)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        if on_error is not None:
            on_error(exc)
        return None


@dataclass_transform(frozen_default=True, field_specifiers=(field, dataclasses.Field))
def result(name: str) -> Callable[[type[R]], type[R]]:
    """Class decorator, the one declaration of a result document: the class made a frozen dataclass
    of its fields, written as results/<name>.json, and registered so an event log's version 1
    results are upgraded by their own class."""

    def declare(cls: type[R]) -> type[R]:
        if name in _RESULT_TYPES and _RESULT_TYPES[name] is not cls:
            raise ValueError(f"result {name!r} registered twice")
        cls.name = name
        _RESULT_TYPES[name] = cls
        return dataclass(frozen=True)(cls)  # the class itself, made a dataclass

    return declare


def result_class(name: str) -> type[ResultDocument] | None:
    """The registered result document class of results/<name>.json (None: no such result)."""
    return _registered(_RESULT_TYPES, name)


def forget_types(kind_prefix: str, result_name: str) -> None:
    """Takes an experiment's event kinds (`<prefix>.*`) and its result out of the tables again (a
    test's throwaway experiment, registered for the test only)."""
    for kind in [kind for kind in _EVENT_TYPES if kind.startswith(kind_prefix + ".")]:
        del _EVENT_TYPES[kind]
    _RESULT_TYPES.pop(result_name, None)
    _VOCABULARIES.pop(kind_prefix, None)


def upgrade_result(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Result document `name` in version 2's spelling (its class's `upgrade_v1`)."""
    cls = _registered(_RESULT_TYPES, name)
    return cls.upgrade_v1(dict(doc)) if cls is not None else doc


def upgrade_event(doc: dict[str, Any]) -> dict[str, Any]:
    """An event document of any version in version 2's spelling: a version 1 kind (`started`,
    `toy-depth-step`: each class's `v1_kind`) renamed, and its fields by its class's `upgrade_v1`."""
    if doc.get("v", 1) >= 2:
        return doc
    kind = doc.get("kind")
    _import_vocabularies()  # a version 1 kind need not name its command (`toy-depth-step`)
    cls = _V1_KINDS.get(kind) or _EVENT_TYPES.get(kind)  # type: ignore[arg-type]  # no kind: no class
    if cls is None:
        return doc | {"v": EVENT_SCHEMA_VERSION}
    return cls.upgrade_v1(dict(doc)) | {"v": EVENT_SCHEMA_VERSION, "kind": cls.kind}


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """Base of every event; `job` names the run (the job runner stamps it), `t` the wall time."""

    kind: ClassVar[str] = "event"
    v1_kind: ClassVar[str] = ""  # its kind in version 1, where that was spelled differently
    v1_fields: ClassVar[Mapping[str, str]] = {}  # its fields renamed since version 1
    job: str = field(default="", kw_only=True)
    t: float = field(default_factory=time.time, kw_only=True)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = json_safe(self)  # its fields less those that are ABSENT (an ablation row's `part`)
        return {"v": EVENT_SCHEMA_VERSION, "kind": self.kind, **body}

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        upgraded: dict[str, Any] = renamed_v1(doc, cls.v1_fields)
        return upgraded


def event_from_json(doc: dict[str, Any]) -> Event:
    """Rebuilds an event written by `Event.to_json` (any schema version, see `upgrade_event`);
    an unknown kind raises ValueError, a document missing a field TypeError."""
    doc = upgrade_event(doc)
    kind = doc.get("kind")
    cls = _registered(_EVENT_TYPES, kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown event kind {doc.get('kind')!r}")
    return from_doc(cls, doc)


@event("job.started", v1_kind="started")
class Started(Event):
    """A job began; `spec` is its full settings, so it can be resumed from the log alone."""

    experiment: str
    spec: dict[str, Any]


def count_text(done: int, total: int, unit: str) -> str:
    """A count as every front end says it, its unit first: `texts 40/48`, `layers 3/30` (`40 texts`
    while the total is not known; "" before anything is counted)."""
    if total > 0:
        return f"{unit} {done}/{total}".lstrip()
    return f"{done} {unit}".rstrip() if done else ""


@event("job.progress", v1_kind="progress")
class Progress(Event):
    """Progress of a job: `done` of `total` `unit`s (texts, batches, steps, layers; total 0 while
    not known) in its `phase` (starting, baseline, training, evaluation, ...), with a short label and
    the `rate` measured in this phase (units a second; null before one unit is done), from which a
    front end draws a bar and the time left (`seconds_left`). Every Progress that counts names its
    unit (`texts`, `layers`; `layers and blocks` for a map of each layer and its blocks), said before
    the count: `baseline: texts 40/48` (`count`)."""

    done: int
    total: int
    label: str = ""
    phase: str = ""
    unit: str = ""
    rate: float | None = None

    @property
    def count(self) -> str:
        """Its count in words, `texts 40/48` (`count_text`)."""
        return count_text(self.done, self.total, self.unit)

    @property
    def seconds_left(self) -> float | None:
        """The time left in this phase at the measured rate (None while there is no rate)."""
        if not self.rate or self.total <= 0:
            return None
        return max(0, self.total - self.done) / self.rate


class Pace:
    """One phase of a job, timed: `at(done)` is its Progress with the rate measured since the phase
    began (`Pace("baseline", 48, "texts")`); `first` units were done before it began (a resumed
    sweep's), counted in `done` but not in the rate."""

    def __init__(self, phase: str, total: int, unit: str, label: str = "", first: int = 0) -> None:
        self.phase, self.total, self.unit, self.label = phase, total, unit, label or phase
        self.first = first
        self.began = time.perf_counter()

    def at(self, done: int) -> Progress:
        seconds = time.perf_counter() - self.began
        rate = (done - self.first) / seconds if done > self.first and seconds > 0 else None
        return Progress(done, self.total, self.label, phase=self.phase, unit=self.unit, rate=rate)


@event("job.message", v1_kind="message")
class Message(Event):
    """A line for the log panel (level: info, warning, error)."""

    text: str
    level: str = "info"


@event("job.result", v1_kind="result")
class Result(Event):
    """The last event of an experiment: `name` is the result file, `data` its JSON document."""

    name: str
    data: dict[str, Any]

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("data"), dict):
            doc["data"] = upgrade_result(str(doc.get("name")), doc["data"])
        return doc


def kept_on_stop(work: Iterator[Event], partial: Callable[[], Result | None]) -> Iterator[Event]:
    """`work`'s events; when a stop ends it (a cancel, Ctrl-C, SIGTERM or SIGHUP: `Stopped` is a
    KeyboardInterrupt), first the Result `partial()` makes of what is finished (None: nothing is),
    marked partial by its document, then the stop goes on. A sweep's finished rows are so kept."""
    try:
        yield from work
    except (Cancelled, KeyboardInterrupt):
        found = partial()
        if found is not None:
            yield found
        raise


@event("job.state")
class TaskState(Event):
    """A task's state changed (queued, placed, running, retried, done; an atlas's measures also
    waiting, reused, failed, interrupted), `detail` saying more (where it was placed, its progress,
    why it was retried). A run on a cluster logs its own task's (`task` empty); an atlas logs each of
    its measures' into its own session, `task` naming it (model|variant|experiment), `session` the
    session it runs into and `since` the byte of that session's log its job follows."""

    state: str
    detail: str = ""
    task: str = ""
    session: str = ""
    since: int = 0


@event("job.cancelling")
class Cancelling(Event):
    """The job was asked to stop; it stops at its next forward (and keeps what it finished)."""


@event("job.finished", v1_kind="finished")
class Finished(Event):
    """Written by the job runner when a job ends: status is done, cancelled or failed."""

    status: str
    error: str = ""


# growth: every event names its arm and seed; steps count the arm's optimizer steps from 1 --------


# dynamics, weights, manipulate, scaling-fit, toy-depth --------------------------------------------
