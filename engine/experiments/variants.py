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

from engine.core.errors import UserError
from engine.experiments.session_models import SAVED_ARMS
from engine.experiments.session_models import pruned_layers as pruned_layers  # the prompt pane's and the layer map's
from engine.experiments.session_models import saved_model_path as saved_model_path
from engine.models.families import PARTS, Block

ON_LOADED_MODEL = ("original", "modified", "noised", "recovered", "pruned")
VARIANTS = ON_LOADED_MODEL + tuple(SAVED_ARMS)
NOISE_SEED = 0  # the noised variant is the same model every time it is asked for


@dataclass(frozen=True)
class Variant:
    """One variant as the user asked for it, captured when asked (so a later edit of the form
    does not change a generation already under way).

    `layers`: the layers modified or noised; `blocks`: the attention and MLP blocks the modified
    model removes, (layer, part), each in a layer not in `layers`; `sigma`: noise scale in units of
    each matrix's std; `weights`: the recovered layers' matrices (layer -> canonical name -> tensor);
    `path`: the saved growth or uniform model."""

    name: str
    layers: tuple[int, ...] = ()
    sigma: float = 0.5
    weights: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    path: Path | None = None
    blocks: tuple[Block, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in VARIANTS:
            raise UserError(f"unknown model variant {self.name!r}; use one of {', '.join(VARIANTS)}")
        if self.name == "noised" and not self.sigma > 0:
            raise UserError(f"sigma must be above 0, not {self.sigma}")
        if self.blocks and self.name != "modified":
            raise UserError(f"only the modified model removes blocks, not the {self.name} one")
        check_blocks(self.layers, self.blocks)


def check_blocks(layers: Sequence[int], blocks: Sequence[Block]) -> None:
    """Blocks the modified model can remove beside `layers`: each (layer, "attention" or "mlp") in a
    layer not replaced whole (its weights are the neighbours' mean then: mark the layer or its blocks)."""
    for layer, part in blocks:
        if part not in PARTS:
            raise UserError(f"unknown block {part!r} of layer {layer}; use one of {', '.join(PARTS)}")
        if layer in layers:
            raise UserError(f"layer {layer} is marked whole and its {part} block too; unmark one of them")


@contextlib.contextmanager
def modified(model: Any, layers: Sequence[int], blocks: Sequence[Block] = ()) -> Iterator[Any]:
    """Each of `layers` replaced by the mean of its neighbours as they were before any change
    (so marking two adjacent layers gives each the mean of its original neighbours, the
    ablation experiment's `mean` method layer by layer), and each of `blocks` removed: its output
    replaced by zero, so the residual passes by (the sublayer map's `skip`, a block cut's removal;
    in a parallel layer the other block's term stays). Weights and hooks are put back on exit."""
    from engine.experiments.ablation.removal import neighbour_mean
    from engine.models.anatomy import LayerStack

    check_blocks(layers, blocks)
    stack = LayerStack(model)
    targets = {index: neighbour_mean(stack, stack.check_index(index)) for index in sorted(set(layers))}
    with contextlib.ExitStack() as held:
        for layer, part in sorted(set(blocks)):
            held.enter_context(stack.part_skipped(layer, part))
        held.enter_context(stack.holding(targets))
        yield model


@contextlib.contextmanager
def noised(model: Any, layers: Sequence[int], sigma: float, seed: int = NOISE_SEED) -> Iterator[Any]:
    """W += N(0, (sigma * std(W))^2) on every matrix of `layers`, as the recovery experiment
    noises a layer: each layer gets the noise of a recovery run with this seed (its first repeat)."""
    from engine.experiments.recovery.sweep import add_noise, noise_seed
    from engine.models.anatomy import LayerStack

    stack = LayerStack(model)
    marked = [stack.check_index(index) for index in sorted(set(layers))]
    with stack.preserved(marked):
        for index in marked:
            add_noise(stack, index, sigma, noise_seed(seed, index, 0))
        yield model


@contextlib.contextmanager
def recovered(model: Any, weights: Mapping[int, Mapping[str, Any]]) -> Iterator[Any]:
    """The layers a recovery run fine-tuned, with the matrices it saved."""
    from engine.models.anatomy import LayerStack

    with LayerStack(model).holding({index: dict(tensors) for index, tensors in weights.items()}):
        yield model


@contextlib.contextmanager
def applied(model: Any, variant: Variant) -> Iterator[Any]:
    """The loaded model as `variant` sees it, for the block."""
    if variant.name == "modified":
        with modified(model, variant.layers, variant.blocks):
            yield model
    elif variant.name == "noised":
        with noised(model, variant.layers, variant.sigma):
            yield model
    elif variant.name == "recovered":
        with recovered(model, variant.weights):
            yield model
    elif variant.name == "pruned":  # the layers really dropped, as the prune experiment exports them
        from engine.models.pruning import removed

        with removed(model, variant.layers):
            yield model
    elif variant.name == "original":
        yield model
    else:
        raise ValueError(f"{variant.name} is not a variant of the loaded model")


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
