"""A1: the layer-importance map. Each layer in turn is replaced (neighbour mean, skip or zero),
the model is evaluated from that layer on through the prefix cache, and the weights are put back.

Below the layer (`--part`): each layer's attention and MLP blocks removed alone (skip: the block's
term in the residual sum is zero, the field's removal; zero: its matrices zeroed; mean: its matrices
the neighbours' mean), evaluated from their layer's input through the same cache. `--proxies-only`:
the cheap measures of every layer and block from the one pass, no ablation."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.core.codec import ABSENT, from_doc, json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Pace, Result, kept_on_stop
from engine.core.turns import Change, ModelTurns
from engine.evaluation.perplexity import Batch, Evaluator, Scoring, TextScores, drained, masked
from engine.evaluation.statistics import bootstrap_degradation, degradation_pct, importance_class, spearman
from engine.experiments.ablation.vocabulary import (
    AblationMap,
    AblationProxies,
    AblationProxyMap,
    AblationRow,
    AblationSettings,
    LayerAblated,
    ProxyRow,
)
from engine.experiments.ablation.wavefront import (
    StreamCheckpoint,
    Wavefront,
    close_after,
    reach_of,
    streamed_evaluator,
    unit_name,
)
from engine.experiments.context import RunContext
from engine.experiments.sweep_checkpoint import CHECKPOINT_FILE, resumed, write_checkpoint
from engine.models.anatomy import LayerStack
from engine.models.distributed import ShardPlan
from engine.models.families import PARTS, check_parts
from engine.models.streaming import LayerSource, StreamedModel

STREAM_FILE = "stream.safetensors"  # a streamed map's wavefront, beside the finished rows (layers.json)


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
        total = sum(m[name].detach().to(own[name].device).float() for m in mats) / len(mats)
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


class PartMeter:
    """Block Influence and the angular distances (all tokens, and each text's last token) of every
    attention and MLP block: between the residual stream before the block's addition and after it.
    Sequential layers: attention from the layer's input h to h + a, the MLP from h + a to the
    layer's output; parallel ones (GPT-NeoX): each block from h to h plus its own term. The blocks'
    terms come from `LayerStack.capture_parts` (`term`), the layer's input and output from the
    layer observer (the call), in the same forward."""

    def __init__(self, stack: LayerStack, parts: tuple[str, ...]) -> None:
        self.parts = parts
        self.parallel = stack.parallel_residual
        self.terms: dict[tuple[int, str], torch.Tensor] = {}
        self.sums: dict[tuple[int, str], torch.Tensor] = {}  # (influence, angular, tokens, last angular, rows)

    def term(self, batch: Batch | None, index: int, part: str, term: torch.Tensor) -> None:
        self.terms[(index, part)] = term

    def __call__(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        attention = self.terms.pop((index, "attention")).reshape(layer_input.shape).to(layer_input.device)
        mlp = self.terms.pop((index, "mlp")).reshape(layer_input.shape).to(layer_input.device)
        middle = layer_input + attention  # as the layer adds it (OPT's fc2 term comes flat: reshaped)
        pairs = {"attention": (layer_input, middle),
                 "mlp": (layer_input, layer_input + mlp) if self.parallel else (middle, layer_output)}
        for part in self.parts:
            self._add(batch, (index, part), *pairs[part])

    def _add(self, batch: Batch, key: tuple[int, str], before: torch.Tensor, after: torch.Tensor) -> None:
        after = after.to(before.device)
        cos = torch.nn.functional.cosine_similarity(before.float(), after.float(), dim=-1).clamp(-1.0, 1.0)
        mask = batch.attention_mask.to(cos.device)
        last = mask.sum(dim=1) - 1
        rows = torch.arange(len(last), device=cos.device)
        unit = [torch.nn.functional.normalize(x[rows, last].double(), dim=-1) for x in (before, after)]
        last_cos = (unit[0] * unit[1]).sum(dim=-1).clamp(-1.0, 1.0)
        values = torch.stack([
            masked(1 - cos, mask).sum().double(), masked(torch.arccos(cos) / math.pi, mask).sum().double(),
            mask.sum().double(), (torch.arccos(last_cos) / math.pi).sum(), last_cos.new_tensor(len(last)),
        ])  # fmt: skip
        self.sums[key] = self.sums[key] + values if key in self.sums else values

    def means(self) -> dict[tuple[int, str], tuple[float, float, float]]:
        """(layer, part) -> (Block Influence, angular all tokens, angular last token)."""
        found = {}
        for key, sums in self.sums.items():
            influence, angular, tokens, last, rows = sums.cpu().tolist()
            found[key] = (influence / tokens, angular / tokens, last / rows)
        return found


class InfluenceMeter:
    """Block Influence (1 - cos(h_in, h_out)) and angular distance (arccos(cos) / pi) per layer,
    averaged over real tokens (`angular_all_tokens`), accumulated while the prefix cache is built;
    and each text's (window's) last-token hidden state at every layer's input, for the field's
    last-token definitions (`last_token_blocks`: Gromov et al., PruneMe, short-transformers)."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.sums: dict[int, torch.Tensor] = {}  # layer -> (influence, angular, count), on that layer's device
        self.last: dict[int, list[torch.Tensor]] = {}  # layer (n_layers: the last one's output) -> [rows, hidden]

    def __call__(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        """Accumulates on the layer's own device (the layers of a split model sit on several GPUs):
        no host sync inside the forward's per-layer hooks."""
        cos = torch.nn.functional.cosine_similarity(layer_input.float(), layer_output.float(), dim=-1)
        cos = cos.clamp(-1.0, 1.0)
        mask = batch.attention_mask
        values = torch.stack([masked(1 - cos, mask).sum(), masked(torch.arccos(cos) / math.pi, mask).sum(),
                              mask.to(cos.device).sum()]).double()
        self.sums[index] = self.sums[index] + values if index in self.sums else values
        last = mask.to(layer_input.device).sum(dim=1) - 1  # right padding: each row's last real token
        rows = torch.arange(len(last), device=layer_input.device)
        self.last.setdefault(index, []).append(layer_input[rows, last].detach().float())
        if index == self.n_layers - 1:
            output = layer_output[rows, last.to(layer_output.device)]
            self.last.setdefault(index + 1, []).append(output.detach().float())

    def last_token_blocks(self) -> dict[int, np.ndarray]:
        """n -> the angular distance arccos(cos(h_l, h_{l+n})) / pi between the last token's input
        of layer l and of layer l + n (the last layer's output for l + n = depth), averaged over
        texts (windows), for l = 0 .. depth - n: Gromov et al.'s block measure; n = 1 is each
        layer's own last-token angular distance."""
        if not self.last:
            return {}
        home = self.last[0][0].device
        states = torch.stack([torch.cat([t.to(home) for t in self.last[i]]) for i in range(self.n_layers + 1)])
        unit = torch.nn.functional.normalize(states.double(), dim=-1)  # [depth + 1, rows, hidden]; float64: arccos
        # near cos = 1 turns float32's rounding into angles of 1e-4
        blocks = {}
        for n in range(1, self.n_layers + 1):
            cos = (unit[:-n] * unit[n:]).sum(dim=-1).clamp(-1.0, 1.0)
            blocks[n] = (torch.arccos(cos) / math.pi).mean(dim=1).cpu().numpy()
        return blocks

    def means(self) -> tuple[np.ndarray, np.ndarray]:
        """One host copy at the end, after gathering the sums on one device."""
        if not self.sums:
            return np.full(self.n_layers, np.nan), np.full(self.n_layers, np.nan)
        home = self.sums[min(self.sums)].device
        sums = torch.stack([self.sums[i].to(home) for i in range(self.n_layers)], dim=1).cpu().numpy()
        return sums[0] / sums[2], sums[1] / sums[2]


Unit = tuple[int, str | None]  # (layer, None) for a whole layer, (layer, "attention" or "mlp") for a block


def run_ablation(
    model, tokenizer, settings: AblationSettings, cancel: CancelToken | None = None, model_name: str = "",
    turns: ModelTurns | None = None, done: Mapping[Unit, AblationRow] | None = None,
    keep: Callable[[AblationRow], None] | None = None, stream: LayerSource | None = None,
    stream_state: StreamCheckpoint | None = None,
) -> Iterator[Event]:
    """The map. With `turns` (a model the console shares with its prompt pane) every forward is a
    turn of its own, and each layer is ablated inside the turn and put back before it ends, so
    another thread waits for one batch, never for the map, and never sees a changed layer; without,
    each layer is ablated once for all its batches.

    `done`: rows an earlier run with the same settings finished (--resume), not measured again;
    `keep(row)` hears each row as soon as it is finished (the checkpoint). A run stopped before its
    last row (a cancel, Ctrl-C, SIGTERM) still hands over the rows it has: a Result marked `partial`,
    then the stop goes on. Every row depends on its own layer alone (its bootstrap's seed too), so
    a row of a partial map equals the full map's, and a resumed map equals an uninterrupted one.

    With `stream` (a skeleton `model` and its layer source) the map is one streamed wavefront
    (engine/experiments/ablation/wavefront.py): the same rows, each weight read once; its state
    kept in `stream_state` every few layers, from which a killed run resumes."""
    settings.validate()
    started = time.perf_counter()
    evaluator = Evaluator.for_settings(model, tokenizer, settings, cancel=cancel) if stream is None else \
        streamed_evaluator(stream, tokenizer, settings, cancel)
    stack = evaluator.stack
    n = len(stack)
    parts = settings.parts()
    if parts:
        check_parts(stack.model_type)
    meter = InfluenceMeter(n)
    part_meter = PartMeter(stack, parts) if parts else None
    todo = range(n) if settings.layers is None else sorted({stack.check_index(i) for i in settings.layers})
    units: list[Unit] = [(index, part) for index in todo for part in (None, *parts)]  # a layer, then its blocks
    rows = {unit: (done or {})[unit] for unit in units if unit in (done or {})}

    def removal(index: int, part: str | None) -> contextlib.AbstractContextManager[None]:
        return ablated(stack, index, settings.method) if part is None else \
            ablated_part(stack, index, part, settings.method)

    def in_memory(index: int, part: str | None) -> TextScores:
        start = index if settings.prefix_cache else 0
        return drained(per_turn(turns, functools.partial(removal, index, part),
                                functools.partial(evaluator.scoring, start)))

    if stream is None:
        score = in_memory
        base = yield from first_pass(evaluator, meter, part_meter, turns,
                                     keep=settings.prefix_cache and not settings.proxies_only)
    else:
        front = Wavefront(evaluator, stream, [] if settings.proxies_only else [u for u in units if u not in rows],
                          removal, reach_of(settings.method), stream_state)
        base = yield from front.run(meter, part_meter)
        score = front.score
    baseline = base.perplexity
    influence, angular = meter.means()
    blocks = meter.last_token_blocks()
    yield AblationProxies([float(v) for v in influence], [float(v) for v in angular], baseline)
    block_proxies = part_meter.means() if part_meter is not None else {}
    if settings.proxies_only:
        yield Result("ablation-proxies", json_safe(proxy_map(
            model_name, evaluator, settings, time.perf_counter() - started, baseline, (influence, angular, blocks),
            block_proxies)))
        return
    if rows:
        yield Message(f"resuming: {len(rows)} of {len(units)} {'rows' if parts else 'layers'} already finished "
                      f"({', '.join(unit_name(unit) for unit in rows)}), skipped")
    pace = Pace("ablation", len(units), "layers", first=len(rows))
    yield pace.at(len(rows))

    def row(index: int, part: str | None, unit_scores: TextScores) -> AblationRow:
        ppl = unit_scores.perplexity
        d = degradation_pct(ppl, baseline)
        low = high = None
        if settings.bootstrap:
            low, high = bootstrap_degradation(
                unit_scores.nll, base.nll, base.tokens, settings.bootstrap, settings.seed + index
            )
        anti = d < 0 and (high is None or high < 0)
        if part is None:
            proxies = float(influence[index]), float(angular[index]), float(blocks[1][index])
        else:
            proxies = block_proxies[(index, part)]
        return AblationRow(
            layer=index,
            ppl=ppl,
            degradation_pct=d,
            layer_class=importance_class(d),
            anti=anti,
            anti_within_noise=d < 0 and not anti,
            ci_low=low,
            ci_high=high,
            block_influence=proxies[0],
            angular_distance=proxies[1],
            angular_last_token=proxies[2],
            **({"part": part} if part else {}),
        )

    def document(partial: bool) -> AblationMap:
        ordered = [rows[unit] for unit in units if unit in rows]
        layers = [found for found in ordered if found.part is ABSENT]
        part_rows = [found for found in ordered if found.part is not ABSENT]
        return AblationMap(
            model=model_name,
            method=settings.method,
            baseline_ppl=baseline,
            eval_tokens=evaluator.n_tokens,
            eval_texts=evaluator.n_texts,
            seconds=time.perf_counter() - started,
            settings=settings,
            layers=layers,
            spearman=all_spearmans(layers, part_rows),
            protocol=evaluator.protocol,
            angular_blocks={str(k): [float(v) for v in values] for k, values in blocks.items()},
            angular_block_best=block_search(blocks),
            **({"parts": part_rows} if parts else {}),
            **({"partial": True} if partial else {}),
        )

    def measured() -> Iterator[Event]:
        for index, part in units:
            if (index, part) in rows:
                continue
            unit_scores = score(index, part)
            finished = rows[(index, part)] = row(index, part, unit_scores)
            if keep is not None:
                keep(finished)
            yield LayerAblated(index, n, finished.ppl, baseline, finished.degradation_pct, finished.layer_class,
                               **({"part": part} if part else {}))
            yield pace.at(len(rows))

    yield from kept_on_stop(measured(), lambda: Result("ablation", json_safe(document(partial=True))) if rows else None)
    yield Result("ablation", json_safe(document(partial=False)))


def per_turn(turns: ModelTurns | None, change: Change | None, measure: Callable[..., Scoring]) -> Scoring:
    """`measure(around=...)` (an Evaluator's pass) with the model changed by `change()`: for each
    batch's turn only when the model is shared (`turns`), else once around the whole pass."""
    if turns is not None:
        return (yield from measure(around=turns.around(change)))
    with change() if change is not None else contextlib.nullcontext():
        return (yield from measure())


def first_pass(evaluator: Evaluator, meter: InfluenceMeter, part_meter: PartMeter | None, turns: ModelTurns | None,
               keep: bool) -> Scoring:
    """The baseline's one forward: the prefix cache when `keep`, every layer's proxies on the way and
    with `part_meter` every block's (its terms captured in the same forward); its progress batch by batch."""
    if part_meter is None:
        return (yield from per_turn(turns, None, functools.partial(evaluator.building, meter, keep)))

    def both(batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        meter(batch, index, layer_input, layer_output)
        part_meter(batch, index, layer_input, layer_output)

    capture = functools.partial(evaluator.stack.capture_parts, part_meter.term)
    return (yield from per_turn(turns, capture, functools.partial(evaluator.building, both, keep)))


def proxy_map(model_name: str, evaluator: Evaluator, settings: AblationSettings, seconds: float, baseline: float,
              layer_proxies: tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]],
              block_proxies: dict[tuple[int, str], tuple[float, float, float]]) -> AblationProxyMap:
    """`--proxies-only`: the measures of the one pass, as the full map would record them."""
    influence, angular, blocks = layer_proxies
    layers = [ProxyRow(index, float(influence[index]), float(angular[index]), float(blocks[1][index]))
              for index in range(len(influence))]
    ordered = sorted(block_proxies, key=lambda key: (key[0], PARTS.index(key[1])))
    parts = [ProxyRow(index, *block_proxies[(index, part)], part=part) for index, part in ordered]
    return AblationProxyMap(
        model=model_name, baseline_ppl=baseline, eval_tokens=evaluator.n_tokens, eval_texts=evaluator.n_texts,
        seconds=seconds, settings=settings, layers=layers, protocol=evaluator.protocol,
        angular_blocks={str(k): [float(v) for v in values] for k, values in blocks.items()},
        angular_block_best=block_search(blocks), **({"parts": parts} if settings.parts() else {}),
    )


