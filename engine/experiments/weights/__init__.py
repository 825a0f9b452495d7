"""A2-A3: how predictable each weight matrix is from its layer index (Ridge on polynomial and

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""

from __future__ import annotations

from types import ModuleType

from engine.experiments.contract import Contract


def contract() -> Contract:
    """Its vocabulary's declaration, imported now (torch-free)."""
    from engine.experiments.weights.vocabulary import CONTRACT

    return CONTRACT


def computation() -> ModuleType:
    """Its computation, imported now (torch)."""
    from engine.experiments.weights import run

    return run
