"""What an experiment declares in its own folder, so that nothing outside it lists experiments.

Its package (`engine/experiments/<name>/__init__.py`) gives two functions, each importing its module
only when called: `contract()` (the vocabulary's `CONTRACT`; torch-free) and `computation()` (the
module with `run`, and `shard_plan` where its sweep splits). The registry row holds the package; the
event core imports a vocabulary through `contract` when one of its words is first read.

The `Contract` names the vocabulary's settings class and result document class, its `sample()` and
presets, and what its sample looks like to the two readers above the engine: the notebook API's
tidy table (`Frame`) and the publication figure (`FigureShape`). tests/test_contract.py checks every
row against it (the view and the figure module are found by name) and names what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Protocol

from engine.core.events import ResultDocument
from engine.core.settings import Settings


@dataclass(frozen=True)
class Frame:
    """The sample's tidy table (`tidy_rows()`, the notebook API's DataFrame): its first columns, in
    order, and its number of rows, written by hand from the sample."""

    columns: tuple[str, ...]
    rows: int


@dataclass(frozen=True)
class FigureShape:
    """The sample's publication figure (figures/<name>.py): each panel's (x label, y label), in order."""

    panels: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Contract:
    """An experiment's vocabulary, declared once (`CONTRACT` in its vocabulary module). `frame` and
    `figure` None: not declared, which the contract test reports by name."""

    settings: type[Settings]
    result: type[ResultDocument]
    sample: Callable[[], ResultDocument]  # a result built from the class: the tests' and snapshots' example
    frame: Frame | None = None
    figure: FigureShape | None = None
    presets: Mapping[str, Settings] = field(default_factory=dict)  # `--preset NAME`


class ExperimentFolder(Protocol):
    """An experiment's package: its contract and its computation, each imported when first asked for."""

    __name__: str

    def contract(self) -> Contract: ...

    def computation(self) -> ModuleType: ...
