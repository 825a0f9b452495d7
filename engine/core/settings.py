"""Settings: every number a user can change, declared once, on a dataclass field.

A field made with `setting(...)` carries its help text, its allowed range or choices and its flag.
From that one declaration come the command-line flags (`cli/main.py`), the validation every front end
runs before a model loads, and the JSON form a job file stores (so a resume rebuilds settings from
data, never from an argv). Values read back from a session file are untrusted: `from_dict` checks
each one's type and range exactly as a flag would be checked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine.core.errors import UserError

S = TypeVar("S", bound="Settings")

_MISSING = dataclasses.MISSING
MAX_SEED = 2**31 - 1  # numpy's legacy, sklearn's and torch's generators all take it (seed + index too)
# Every integer a setting takes, when its field names no upper bound of its own: a count or size past
# it is no run this machine can make, and what Rust tokenizers and numpy take without an OverflowError.
MAX_INT = 2**31 - 1
# Tokens in one evaluation text, window or training block at most: the memory plan's eager attention
# scores alone are width^2 x (bytes + 4) per head (engine/models/memory.py plan_memory), so a window of 2^20
# tokens needs 6.6 TB for one head in float16; the longest contexts models are trained on are below it.
MAX_WINDOW = 2**20
WINDOW_WHY = ("one window's attention scores take tokens^2 x 6 bytes a head (6.6 TB at 2^20 tokens); "
              "use a value the model's context holds")


def setting(
    default: Any,
    help: str,
    *,
    choices: tuple[Any, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
    flag: str | None = None,
    why: str | None = None,
    aliases: tuple[str, ...] = (),
    words: Mapping[str, Any] | None = None,
    none_word: str | None = None,
    pattern: str | None = None,
    rule: str | None = None,
    cli: bool = True,
    resume_free: bool = False,
    file: str | None = None,
    parse: Callable[[str], Any] | None = None,
    show: Callable[[Any], str] | None = None,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
) -> Any:
    """A settings field. `low`/`high` are inclusive bounds and `above`/`below` exclusive ones,
    applied to a number or to each element of a tuple; floats must also be finite; an integer
    field without `high` or `below` takes at most MAX_INT. `why` says why `high` is the limit (the
    error over it ends with it). Text fields may name a `pattern` (a regular expression the text
    must match whole) and the `rule` that says it in words. `words` maps
    words a user may type for an element ('all' -> 0); `none_word` is the word that means None for
    an optional field ('all' layers). `resume_free` marks settings a resumed run may change.
    `file` names what the path in this field is ("evaluation file"): it is read before a model
    loads. Structured fields (a phase table, pairs) bring their own `parse` (flag text -> value),
    `show` (value -> flag text), `encode` (value -> JSON) and `decode` (JSON -> value, raising
    UserError or ValueError on a bad document)."""
    meta = {
        "help": help, "choices": choices, "low": low, "high": high, "above": above, "below": below, "flag": flag,
        "why": why, "pattern": pattern, "rule": rule, "aliases": aliases, "words": dict(words or {}),
        "none_word": none_word, "cli": cli, "resume_free": resume_free, "file": file, "parse": parse, "show": show,
        "encode": encode, "decode": decode,
    }  # fmt: skip
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings are immutable: use a tuple default")
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class FieldSpec:
    """What one field accepts, read off its annotation and its `setting(...)` metadata."""

    name: str
    base: type  # int, float, str or bool (the element type for tuples)
    is_tuple: bool
    optional: bool
    default: Any
    meta: Mapping[str, Any]

    @property
    def flag(self) -> str:
        return self.meta.get("flag") or "--" + self.name.replace("_", "-")

    @property
    def help(self) -> str:
        return str(self.meta.get("help", ""))

    def rule(self) -> str:
        """The allowed values in words, for help texts and errors."""
        meta = self.meta
        if meta.get("choices"):
            text = "one of " + ", ".join(map(str, meta["choices"]))
        elif meta.get("rule"):
            text = meta["rule"]
        elif self.base is bool:
            text = "true or false"
        else:
            kind = "an integer" if self.base is int else "a number" if self.base is float else "text"
            bounds = []
            if meta.get("above") is not None:
                bounds.append(f"above {_number(meta['above'])}")
            if meta.get("low") is not None:
                bounds.append(f"at least {_number(meta['low'])}")
            if meta.get("high") is not None:
                bounds.append(f"at most {_number(meta['high'])}")
            if meta.get("below") is not None:
                bounds.append(f"below {_number(meta['below'])}")
            text = kind + (" " + " and ".join(bounds) if bounds else "")
        if self.is_tuple:
            text = "a comma-separated list, each " + text
        if self.optional and self.meta.get("none_word"):
            text += f", or '{self.meta['none_word']}'"
        return text

    # checking one value ------------------------------------------------------------------------
    def fail(self, value: Any, rule: str | None = None, why: str | None = None) -> UserError:
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        if not shown.isprintable():  # a newline or a control character typed: the error stays one line
            shown = repr(shown)
        if len(shown) > 60:  # 10**30, a file's whole text: the start and the length
            shown = f"{shown[:24]}...({len(shown)} characters)"
        error = UserError(f"{self.flag} {shown}: must be {rule or self.rule()} (default {self.default_text()})"
                          + (f"; {why}" if why else ""))
        error.rule_why = (rule, why)  # type: ignore[attr-defined]  # kept when the typed text is shown instead
        return error

    def default_text(self) -> str:
        if self.default is None:
            return self.meta.get("none_word") or "none"
        if isinstance(self.default, tuple):
            return ",".join(map(str, self.default)) or "none"
        return str(self.default)

    def coerce(self, value: Any) -> Any:
        """A value from JSON or Python, converted to this field's type and checked; else UserError."""
        if value is None:
            if self.optional:
                return None
            raise self.fail(value)
        if self.is_tuple:
            if not isinstance(value, (list, tuple)):
                raise self.fail(value)
            return tuple(self._element(v, value) for v in value)
        return self._element(value, value)

    def _element(self, item: Any, whole: Any) -> Any:
        base = self.base
        if base is bool:
            if not isinstance(item, bool):
                raise self.fail(whole)
            return item
        if base is str:
            if not isinstance(item, str):
                raise self.fail(whole)
            if self.meta.get("pattern") and not re.fullmatch(self.meta["pattern"], item):
                raise self.fail(whole)
            converted: Any = item
        elif base is int:
            if isinstance(item, bool) or not isinstance(item, int):
                if isinstance(item, float) and item.is_integer() and abs(item) < 2**53:
                    item = int(item)
                else:
                    raise self.fail(whole)
            converted = item
        elif base is float:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                raise self.fail(whole)
            converted = float(item)
            if not math.isfinite(converted):
                raise self.fail(whole)
        else:  # nested structures (growth phases): the experiment's own `check` validates them
            return item
        meta = self.meta
        if meta.get("choices") and converted not in meta["choices"]:
            raise self.fail(whole)
        if base in (int, float):
            if meta.get("low") is not None and converted < meta["low"]:
                raise self.fail(whole)
            if meta.get("high") is not None and converted > meta["high"]:
                raise self.fail(whole, why=meta.get("why"))
            if base is int and meta.get("high") is None and meta.get("below") is None and converted > MAX_INT:
                raise self.fail(whole, f"{self.rule()} and at most {MAX_INT}",
                                "no count or size of a run goes beyond it: use a smaller one")
            if meta.get("above") is not None and converted <= meta["above"]:
                raise self.fail(whole)
            if meta.get("below") is not None and converted >= meta["below"]:
                raise self.fail(whole)
        return converted

    def from_json(self, value: Any) -> Any:
        """A value read from a JSON document (a job file, a checkpoint): decoded, then checked."""
        decode = self.meta.get("decode")
        if decode is not None and value is not None:
            try:
                value = decode(value)
            except (TypeError, ValueError, KeyError):
                raise self.fail(value) from None
        return self.coerce(value)

    def to_json(self, value: Any) -> Any:
        encode = self.meta.get("encode")
        if encode is not None and value is not None:
            return encode(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        return _plain(value)

    def show_text(self, value: Any) -> str:
        """The flag text that parses back to `value` (how a job's command is rebuilt from data)."""
        show: Callable[[Any], str] | None = self.meta.get("show")
        if show is not None:
            return show(value)
        if value is None:
            none_word: str | None = self.meta.get("none_word")
            if not none_word:
                raise ValueError(f"{self.flag} has no text for 'none'")
            return none_word
        names = {v: k for k, v in self.meta.get("words", {}).items()}
        items = value if self.is_tuple else (value,)
        text = ",".join(names.get(item, repr(item) if isinstance(item, float) else str(item)) for item in items)
        return text

    def parse_text(self, text: str) -> Any:
        """A value typed on the command line; errors name the flag."""
        parse = self.meta.get("parse")
        if parse is not None:
            try:
                value = parse(text)
            except ValueError:
                raise self.fail(text) from None
            return self._typed(value, text)
        text = text.strip()
        if self.optional and self.meta.get("none_word") and text.lower() == self.meta["none_word"]:
            return None
        parts = [p.strip() for p in text.split(",")] if self.is_tuple else [text]
        if self.is_tuple and parts == [""]:
            parts = []
        values = []
        for part in parts:
            if part in self.meta.get("words", {}):
                values.append(self.meta["words"][part])
                continue
            try:
                if self.base is int:
                    values.append(int(part))
                elif self.base is float:
                    values.append(float(part))
                elif self.base is bool:
                    values.append(part.lower() in ("1", "true", "yes", "on"))
                else:
                    values.append(part)
            except ValueError:
                raise self.fail(text) from None
        return self._typed(tuple(values) if self.is_tuple else values[0], text)

    def _typed(self, value: Any, text: str) -> Any:
        """`coerce`, with an error that repeats what was typed."""
        try:
            return self.coerce(value)
        except UserError as exc:
            raise self.fail(text.strip(), *getattr(exc, "rule_why", (None, None))) from None


@functools.cache
def _fields_of(cls: type) -> tuple[FieldSpec, ...]:
    """A settings class's field specs, worked out once per class (every Settings made reads them)."""
    hints = typing.get_type_hints(cls)
    return tuple(_spec_of(f.name, hints[f.name], f) for f in dataclasses.fields(cls))


def _spec_of(name: str, hint: Any, f: dataclasses.Field[Any]) -> FieldSpec:
    optional = False
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and type(None) in args:
        optional = True
        rest = [a for a in args if a is not type(None)]
        hint = rest[0]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    is_tuple = origin is tuple
    base = args[0] if is_tuple and args else hint
    if not isinstance(base, type):
        base = object  # a structured value (tuple of pairs, phases): checked by the experiment
    default = f.default if f.default is not _MISSING else None
    return FieldSpec(name, base, is_tuple, optional, default, f.metadata)


class Settings:
    """Base of every experiment's frozen settings dataclass."""

    __dataclass_fields__: typing.ClassVar[dict[str, dataclasses.Field[Any]]]  # each subclass is a dataclass

    @classmethod
    def fields(cls) -> tuple[FieldSpec, ...]:
        settings_class: type = cls  # as `type`: mypy takes a type[Settings] for unhashable
        return _fields_of(settings_class)

    def __post_init__(self) -> None:
        """A whole number given for a float field in code (`limit=3`) is the float a flag or a job
        file gives (3.0), so settings made either way are equal and write the same JSON."""
        for spec in self.fields():
            value = getattr(self, spec.name)
            if spec.base is not float or isinstance(value, bool):
                continue
            if type(value) is int:
                object.__setattr__(self, spec.name, float(value))
            elif spec.is_tuple and isinstance(value, tuple) and any(type(v) is int for v in value):
                object.__setattr__(self, spec.name, tuple(float(v) if type(v) is int else v for v in value))

    def validate(self) -> None:
        """Every field against its declared range, then the experiment's cross-field `check`."""
        for spec in self.fields():
            if spec.meta.get("help") is None:
                continue
            spec.coerce(getattr(self, spec.name))
        self.check()

    def check(self) -> None:
        """Rules that involve several fields; experiments override it."""

    def check_inputs(self) -> None:
        """Every input file the run will read, read once now: a wrong path or a binary file is one
        line before any slow step (a model load, a session)."""
        from engine.core.files import read_lines

        for spec in self.fields():
            value = getattr(self, spec.name)
            if spec.meta.get("file") and value is not None:
                read_lines(value, spec.meta["file"])

    def inputs_from(self) -> str | None:
        """The session whose results the run reads (RunContext.inputs); None: the run's own."""
        return None

    def check_against(self, shape: Any) -> None:
        """What the run needs of its model, checked on the model's shape (an engine.models.memory.ModelShape:
        layer count, hidden size, family) from its config before the weights load, and of the
        files it will write; experiments override it (engine/models/preflight.py calls it)."""

    def edits_weights(self) -> bool:
        """The run changes weights in place (noise, training, replaced layers), which needs every
        layer it touches on the computing device, none offloaded by --device-map."""
        return False

    def training_needs(self, shape: Any) -> Any:
        """What a run with these settings trains at once, at most, on a model of this shape (an
        engine.models.memory.Training, for the memory plan); None: it trains nothing."""
        return None

    def checkpoint_params(self, shape: Any) -> int:
        """Parameters a run with these settings keeps in its checkpoints at most on a model of this
        shape, for the disk check before the load; 0: its checkpoints are small or it has none."""
        return 0

    def override(self: S, changes: Mapping[str, Any]) -> S:
        """These settings with `changes` (explicit flags over a preset) applied, then validated."""
        made = dataclasses.replace(self, **changes)
        made.validate()
        return made

    def to_dict(self) -> dict[str, Any]:
        return {spec.name: spec.to_json(getattr(self, spec.name)) for spec in self.fields()}

    @classmethod
    def from_dict(cls: type[S], doc: Mapping[str, Any], *, base: S | None = None) -> S:
        """Settings rebuilt from untrusted JSON: unknown keys and wrong types are refused."""
        if not isinstance(doc, Mapping):
            raise UserError(f"{cls.__name__}: expected a JSON object of settings")
        specs = {spec.name: spec for spec in cls.fields()}
        unknown = sorted(set(doc) - set(specs))
        if unknown:
            raise UserError(f"unknown setting {unknown[0]!r}; known: {', '.join(specs)}")
        values = {name: specs[name].from_json(value) for name, value in doc.items()}
        made = dataclasses.replace(base, **values) if base is not None else cls(**values)
        made.validate()
        return made

    def resume_key(self) -> dict[str, Any]:
        """The settings a resumed run must share with the run it continues."""
        free = {spec.name for spec in self.fields() if spec.meta.get("resume_free")}
        return {k: v for k, v in self.to_dict().items() if k not in free}


def check_layers(indices: Iterable[int], n_layers: int, flag: str) -> None:
    """Layer numbers given with `flag`, each against a model of `n_layers` layers."""
    for index in indices:
        if not 0 <= index < n_layers:
            raise UserError(f"{flag}: layer {index} is out of range; this model has layers 0 to {n_layers - 1}")


def from_preset(presets: Mapping[str, S], name: str, **changes: Any) -> S:
    """Preset `name` with some fields changed; an unknown name is a one-line error."""
    if name not in presets:
        raise UserError(f"unknown preset {name!r}; use {', '.join(presets)}")
    return dataclasses.replace(presets[name], **changes)


def _number(bound: float) -> str:
    """A bound as typed: 2147483647, not 2.14748e+09; 1e-06 stays short."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else f"{bound:g}"


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
