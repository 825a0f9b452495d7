"""A1: the layer-importance map. Each layer in turn is replaced (neighbour mean, skip or zero),
the model is evaluated from that layer on through the prefix cache, and the weights are put back."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import torch

from engine.anatomy import LayerStack
from engine.errors import UserError
from engine.events import CancelToken, Event, Progress, Result, event_type
from engine.perplexity import Batch, Evaluator
from engine.statistics import bootstrap_degradation, degradation_pct, importance_class, spearman

METHODS = ("mean", "skip", "zero")


@dataclass(frozen=True)
class AblationSettings:
    """Defaults follow the paper: neighbour mean, norms untouched."""

    method: str = "mean"
    eval_set: str = "full"
    eval_file: str | None = None
    bootstrap: int = 0
    batch_size: int = 8
    max_length: int = 256
    seed: int = 0
    prefix_cache: bool = True  # off only to measure the straightforward version

    def validate(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"unknown method {self.method!r}; use one of {', '.join(METHODS)}")
        if self.bootstrap < 0:
            raise UserError("--bootstrap must be 0 (off) or a positive number of resamples, e.g. 1000")
        if self.batch_size < 1:
            raise UserError("--batch-size must be at least 1")


@event_type
@dataclass(frozen=True)
class LayerAblated(Event):
    """One row of the map, as soon as it is known (before any bootstrap)."""

    kind: ClassVar[str] = "ablation.layer"
    index: int
    n_layers: int
    ppl: float
    baseline_ppl: float
    degradation_pct: float
    layer_class: str


def neighbour_mean(stack: LayerStack, index: int) -> dict[str, torch.Tensor]:
    """(W[l-1] + W[l+1]) / 2 per matrix; an edge layer takes its single neighbour."""
    neighbours = [i for i in (index - 1, index + 1) if 0 <= i < len(stack)]
    if not neighbours:
        raise UserError("a one-layer model has no neighbours to ablate with; use --method skip or zero")
    mats = [stack.matrices(i) for i in neighbours]
    means = {}
    for name in stack.matrix_names:  # summed in float32, cast once: half precision would round twice
        total = sum(m[name].detach().float() for m in mats) / len(mats)
        means[name] = total.to(mats[0][name].dtype)
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


class InfluenceMeter:
    """Block Influence (1 - cos(h_in, h_out)) and angular distance (arccos(cos) / pi) per layer,
    averaged over real tokens, accumulated while the prefix cache is built."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.sums: torch.Tensor | None = None  # (influence, angular, count) per layer, on the model's device

    def __call__(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        """Accumulates on the device: no host sync inside the forward's per-layer hooks."""
        cos = torch.nn.functional.cosine_similarity(layer_input.float(), layer_output.float(), dim=-1)
        cos = cos.clamp(-1.0, 1.0)
        mask = batch.attention_mask.to(cos.dtype)
        if self.sums is None:
            self.sums = torch.zeros(3, self.n_layers, dtype=torch.float64, device=cos.device)
        self.sums[0, index] += ((1 - cos) * mask).sum()
        self.sums[1, index] += (torch.arccos(cos) / math.pi * mask).sum()
        self.sums[2, index] += mask.sum()

    def means(self) -> tuple[np.ndarray, np.ndarray]:
        sums = self.sums.cpu().numpy() if self.sums is not None else np.zeros((3, self.n_layers))
        return sums[0] / sums[2], sums[1] / sums[2]


def run_ablation(
    model, tokenizer, settings: AblationSettings, cancel: CancelToken | None = None, model_name: str = ""
) -> Iterator[Event]:
    settings.validate()
    started = time.perf_counter()
    evaluator = Evaluator.for_settings(model, tokenizer, settings)
    stack = evaluator.stack
    n = len(stack)
    meter = InfluenceMeter(n)
    base = evaluator.build_cache(observe=meter)
    if not settings.prefix_cache:
        evaluator.drop_cache()
    baseline = base.perplexity
    yield Progress(0, n, "ablation")
    scores = []
    for index in range(n):
        if cancel is not None:
            cancel.check()
        with ablated(stack, index, settings.method):
            layer_scores = evaluator.scores(index if settings.prefix_cache else 0)
        scores.append(layer_scores)
        ppl = layer_scores.perplexity
        d = degradation_pct(ppl, baseline)
        yield LayerAblated(index, n, ppl, baseline, d, importance_class(d))
        yield Progress(index + 1, n, "ablation")

    influence, angular = meter.means()
    layers = []
    for index, layer_scores in enumerate(scores):
        ppl = layer_scores.perplexity
        d = degradation_pct(ppl, baseline)
        low = high = None
        if settings.bootstrap:
            low, high = bootstrap_degradation(
                layer_scores.nll, base.nll, base.tokens, settings.bootstrap, settings.seed + index
            )
        anti = d < 0 and (high is None or high < 0)
        layers.append(
            {
                "index": index,
                "ppl": ppl,
                "degradation_pct": d,
                "class": importance_class(d),
                "anti": anti,
                "anti_within_noise": d < 0 and not anti,
                "ci_low": low,
                "ci_high": high,
                "block_influence": float(influence[index]),
                "angular_distance": float(angular[index]),
            }
        )
    degradations = [row["degradation_pct"] for row in layers]
    doc = {
        "model": model_name,
        "method": settings.method,
        "baseline_ppl": baseline,
        "eval_tokens": evaluator.n_tokens,
        "eval_texts": len(evaluator.texts),
        "seconds": time.perf_counter() - started,
        "settings": asdict(settings),
        "layers": layers,
        "spearman": {
            "block_influence": spearman(influence, degradations),
            "angular_distance": spearman(angular, degradations),
        },
    }
    yield Result("ablation", doc)
