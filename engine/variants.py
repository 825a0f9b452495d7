"""The model variants the prompt pane generates with, built once here so that the console holds no
weight surgery of its own and the variants can be tested without a terminal.

Variants of the loaded model (original, modified, noised, recovered) change its weights in place
for the length of a `with` block and put every bit back on exit: a 135M-parameter model is never
copied for a few sentences of text. The session's growth and uniform models are separate models,
loaded from the folder a growth run saved them in.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import UserError
from engine.events import GrowthResult, PruneResult

ON_LOADED_MODEL = ("original", "modified", "noised", "recovered", "pruned")
SAVED_ARMS = {"growth": "growth_100", "uniform": "uniform_100"}  # variant -> the growth run's arm
VARIANTS = ON_LOADED_MODEL + tuple(SAVED_ARMS)
NOISE_SEED = 0  # the noised variant is the same model every time it is asked for


@dataclass(frozen=True)
class Variant:
    """One variant as the user asked for it, captured when asked (so a later edit of the form
    does not change a generation already under way).

    `layers`: the layers modified or noised; `sigma`: noise scale in units of each matrix's std;
    `weights`: the recovered layers' matrices (layer -> canonical name -> tensor); `path`: the
    saved growth or uniform model."""

    name: str
    layers: tuple[int, ...] = ()
    sigma: float = 0.5
    weights: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    path: Path | None = None

    def __post_init__(self) -> None:
        if self.name not in VARIANTS:
            raise UserError(f"unknown model variant {self.name!r}; use one of {', '.join(VARIANTS)}")
        if self.name == "noised" and not self.sigma > 0:
            raise UserError(f"sigma must be above 0, not {self.sigma}")


@contextlib.contextmanager
def modified(model: Any, layers: Sequence[int]) -> Iterator[Any]:
    """Each of `layers` replaced by the mean of its neighbours as they were before any change
    (so marking two adjacent layers gives each the mean of its original neighbours, the
    ablation experiment's `mean` method layer by layer)."""
    from engine.anatomy import LayerStack
    from engine.experiments.ablation import neighbour_mean

    stack = LayerStack(model)
    targets = {index: neighbour_mean(stack, stack.check_index(index)) for index in sorted(set(layers))}
    with stack.holding(targets):
        yield model


@contextlib.contextmanager
def noised(model: Any, layers: Sequence[int], sigma: float, seed: int = NOISE_SEED) -> Iterator[Any]:
    """W += N(0, (sigma * std(W))^2) on every matrix of `layers`, as the recovery experiment
    noises a layer: each layer gets the noise of a recovery run with this seed (its first repeat)."""
    from engine.anatomy import LayerStack
    from engine.experiments.recovery import add_noise, noise_seed

    stack = LayerStack(model)
    marked = [stack.check_index(index) for index in sorted(set(layers))]
    with stack.preserved(marked):
        for index in marked:
            add_noise(stack, index, sigma, noise_seed(seed, index, 0))
        yield model


@contextlib.contextmanager
def recovered(model: Any, weights: Mapping[int, Mapping[str, Any]]) -> Iterator[Any]:
    """The layers a recovery run fine-tuned, with the matrices it saved."""
    from engine.anatomy import LayerStack

    with LayerStack(model).holding({index: dict(tensors) for index, tensors in weights.items()}):
        yield model


@contextlib.contextmanager
def applied(model: Any, variant: Variant) -> Iterator[Any]:
    """The loaded model as `variant` sees it, for the block."""
    if variant.name == "modified":
        with modified(model, variant.layers):
            yield model
    elif variant.name == "noised":
        with noised(model, variant.layers, variant.sigma):
            yield model
    elif variant.name == "recovered":
        with recovered(model, variant.weights):
            yield model
    elif variant.name == "pruned":  # the layers really dropped, as the prune experiment exports them
        from engine.pruning import removed

        with removed(model, variant.layers):
            yield model
    elif variant.name == "original":
        yield model
    else:
        raise ValueError(f"{variant.name} is not a variant of the loaded model")


def pruned_layers(prune_result: Mapping[str, Any] | None) -> tuple[int, ...]:
    """The layers the session's prune run removed at its exported point (else its ppl criterion's
    deepest cut): what the `pruned` variant drops. () when there is no prune result, or one this
    version cannot read (damaged, or written by another version)."""
    if not prune_result:
        return ()
    try:
        result = PruneResult.from_json(prune_result)
    except (KeyError, TypeError, ValueError, AttributeError):
        return ()
    point = result.exported_point or max((cut for cut in result.curve if cut.method == "ppl"),
                                         key=lambda cut: cut.removed, default=None)
    return tuple(int(layer) for layer in point.layers) if point is not None else ()


def saved_model_path(growth_result: Mapping[str, Any] | None, name: str) -> Path | None:
    """The folder a growth run saved the `growth` or `uniform` model in, if it still exists (None
    without a growth result, or with one this version cannot read)."""
    wanted = SAVED_ARMS[name]
    if not growth_result:
        return None
    try:
        arm = GrowthResult.from_json(growth_result).arms.get(wanted)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    path = arm.model if arm is not None else None
    return Path(path) if path and Path(path).exists() else None


class SavedModels:
    """Growth and uniform models loaded from their folders, each once (thread-safe: the prompt
    pane's worker asks for them)."""

    def __init__(self) -> None:
        self._loaded: dict[Path, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def get(self, path: Path) -> tuple[Any, Any]:
        """(model, tokenizer) of the model saved in `path`."""
        with self._lock:
            if path not in self._loaded:
                from engine.experiments.growth.architecture import load_growth_model

                self._loaded[path] = load_growth_model(path)
            return self._loaded[path]
