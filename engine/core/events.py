"""The core of the vocabulary every experiment speaks: the event base and the job's own events,
the result document base, their JSON codec, the version 1 migrations, and the cancel token.

An experiment is a generator of `Event`s that ends by yielding a `Result`. Events are JSON lines
with a schema version, and each one carries enough to redraw the UI from it alone, so a console
that reopens a session replays the log instead of recomputing. This module names no experiment:
each experiment's events and result document live in its own torch-free vocabulary module
(`engine/experiments/<name>/vocabulary.py`), registered here by the `event_type` and
`result_type` decorators when the registry imports it.

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
import functools
import math
import numbers
import threading
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from engine.core.errors import UserError
from engine.core.settings import Settings

EVENT_SCHEMA_VERSION = 2

_EVENT_TYPES: dict[str, type[Event]] = {}
_V1_KINDS: dict[str, type[Event]] = {}  # a version 1 kind spelled otherwise -> its class
_RESULT_TYPES: dict[str, type[ResultDocument]] = {}
T = TypeVar("T")
R = TypeVar("R", bound="ResultDocument")


class Cancelled(Exception):
    """Raised inside an experiment when its cancel flag is set."""


class CancelToken:
    """A flag the front end sets and the experiment checks between steps."""

    def __init__(self) -> None:
        self._flag = threading.Event()

    def cancel(self) -> None:
        self._flag.set()

    @property
    def cancelled(self) -> bool:
        return self._flag.is_set()

    def check(self) -> None:
        if self._flag.is_set():
            raise Cancelled()


def event_type(cls: type[Event]) -> type[Event]:
    """Class decorator: registers an event class under its `kind` for `event_from_json`."""
    if cls.kind in _EVENT_TYPES and _EVENT_TYPES[cls.kind] is not cls:
        raise ValueError(f"event kind {cls.kind!r} registered twice")
    _EVENT_TYPES[cls.kind] = cls
    if cls.v1_kind:
        _V1_KINDS[cls.v1_kind] = cls
    return cls


def event_types() -> dict[str, type[Event]]:
    """Every registered kind and its class, in the order they are declared here."""
    return dict(_EVENT_TYPES)


class _Absent:
    """The value of a field its document leaves out (see `ABSENT`)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False

    def __copy__(self) -> _Absent:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Absent:
        return self

    def __reduce__(self) -> str:
        return "ABSENT"  # pickled by name: an event sent between workers keeps the one ABSENT


# A field whose key a document has in one case and lacks in another (toy-depth's `se`, written only
# when the law was fitted) defaults to ABSENT: `json_safe` writes no key for it, and a document
# without the key reads back as ABSENT, so the class writes each shape byte for byte.
ABSENT: Any = _Absent()