def spearmans(layers: list[AblationRow]) -> dict[str, float]:
    """How well the cheap per-layer measures rank the layers like the ablation does (the angular
    distance over all tokens, `angular_distance`, and of the last token, the field's)."""
    degradations = [row.degradation_pct for row in layers]
    found = {
        "block_influence": spearman([row.block_influence for row in layers], degradations),
        "angular_distance": spearman([row.angular_distance for row in layers], degradations),
    }
    if all(isinstance(row.angular_last_token, float) for row in layers):
        found["angular_last_token"] = spearman([row.angular_last_token for row in layers], degradations)
    return found


def all_spearmans(layers: list[AblationRow], parts: list[AblationRow]) -> dict[str, float]:
    """The whole layers' rankings, and with blocks each block kind's, keyed `<part>:<measure>`."""
    found = spearmans(layers)
    for part in PARTS:
        rows = [row for row in parts if row.part == part]
        if rows:
            found.update({f"{part}:{key}": value for key, value in spearmans(rows).items()})
    return found


def block_search(blocks: dict[int, np.ndarray]) -> dict[str, int]:
    """short-transformers' block search: for each block length n, the first layer l of the block
    whose last-token angular distance from layer l's input to layer l+n's is smallest."""
    return {str(n): int(np.argmin(values)) for n, values in blocks.items()}


