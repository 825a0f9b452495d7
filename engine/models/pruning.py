"""Removing decoder layers for real: the model keeps working with fewer layers.

Skipping a layer (`LayerStack.skipped`) keeps its weights and its place; removing it must also
leave a model that generates with a KV cache and saves a config that reloads. So `removed` puts a
ModuleList without those layers in the model, sets `num_hidden_layers`, slices the config's
per-layer lists (`layer_types` of Gemma 2/3, Qwen2/3, Mistral...; the growth model's
`intermediate_sizes`), lowers Qwen's `max_window_layers` by the layers removed below it and
renumbers every kept module's `layer_idx` (the slot it writes in the cache). Rotary tables and
masks are built from the config and need nothing. On exit every change is undone exactly (same
module objects, same numbers), so experiments cut in place, like the rest of the engine, instead of
copying a model per candidate.

Below the layer (`prune --unit block`), a cut is a set of attention and MLP blocks, (layer, part):
a removed block adds nothing to the residual stream (its term skipped; a parallel layer keeps the
other term), a layer that loses both blocks is removed whole. For an export the skipped blocks'
output projections are zeroed, which every family's own forward reads as the same skip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.core.errors import UserError
from engine.models.anatomy import LayerStack
from engine.models.families import PARTS, Block

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing's own from Python 3.13

# Config attributes holding one entry per layer (transformers 5): sliced with the layers.
PER_LAYER_LISTS = ("layer_types", "intermediate_sizes", "no_rope_layers", "kv_sharing_modes")
# Config attributes holding a layer index where the layers change kind (Qwen2/3: the sliding window
# from this layer on): lowered by the layers removed below it, so the kept layers keep their kind.
LAYER_THRESHOLDS = ("max_window_layers",)


def check_removal(n_layers: int, indices: Sequence[int]) -> tuple[int, ...]:
    """The distinct layers to remove, sorted; one-line errors for out-of-range or all layers."""
    chosen = tuple(sorted(set(indices)))
    bad = [i for i in chosen if not 0 <= i < n_layers]
    if bad:
        raise UserError(f"layer {bad[0]} is out of range; this model has layers 0 to {n_layers - 1}")
    if len(chosen) >= n_layers:
        raise UserError(f"cannot remove all {n_layers} layers; keep at least one (remove at most {n_layers - 1})")
    return chosen


def _parent_and_name(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent, _, name = path.rpartition(".")
    return (model.get_submodule(parent) if parent else model), name


def _indexed_modules(layer: nn.Module) -> list[Any]:
    """The modules of one layer that know their position (`layer_idx`, an int: the cache slot; Any,
    as nn.Module types an attribute set on it as a tensor or a module)."""
    return [m for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)]


def _check_supported(model: nn.Module) -> None:
    config = model.config
    if getattr(config, "is_heterogeneous", False):
        raise UserError("this model has a per-layer config (heterogeneous layers); removing layers is not supported")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or getattr(config, "reorder_and_upcast_attn", False):
        raise UserError("this GPT-2 scales attention by the layer's index, so a layer cannot move; "
                        "removing layers is not supported for it")


def _apply(model: nn.Module, indices: Sequence[int]) -> tuple[tuple[int, ...], Callable[[], None]]:
    """Cuts the layers; returns the kept layers' original indices and the exact undo."""
    stack = LayerStack(model)
    n = len(stack)
    drop = check_removal(n, indices)
    _check_supported(model)
    config: Any = model.config  # the model's PretrainedConfig: its per-family fields are read by name
    kept = tuple(i for i in range(n) if i not in drop)
    parent, name = _parent_and_name(model, stack.spec.layers)
    original = stack.layers
    saved_lists = {key: getattr(config, key) for key in PER_LAYER_LISTS
                   if isinstance(getattr(config, key, None), (list, tuple)) and len(getattr(config, key)) == n}
    saved_n = config.num_hidden_layers
    saved_thresholds = {key: getattr(config, key) for key in LAYER_THRESHOLDS
                        if isinstance(getattr(config, key, None), int)}
    saved_idx = [(m, m.layer_idx) for i in kept for m in _indexed_modules(original[i])]

    def undo() -> None:
        setattr(parent, name, original)
        config.num_hidden_layers = saved_n
        for key, value in {**saved_lists, **saved_thresholds}.items():
            setattr(config, key, value)
        for module, index in saved_idx:
            module.layer_idx = index

    try:
        setattr(parent, name, nn.ModuleList([original[i] for i in kept]))
        for key, values in saved_lists.items():
            setattr(config, key, type(values)(values[i] for i in kept))
        config.num_hidden_layers = len(kept)
        for key, threshold in saved_thresholds.items():
            setattr(config, key, threshold - sum(1 for i in drop if i < threshold))
        for position, i in enumerate(kept):
            for module in _indexed_modules(original[i]):
                module.layer_idx = position
    except BaseException:
        undo()
        raise
    return kept, undo


