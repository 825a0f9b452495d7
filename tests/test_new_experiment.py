"""Adding an experiment is its folder, its view and one registry row, nothing else.

The experiment here (tests/throwaway.py) is written as files into a temporary package, as a
contributor would write `engine/experiments/letter_count/` and `tui/views/letter_count.py`, and
registered with one row. It then shows in `anatomy-tui run --help` with its flags, runs into a
session and its --json file, prints through its view, reads back through its class, stands in
the console's Analyses pane, and splits over workers; without a view it prints as JSON. It keeps
the contract every experiment keeps (tests/experiment_contract.py), and one written without its
figure, its frame or its view is told so by name.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
from experiment_contract import contract_problems, figure_problems
from in_process_workers import InProcessWorkers
from throwaway import installed

from cli.main import main
from engine import registry
from engine.core.codec import json_safe
from engine.core.events import Message, Progress, Result, event_from_json, event_types
from engine.experiments.context import RunContext
from engine.models import memory
from engine.models.distributed import shard
from sessions.store import SessionStore
from tui.views import analyses

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def experiment(tmp_path):
    yield from installed(tmp_path / "package")


@pytest.fixture
def viewless(tmp_path):
    yield from installed(tmp_path / "package", without=("view",))


def test_nothing_else_in_the_project_changes() -> None:
    """The throwaway experiment lives in the test's own files: no project file names it."""
    tracked = subprocess.run(["git", "grep", "-l", "letter_count\\|letter-count", "--", "engine", "tui", "sessions"],
                             cwd=ROOT, capture_output=True, text=True).stdout  # fmt: skip
    assert tracked == ""


def test_run_help_lists_it_and_its_flags_come_from_its_settings(experiment, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0 and "letter-count" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", "letter-count", "--help"])
    text = capsys.readouterr().out
    assert "count the letters of a few words" in text and "--words LIST" in text and "--repeat N" in text
    assert main(["run", "letter-count", "--repeat", "0"]) == 2  # checked as the field declares
    assert "--repeat 0: must be an integer at least 1" in capsys.readouterr().err


def test_it_runs_into_a_session_and_the_json_and_prints_through_its_view(experiment, tmp_path, capsys) -> None:
    out = tmp_path / "letters.json"
    assert main(["run", "letter-count", "--words", "ab,cde", "--repeat", "2", "--session", "s",
                 "--json", str(out)]) == 0  # fmt: skip
    settings = {"words": ["ab", "cde"], "repeat": 2, "block_size": 8}
    expected = {"counts": {"ab": 4, "cde": 6}, "total": 10, "settings": settings}
    assert json.loads(out.read_text()) == expected
    session = SessionStore().open("s")
    assert session.load_result("letter-count") == expected
    kinds = [json.loads(line)["kind"] for line in session.events_path.read_text().splitlines()]
    assert kinds.count("letter-count.word") == 2  # its own events, in the session's log
    printed = capsys.readouterr().out
    assert "letters per word" in printed and "cde" in printed and "{" not in printed


def test_its_events_and_result_round_trip_through_the_core_codec(experiment) -> None:
    word = cast(Any, event_types()["letter-count.word"])(word="abc", letters=3)  # a class of the throwaway package
    assert event_from_json(json.loads(json.dumps(word.to_json()))) == word
    doc = json_safe(experiment.sample())
    assert json.dumps(json_safe(experiment.result_class.from_json(doc))) == json.dumps(doc)


def test_its_sweep_splits_over_workers_as_the_others_do(experiment) -> None:
    from cli.shards import sharded_events

    settings = experiment.settings_class()
    split = experiment.shard_plan(settings, 0)
    assert split.items == list(settings.words) and experiment.known_units(settings) == 5
    shares = [shard(split.items, rank, 2) for rank in range(2)]
    assert shares == [["alpha", "delta", "epsilon"], ["beta", "gamma"]]  # snake order
    events = list(sharded_events("letter-count", settings, RunContext(), InProcessWorkers(2)))  # type: ignore[arg-type]  # Workers, in-process
    assert cast(Message, events[0]).text == "5 words"  # the plan's notes, logged first
    progress = [event for event in events if isinstance(event, Progress)]
    assert (progress[-1].done, progress[-1].total) == (5, 5)  # summed over the workers
    assert cast(Result, events[-1]).data == list(experiment.run(settings, RunContext()))[-1].data


def test_its_settings_tell_the_memory_plan_what_it_trains(experiment) -> None:
    settings = experiment.settings_class(block_size=16)
    shape = memory.ModelShape(params=100, n_layers=2, hidden=4, intermediate=8, heads=1, vocab=10,
                              layer_matrices=40)  # fmt: skip
    plan = memory.plan_memory(shape, "float32", "cpu", [4], 1, training=settings.training_needs(shape))
    assert settings.training_needs(shape) == memory.Training(40, 2, 16, 1) and plan.training > 0


def test_without_a_view_it_prints_its_json_and_is_no_analysis(viewless, capsys) -> None:
    assert main(["run", "letter-count", "--words", "xyz"]) == 0
    assert json.loads(capsys.readouterr().out) == {"counts": {"xyz": 3}, "total": 3,
                                                   "settings": {"words": ["xyz"], "repeat": 1, "block_size": 8}}
    assert "letter-count" not in [name for name, _ in analyses()]


@pytest.mark.report
def test_it_keeps_the_contract_every_experiment_keeps(experiment) -> None:
    pytest.importorskip("matplotlib")
    assert contract_problems(experiment) == [] and figure_problems(experiment) == []


@pytest.mark.parametrize(("part", "said"), [
    ("figure", "letter-count: no figure (figures/letter_count.py with draw(result))"),
    ("frame", "letter-count: no frame declared (Contract.frame: its sample's tidy table, first columns and rows)"),
    ("view", "letter-count: no view (tui/views/letter_count.py)"),
])  # fmt: skip
@pytest.mark.report
def test_a_part_left_out_is_named_by_the_contract_check(tmp_path, part, said) -> None:
    pytest.importorskip("matplotlib")
    for entry in installed(tmp_path / "package", without=(part,)):
        assert [*contract_problems(entry), *figure_problems(entry)] == [said]


def test_unregistered_it_is_gone(tmp_path) -> None:
    for _ in installed(tmp_path / "package"):
        assert "letter-count.word" in event_types()
    assert "letter-count" not in registry.BY_NAME and "letter-count.word" not in event_types()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_console_shows_it_in_the_analyses_pane(experiment, capsys) -> None:
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