def merge_shards(docs: list[dict], settings: AblationSettings) -> dict:
    """One map from the maps of a split sweep (each over some layers): rows in layer order and the
    Spearman over all of them, so the numbers equal a serial run's."""
    maps = [AblationMap.from_json(doc) for doc in docs]
    layers = sorted((row for part in maps for row in part.layers), key=lambda row: row.layer)
    blocks = sorted((row for part in maps for row in part.parts or ()),
                    key=lambda row: (row.layer, PARTS.index(row.part)))
    merged = dataclasses.replace(
        maps[0], seconds=max(part.seconds for part in maps), settings=settings, layers=layers,
        spearman=all_spearmans(layers, blocks), **({"parts": blocks} if settings.parts() else {}),
    )
    return json_safe(merged)


def shard_plan(settings: AblationSettings, n_layers: int, inputs: Mapping[str, dict], model_name: str) -> ShardPlan:
    """The registry's split (`--shards`): by layer, each share's layers through its settings (with
    --part, a layer's blocks go with it)."""
    if settings.proxies_only:
        raise UserError("--proxies-only is one pass; it does not split over workers: drop --shards")
    layers = range(n_layers) if settings.layers is None else sorted(set(settings.layers))
    merge = functools.partial(merge_shards, settings=settings)
    return ShardPlan(list(layers), lambda share: dataclasses.replace(settings, layers=tuple(share)), merge)


