"""The JSON codec of events and result documents: `json_safe` writes a dataclass as the document a
reader expects (NaN as null, ABSENT fields left out, Settings as their `to_dict()`), `from_doc`
reads one back, checking each value against its field's annotation, since a session's files are
untrusted: a line of the wrong shape is an error its reader skips, never a half-built event."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from engine.core.errors import UserError
from engine.core.settings import Settings

T = TypeVar("T")


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
            return _SEQUENCES, _fixed(tuple(_decoder(arg) for arg in args))
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


def _fixed(checks: tuple[Check, ...]) -> Callable[[Any], Any]:
    """A fixed tuple (`tuple[int, float]`): as many items as it names, each checked as its own."""

    def rebuilt(value: Any) -> tuple[Any, ...]:
        if len(value) != len(checks):
            raise TypeError(f"{len(value)} items where {len(checks)} belong")
        items = []
        for v, (allowed, decode) in zip(value, checks, strict=True):
            if v is not None and allowed is not None and not _fits(v, allowed):
                raise _wrong(v, allowed)
            items.append(v if v is None or decode is None else decode(v))
        return tuple(items)

    return rebuilt


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


class FieldError(TypeError, ValueError):
    """A document's field that does not fit its class: `field` the path to it from the document's
    top (`layers.ppl`: a row's field), `why` in a phrase; a TypeError (and a ValueError, as a
    setting's refusal was) so that every reader that skips a damaged line skips it."""

    def __init__(self, cls: type, field: str, why: str) -> None:
        super().__init__(f"{cls.__name__}.{field}: {why}")
        self.field, self.why = field, why


def from_doc(cls: type[T], doc: Mapping[str, Any]) -> T:
    """Rebuilds dataclass `cls` from its JSON document. Keys it does not declare are ignored (a newer
    writer may add some); a missing field raises TypeError, so a rename cannot pass unnoticed, and so
    does a value of the wrong type (a list for a string, a string for a step): `FieldError`, naming
    the field (nested: its path). The log is untrusted, and its reader skips such a line as damaged."""
    dataclass_type: type = cls  # as `type`: mypy takes a type[T] for unhashable (the caches below)
    decoders = _field_decoders(dataclass_type)
    values = {}
    for k, v in doc.items():
        found = decoders.get(k)
        if found is None:
            continue
        if v is not None:
            allowed, decode = found
            if allowed is not None and not _fits(v, allowed):
                raise FieldError(cls, k, str(_wrong(v, allowed)))
            if decode is not None:
                try:
                    v = decode(v)
                except FieldError as inner:
                    raise FieldError(cls, f"{k}.{inner.field}", inner.why) from None
                except (TypeError, ValueError) as exc:
                    raise FieldError(cls, k, str(exc)) from None
        values[k] = v
    for name in _required(dataclass_type):
        if name not in values:
            raise FieldError(cls, name, "missing")
    return cls(**values)


@functools.cache
def _required(cls: type) -> tuple[str, ...]:
    """The fields a document of `cls` must have: those without a default."""
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
