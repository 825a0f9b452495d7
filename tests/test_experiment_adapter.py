"""An experiment module is its adapter: it declares how its sweep splits (`shard_plan`), what it
trains (`training_needs`) and its result class (`RESULT`), and the sharding, the memory plan and the
runner ask the registry for them, naming no experiment.

The experiment here is defined in this file (this module is its engine module) and registered for
the test only: distributed.plan splits it as it splits the others, the runner's split runs its
shares and merges them into the serial result, and the memory plan counts what it trains.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from in_process_workers import InProcessWorkers

from engine import registry
from engine.core.events import Event, Progress, Result
from engine.core.settings import Settings, setting
from engine.models import memory
from engine.models.distributed import ShardPlan, known_units, plan, shard
from engine.registry import Experiment, RunContext

ROOT = Path(__file__).resolve().parents[1]

# the engine module (engine/experiments/letter_split.py) ------------------------------------------


@dataclass(frozen=True)
class LetterSplitSettings(Settings):
    words: tuple[str, ...] = setting(("alpha", "beta", "gamma", "delta", "epsilon"), "the words counted")
    block_size: int = setting(8, "tokens per training block (for the memory plan)", low=1)


@dataclass(frozen=True)
class LetterCounts:
    """results/letter-split.json."""

    counts: dict[str, int]
    total: int


RESULT = LetterCounts


def run(settings: LetterSplitSettings, context: RunContext) -> Iterator[Event]:
    counts: dict[str, int] = {}
    for done, word in enumerate(settings.words, 1):
        counts[word] = len(word)
        yield Progress(done, len(settings.words), word)
    yield Result("letter-split", {"counts": counts, "total": sum(counts.values())})


def merge_shards(docs: list[dict[str, Any]], settings: LetterSplitSettings) -> dict[str, Any]:
    """The words in the order the settings give them, as a serial run counts them."""
    counts = {word: count for doc in docs for word, count in doc["counts"].items()}
    ordered = {word: counts[word] for word in settings.words}
    return {"counts": ordered, "total": sum(ordered.values())}


def shard_plan(settings: LetterSplitSettings, n_layers: int, inputs: Mapping[str, dict], model_name: str
               ) -> ShardPlan:
    return ShardPlan(list(settings.words), lambda share: replace(settings, words=tuple(share)),
                     lambda docs: merge_shards(docs, settings), notes=(f"{len(settings.words)} words",))


def training_needs(settings: LetterSplitSettings, shape: memory.ModelShape) -> memory.Training:
    return memory.Training(shape.layer_matrices, 2, settings.block_size, 1)


ROW = Experiment("letter-split", "count the letters of words, split over workers", __name__,
                 "LetterSplitSettings", needs_model=False, writes="letter-split", shardable=True)  # fmt: skip


@pytest.fixture
def registered(monkeypatch) -> Experiment:
    monkeypatch.setattr(registry, "EXPERIMENTS", (*registry.EXPERIMENTS, ROW))
    monkeypatch.setitem(registry.BY_NAME, ROW.name, ROW)
    return ROW


# the checks ---------------------------------------------------------------------------------------


def test_a_new_experiment_with_its_own_shard_plan_splits_like_the_others(registered) -> None:
    settings = LetterSplitSettings()
    split = plan("letter-split", settings, 0)
    assert split.items == list(settings.words)
    assert known_units("letter-split", settings) == 5  # no model: the settings fix the units
    shares = [shard(split.items, rank, 2) for rank in range(2)]
    assert shares == [["alpha", "delta", "epsilon"], ["beta", "gamma"]]  # snake order
    parts = [list(registered.run(split.restrict(share), RunContext(share=share)))[-1].data for share in shares]
    serial = list(registered.run(settings, RunContext()))[-1].data
    assert split.merge(parts) == serial and list(split.merge(parts)["counts"]) == list(settings.words)


def test_the_runners_split_runs_its_shares_and_merges_them_into_the_serial_result(registered) -> None:
    from tui.runner import sharded_events

    settings = LetterSplitSettings()
    events = list(sharded_events("letter-split", settings, RunContext(), InProcessWorkers(2)))  # type: ignore[arg-type]
    assert events[0].text == "5 words"  # the plan's notes, logged first
    progress = [event for event in events if isinstance(event, Progress)]
    assert (progress[-1].done, progress[-1].total) == (5, 5)  # summed over the workers
    assert events[-1].data == list(registered.run(settings, RunContext()))[-1].data


def test_a_plan_with_its_own_sweep_runs_it(registered, monkeypatch) -> None:
    from tui.runner import sharded_events

    ran = []

    def own_sweep(split: ShardPlan, context: RunContext, workers: Any) -> Iterator[Event]:
        ran.append((split.items, context.inputs))
        yield Result("letter-split", {"counts": {}, "total": 0})

    own_plan = ShardPlan(["a"], lambda share: None, lambda docs: {}, sweep=own_sweep)
    monkeypatch.setattr(sys.modules[__name__], "shard_plan", lambda *args: own_plan)
    context = RunContext(inputs={"other": {"x": 1}})
    events = list(sharded_events("letter-split", LetterSplitSettings(), context, InProcessWorkers(2)))  # type: ignore[arg-type]
    assert ran == [(["a"], {"other": {"x": 1}})] and events[-1].data["total"] == 0


def test_its_memory_needs_and_result_class_come_from_its_module(registered) -> None:
    settings = LetterSplitSettings(block_size=16)
    shape = memory.ModelShape(params=100, n_layers=2, hidden=4, intermediate=8, heads=1, vocab=10,
                              layer_matrices=40)  # fmt: skip
    assert registry.owner(settings) is registered
    assert memory.training_of(shape, settings) == memory.Training(40, 2, 16, 1)
    assert registered.result_class is LetterCounts


def test_without_the_declarations_nothing_splits_trains_or_is_typed(registered, monkeypatch) -> None:
    from engine.core.errors import UserError

    monkeypatch.setitem(registry.BY_NAME, ROW.name, replace(ROW, shardable=False))
    with pytest.raises(UserError, match="letter-split does not split over workers"):
        plan("letter-split", LetterSplitSettings(), 0)
    monkeypatch.delattr(sys.modules[__name__], "RESULT")
    assert registry.experiment("dynamics").shard_plan is None and registered.result_class is None
    assert memory.training_of(memory.ModelShape(1, 1, 1, 1, 1, 1), object()) is None  # settings of no experiment


def test_every_shardable_row_has_a_shard_plan_and_only_those() -> None:
    for entry in registry.EXPERIMENTS:
        assert (getattr(entry.load(), "shard_plan", None) is not None) == entry.shardable, entry.name


def _compared_names(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Experiment names a comparison (==, !=, in) or a match case tests against, with their lines."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.match_case):
            operands = [node.pattern]
        else:
            continue
        for operand in operands:
            for leaf in ast.walk(operand):
                if isinstance(leaf, ast.Constant) and leaf.value in names:
                    found.append((leaf.lineno, leaf.value))
    return found


@pytest.mark.parametrize("source", ["engine/models/distributed.py", "engine/models/memory.py", "tui/runner.py"])
def test_the_sharding_the_memory_plan_and_the_runner_name_no_experiment(source) -> None:
    """No branch on an experiment's name, and none of the names the issue's grep looks for, quoted."""
    text = (ROOT / source).read_text(encoding="utf-8")
    names = {entry.name for entry in registry.EXPERIMENTS}
    assert _compared_names(ast.parse(text), names) == []
    quoted = re.findall(r'"(recovery|ablation|toy-depth|manipulate|prune|growth)"', text)
    assert quoted == [], f"{source} names {quoted}"
