"""B1: hidden-state dynamics. For every token and layer l, the angle between the layer's input and

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""

from __future__ import annotations

from types import ModuleType

from engine.experiments.contract import Contract


def contract() -> Contract:
    """Its vocabulary's declaration, imported now (torch-free)."""
    from engine.experiments.dynamics.vocabulary import CONTRACT

    return CONTRACT


def computation() -> ModuleType:
    """Its computation, imported now (torch)."""
    from engine.experiments.dynamics import run

    return run
