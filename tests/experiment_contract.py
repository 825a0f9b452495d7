"""What an experiment must provide, checked against its registry row (tests/test_contract.py, and the
throwaway experiment's test): each missing or wrong part is one line naming the experiment and the
part, instead of a KeyError or an AttributeError in some other test.

Its folder: `contract()` and `computation()`; the contract's settings class, its result document
class (named as the command, with a `settings` field of that settings class), `sample()` (an
instance that round-trips through JSON), its events (`<command>.*`), its frame (the sample's tidy
table: first columns and rows, as declared) and its figure's shape; the computation's `run` (and
`shard_plan` exactly when the row is shardable); its view, `tui/views/<name>.py`. The figure
itself, `figures/<name>.py`, drawn with the declared panels, is checked by `figure_problems`, where
matplotlib is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import typing
from typing import Any

from engine.core.codec import json_safe
from engine.core.events import ResultDocument, event_types
from engine.core.settings import Settings
from engine.experiments.contract import Contract
from engine.registry import Experiment


def _module_name(entry: Experiment) -> str:
    return entry.name.replace("-", "_")


def contract_problems(entry: Experiment) -> list[str]:
    """One line per part the experiment lacks or gets wrong (empty: it keeps its contract)."""
    name = entry.name
    for part in ("contract", "computation"):
        if not callable(getattr(entry.folder, part, None)):
            return [f"{name}: its package {entry.folder.__name__} has no {part}() (engine/experiments/contract.py)"]
    contract = entry.contract()
    if not isinstance(contract, Contract):
        return [f"{name}: contract() gives a {type(contract).__name__}, not a Contract"]
    problems = [*_vocabulary_problems(name, contract), *_computation_problems(entry)]
    if importlib.util.find_spec(f"tui.views.{_module_name(entry)}") is None:
        problems.append(f"{name}: no view (tui/views/{_module_name(entry)}.py)")
    return problems


def _vocabulary_problems(name: str, contract: Contract) -> list[str]:
    settings, result = contract.settings, contract.result
    if not (isinstance(settings, type) and issubclass(settings, Settings)):
        return [f"{name}: its contract's settings {settings!r} is no Settings class"]
    if not (isinstance(result, type) and issubclass(result, ResultDocument) and dataclasses.is_dataclass(result)):
        return [f"{name}: its contract's result {result!r} is no result document (@result(name))"]
    problems = []
    if result.name != name:
        problems.append(f"{name}: its result {result.__name__} is written as results/{result.name}.json, "
                        f"not results/{name}.json")
    hints = typing.get_type_hints(result)
    if "settings" not in hints:
        problems.append(f"{name}: its result {result.__name__} has no `settings` field (the settings the run "
                        f"resolved, a {settings.__name__})")
    elif hints["settings"] is not settings:
        problems.append(f"{name}: its result's `settings` is a {hints['settings']}, not its {settings.__name__}")
    if not any(kind.startswith(f"{name}.") for kind in event_types()):
        problems.append(f"{name}: no event of its own (@event(\"{name}.<what>\"))")
    sample = contract.sample()
    if not isinstance(sample, result):
        return [*problems, f"{name}: sample() gives a {type(sample).__name__}, not a {result.__name__}"]
    doc = json.loads(json.dumps(json_safe(sample)))
    if result.from_json(doc) != sample:
        problems.append(f"{name}: its sample does not read back from its JSON as it was")
    return problems + _frame_problems(name, contract, sample)


def _frame_problems(name: str, contract: Contract, sample: Any) -> list[str]:
    if contract.frame is None:
        return [f"{name}: no frame declared (Contract.frame: its sample's tidy table, first columns and rows)"]
    rows = sample.tidy_rows()
    columns = list(rows[0]) if rows else []
    declared = list(contract.frame.columns)
    if columns[: len(declared)] != declared or len(rows) != contract.frame.rows:
        return [f"{name}: its sample's frame starts {columns[: len(declared)]} with {len(rows)} rows; "
                f"its contract declares {declared} with {contract.frame.rows}"]
    if any(list(row) != columns for row in rows):
        return [f"{name}: its sample's tidy rows do not all have the same columns"]
    return []


def _computation_problems(entry: Experiment) -> list[str]:
    computation = entry.folder.computation()
    problems = [] if callable(getattr(computation, "run", None)) else [
        f"{entry.name}: its computation {computation.__name__} has no run(settings, context)"]
    if callable(getattr(computation, "shard_plan", None)) != entry.shardable:
        said = "is" if entry.shardable else "is not"
        problems.append(f"{entry.name}: its row {said} shardable, and its computation "
                        f"{'lacks' if entry.shardable else 'has'} shard_plan")
    return problems


def figure_problems(entry: Experiment) -> list[str]:
    """Its figure module, drawn from its sample with the panels its contract declares (needs matplotlib)."""
    import figures

    contract, name = entry.contract(), entry.name
    if importlib.util.find_spec(f"figures.{_module_name(entry)}") is None:
        return [f"{name}: no figure (figures/{_module_name(entry)}.py with draw(result))"]
    if contract.figure is None:
        return [f"{name}: no figure shape declared (Contract.figure: each panel's x and y label)"]
    drawn = tuple((ax.get_xlabel(), ax.get_ylabel()) for ax in figures.figure_for(contract.sample()).axes)
    if drawn != contract.figure.panels:
        return [f"{name}: its sample's figure has the panels {drawn}; its contract declares {contract.figure.panels}"]
    return []
