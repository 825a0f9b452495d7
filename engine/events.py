"""The events and results every experiment speaks.

An experiment is a generator of `Event`s that ends by yielding a `Result`. Events are JSON lines
with a schema version, and each one carries enough to redraw the UI from it alone, so a console
that reopens a session replays the log instead of recomputing.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

EVENT_SCHEMA_VERSION = 1

_EVENT_TYPES: dict[str, type[Event]] = {}


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
    return cls


def json_safe(value: Any) -> Any:
    """NaN and inf are not JSON: they become null, which every reader handles."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    if hasattr(value, "item") and callable(value.item):  # numpy or torch scalar
        return json_safe(value.item())
    return value


@dataclass(frozen=True)
class Event:
    """Base of every event; `job` names the run (the job runner stamps it), `t` the wall time."""

    kind: ClassVar[str] = "event"
    job: str = field(default="", kw_only=True)
    t: float = field(default_factory=time.time, kw_only=True)

    def to_json(self) -> dict[str, Any]:
        body = json_safe(dataclasses.asdict(self))
        return {"v": EVENT_SCHEMA_VERSION, "kind": self.kind, **body}


def event_from_json(doc: dict[str, Any]) -> Event:
    """Rebuilds an event written by `Event.to_json`; unknown kinds raise ValueError."""
    kind = doc.get("kind")
    cls = _EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in doc.items() if k in names})


@event_type
@dataclass(frozen=True)
class Started(Event):
    """A job began; `spec` is its full settings, so it can be resumed from the log alone."""

    kind: ClassVar[str] = "started"
    experiment: str
    spec: dict[str, Any]


@event_type
@dataclass(frozen=True)
class Progress(Event):
    """Generic progress of a long job: `done` of `total` units, with a short label."""

    kind: ClassVar[str] = "progress"
    done: int
    total: int
    label: str = ""


@event_type
@dataclass(frozen=True)
class Message(Event):
    """A line for the log panel (level: info, warning, error)."""

    kind: ClassVar[str] = "message"
    text: str
    level: str = "info"


@event_type
@dataclass(frozen=True)
class Result(Event):
    """The last event of an experiment: `name` is the result file, `data` its JSON document."""

    kind: ClassVar[str] = "result"
    name: str
    data: dict[str, Any]


@event_type
@dataclass(frozen=True)
class Finished(Event):
    """Written by the job runner when a job ends: status is done, cancelled or failed."""

    kind: ClassVar[str] = "finished"
    status: str
    error: str = ""


# --- prune ---------------------------------------------------------------------------------------


@event_type
@dataclass(frozen=True)
class PruneScores(Event):
    """One criterion's per-layer score (low = cheapest to remove), once it is known."""

    kind: ClassVar[str] = "prune.scores"
    method: str
    scores: list[float | None]


@event_type
@dataclass(frozen=True)
class PrunePoint(Event):
    """One point of a criterion's curve: `removed` layers (`layers`, original indices from 0) cut;
    `healed_ppl` is None without --heal-steps."""

    kind: ClassVar[str] = "prune.point"
    method: str
    removed: int
    layers: list[int]
    ppl: float
    baseline_ppl: float
    ci_low: float | None = None
    ci_high: float | None = None
    healed_ppl: float | None = None


@event_type
@dataclass(frozen=True)
class PruneExported(Event):
    """The pruned (and healed) model was saved as a Hugging Face folder."""

    kind: ClassVar[str] = "prune.exported"
    folder: str
    method: str
    layers: list[int]
    ppl: float
