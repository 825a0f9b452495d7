"""The console's forms start from the experiments' declarations: the recovery form's sigma, steps
and lr are RecoverySettings' defaults (read from its source, so no torch before the first paint),
the growth form's flags are its registry row's `console_flags`, and both parse as the run would."""

from __future__ import annotations

import ast
import shlex

import pytest
from textual.widgets import Input
from tui_fixtures import demo_session

from engine.registry import BY_NAME, EXPERIMENTS
from sessions.store import SessionStore
from tui.app import AnatomyApp
from tui.flags import settings_from_flags

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("entry", EXPERIMENTS, ids=lambda entry: entry.name)
def test_declared_defaults_are_the_settings_defaults(entry) -> None:
    declared = entry.declared_defaults()
    defaults = entry.settings_class()
    assert declared, f"{entry.name}: no literal defaults read from {entry.module}"
    for name, text in declared.items():
        assert ast.literal_eval(text) == getattr(defaults, name), (entry.name, name, text)


async def test_the_forms_hold_the_settings_defaults(isolated_home) -> None:
    from engine.experiments.recovery.vocabulary import RecoverySettings

    demo_session(SessionStore())
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        form = {name: app.screen.query_one(f"#{name}", Input).value for name in ("sigma", "steps", "lr")}
        growth = app.screen.query_one("#growth-flags", Input).value
    assert form == {"sigma": "0.5", "steps": "200", "lr": "1e-4"}  # as declared (the look is unchanged)
    defaults = RecoverySettings()
    assert (float(form["sigma"]), int(form["steps"]), float(form["lr"])) == (defaults.sigma, defaults.steps,
                                                                               defaults.lr)
    assert growth == "--preset tiny"
    assert settings_from_flags(BY_NAME["growth"], shlex.split(growth)) == BY_NAME["growth"].presets["tiny"]
