"""The registry row and the experiment's own folder are all the shared code knows of it: the
sharding, the memory plan, the runner and the core vocabulary name no experiment, and each row's
computation declares a shard plan exactly when the row says its sweep splits.

The throwaway experiment of tests/throwaway.py (a folder in a temporary package) stands in for a
new one here too."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from in_process_workers import InProcessWorkers
from throwaway import installed

from engine import registry
from engine.core.errors import UserError
from engine.core.events import Event, Result
from engine.experiments.context import RunContext
from engine.models.distributed import ShardPlan

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def experiment(tmp_path):
    yield from installed(tmp_path / "package")


def test_a_plan_with_its_own_sweep_runs_it(experiment, monkeypatch) -> None:
    from cli.shards import sharded_events

    ran = []

    def own_sweep(split: ShardPlan, context: RunContext, workers: Any) -> Iterator[Event]:
        ran.append((split.items, context.inputs))
        yield Result("letter-count", {"counts": {}, "total": 0})

    own_plan = ShardPlan(["a"], lambda share: None, lambda docs: {}, sweep=own_sweep)
    monkeypatch.setattr(importlib.import_module("letter_count.run"), "shard_plan", lambda *args: own_plan)
    context = RunContext(inputs={"other": {"x": 1}})
    settings = experiment.settings_class()
    events = list(sharded_events("letter-count", settings, context, InProcessWorkers(2)))  # type: ignore[arg-type]  # Workers, in-process
    assert isinstance(events[-1], Result)
    assert ran == [(["a"], {"other": {"x": 1}})] and events[-1].data["total"] == 0


def test_a_row_that_does_not_split_says_which_do(experiment) -> None:
    from dataclasses import replace

    unsplit = replace(experiment, shardable=False)
    with pytest.raises(UserError, match="letter-count does not split over workers; --shards applies to ablation"):
        unsplit.shard_plan(experiment.settings_class(), 0)


def test_settings_of_no_experiment_train_nothing_and_keep_no_checkpoints() -> None:
    from engine.core.settings import Settings
    from engine.models import memory

    shape = memory.ModelShape(1, 1, 1, 1, 1, 1)
    assert Settings().training_needs(shape) is None and Settings().checkpoint_params(shape) == 0


def test_every_shardable_row_has_a_shard_plan_and_only_those() -> None:
    for entry in registry.EXPERIMENTS:
        computation = entry.folder.computation()
        assert (getattr(computation, "shard_plan", None) is not None) == entry.shardable, entry.name


def _compared_names(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Experiment names a comparison (==, !=, in) or a match case tests against, with their lines."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands: list[ast.AST] = [node.left, *node.comparators]
        elif isinstance(node, ast.match_case):
            operands = [node.pattern]
        else:
            continue
        for operand in operands:
            for leaf in ast.walk(operand):
                if isinstance(leaf, ast.Constant) and leaf.value in names:
                    found.append((leaf.lineno, leaf.value))
    return found


SHARED = ["engine/models/distributed.py", "engine/models/memory.py", "engine/core/events.py",
          "engine/core/settings.py", "engine/experiments/context.py", "cli/runner.py", "cli/shards.py", "cli/plan.py",
          "cli/drive.py", "cli/cluster_run.py"]


@pytest.mark.parametrize("source", SHARED)
def test_the_sharding_the_memory_plan_and_the_runner_name_no_experiment(source) -> None:
    """No branch on an experiment's name, and none of the names the issue's grep looks for, quoted."""
    text = (ROOT / source).read_text(encoding="utf-8")
    names = {entry.name for entry in registry.EXPERIMENTS}
    assert _compared_names(ast.parse(text), names) == []
    quoted = re.findall(r'"(recovery|ablation|toy-depth|manipulate|prune|growth)"', text)
    assert quoted == [], f"{source} names {quoted}"