def run(settings: AblationSettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry: the map of the context's model. With a checkpoint folder (a session's)
    each finished row is kept there at once, and `context.resume` skips the rows an earlier run with
    the same key finished (a share of a split sweep keeps none: rank 0 merges the shares)."""
    loaded = context.needed_model("ablation")
    folder = context.checkpoint_dir if context.share is None else None
    state, note = resumed(settings, loaded, folder, context.resume)
    yield from note
    done = finished_rows(state, Path(folder) / CHECKPOINT_FILE if folder is not None else None)
    keep = None
    if folder is not None:
        path = Path(folder) / CHECKPOINT_FILE
        write_checkpoint(path, state)  # a fresh run forgets an older run's rows

        def keep(row: AblationRow) -> None:
            state["layers"][unit_name((row.layer, None if row.part is ABSENT else row.part))] = json_safe(row)
            write_checkpoint(path, state)

    stream = loaded.stream if isinstance(loaded, StreamedModel) else None
    stream_state = None if stream is None or folder is None else \
        StreamCheckpoint(Path(folder) / STREAM_FILE, state["key"], context.resume)
    events = run_ablation(loaded.model, loaded.tokenizer, settings, context.cancel, loaded.name, context.turns,
                          done=done, keep=keep, stream=stream, stream_state=stream_state)
    yield from (events if stream is None else close_after(events, stream))


def finished_rows(state: dict[str, Any], path: Path | None) -> dict[Unit, AblationRow]:
    """The rows of a checkpoint's state, read as untrusted data: a row that does not fit says the file
    is damaged."""
    rows = {}
    for doc in state["layers"].values():
        try:
            if not isinstance(doc, dict):
                raise TypeError(f"a row is a {type(doc).__name__}, not an object")
            found = from_doc(AblationRow, doc)
            if found.part is not ABSENT and found.part not in PARTS:
                raise ValueError(f"unknown part {found.part!r}")
        except (TypeError, ValueError) as exc:
            raise UserError(f"{path} is damaged ({exc}); run without --resume to start over") from exc
        rows[(found.layer, None if found.part is ABSENT else found.part)] = found
    return rows
