"""`evaluate`: zero-shot accuracy through lm-eval-harness on the loaded model and the session's

`vocabulary` holds what the console, the store and the registry read (torch-free);
`run` the computation."""

from __future__ import annotations

from types import ModuleType

from engine.experiments.contract import Contract


def contract() -> Contract:
    """Its vocabulary's declaration, imported now (torch-free)."""
    from engine.experiments.evaluate.vocabulary import CONTRACT

    return CONTRACT


def computation() -> ModuleType:
    """Its computation, imported now (torch)."""
    from engine.experiments.evaluate import run

    return run
