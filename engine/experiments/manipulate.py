"""A4: the five manipulation strategies for a layer (zero, clone, blend, low-rank SVD blend, scale),
one layer at a time and, with `together`, on every chosen layer at once. Each trial measures
perplexity from the lowest changed layer on through the prefix cache, writes a short greedy sample,
and puts the weights back bit for bit.

Sources are always layers left as they are: one at a time, every other layer; together, the layers
outside the chosen set. So a trial can write its layers one by one in any order.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from engine.anatomy import LayerStack
from engine.errors import UserError
from engine.events import CancelToken, Event, Progress, Result, event_type, json_safe
from engine.perplexity import Evaluator
from engine.statistics import degradation_pct

STRATEGIES = ("zero", "clone", "blend", "svd", "scale")
PAPER_ALPHAS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)


@dataclass(frozen=True)
class ManipulationSettings:
    """Defaults follow the paper: the five strategies, alpha grid 0-0.9, one layer at a time."""

    layers: tuple[int, ...] = ()  # empty: every layer (the CLI fills in the session's redundant/anti layers)
    strategies: tuple[str, ...] = STRATEGIES
    alphas: tuple[float, ...] = PAPER_ALPHAS
    rank: int = 8
    together: bool = False
    prompt: str = "The capital of France is"
    sample_tokens: int = 20
    eval_set: str = "full"
    eval_file: str | None = None
    batch_size: int = 8
    max_length: int = 256

    def validate(self) -> None:
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown or not self.strategies:
            name = unknown[0] if unknown else ""
            raise UserError(f"unknown strategy {name!r}; use {', '.join(STRATEGIES)}")
        if self.rank <= 0:
            raise UserError("--rank must be a positive number of singular directions, e.g. 8")
        if "scale" in self.strategies and not self.alphas:
            raise UserError("--alphas is empty; give at least one scale factor, e.g. 0.9")
        if self.sample_tokens < 0:
            raise UserError("--sample-tokens must be 0 (no samples) or more")
        if self.batch_size < 1:
            raise UserError("--batch-size must be at least 1")


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
    if below is None or above is None:
        source = stack.matrices(below if above is None else above)
        return {name: p.detach().clone() for name, p in source.items()}
    w_below = (above - index) / (above - below)
    low, high = stack.matrices(below), stack.matrices(above)
    return {  # summed in float32, cast once: half precision would round each term
        name: (w_below * low[name].detach().float() + (1 - w_below) * high[name].detach().float()).to(low[name].dtype)
        for name in low
    }


def clone_source(n_layers: int, index: int, changed: set[int]) -> int:
    """The nearest unchanged layer; on a tie, the one below (it feeds this layer's position)."""
    below, above = nearest_kept(n_layers, index, changed)
    if below is None or (above is not None and above - index < index - below):
        return above
    return below


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
        return matrix.detach().clone()
    top = _top_right_vectors(side, rank, tol, max_iter)
    approx = (side @ top) @ top.T
    return (approx if tall else approx.T).to(matrix.dtype)


def _top_right_vectors(side: torch.Tensor, rank: int, tol: float, max_iter: int) -> torch.Tensor:
    n = side.shape[1]
    k = min(n, rank + 32)
    generator = torch.Generator(device=side.device).manual_seed(0)
    basis = torch.linalg.qr(torch.randn(n, k, generator=generator, device=side.device))[0]
    previous = None
    for _ in range(max_iter):
        block = side @ basis
        _, _, vh = torch.linalg.svd(block, full_matrices=False)
        top = basis @ vh[:rank].T  # Ritz vectors: the best top-r estimate in this subspace
        if previous is not None:
            moved = torch.linalg.matrix_norm(top - previous @ (previous.T @ top), ord=2)
            if float(moved) < tol:
                return top
        previous = top
        basis = torch.linalg.qr(side.T @ block)[0]
    _, vectors = torch.linalg.eigh((side.T @ side).double())  # exact fallback, ascending eigenvalues
    return vectors[:, -rank:].to(side.dtype)


def target_weights(
    stack: LayerStack, index: int, strategy: str, param: float | None, changed: set[int]
) -> dict[str, torch.Tensor] | None:
    """What layer `index`'s matrices become; None for scale/zero, which are done in place."""
    if strategy == "clone":
        source = stack.matrices(clone_source(len(stack), index, changed))
        return {name: p.detach() for name, p in source.items()}
    if strategy == "blend":
        return blend_weights(stack, index, changed)
    if strategy == "svd":  # the blend, plus the top-r singular directions of the layer's own difference
        blend = blend_weights(stack, index, changed)
        own = stack.matrices(index)
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
                    weight.mul_(param)
                else:
                    weight.copy_(target[name])
        yield


def greedy_sample(model, tokenizer, prompt: str, tokens: int) -> str:
    """A short greedy continuation, so the user can read what a perplexity means."""
    if tokens == 0:
        return ""
    device = next(model.parameters()).device
    encoded = tokenizer(prompt, return_tensors="pt").to(device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=tokens, do_sample=False, pad_token_id=pad,
                             temperature=None, top_p=None, top_k=None)
    return tokenizer.decode(out[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True)


@event_type
@dataclass(frozen=True)
class TrialDone(Event):
    kind: ClassVar[str] = "manipulate.trial"
    layers: tuple[int, ...]
    strategy: str
    param: float | None
    ppl: float
    baseline_ppl: float
    degradation_pct: float
    sample: str


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
    model, tokenizer, settings: ManipulationSettings, cancel: CancelToken | None = None, model_name: str = ""
) -> Iterator[Event]:
    settings.validate()
    started = time.perf_counter()
    evaluator = Evaluator.for_settings(model, tokenizer, settings)
    stack = evaluator.stack
    layers = sorted({stack.check_index(i) for i in settings.layers or range(len(stack))})
    needs_neighbours = any(s in ("clone", "blend", "svd") for s in settings.strategies)
    if needs_neighbours and (len(stack) < 2 or (settings.together and len(layers) == len(stack))):
        raise UserError("clone, blend and svd need a layer left as it is: choose fewer --layers "
                        "(or drop --together), or use --strategies zero,scale")
    plan = trials(settings, layers)
    baseline = evaluator.build_cache().perplexity
    baseline_sample = greedy_sample(model, tokenizer, settings.prompt, settings.sample_tokens)
    yield Progress(0, len(plan), "manipulate")
    rows = []
    for done, (group, strategy, param) in enumerate(plan, start=1):
        if cancel is not None:
            cancel.check()
        with manipulated(stack, group, strategy, param):
            ppl = evaluator.perplexity(min(group))
            sample = greedy_sample(model, tokenizer, settings.prompt, settings.sample_tokens)
        d = degradation_pct(ppl, baseline)
        rows.append({"layers": list(group), "strategy": strategy, "param": param, "ppl": ppl,
                     "degradation_pct": d, "sample": sample, "together": len(group) > 1})
        yield TrialDone(group, strategy, param, ppl, baseline, d, sample)
        yield Progress(done, len(plan), "manipulate")
    doc = {
        "model": model_name,
        "baseline_ppl": baseline,
        "baseline_sample": baseline_sample,
        "prompt": settings.prompt,
        "layers": layers,
        "eval_tokens": evaluator.n_tokens,
        "seconds": time.perf_counter() - started,
        "settings": asdict(settings),
        "results": rows,
    }
    yield Result("manipulate", json_safe(doc))
