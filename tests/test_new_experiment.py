"""Adding an experiment is its engine module, its view module and a registry row, nothing else.

The experiment here is defined in this file: its Settings dataclass and its `run` generator (this
module is its engine module), its view (a module put in sys.modules as `tui.views.letter_count`, as
`tui/views/letter_count.py` would be found) and its row, added to engine.registry's tables. It then
shows in `anatomy-tui run --help` with its flags, runs into a session and its --json file, prints
through its view, and stands in the console's Analyses pane; without a view it prints as JSON.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from engine import registry
from engine.core.events import Event, Progress, Result
from engine.core.settings import Settings, setting
from engine.registry import Experiment, RunContext
from sessions.store import SessionStore
from tui.cli import main
from tui.views import Analysis, analyses

# the engine module (engine/experiments/letter_count.py) ------------------------------------------


@dataclass(frozen=True)
class LetterCountSettings(Settings):
    words: tuple[str, ...] = setting(("alpha", "beta"), "the words whose letters are counted")
    repeat: int = setting(1, "times each word is counted", low=1)


def run(settings: LetterCountSettings, context: RunContext) -> Iterator[Event]:
    counts: dict[str, int] = {}
    for done, word in enumerate(settings.words, 1):
        context.cancel.check()
        counts[word] = len(word) * settings.repeat
        yield Progress(done=done, total=len(settings.words), label=word)
    yield Result(name="letter-count", data={"counts": counts, "total": sum(counts.values())})


ROW = Experiment("letter-count", "count the letters of a few words", __name__, "LetterCountSettings",
                 needs_model=False, writes="letter-count")  # fmt: skip

# the view module (tui/views/letter_count.py) -----------------------------------------------------


def print_result(doc: dict[str, Any]) -> None:
    table = Table(title="letters per word")
    table.add_column("word")
    table.add_column("letters", justify="right")
    for word, count in doc["counts"].items():
        table.add_row(word, str(count))
    Console().print(table)


def summary(doc: dict[str, Any], command: str) -> Text:
    return Text(f"{doc['total']} letters in {len(doc['counts'])} words")


def view_module() -> types.ModuleType:
    module = types.ModuleType("tui.views.letter_count")
    module.print_result = print_result  # type: ignore[attr-defined]
    module.summary = summary  # type: ignore[attr-defined]
    module.ANALYSIS = Analysis("Letters counted", place=0)  # type: ignore[attr-defined]
    return module


@pytest.fixture
def registered(monkeypatch) -> Experiment:
    """The row in the registry's tables (its module: this file)."""
    monkeypatch.setattr(registry, "EXPERIMENTS", (*registry.EXPERIMENTS, ROW))
    monkeypatch.setitem(registry.BY_NAME, ROW.name, ROW)
    return ROW


@pytest.fixture
def with_view(registered, monkeypatch) -> Experiment:
    monkeypatch.setitem(sys.modules, "tui.views.letter_count", view_module())
    return registered


# the checks ---------------------------------------------------------------------------------------


def test_run_help_lists_it_and_its_flags_come_from_its_settings(registered, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0 and "letter-count" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", "letter-count", "--help"])
    text = capsys.readouterr().out
    assert "count the letters of a few words" in text and "--words LIST" in text and "--repeat N" in text
    assert main(["run", "letter-count", "--repeat", "0"]) == 2  # checked as the field declares
    assert "--repeat 0: must be an integer at least 1" in capsys.readouterr().err


def test_it_runs_into_a_session_and_the_json_and_prints_through_its_view(with_view, tmp_path, capsys) -> None:
    out = tmp_path / "letters.json"
    assert main(["run", "letter-count", "--words", "ab,cde", "--repeat", "2", "--session", "s",
                 "--json", str(out)]) == 0  # fmt: skip
    expected = {"counts": {"ab": 4, "cde": 6}, "total": 10}
    assert json.loads(out.read_text()) == expected
    assert SessionStore().open("s").load_result("letter-count") == expected
    printed = capsys.readouterr().out
    assert "letters per word" in printed and "cde" in printed and "{" not in printed


def test_without_a_view_it_prints_its_json_and_is_no_analysis(registered, capsys) -> None:
    assert main(["run", "letter-count", "--words", "xyz"]) == 0
    assert json.loads(capsys.readouterr().out) == {"counts": {"xyz": 3}, "total": 3}
    assert "letter-count" not in [name for name, _ in analyses()]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_console_shows_it_in_the_analyses_pane(with_view, capsys) -> None:
    from tui.app import AnatomyApp

    assert [name for name, _ in analyses()][0] == "letter-count"  # place 0: above the others
    assert main(["run", "letter-count", "--words", "ab,cde", "--session", "s"]) == 0
    app = AnatomyApp(session="s", load_model=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        titles = [str(title.render()) for title in app.screen.query(".analysis-title")]
        assert titles[0] == "Letters counted" and len(titles) == len(analyses())
        assert str(app.screen.query_one("#result-letter-count").render()) == "5 letters in 2 words"
