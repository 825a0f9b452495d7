"""prune's criteria: for each count n, which layers (or, with --unit block, which attention and MLP
blocks) to remove: the cheap ones measured in the one pass that builds the prefix cache (angular,
angular_last, bi), the greedy perplexity search (ppl, SLEB), the session's ablation map, the last
layers. Layers are indexed from 0 in the uncut model."""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np
import torch

from engine.core.events import CancelToken, Event, Message, Progress
from engine.data.eval_data import EvalSource
from engine.evaluation.perplexity import Batch, Evaluator, masked
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.prune.replace import admissible
from engine.experiments.prune.vocabulary import BLOCK_METHODS, PruneCut, PruneSettings
from engine.models.anatomy import LayerStack
from engine.models.families import PARTS, Block
from engine.models.pruning import Cut, cut_removed, layer_params, removed_params

# --- reading the ablation map ---------------------------------------------------------------------


def map_degradation(ablation: AblationMap | None, blocks: bool = False) -> dict[Any, float]:
    """Layer -> D% from the session's ablation map (rows without a D% left out); with `blocks`,
    (layer, part) -> D% from its sublayer rows (`ablation --part`)."""
    if ablation is None:
        return {}
    if blocks:
        return {(row.layer, row.part): float(row.degradation_pct) for row in ablation.parts or ()
                if row.degradation_pct is not None}
    return {row.layer: float(row.degradation_pct) for row in ablation.layers if row.degradation_pct is not None}


# --- the cheap criteria, from one pass ------------------------------------------------------------


