"""Every experiment keeps the contract its folder declares (tests/experiment_contract.py): a part
missing or wrong is one line naming the experiment and the part."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from experiment_contract import contract_problems, figure_problems

from engine import registry
from engine.core.events import ResultDocument
from engine.experiments.context import RunContext
from engine.experiments.contract import Frame

NAMES = [entry.name for entry in registry.EXPERIMENTS]


@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_keeps_its_contract(name):
    problems = contract_problems(registry.experiment(name))
    assert not problems, "\n".join(problems)


@pytest.mark.report
@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_draws_the_figure_it_declares(name):
    pytest.importorskip("matplotlib")
    problems = figure_problems(registry.experiment(name))
    assert not problems, "\n".join(problems)


def _with_contract(entry: registry.Experiment, **changes: Any) -> registry.Experiment:
    """The row with its contract changed (its package stood in by one that answers the new one)."""
    changed = dataclasses.replace(entry.contract(), **changes)

    class Folder:
        __name__ = entry.folder.__name__
        contract = staticmethod(lambda: changed)
        computation = staticmethod(entry.folder.computation)

    return dataclasses.replace(entry, folder=Folder())


@dataclasses.dataclass(frozen=True)
class Unsettled(ResultDocument):
    """A result document that forgot its settings."""

    name: ClassVar[str] = "ablation"
    model: str


def test_a_result_without_settings_is_named_not_a_key_error():
    """Before, a result class without `settings` stopped tests/test_events.py with a bare KeyError."""
    fake = _with_contract(registry.experiment("ablation"), result=Unsettled, sample=lambda: Unsettled("tiny"))
    assert "ablation: its result Unsettled has no `settings` field (the settings the run resolved, a " \
           "AblationSettings)" in contract_problems(fake)


def test_a_frame_that_differs_from_the_declaration_is_named():
    entry = registry.experiment("prune")
    problems = contract_problems(_with_contract(entry, frame=Frame(("method", "removed"), rows=11)))
    assert problems == ["prune: its sample's frame starts ['method', 'removed'] with 12 rows; its contract "
                        "declares ['method', 'removed'] with 11"]
    assert contract_problems(_with_contract(entry, frame=None)) == [
        "prune: no frame declared (Contract.frame: its sample's tidy table, first columns and rows)"]


def test_a_folder_of_another_experiment_is_read_only_where_the_row_says_so(tmp_path):
    """evaluate reads recovery's recovered layers: its row says so (reads_folders), the row's run hands
    that to the context, and the context refuses a folder the row does not name."""
    assert registry.experiment("evaluate").reads_folders == ("recovery",)
    assert all(not entry.reads_folders for entry in registry.EXPERIMENTS if entry.name != "evaluate")
    seen: list[tuple[str, ...]] = []

    def run(settings, context):
        seen.append(context.folders_read)
        return iter(())

    computation = SimpleNamespace(__name__="reader", run=run)
    folder = SimpleNamespace(__name__="reader", contract=registry.experiment("evaluate").contract,
                             computation=lambda: computation)
    row = dataclasses.replace(registry.experiment("evaluate"), folder=folder)
    list(row.run(row.settings_class(), RunContext()))
    assert seen == [("recovery",)]
    context = RunContext(output_dir=tmp_path, folders_read=("recovery",))
    assert context.folder_of("recovery", "weights") == tmp_path / "checkpoints" / "recovery" / "weights"
    with pytest.raises(ValueError, match="reads prune's folder, which its registry row's reads_folders does not name"):
        context.folder_of("prune")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "recovery").symlink_to(tmp_path)
    assert context.folder_of("recovery") is None  # nothing read through a link
