"""The console's forms start from the experiments' declarations: the recovery form's sigma, steps
and lr are RecoverySettings' defaults (from its torch-free vocabulary, so no torch before the first paint),
the growth form's flags are its registry row's `console_flags`, and both parse as the run would."""

from __future__ import annotations

import shlex

import pytest
from textual.widgets import Input
from tui_fixtures import demo_session

from cli.flags import settings_from_flags
from engine.registry import BY_NAME, EXPERIMENTS
from sessions.store import SessionStore
from tui.app import AnatomyApp

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("entry", EXPERIMENTS, ids=lambda entry: entry.name)
def test_default_texts_parse_back_to_the_defaults(entry) -> None:
    """What a form shows for each flag is what the flag parses to: the run starts from the defaults."""
    texts = entry.default_texts()
    defaults = entry.defaults()
    specs = {spec.name: spec for spec in entry.settings_class.fields()}
    assert texts
    for name, text in texts.items():
        assert specs[name].parse_text(text) == getattr(defaults, name), (entry.name, name, text)


def test_small_float_defaults_read_as_typed() -> None:
    texts = BY_NAME["recovery"].default_texts()
    assert (texts["lr"], texts["sigma"], texts["steps"]) == ("1e-4", "0.5", "auto")  # steps: sized for the device


async def test_the_forms_hold_the_settings_defaults(isolated_home) -> None:
    from engine.experiments.recovery.vocabulary import RecoverySettings

    demo_session(SessionStore())
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        form = {name: app.screen.query_one(f"#{name}", Input).value for name in ("sigma", "steps", "lr")}
        growth = app.screen.query_one("#growth-flags", Input).value
    assert form == {"sigma": "0.5", "steps": "auto", "lr": "1e-4"}  # as declared (the look is unchanged)
    defaults = RecoverySettings()
    assert (float(form["sigma"]), None, float(form["lr"])) == (defaults.sigma, defaults.steps, defaults.lr)
    assert growth == "--preset tiny"
    assert settings_from_flags(BY_NAME["growth"], shlex.split(growth)) == BY_NAME["growth"].presets["tiny"]