class AngularMeter:
    """Angular distance between the inputs of layers l and l+n for each requested n, averaged over
    real tokens, gathered while the prefix cache is built (the layer inputs are already kept). The
    sums stay tensors on the states' device until `distances`: no host sync per batch."""

    def __init__(self, n_layers: int, blocks: Sequence[int]) -> None:
        self.n_layers = n_layers
        self.blocks = tuple(blocks)
        self.sums: dict[tuple[int, int], torch.Tensor] = {}
        self.count: torch.Tensor | int = 0
        self._states: list[torch.Tensor] = []

    def __call__(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        self._states.append(layer_input)
        if index < self.n_layers - 1:
            return
        states = self._states + [layer_output]
        self._states = []
        self.count = self.count + batch.attention_mask.sum()
        for n in self.blocks:
            for start in range(self.n_layers - n + 1):
                first = states[start].float()
                cos = torch.nn.functional.cosine_similarity(first, states[start + n].to(first.device).float(), dim=-1)
                angle = torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi
                total = masked(angle, batch.attention_mask).sum().double()
                self.sums[n, start] = self.sums.get((n, start), 0) + total

    def distances(self, n: int) -> np.ndarray:
        """One host read for the row of sums (each sits on the GPU its first layer's states were on)."""
        row = [self.sums[n, start] for start in range(self.n_layers - n + 1)]
        return torch.stack([value.to(row[0].device) for value in row]).cpu().numpy() / float(self.count)


def cut_name(cut: Cut) -> str:
    """A cut in a few characters: layers `14-15`, blocks `14a-15m` (attention, MLP)."""
    return "-".join(f"{b[0]}{b[1][0]}" if isinstance(b, tuple) else str(b) for b in cut)


def units_of(n_layers: int, blocks: bool) -> list[Any]:
    """What a criterion ranks: the layers, or with `blocks` every (layer, part) in the order they run."""
    return [(i, part) for i in range(n_layers) for part in PARTS] if blocks else list(range(n_layers))


def greedy_ppl(model: Any, tokenizer: Any, texts: EvalSource, settings: PruneSettings, target: int,
               cancel: CancelToken | None, batch_size: int) -> Generator[Event, None, tuple[list[Any], list[float]]]:
    """SLEB: greedy removals, `target` layers (with --unit block: blocks until their parameters
    reach `target`). Returns (the order of removal, the first round's perplexity of each single
    removal, in `units_of` order). Each round builds the prefix cache of the model cut so far and
    evaluates every remaining layer (block) from its layer's position, skipped (equal to removed;
    tested)."""
    blocks = settings.unit == "block"
    candidates = units_of(len(LayerStack(model)), blocks)
    order: list[Any] = []  # layers, or (layer, part) blocks
    first: list[float] = []

    def reached() -> int:  # how far towards the target the order goes
        return min(removed_params(model, order), target) if blocks else len(order)

    while reached() < target:
        with cut_removed(model, tuple(order)) as kept:
            # sized once, by the caller
            evaluator = Evaluator(model, tokenizer, texts, batch_size, settings.max_length, cancel=cancel)
            evaluator.build_cache()
            rest = [unit for unit in candidates if unit not in order]
            trial = []
            for unit in rest:
                if cancel is not None:
                    cancel.check()
                position = kept.index(unit[0] if blocks else unit)
                with (evaluator.stack.part_skipped(position, unit[1]) if blocks
                      else evaluator.stack.skipped([position])):
                    trial.append(evaluator.perplexity(position))
            del evaluator
        if not order:
            first = trial
        best = int(np.argmin([p if math.isfinite(p) else math.inf for p in trial]))
        order.append(rest[best])
        yield Progress(reached(), target, "prune: ppl greedy search", unit="parameters" if blocks else "layers")
        yield Message(f"ppl round {len(order)}: remove {'block' if blocks else 'layer'} {cut_name((rest[best],))} "
                      f"(PPL {trial[best]:.3f})")
    return order, first


def criterion_layers(method: str, counts: Sequence[int], *, bi: np.ndarray, angular: AngularMeter | None,
                     greedy: Sequence[int], degradation: dict[int, float],
                     last_blocks: dict[int, np.ndarray] | None = None,
                     foldable: bool = False) -> dict[int, tuple[int, ...]]:
    """The layers (original indices, sorted) each count removes under one criterion. With
    `foldable` (a block criterion for --replace), the best block that has a layer before it and
    stops before the last layer."""
    if method in BLOCK_METHODS:
        chosen = {}
        n_layers = len(bi)
        for n in counts:
            if method == "angular":
                assert angular is not None  # the angular criterion measures its distances (prune's run)
                measured = angular.distances(n)
            else:
                assert last_blocks is not None  # angular_last's distances: prune's run passes them
                measured = last_blocks[n]
            distances = np.asarray(measured, dtype=float)
            if foldable:
                distances = np.array([d if admissible(n_layers, start, n) else np.inf
                                      for start, d in enumerate(distances)])
            start = int(np.argmin(distances))
            chosen[n] = tuple(range(start, start + n))
        return chosen
    if method == "last":  # the last layers before the final norm (the baseline of Reassessing Layer Pruning)
        return {n: tuple(range(len(bi) - n, len(bi))) for n in counts}
    if method == "bi":
        order = [int(i) for i in np.argsort(bi, kind="stable")]
    elif method == "map":
        order = sorted(degradation, key=lambda layer: (degradation[layer], layer))
    else:
        order = list(greedy)
    return {n: tuple(sorted(order[:n])) for n in counts}


PROXIES = {"bi": 0, "angular": 1, "angular_last": 2}  # a criterion's place in PartMeter.means' triples


def block_order(method: str, n_layers: int, *, proxies: dict[Block, tuple[float, float, float]],
                greedy: Sequence[Block], degradation: dict[Block, float]) -> list[Block]:
    """Every attention and MLP block, cheapest to remove first, by one criterion (--unit block):
    each block's own proxy (LLM-Drop), the greedy order, the sublayer map's D%, or from the end."""
    units = units_of(n_layers, True)
    if method == "ppl":
        return list(greedy)
    if method == "last":
        return units[::-1]
    score = degradation if method == "map" else {b: proxies[b][PROXIES[method]] for b in units}
    return sorted(units, key=lambda b: score[b])  # stable: ties in running order


def layers_worth(model: Any, n: int) -> float:
    """The parameters of n layers (n times the mean decoder layer's)."""
    sizes = layer_params(model)
    return n * sum(sizes) / len(sizes)


def block_cuts(model: Any, order: Sequence[Block], counts: Sequence[int]) -> dict[int, tuple[Block, ...]]:
    """Each count n: the first blocks of `order` whose removed parameters reach n layers' worth."""
    chosen = {}
    for n in counts:
        target = layers_worth(model, n)
        taken: list[Block] = []
        for block in order:
            if removed_params(model, taken) >= target:
                break
            taken.append(block)
        chosen[n] = tuple(sorted(taken, key=lambda b: (b[0], PARTS.index(b[1]))))
    return chosen


def point_cut(point: PruneCut) -> Cut:
    """What a curve's point removed, as `cut_removed` takes it: its blocks, else its layers."""
    return tuple((b.layer, b.part) for b in point.blocks) if point.blocks else tuple(point.layers)

