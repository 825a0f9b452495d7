"""Teacher-student toy models of paper B: how the loss of a student falls with its depth.

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""

from __future__ import annotations

from types import ModuleType

from engine.experiments.contract import Contract


def contract() -> Contract:
    """Its vocabulary's declaration, imported now (torch-free)."""
    from engine.experiments.toy_depth.vocabulary import CONTRACT

    return CONTRACT


def computation() -> ModuleType:
    """Its computation, imported now (torch)."""
    from engine.experiments.toy_depth import run

    return run
