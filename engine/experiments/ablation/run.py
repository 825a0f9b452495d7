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
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from engine.core.codec import ABSENT, from_doc, json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Pace, Result, kept_on_stop
from engine.core.turns import Change, ModelTurns
from engine.data.eval_data import EvalSource
from engine.evaluation.perplexity import Batch, Evaluator, Scoring, TextScores, drained
from engine.evaluation.statistics import bootstrap_degradation, degradation_pct, importance_class
from engine.experiments.ablation.meters import InfluenceMeter, PartMeter
from engine.experiments.ablation.rankings import all_spearmans, block_search, merge_shards, proxy_map
from engine.experiments.ablation.removal import ablated, ablated_part
from engine.experiments.ablation.vocabulary import (
    AblationMap,
    AblationProxies,
    AblationRow,
    AblationSettings,
    LayerAblated,
)
from engine.experiments.ablation.wavefront import (
    StreamCheckpoint,
    Wavefront,
    close_after,
    streamed_evaluator,
    unit_name,
)
from engine.experiments.context import RunContext
from engine.experiments.sweep_checkpoint import CHECKPOINT_FILE, resumed, write_checkpoint
from engine.models.distributed import ShardPlan
from engine.models.families import PARTS, check_parts
from engine.models.streaming import LayerSource, StreamedModel

STREAM_FILE = "stream.safetensors"  # a streamed map's wavefront, beside the finished rows (layers.json)
Unit = tuple[int, str | None]  # (layer, None) for a whole layer, (layer, "attention" or "mlp") for a block


def run_ablation(
    model: Any, tokenizer: Any, settings: AblationSettings, cancel: CancelToken | None = None, model_name: str = "",
    turns: ModelTurns | None = None, done: Mapping[Unit, AblationRow] | None = None,
    keep: Callable[[AblationRow], None] | None = None, stream: LayerSource | None = None,
    stream_state: StreamCheckpoint | None = None, source: EvalSource | None = None,
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
    kept in `stream_state` every few layers, from which a killed run resumes. `source`: the texts or
    windows to score instead of the settings' (the depth family's held-out windows)."""
    settings.validate()
    started = time.perf_counter()
    evaluator = Evaluator.for_settings(model, tokenizer, settings, source, cancel) if stream is None else \
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
                          removal, settings.reach(), stream_state)
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
    counted = "layers and blocks" if parts else "layers"  # --part: each layer, then its blocks (3 a layer: both)
    if rows:
        yield Message(f"resuming: {len(rows)} of {len(units)} {counted} already finished "
                      f"({', '.join(unit_name(unit) for unit in rows)}), skipped")
    pace = Pace("ablation", len(units), counted, first=len(rows))
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
        present: dict[str, Any] = {**({"parts": part_rows} if parts else {}), **({"partial": True} if partial else {})}
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
            **present,
        )

    def measured() -> Iterator[Event]:
        for index, part in units:
            if (index, part) in rows:
                continue
            unit_scores = score(index, part)
            finished = rows[(index, part)] = row(index, part, unit_scores)
            if keep is not None:
                keep(finished)
            assert finished.ppl is not None and finished.degradation_pct is not None  # row() measured both
            named: dict[str, Any] = {"part": part} if part else {}
            yield LayerAblated(index, n, finished.ppl, baseline, finished.degradation_pct, finished.layer_class,
                               **named)
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


def shard_plan(settings: AblationSettings, n_layers: int, inputs: Mapping[str, dict[str, Any]],
               model_name: str) -> ShardPlan:
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
