"""The notebook API's results: a run's or a session's result as its class (read by the one reader,
sessions/documents.py) beside its document, as a tidy DataFrame (pandas) or its figure (figures/),
and the API's one-line error."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, table_row
from sessions.documents import Damaged, typed_result
from sessions.store import SessionError

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure


class InputError(UserError, ValueError):
    """What was given cannot be used (an unknown experiment or setting, a value out of range, a
    session that does not open); the message is one line that says what to do."""


@contextlib.contextmanager
def one_line() -> Iterator[None]:
    """The engine's and the store's one-line errors as an InputError, without their chain."""
    try:
        yield
    except (UserError, SessionError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class RunResult:
    """An experiment's result, typed (`result`, the class the console and the CLI read it with) and
    as saved (`data`, results/<name>.json), with the events the run sent (`events`, none for a
    result read from a session). The result's own fields read through it: `run(...).layers`.

    `partial` is True when the run was cancelled (a kernel interrupt) before its result: `result` and
    `data` are then None and `to_pandas()` gives the experiment's events it sent (an ablation's
    rows so far, a recovery's curve points). A resumable experiment run with `session=` continues
    from its checkpoint with `run(..., session=..., resume=True)`."""

    experiment: str
    name: str  # the result file's name: the experiment's, or ablation-proxies
    result: ResultDocument | None
    data: dict[str, Any] | None
    events: tuple[Event, ...] = ()
    session: str | None = None
    partial: bool = False

    def to_pandas(self, table: str | None = None) -> pandas.DataFrame:
        """`to_pandas(self, table)`."""
        return to_pandas(self, table)

    def plot(self) -> Figure:
        """`plot(self)`."""
        return plot(self)

    def __getattr__(self, name: str) -> Any:
        document = self.__dict__.get("result")
        if name.startswith("_") or document is None:
            raise AttributeError(name)
        return getattr(document, name)

    def __repr__(self) -> str:
        where = f" in session {self.session!r}" if self.session else ""
        if self.partial:
            return f"RunResult({self.experiment}: partial, cancelled after {len(self.events)} events{where})"
        return f"RunResult({self.name}{where}: {type(self.result).__name__})"


def typed(experiment: str, name: str, data: dict[str, Any], **more: Any) -> RunResult:
    """Result `name`'s document `data` as a RunResult: read as its class by the one reader, or an
    InputError naming the result and the field that does not fit."""
    try:
        document = typed_result(name, data, f"results/{name}.json")
    except Damaged as exc:
        raise InputError(str(exc)) from None
    if not isinstance(document, ResultDocument):  # the atlas's table: `anatomy-tui compare` reads it
        raise InputError(f"result {name!r} is an atlas's table, not an experiment's: read it with "
                         "`anatomy-tui compare`")
    return RunResult(experiment, name, document, data, **more)


def to_pandas(what: RunResult | ResultDocument | Iterable[Event], table: str | None = None) -> pandas.DataFrame:
    """A tidy DataFrame: of a result, its rows (each experiment's own: a row per layer for an
    ablation map and, with `part`, per block; per curve point for recovery; per criterion point for
    prune; per model and task for evaluate; ...); of a cancelled run (`partial`), of the events it
    sent; of events (`Session.events()`), a row per event with its `kind`, `job`, `t` and fields.

    `table` names another part of a result by its fields' path: a record (`"fit"`: one row of its
    numbers), a list of records (`"anatomy_by_depth"`: a row each), or a list inside each record of
    a list (`"members.curve"`: a row per point, the member's own numbers beside it); an unknown name
    is an InputError listing the result's parts."""
    import pandas

    if table is not None:
        document = what.result if isinstance(what, RunResult) else what
        if not isinstance(document, ResultDocument):
            raise InputError(f"table={table!r} reads a part of a result; give a finished run's result, not events")
        return pandas.DataFrame(part_rows(document, table))
    if isinstance(what, RunResult):
        if what.partial or what.result is None:  # cancelled before its result: the events it sent
            return to_pandas(event for event in what.events if event.kind.startswith(what.experiment + "."))
        return to_pandas(what.result)
    if isinstance(what, ResultDocument):
        return pandas.DataFrame(what.tidy_rows())
    # the rest are events; named as such, since RunResult's __getattr__ keeps mypy from narrowing it away
    events: Iterable[Event] = what
    return pandas.DataFrame([{"kind": event.kind, **table_row(event)} for event in events])


PLAIN = (bool, int, float, str, type(None))


def numbers(record: Any) -> dict[str, Any]:
    """A record's numbers, words and lists of them (as tuples): its cells, without the records in it."""
    return {k: v for k, v in table_row(record).items()
            if isinstance(v, PLAIN) or (isinstance(v, tuple) and all(isinstance(x, PLAIN) for x in v))}


def parts(record: Any, prefix: str = "") -> list[str]:
    """The paths `to_pandas(..., table=)` reads in this record: each field holding a record or a
    list of records, and theirs (read from the first record of a list)."""
    found = []
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        inner = value[0] if isinstance(value, list) and value else value
        if dataclasses.is_dataclass(inner) and not isinstance(inner, type):
            found += [prefix + f.name, *parts(inner, f"{prefix}{f.name}.")]
    return found


def part_rows(document: ResultDocument, path: str) -> list[dict[str, Any]]:
    """The rows of the part of `document` at `path` (to_pandas's `table`): a row per record there,
    each after the numbers of the records of the lists it was reached through."""
    level: list[tuple[dict[str, Any], Any, bool]] = [({}, document, False)]  # (carried, record, in a list)
    for name in path.split("."):
        reached = []
        for carried, record, listed in level:
            value = getattr(record, name, None) if dataclasses.is_dataclass(record) else None
            if value is None or not (dataclasses.is_dataclass(value) or isinstance(value, list)):
                raise InputError(f"{type(document).name} has no table {path!r}; its tables: "
                                 f"{', '.join(parts(document)) or 'none (to_pandas() alone)'}")
            carry = {**carried, **numbers(record)} if listed else carried
            items = value if isinstance(value, list) else [value]
            reached += [(carry, item, isinstance(value, list)) for item in items]
        level = reached
    rows = [(carried, numbers(record)) for carried, record, _ in level if dataclasses.is_dataclass(record)]
    return [{**{k: v for k, v in carried.items() if k not in own}, **own} for carried, own in rows]


def plot(what: RunResult | ResultDocument) -> Figure:
    """The result's figure (a matplotlib Figure) from the `figures` package: `figures.figure_for`."""
    if isinstance(what, RunResult):
        if what.result is None:
            raise InputError(f"{what.experiment} was cancelled before its result: nothing to plot "
                             "(to_pandas() gives the events it sent)")
        what = what.result
    import figures

    return figures.figure_for(what)
