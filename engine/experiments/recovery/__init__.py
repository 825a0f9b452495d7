"""A5: recovery speed. Gaussian noise (sigma * std(W)) hits the weight matrices of one layer, that

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""

from __future__ import annotations

from types import ModuleType

from engine.experiments.contract import Contract


def contract() -> Contract:
    """Its vocabulary's declaration, imported now (torch-free)."""
    from engine.experiments.recovery.vocabulary import CONTRACT

    return CONTRACT


def computation() -> ModuleType:
    """Its computation, imported now (torch)."""
    from engine.experiments.recovery import run

    return run
