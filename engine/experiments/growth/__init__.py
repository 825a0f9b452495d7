"""Growth Transformer Training (SCIENCE.md A6): a heterogeneous model grown phase by phase from an
importance profile, compared with a uniform model of the same size at the same token budget.

vocabulary.py    settings, presets, events and the result document (torch-free)
profile.py       per-layer importance classes: the paper's preset, or a session's ablation map
protocol.py      the phase table: load, validate, derive from a profile, scale to a budget
architecture.py  the per-layer-width Llama, the uniform baseline solved to equal size, cloning
data.py          the corpus, the character tokenizer, deterministic batches
checkpoint.py    atomic safetensors + JSON checkpoints of a run in progress
trainer.py       one arm: grow, train, evaluate, checkpoint, yield events
experiment.py    `run_growth`: every arm and seed, generations, the result; `run(settings, context)`
export.py        a saved growth or uniform model exported with its card
"""

from __future__ import annotations

from types import ModuleType

from engine.experiments.contract import Contract


def contract() -> Contract:
    """Its vocabulary's declaration, imported now (torch-free)."""
    from engine.experiments.growth.vocabulary import CONTRACT

    return CONTRACT


def computation() -> ModuleType:
    """Its computation, imported now (torch)."""
    from engine.experiments.growth import experiment

    return experiment
