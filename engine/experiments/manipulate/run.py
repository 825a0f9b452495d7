"""A4: the five manipulation strategies for a layer (zero, clone, blend, low-rank SVD blend, scale),
one layer at a time and, with `together`, on every chosen layer at once. Each trial measures
perplexity from the lowest changed layer on through the prefix cache, writes a short greedy sample,
and puts the weights back bit for bit.

Sources are always layers left as they are: one at a time, every other layer; together, the layers
outside the chosen set. So a trial can write its layers one by one in any order.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress, Result, decode_or_none
from engine.evaluation.generation import generate_text
from engine.evaluation.perplexity import Evaluator
from engine.evaluation.statistics import degradation_pct
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.context import RunContext
from engine.experiments.manipulate.vocabulary import (
    ManipulateResult,
    ManipulateRow,
    ManipulationSettings,
    TrialDone,
)
from engine.models.anatomy import LayerStack
from engine.models.distributed import ShardPlan


def default_layers(ablation: AblationMap | None, model_name: str) -> tuple[tuple[int, ...], str]:
    """The redundant and anti layers of an ablation map of this model, else () for all."""
    if ablation is None or ablation.model != model_name:
        return (), "no ablation map of this model in the session: every layer"
    chosen = tuple(row.layer for row in ablation.layers if row.layer_class == "redundant" or row.anti)
    if not chosen:
        return (), "the ablation map has no redundant or anti layers: every layer"
    return chosen, f"redundant and anti layers of the session's ablation map: {','.join(map(str, chosen))}"


def nearest_kept(n_layers: int, index: int, changed: set[int]) -> tuple[int | None, int | None]:
    """The closest unchanged layer below and above `index` (None where there is none)."""
    below = next((i for i in range(index - 1, -1, -1) if i not in changed), None)
    above = next((i for i in range(index + 1, n_layers) if i not in changed), None)
    if below is None and above is None:
        raise UserError("every layer is chosen: clone, blend and svd need at least one layer left as it is")
    return below, above


def blend_weights(stack: LayerStack, index: int, changed: set[int]) -> dict[str, torch.Tensor]:
    """Distance-weighted average of the nearest unchanged layers on each side: the linear
    interpolation between them at `index` (the neighbour mean of A1 when both sit next to it; an
    edge layer takes its single neighbour)."""
    below, above = nearest_kept(len(stack), index, changed)
    stack.check_editable([i for i in (below, above) if i is not None])
    own = stack.matrices(index)  # sources may sit on another GPU: the blend is made where it goes
    if below is None or above is None:
        nearest = below if above is None else above
        assert nearest is not None, "every layer is changed"  # planned() refuses that
        source = stack.matrices(nearest)
        return {name: p.detach().to(own[name].device, copy=True) for name, p in source.items()}
    w_below = (above - index) / (above - below)
    low, high = stack.matrices(below), stack.matrices(above)
    return {  # summed in float32, cast once, on the layer's own device: half precision would round each term
        name: (w_below * low[name].detach().to(own[name].device).float()
               + (1 - w_below) * high[name].detach().to(own[name].device).float()).to(own[name].dtype)
        for name in low
    }


def clone_source(n_layers: int, index: int, changed: set[int]) -> int:
    """The nearest unchanged layer; on a tie, the one below (it feeds this layer's position)."""
    below, above = nearest_kept(n_layers, index, changed)
    nearest = above if below is None or (above is not None and above - index < index - below) else below
    assert nearest is not None, "every layer is changed"  # planned() refuses that
    return nearest


def low_rank(matrix: torch.Tensor, rank: int, tol: float = 1e-4, max_iter: int = 60) -> torch.Tensor:
    """Best rank-r approximation without an SVD of the full matrix.

    Subspace iteration in float32 on M^T M (a block of k = r + 32 vectors, never forming the Gram
    matrix) with a Rayleigh-Ritz step each round gives the top-r right singular vectors V_r, and
    M V_r V_r^T = U_r S_r V_r^T. The error check: iterate until the top-r subspace moves by less
    than `tol` (sine of the largest principal angle; float32's own noise floor is about 1e-5)
    between rounds; if it has not settled after
    `max_iter` rounds (top singular values too close together), fall back to the exact top-r from
    the float64 eigendecomposition of the small-side Gram matrix. A 14336 x 4096 matrix costs a few
    products with a 4096 x 40 block instead of a float64 SVD of 470 MB."""
    m = matrix.detach().float()
    tall = m.shape[0] >= m.shape[1]
    side = m if tall else m.T
    n = side.shape[1]
    if rank >= n:
        whole: torch.Tensor = matrix.detach().clone()
        return whole
    top = _top_right_vectors(side, rank, tol, max_iter)
    approx = (side @ top) @ top.T
    best: torch.Tensor = (approx if tall else approx.T).to(matrix.dtype)
    return best


def _top_right_vectors(side: torch.Tensor, rank: int, tol: float, max_iter: int) -> torch.Tensor:
    n = side.shape[1]
    k = min(n, rank + 32)
    generator = torch.Generator(device=side.device).manual_seed(0)
    basis = torch.linalg.qr(torch.randn(n, k, generator=generator, device=side.device))[0]
    previous = None
    for _ in range(max_iter):
        block = side @ basis
        _, _, vh = torch.linalg.svd(block, full_matrices=False)
        top: torch.Tensor = basis @ vh[:rank].T  # Ritz vectors: the best top-r estimate in this subspace
        if previous is not None:
            moved = torch.linalg.matrix_norm(top - previous @ (previous.T @ top), ord=2)
            if float(moved) < tol:
                return top
        previous = top
        basis = torch.linalg.qr(side.T @ block)[0]
    _, vectors = torch.linalg.eigh((side.T @ side).double())  # exact fallback, ascending eigenvalues
    exact: torch.Tensor = vectors[:, -rank:].to(side.dtype)
    return exact


def target_weights(
    stack: LayerStack, index: int, strategy: str, param: float | None, changed: set[int]
) -> dict[str, torch.Tensor] | None:
    """What layer `index`'s matrices become; None for scale/zero, which are done in place."""
    if strategy == "clone":
        source_index = clone_source(len(stack), index, changed)
        stack.check_editable([source_index])
        source = stack.matrices(source_index)
        return {name: p.detach() for name, p in source.items()}  # copy_ moves it across devices
    if strategy == "blend":
        return blend_weights(stack, index, changed)
    if strategy == "svd":  # the blend, plus the top-r singular directions of the layer's own difference
        blend = blend_weights(stack, index, changed)
        own = stack.matrices(index)
        assert param is not None  # svd's rank (trials() gives it)
        return {name: blend[name] + low_rank(own[name].detach() - blend[name], int(param)) for name in own}
    return None


@contextlib.contextmanager
def manipulated(
    stack: LayerStack, layers: Sequence[int], strategy: str, param: float | None = None
) -> Iterator[None]:
    """The layers changed by one strategy for the duration of the block, then restored exactly."""
    changed = {stack.check_index(i) for i in layers}
    with stack.preserved(sorted(changed)), torch.no_grad():
        for index in sorted(changed):
            target = target_weights(stack, index, strategy, param, changed)
            for name, weight in stack.matrices(index).items():
                if strategy == "zero":
                    weight.zero_()
                elif strategy == "scale":
                    assert param is not None  # scale's alpha (trials() gives it)
                    weight.mul_(param)
                else:
                    assert target is not None  # clone, blend and svd give their weights
                    weight.copy_(target[name])
        yield




Trial = tuple[tuple[int, ...], str, float | None]


def trials(settings: ManipulationSettings, layers: Sequence[int]) -> list[Trial]:
    """(layers, strategy, param) for every run: one layer at a time, then all together if asked."""

    def params(strategy: str) -> list[float | None]:
        if strategy == "scale":
            return list(settings.alphas)
        return [settings.rank] if strategy == "svd" else [None]

    groups = [(i,) for i in layers] + ([tuple(layers)] if settings.together and len(layers) > 1 else [])
    return [(group, s, p) for group in groups for s in settings.strategies for p in params(s)]


def run_manipulation(
    model: Any, tokenizer: Any, settings: ManipulationSettings, cancel: CancelToken | None = None, model_name: str = "",
    only: Collection[int] | None = None,
) -> Iterator[Event]:
    """Every trial of `trials`, or those at the positions in `only` (a worker's share of a split
    run; `merge_shards` puts the rows back in order). A trial's numbers depend on it alone: each
    starts from the weights as they were, and the samples are greedy."""
    settings.validate()
    started = time.perf_counter()
    evaluator = Evaluator.for_settings(model, tokenizer, settings, cancel=cancel)
    stack = evaluator.stack
    layers = sorted({stack.check_index(i) for i in settings.layers or range(len(stack))})
    needs_neighbours = any(s in ("clone", "blend", "svd") for s in settings.strategies)
    if needs_neighbours and (len(stack) < 2 or (settings.together and len(layers) == len(stack))):
        raise UserError("clone, blend and svd need a layer left as it is: choose fewer --layers "
                        "(or drop --together), or use --strategies zero,scale")
    plan = [trial for k, trial in enumerate(trials(settings, layers)) if only is None or k in only]
    baseline = evaluator.build_cache().perplexity
    baseline_sample = generate_text(model, tokenizer, settings.prompt, settings.sample_tokens)
    yield Progress(0, len(plan), "manipulate", unit="trials")
    rows = []
    for done, (group, strategy, param) in enumerate(plan, start=1):
        if cancel is not None:
            cancel.check()
        with manipulated(stack, group, strategy, param):
            ppl = evaluator.perplexity(min(group))
            sample = generate_text(model, tokenizer, settings.prompt, settings.sample_tokens)
        d = degradation_pct(ppl, baseline)
        rows.append(ManipulateRow(layers=list(group), strategy=strategy, param=param, ppl=ppl,
                                  degradation_pct=d, sample=sample, together=len(group) > 1))
        yield TrialDone(group, strategy, param, ppl, baseline, d, sample)
        yield Progress(done, len(plan), "manipulate", unit="trials")
    doc = ManipulateResult(
        model=model_name,
        baseline_ppl=baseline,
        baseline_sample=baseline_sample,
        prompt=settings.prompt,
        layers=layers,
        eval_tokens=evaluator.n_tokens,
        seconds=time.perf_counter() - started,
        settings=settings,
        results=rows,
        protocol=evaluator.protocol,
    )
    yield Result("manipulate", json_safe(doc))


def run(settings: ManipulationSettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry: without --layers, the layers the session's ablation map calls
    redundant or anti."""
    loaded = context.needed_model("manipulate")
    if settings.layers is None:
        chosen, why = default_layers(context.input(AblationMap), loaded.name)
        yield Message(f"layers: {why}")
        settings = replace(settings, layers=chosen)
    yield from run_manipulation(loaded.model, loaded.tokenizer, settings, context.cancel, loaded.name, context.share)


def planned(settings: ManipulationSettings, n_layers: int, ablation: AblationMap | None, model_name: str
            ) -> tuple[ManipulationSettings, list[Trial], str]:
    """The settings with their layers chosen (as `run` chooses them), the run's trials, and why those
    layers ("" when --layers named them), for a split run: every worker must agree on them."""
    why = ""
    if settings.layers is None:
        chosen, why = default_layers(ablation, model_name)
        settings = replace(settings, layers=chosen)
    layers = sorted(set(settings.layers or range(n_layers)))
    outside = [i for i in layers if not 0 <= i < n_layers]
    if outside:
        raise UserError(f"layer {outside[0]} is out of range; this model has layers 0 to {n_layers - 1}")
    return settings, trials(settings, layers), why


def shard_plan(settings: ManipulationSettings, n_layers: int, inputs: Mapping[str, dict[str, Any]], model_name: str
               ) -> ShardPlan:
    """The registry's split (`--shards`): by trial, each share's trial positions in RunContext.share;
    the layers are chosen once (`planned`) and logged as a serial run logs them."""
    ablation = decode_or_none(AblationMap, inputs.get(AblationMap.name))  # JSON in the plan's inputs
    chosen, planned_trials, why = planned(settings, n_layers, ablation, model_name)
    merge = functools.partial(merge_shards, settings=chosen)
    notes = (f"layers: {why}",) if why else ()
    return ShardPlan(list(range(len(planned_trials))), lambda share: chosen, merge, notes=notes)


def merge_shards(docs: list[dict[str, Any]], settings: ManipulationSettings) -> dict[str, Any]:
    """One result from the results of a split run (each over some trials): the rows in the order
    of the trials, as a serial run lists them."""
    shares = [ManipulateResult.from_json(doc) for doc in docs]
    position = {trial: k for k, trial in reversed(list(enumerate(trials(settings, shares[0].layers))))}

    def place(row: ManipulateRow) -> int:
        return position[(tuple(row.layers), row.strategy, row.param)]

    rows = sorted((row for share in shares for row in share.results), key=place)
    merged: dict[str, Any] = json_safe(replace(shares[0], results=rows,
                                               seconds=max(share.seconds for share in shares)))
    return merged