@contextlib.contextmanager
def removed(model: nn.Module, indices: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Inside the block the model has no layers `indices` (original numbering, from 0); yields the
    kept layers' original indices. Everything is put back on exit."""
    kept, undo = _apply(model, indices)
    try:
        yield kept
    finally:
        undo()


def split_cut(blocks: Sequence[Block]) -> tuple[tuple[int, ...], tuple[Block, ...]]:
    """The layers that lose both blocks (removed whole) and the blocks removed alone, sorted."""
    chosen = set(blocks)
    whole = tuple(sorted({layer for layer, _ in chosen if all((layer, part) in chosen for part in PARTS)}))
    alone = tuple(sorted((b for b in chosen if b[0] not in whole), key=lambda b: (b[0], PARTS.index(b[1]))))
    return whole, alone


@contextlib.contextmanager
def blocks_removed(model: nn.Module, blocks: Sequence[Block]) -> Iterator[tuple[int, ...]]:
    """Inside the block these attention and MLP blocks add nothing to the residual stream (a layer
    without both is removed, as `removed` does); yields the kept layers' original indices."""
    whole, alone = split_cut(blocks)
    stack = LayerStack(model)
    with contextlib.ExitStack() as cut:
        kept = cut.enter_context(removed(model, whole)) if whole else tuple(range(len(stack)))
        for layer, part in alone:
            cut.enter_context(stack.part_skipped(layer, part))
        yield kept


@contextlib.contextmanager
def outputs_zeroed(model: nn.Module, blocks: Sequence[Block]) -> Iterator[None]:
    """The output projections (weight and bias) of these blocks zeroed for the block, then put back
    bit for bit: what an export of a block cut saves, so that plain transformers skips them too."""
    stack = LayerStack(model)
    with stack.preserved(sorted({layer for layer, _ in blocks})), torch.no_grad():
        for layer, part in blocks:
            for param in stack.part_output(layer, part).parameters():
                param.zero_()
        yield


def layer_params(model: nn.Module) -> list[int]:
    """Each decoder layer's parameters (every tensor of the layer: matrices, biases, norms)."""
    return [sum(p.numel() for p in layer.parameters()) for layer in LayerStack(model).layers]


def removed_params(model: nn.Module, blocks: Sequence[Block]) -> int:
    """The parameters a block cut leaves unused: a layer removed whole, all of its own; a block
    removed alone, its matrices' weights and biases."""
    whole, alone = split_cut(blocks)
    stack, sizes = LayerStack(model), layer_params(model)
    return sum(sizes[layer] for layer in whole) + sum(stack.part_params(layer, part) for layer, part in alone)


Cut = tuple[int, ...] | tuple[Block, ...]  # a prune cut: layers, or with --unit block attention and MLP blocks


def is_block_cut(cut: Cut) -> TypeIs[tuple[Block, ...]]:
    return bool(cut) and isinstance(cut[0], tuple)


def cut_layers(cut: Cut) -> tuple[int, ...]:
    """The layers a cut touches: its layers, or the layers holding its blocks."""
    return tuple(sorted({b[0] for b in cut})) if is_block_cut(cut) else tuple(cut)


def cut_removed(model: nn.Module, cut: Cut) -> contextlib.AbstractContextManager[tuple[int, ...]]:
    """`removed` for a cut of layers, `blocks_removed` for a cut of blocks."""
    return blocks_removed(model, cut) if is_block_cut(cut) else removed(model, cut)
