"""The map's removals: a layer, or one of its attention and MLP blocks, replaced in place (the
neighbours' mean, zero, or skipped) for the duration of a block, its weights put back exactly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import torch

from engine.core.errors import UserError
from engine.models.anatomy import LayerStack


def neighbour_mean(stack: LayerStack, index: int) -> dict[str, torch.Tensor]:
    """(W[l-1] + W[l+1]) / 2 per matrix; an edge layer takes its single neighbour."""
    neighbours = [i for i in (index - 1, index + 1) if 0 <= i < len(stack)]
    if not neighbours:
        raise UserError("a one-layer model has no neighbours to ablate with; use --method skip or zero")
    stack.check_editable(neighbours)
    mats = [stack.matrices(i) for i in neighbours]
    own = stack.matrices(index)  # neighbours may sit on another GPU: the mean is made where it goes
    means = {}
    for name in stack.matrix_names:  # summed in float32, cast once: half precision would round twice
        total = cast(torch.Tensor, sum(m[name].detach().to(own[name].device).float() for m in mats)) / len(mats)
        means[name] = total.to(own[name].dtype)
    return means


@contextlib.contextmanager
def ablated(stack: LayerStack, index: int, method: str) -> Iterator[None]:
    """Layer `index` ablated in place for the duration of the block, then restored exactly."""
    if method == "skip":
        with stack.skipped([index]):
            yield
        return
    with stack.preserved([index]):
        targets = neighbour_mean(stack, index) if method == "mean" else None
        with torch.no_grad():
            for name, param in stack.matrices(index).items():
                if targets is None:
                    param.zero_()
                else:
                    param.copy_(targets[name])
        yield


@contextlib.contextmanager
def ablated_part(stack: LayerStack, index: int, part: str, method: str) -> Iterator[None]:
    """Block `part` ("attention" or "mlp") of layer `index` removed for the duration of the block:
    skip zeroes its term in the residual sum, zero its matrices, mean puts the neighbours' mean of
    its matrices in; the weights come back exactly."""
    if method == "skip":
        with stack.part_skipped(index, part):
            yield
        return
    with stack.preserved([index]):
        targets = neighbour_mean(stack, index) if method == "mean" else None
        with torch.no_grad():
            for name, param in stack.part_matrices(index, part).items():
                if targets is None:
                    param.zero_()
                else:
                    param.copy_(targets[name])
        yield