def json_safe(value: Any) -> Any:
    """NaN and inf are not JSON: they become null, which every reader handles. A dataclass becomes
    its fields in their order, less those that are ABSENT; an experiment's `Settings` its `to_dict()`
    (the form a job file stores)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Settings):
        return json_safe(value.to_dict())
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return {name: json_safe(v) for name, v in fields if v is not ABSENT}
    if hasattr(value, "item") and callable(value.item):  # numpy or torch scalar
        return json_safe(value.item())
    return value


# --- typed decoding -----------------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# The JSON types a scalar annotation takes (`type(value) in ...`: JSON gives exact types, and a bool is
# no number here). An int is fine for a float: a writer may say 1 for 1.0.
_SCALARS: dict[Any, frozenset[type]] = {
    str: frozenset({str}),
    int: frozenset({int}),
    float: frozenset({float, int}),
    bool: frozenset({bool}),
}
_SEQUENCES = frozenset({list, tuple})


def _fits(value: Any, allowed: frozenset[type]) -> bool:
    """Whether a value is of an allowed JSON type; a number the engine built (a numpy float or int,
    before `json_safe`) counts as the Python number it stands for, a bool never as a number."""
    if type(value) in allowed:
        return True
    if isinstance(value, bool):
        return False
    if float in allowed and isinstance(value, numbers.Real) or int in allowed and isinstance(value, numbers.Integral):
        return True
    return any(isinstance(value, kind) for kind in allowed)
Check = tuple[frozenset[type] | None, Callable[[Any], Any] | None]  # a field's JSON types and its decoding


def _wrong(value: Any, allowed: Any) -> TypeError:
    names = " or ".join(sorted(t.__name__ for t in allowed)) if isinstance(allowed, frozenset) else allowed.__name__
    return TypeError(f"a {type(value).__name__} ({str(value)[:40]!r}) where {names} belongs")


def _union_types(args: tuple[Any, ...]) -> frozenset[type] | None:
    """The JSON types a union of scalars takes (None aside); None when an arm is not a scalar."""
    found: set[type] = set()
    for arg in args:
        if arg is type(None):
            continue
        if arg not in _SCALARS:
            return None
        found |= _SCALARS[arg]
    return frozenset(found)


@functools.cache
def _decoder(hint: Any) -> Check:
    """How a JSON value (not None) is checked and becomes the annotated type, worked out once per
    type: (the types it may have, or None: any; what rebuilds it, or None: the value as it is).
    Nested dataclasses are rebuilt, an experiment's `Settings` through its `from_dict`, lists become
    tuples where declared, scalars and the items of
    lists, tuples and dicts are checked against their annotations (None passes everywhere: a NaN
    was written as null); a value that does not fit raises TypeError."""
    if hint in _SCALARS:
        return _SCALARS[hint], None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        scalars = _union_types(args)
        if scalars is not None:
            return scalars, None
        arms = [a for a in args if a is not type(None)]
        if len(arms) == 1:
            return _decoder(arms[0])
        return None, None  # a union of containers: not checked
    if isinstance(hint, type) and issubclass(hint, Settings):
        return frozenset({dict}), functools.partial(_settings_from_doc, hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return frozenset({dict}), functools.partial(from_doc, hint)
    if origin is list or origin is tuple:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return _SEQUENCES, tuple if origin is tuple else None  # a fixed tuple: its items not checked
        return _SEQUENCES, _items(origin, *_decoder(args[0] if args else Any))
    if origin is dict or hint is dict:
        return frozenset({dict}), _values(*_decoder(args[1])) if len(args) == 2 else None
    if hint is list or hint is tuple:
        return _SEQUENCES, None if hint is list else tuple
    return None, None  # Any, or a type JSON cannot name: as it is


def _items(origin: type, allowed: frozenset[type] | None, decode: Callable[[Any], Any] | None
           ) -> Callable[[Any], Any] | None:
    """A list's or tuple's items checked (and rebuilt where `decode` says)."""
    if decode is not None:
        def rebuilt(value: Any) -> Any:
            if allowed is not None:
                for v in value:
                    if v is not None and not _fits(v, allowed):
                        raise _wrong(v, allowed)
            return origin(None if v is None else decode(v) for v in value)

        return rebuilt
    if allowed is None:
        return None if origin is list else tuple

    def checked(value: Any) -> Any:
        for v in value:
            if v is not None and not _fits(v, allowed):
                raise _wrong(v, allowed)
        return value if origin is list or type(value) is tuple else tuple(value)

    return checked


def _values(allowed: frozenset[type] | None, decode: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    """A dict's values checked (and rebuilt where `decode` says); its keys are JSON's, strings."""
    if allowed is None and decode is None:
        return None

    def checked(value: dict[Any, Any]) -> dict[Any, Any]:
        if allowed is not None:
            for v in value.values():
                if v is not None and not _fits(v, allowed):
                    raise _wrong(v, allowed)
        if decode is None:
            return value
        return {k: None if v is None else decode(v) for k, v in value.items()}

    return checked


@functools.cache
def _field_decoders(cls: type) -> dict[str, Check]:
    hints = _hints(cls)
    return {f.name: _decoder(hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def _settings_from_doc(cls: type[Settings], doc: Any) -> Settings:
    """The settings a result records, rebuilt and checked by `from_dict`: a setting the document
    lacks (it was written before the setting existed; `{}` lacks them all) takes its default, one
    this version does not know (a newer writer's) is left out, as `from_doc` leaves out unknown
    keys; a value `from_dict` refuses is a ValueError, as any other field that does not fit."""
    if not isinstance(doc, Mapping):
        raise TypeError(f"{cls.__name__}: expected an object of settings, not {type(doc).__name__}")
    known = {spec.name for spec in cls.fields()}
    try:
        return cls.from_dict({k: v for k, v in doc.items() if k in known})
    except UserError as exc:
        raise ValueError(str(exc)) from None


def from_doc(cls: type[T], doc: Mapping[str, Any]) -> T:
    """Rebuilds dataclass `cls` from its JSON document. Keys it does not declare are ignored (a newer
    writer may add some); a missing field raises TypeError, so a rename cannot pass unnoticed, and so
    does a value of the wrong type (a list for a string, a string for a step): the log is untrusted,
    and its reader skips such a line as damaged."""
    decoders = _field_decoders(cls)
    values = {}
    for k, v in doc.items():
        found = decoders.get(k)
        if found is None:
            continue
        if v is not None:
            allowed, decode = found
            if allowed is not None and not _fits(v, allowed):
                raise TypeError(f"{cls.__name__}.{k}: " + str(_wrong(v, allowed)))
            if decode is not None:
                v = decode(v)
        values[k] = v
    return cls(**values)


# --- version 1 --------------------------------------------------------------------------------

V1_FIELDS = {"index": "layer", "class": "layer_class"}  # version 1's names of a row's fields, everywhere


def renamed_v1(row: Any, names: Mapping[str, str] = V1_FIELDS) -> Any:
    """A version 1 row (a dict) with its fields in version 2's names; anything else as it is."""
    return {names.get(k, k): v for k, v in row.items()} if isinstance(row, dict) else row


class ResultDocument:
    """Base of every result document (results/<name>.json): `name` is its file; an experiment
    whose version 1 documents were spelled differently overrides `upgrade_v1`."""

    name: ClassVar[str] = ""

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        """The document with version 1's names in version 2's; a version 2 document as it is."""
        return doc

    @classmethod
    def from_json(cls: type[R], doc: Mapping[str, Any]) -> R:
        return from_doc(cls, cls.upgrade_v1(dict(doc)))


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


def result_type(cls: type[R]) -> type[R]:
    """Class decorator: registers a result document class under its `name`, so an event log's
    version 1 results are upgraded by their own class."""
    if cls.name in _RESULT_TYPES and _RESULT_TYPES[cls.name] is not cls:
        raise ValueError(f"result {cls.name!r} registered twice")
    _RESULT_TYPES[cls.name] = cls
    return cls


def forget_types(kind_prefix: str, result_name: str) -> None:
    """Takes an experiment's event kinds (`<prefix>.*`) and its result out of the tables again (a
    test's throwaway experiment, registered for the test only)."""
    for kind in [kind for kind in _EVENT_TYPES if kind.startswith(kind_prefix + ".")]:
        del _EVENT_TYPES[kind]
    _RESULT_TYPES.pop(result_name, None)


def upgrade_result(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Result document `name` in version 2's spelling (its class's `upgrade_v1`)."""
    cls = _RESULT_TYPES.get(name)
    return cls.upgrade_v1(dict(doc)) if cls is not None else doc


def upgrade_event(doc: dict[str, Any]) -> dict[str, Any]:
    """An event document of any version in version 2's spelling: a version 1 kind (`started`,
    `toy-depth-step`: each class's `v1_kind`) renamed, and its fields by its class's `upgrade_v1`."""
    if doc.get("v", 1) >= 2:
        return doc
    kind = doc.get("kind")
    cls = _V1_KINDS.get(kind) or _EVENT_TYPES.get(kind)  # type: ignore[arg-type]
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
        body = json_safe(self)  # its fields less those that are ABSENT (an ablation row's `part`)
        return {"v": EVENT_SCHEMA_VERSION, "kind": self.kind, **body}

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        return renamed_v1(doc, cls.v1_fields)


def event_from_json(doc: dict[str, Any]) -> Event:
    """Rebuilds an event written by `Event.to_json` (any schema version, see `upgrade_event`);
    an unknown kind raises ValueError, a document missing a field TypeError."""
    doc = upgrade_event(doc)
    cls = _EVENT_TYPES.get(doc.get("kind"))  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {doc.get('kind')!r}")
    return from_doc(cls, doc)


@event_type
@dataclass(frozen=True)
class Started(Event):
    """A job began; `spec` is its full settings, so it can be resumed from the log alone."""

    kind: ClassVar[str] = "job.started"
    v1_kind: ClassVar[str] = "started"
    experiment: str
    spec: dict[str, Any]


@event_type
@dataclass(frozen=True)
class Progress(Event):
    """Generic progress of a long job: `done` of `total` units, with a short label."""

    kind: ClassVar[str] = "job.progress"
    v1_kind: ClassVar[str] = "progress"
    done: int
    total: int
    label: str = ""


@event_type
@dataclass(frozen=True)
class Message(Event):
    """A line for the log panel (level: info, warning, error)."""

    kind: ClassVar[str] = "job.message"
    v1_kind: ClassVar[str] = "message"
    text: str
    level: str = "info"


@event_type
@dataclass(frozen=True)
class Result(Event):
    """The last event of an experiment: `name` is the result file, `data` its JSON document."""

    kind: ClassVar[str] = "job.result"
    v1_kind: ClassVar[str] = "result"
    name: str
    data: dict[str, Any]

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("data"), dict):
            doc["data"] = upgrade_result(str(doc.get("name")), doc["data"])
        return doc


@event_type
@dataclass(frozen=True)
class Finished(Event):
    """Written by the job runner when a job ends: status is done, cancelled or failed."""

    kind: ClassVar[str] = "job.finished"
    v1_kind: ClassVar[str] = "finished"
    status: str
    error: str = ""


# growth: every event names its arm and seed; steps count the arm's optimizer steps from 1 --------


# dynamics, weights, manipulate, scaling-fit, toy-depth --------------------------------------------
