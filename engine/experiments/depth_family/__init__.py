"""The depth family (paper B on the user's own data): a grid of small decoder LMs trained by one
recipe over depths, widths, token budgets and seeds; the depth exponent a_l fitted with its interval,
and every member's anatomy related to depth.

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""

from __future__ import annotations

from types import ModuleType

from engine.experiments.contract import Contract


def contract() -> Contract:
    """Its vocabulary's declaration, imported now (torch-free)."""
    from engine.experiments.depth_family.vocabulary import CONTRACT

    return CONTRACT


def computation() -> ModuleType:
    """Its computation, imported now (torch)."""
    from engine.experiments.depth_family import run

    return run
