"""Random values thrown at every experiment's settings (issue 14): one line and exit 2, or settings
that obey each field's declared rule; never a traceback, never exit 1.

Registry-driven: the experiments, their fields and the rules come from engine.registry.EXPERIMENTS
and the fields' `setting(...)` metadata. The run stops right after the settings and input checks
(`tui.runner.SessionStore` is replaced by a stop), so no model loads and no session is made.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tui.runner
from engine.errors import UserError
from engine.registry import EXPERIMENTS
from engine.settings import FieldSpec
from tui.cli import main

NAMES = [entry.name for entry in EXPERIMENTS]
BY = {entry.name: entry for entry in EXPERIMENTS}
HYPOTHESIS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class Validated(Exception):
    """Raised where the runner would open the session: everything before it passed."""


WORDS = ["all", "none", "auto", "ALL", "true", "nan", "NaN", "inf", "-inf", "+inf", "1e400", "-1e400", "1e-400",
         "0", "-0", "1", "-1", "2", "0.5", "-0.5", "1.5", "1e9", "10" * 15, str(10**30), str(-(10**30)), "",
         " ", ",", ",,", "1,", ",1", "1,,2", "0x10", "1_000", "\x00", "\udcff", "\u00e9", "a=b", "critical=nan",
         "critical=-1", "[]", "{}", "[1]", '{"phases": 1}', '[{"steps": 1e400}]', '[{"name": "x", "layers": [0], '
         '"steps": 1e400}]', "/", "/nonexistent/file.txt", "../", "-", "--", "x" * 300]


def _element(spec: FieldSpec) -> st.SearchStrategy[str]:
    own = [str(c) for c in spec.meta.get("choices") or ()] + list(spec.meta.get("words", {}))
    if spec.meta.get("none_word"):
        own.append(spec.meta["none_word"])
    numbers = st.one_of(
        st.integers(min_value=-(10**31), max_value=10**31).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-3, max_value=300).map(str),
    )
    return st.one_of(numbers, st.sampled_from(WORDS + own), st.text(max_size=12),
                     st.binary(max_size=8).map(lambda b: b.decode("latin-1")))


def _value(spec: FieldSpec) -> st.SearchStrategy[str]:
    one = _element(spec)
    return st.one_of(one, st.lists(one, min_size=2, max_size=4).map(",".join))


@st.composite
def flags(draw: Any, name: str) -> tuple[list[str], dict[str, str]]:
    """Random flags for random fields: `--flag=value` (a value may start with a dash)."""
    specs = [s for s in BY[name].settings_class.fields() if s.meta.get("cli", True)]
    chosen = draw(st.lists(st.sampled_from(specs), min_size=1, max_size=4, unique_by=lambda s: s.name))
    argv: list[str] = []
    given_text: dict[str, str] = {}
    for spec in chosen:
        if spec.base is bool and not spec.is_tuple:
            argv.append(spec.flag)
            continue
        text = draw(_value(spec))
        if "\x00" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")  # argv cannot hold them
        argv.append(f"{spec.flag}={text}")
        given_text[spec.name] = text
    return argv, given_text


def _obeys(spec: FieldSpec, value: Any) -> None:
    """The field's declared rule, checked again here, independently of `FieldSpec.coerce`."""
    meta = spec.meta
    if value is None:
        assert spec.optional, spec.name
        return
    items = value if spec.is_tuple else (value,)
    if spec.is_tuple:
        assert isinstance(value, tuple), spec.name
    for item in items:
        if spec.base is float:
            assert isinstance(item, float) and math.isfinite(item), (spec.name, item)
        if spec.base is int:
            assert isinstance(item, int) and not isinstance(item, bool), (spec.name, item)
        if spec.base is str:
            assert isinstance(item, str), (spec.name, item)
        if meta.get("choices"):
            assert item in meta["choices"], (spec.name, item)
        if spec.base in (int, float):
            assert meta.get("low") is None or item >= meta["low"], (spec.name, item)
            assert meta.get("high") is None or item <= meta["high"], (spec.name, item)
            assert meta.get("above") is None or item > meta["above"], (spec.name, item)
            assert meta.get("below") is None or item < meta["below"], (spec.name, item)


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
         ) -> tuple[int | None, list[str], Any]:
    """main(argv) stopped after validation: (exit code or None when validated, stderr lines, settings)."""
    seen: dict[str, Any] = {}
    original = tui.runner.settings_from_args

    def record(experiment: Any, args: Any) -> Any:
        seen["settings"] = made = original(experiment, args)
        return made

    def stop() -> None:
        raise Validated

    monkeypatch.setattr(tui.runner, "settings_from_args", record)
    monkeypatch.setattr(tui.runner, "SessionStore", stop)
    capsys.readouterr()
    try:
        code: int | None = main(argv)
    except Validated:
        code = None
    except SystemExit as exc:  # argparse: a usage error
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err.strip().splitlines(), seen.get("settings")


def _check(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--model", "smollm2-135m"] if BY[name].needs_model else []
    code, err, made = _run(["run", name, *argv, *extra], monkeypatch, capsys)
    assert not any("Traceback" in line for line in err), err
    if code is None:
        assert made is not None
        for spec in made.fields():
            _obeys(spec, getattr(made, spec.name))
        json.dumps(made.to_dict(), allow_nan=False)  # a job file can store them
        return
    assert code == 2, (argv, code, err)
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error:"), (argv, err)


@pytest.mark.parametrize("name", NAMES)
def test_random_flags_give_one_line_or_valid_settings(name, monkeypatch, capsys):
    @HYPOTHESIS
    @given(drawn=flags(name))
    def check(drawn: tuple[list[str], dict[str, str]]) -> None:
        _check(name, drawn[0], monkeypatch, capsys)

    check()


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.sampled_from(WORDS)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)


@pytest.mark.parametrize("name", NAMES)
def test_settings_from_random_json_are_valid_or_one_user_error(name):
    cls = BY[name].settings_class
    names = [spec.name for spec in cls.fields()]

    @HYPOTHESIS
    @given(doc=st.dictionaries(st.one_of(st.sampled_from(names), st.text(max_size=6)), JSON_VALUES, max_size=4))
    def check(doc: dict[str, Any]) -> None:
        try:
            made = cls.from_dict(doc)
        except UserError as exc:
            assert "\n" not in str(exc), str(exc)
            return
        for spec in made.fields():
            _obeys(spec, getattr(made, spec.name))

    check()
