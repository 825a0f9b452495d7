"""A5: recovery speed. Gaussian noise (sigma * std(W)) hits the weight matrices of one layer, that
layer alone is fine-tuned with AdamW on training text, and the perplexity on held-out evaluation
texts is followed step by step until the budget runs out. The weights are put back exactly after
each run.

Layers below l are frozen and unchanged, so both training and evaluation start at layer l from a
prefix cache: the evaluation inputs of every layer come from `Evaluator.build_cache`, and the
training blocks' inputs of layer l are captured (in fixed groups of pool neighbours) the first
time a block is drawn, then reused every time the pool cycles (and by every repeat).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine.core.codec import json_safe
from engine.core.events import CancelToken, Event, Message, Pace, Result, kept_on_stop
from engine.data.eval_data import comparable
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.context import RunContext
from engine.experiments.recovery.checkpoints import checkpointed, weights_keeper
from engine.experiments.recovery.shards import merge_shards, whole_layers
from engine.experiments.recovery.summary import layer_row, over_layers
from engine.experiments.recovery.sweep import KeepWeights, Sweep
from engine.experiments.recovery.vocabulary import (
    BASELINE_FILE,
    PAPER_STEPS,
    RecoveryLayer,
    RecoveryResult,
    RecoveryRow,
    RecoverySettings,
)
from engine.experiments.sweep_checkpoint import CHECKPOINT_FILE, resumed
from engine.models.anatomy import LayerStack
from engine.models.distributed import ShardPlan, Workers


def run_recovery(
    model: Any,
    tokenizer: Any,
    settings: RecoverySettings,
    cancel: CancelToken | None = None,
    model_name: str = "",
    done_layers: Sequence[dict[str, Any]] = (),
    ablation: AblationMap | None = None,
    keep_weights: KeepWeights = None,
    runs: Collection[tuple[int, int]] | None = None,
    dtype_name: str = "",
    baseline_file: Path | None = None,
) -> Iterator[Event]:
    """The sweep. `done_layers` are rows finished earlier with the same settings (--resume), as
    saved (JSON): those layers are not run again. `ablation` is the session's ablation map, for the
    Spearman. `runs` limits it to these (layer, repeat) runs, a worker's share of a split sweep:
    a layer's row then holds its runs made here (`whole_layers` and `merge_shards` join them).
    Every run's numbers depend on its layer and repeat alone (`noise_seed`, `layer_inputs`), not on
    the runs made before it.
    `keep_weights(index, matrices)` receives each layer's recovered matrices (first repeat) before
    the original weights are restored, so a front end can save them (the console's prompt pane).
    `baseline_file` holds a baseline measured already (reused when its fingerprint, with the model's
    name and `dtype_name`, is this run's), and this run's is kept there. `--steps auto` is settled
    once the baseline pass has timed the model (`Sweep.sized`); a resumed one keeps its finished
    layers' steps."""
    settings.validate()
    layers = settings.resolve_layers(len(LayerStack(model)))
    started = time.perf_counter()
    done = [RecoveryRow.from_json(row) for row in done_layers]
    rows = {row.layer: row for row in done if row.layer in layers}
    todo = [index for index in layers if index not in rows]
    if settings.steps is None and (kept := steps_of(rows.values())) is not None:
        settings = replace(settings, steps=kept)
    sweep = Sweep(model, tokenizer, settings, cancel, keep_weights, (model_name, dtype_name), baseline_file,
                  max(todo or layers))
    yield from sweep.baselines()
    yield from sweep.sized()
    settings = sweep.settings
    repeats = {index: [r for r in range(settings.repeats) if runs is None or (index, r) in runs] for index in todo}
    sweep.steps_total = sum(map(len, repeats.values())) * settings.settled_steps
    sweep.pace = Pace("training", sweep.steps_total, "steps", "recovery")
    if rows:
        yield Message(f"resuming: layers {', '.join(map(str, rows))} already finished, skipped")
    ablation_map = ablation
    if ablation_map is not None and model_name and ablation_map.model not in ("", model_name):
        yield Message(f"the session's ablation map is for {ablation_map.model}, not {model_name}; "
                      "no Spearman", "warning")
        ablation_map = None
    if ablation_map is not None and (differs := comparable(ablation_map.protocol or None, sweep.evaluator.protocol)):
        yield Message(f"the session's ablation map and this run: {differs}; the Spearman compares rankings only",
                      "warning")
    yield sweep.pace.at(0)

    def trained() -> Iterator[Event]:
        for index in todo:
            prefix: dict[int, torch.Tensor] = {}
            made = []
            for repeat in repeats[index]:
                run = yield from sweep.recover(index, repeat, prefix)
                made.append(run)
            rows[index] = layer_row(index, made, settings.settled_steps)
            yield RecoveryLayer(index, rows[index])

    def document(partial: bool) -> RecoveryResult:
        marked: dict[str, Any] = {"partial": True} if partial else {}
        return RecoveryResult(
            model=model_name,
            baseline_ppl=sweep.baseline,
            eval_tokens=sweep.evaluator.n_tokens,
            eval_texts=sweep.evaluator.n_texts,
            train_source=sweep.train_source,
            train_blocks=len(sweep.blocks),
            settings=settings,
            **over_layers([rows[index] for index in layers if index in rows], settings, ablation_map),
            resumed_layers=[index for index in layers if index not in todo],
            seconds=time.perf_counter() - started,
            protocol=sweep.evaluator.protocol,
            **marked,
        )

    # stopped: the layers finished so far (a curve cut short is not a row), marked partial
    yield from kept_on_stop(trained(), lambda: Result("recovery", json_safe(document(True))) if rows else None)
    yield Result("recovery", json_safe(document(False)))


def steps_of(rows: Iterable[RecoveryRow]) -> int | None:
    """The steps finished layers trained for (a run that did not diverge ran them all); None when
    none tells."""
    return next((run.steps_run for row in rows for run in row.repeats if run.status == "done"), None)


def run(settings: RecoverySettings, context: RunContext) -> Iterator[Event]:
    """The sweep on the context's model; with a checkpoint folder every finished layer is kept
    there, and `context.resume` skips the layers an earlier sweep with the same key finished."""
    loaded = context.needed_model("recovery")
    settings.resolve_layers(loaded.n_layers)  # layer range errors before anything runs
    folder = context.checkpoint_dir
    state, note = resumed(settings, loaded, folder, context.resume)
    yield from note
    keep = weights_keeper(folder, loaded.name) if folder is not None else None
    events = run_recovery(
        loaded.model, loaded.tokenizer, settings, context.cancel, loaded.name,
        done_layers=list(state["layers"].values()), ablation=context.input(AblationMap), keep_weights=keep,
        dtype_name=loaded.dtype_name, baseline_file=Path(folder) / BASELINE_FILE if folder is not None else None,
    )  # fmt: skip
    yield from events if folder is None else checkpointed(events, Path(folder) / CHECKPOINT_FILE, state)


# --- the registry's split over workers (`--shards`): by (layer, repeat) run -------------------------


def shard_plan(settings: RecoverySettings, n_layers: int, inputs: Mapping[str, dict[str, Any]], model_name: str
               ) -> ShardPlan:
    """Every (layer, repeat) run is a unit; a share's layers reach it through its settings; the
    merge makes the comparisons across layers again over all (the Spearman with the session's
    ablation map); `sharded_sweep` runs the split. Workers cannot each time their own `--steps
    auto`: a split sweep runs the paper's steps unless given others."""
    if settings.steps is None:
        settings = replace(settings, steps=PAPER_STEPS)
    runs = [(layer, repeat) for layer in settings.resolve_layers(n_layers) for repeat in range(settings.repeats)]
    merge = functools.partial(merge_shards, settings=settings, ablation=inputs.get(AblationMap.name))

    def layers_of(share: list[tuple[int, int]]) -> RecoverySettings:
        return replace(settings, layers=tuple(dict.fromkeys(layer for layer, _ in share)))

    return ShardPlan(runs, layers_of, merge, sweep=functools.partial(sharded_sweep, settings))


def sharded_sweep(settings: RecoverySettings, split: ShardPlan, context: RunContext, workers: Workers
                  ) -> Iterator[Event]:
    """Rank 0 reads the checkpoint (with --resume) and hands every worker the finished layers, whose
    runs are dealt last so the work left is shared evenly; only the missing layers are trained
    again. Each share is some (layer, repeat) runs; rank 0 checkpoints a layer once all of its
    runs are in. A worker that sees the session folder saves the layers it recovered there."""
    loaded = context.needed_model("recovery")
    folder = Path(context.checkpoint_dir) if context.checkpoint_dir is not None else None
    state, note = resumed(settings, loaded, folder if workers.world.is_main else None, context.resume)
    shared = workers.broadcast([state["layers"], str(folder) if folder is not None else None])
    done = list(shared[0].values())
    finished = {int(layer) for layer in shared[0]}
    items = [run for run in split.items if run[0] not in finished] + [run for run in split.items if run[0] in finished]
    where = Path(shared[1]) if shared[1] else None
    # the session is on this worker's disk: keep its layers there
    keep = weights_keeper(where, loaded.name) if where is not None and where.parent.is_dir() else None
    ablation = context.input(AblationMap)

    def run_share(share: list[tuple[int, int]]) -> Iterator[Event]:
        return run_recovery(
            loaded.model, loaded.tokenizer, split.restrict(share), context.cancel, loaded.name, done_layers=done,
            ablation=ablation, keep_weights=keep, runs=set(share),
        )  # fmt: skip

    events = whole_layers(workers.sweep(run_share, items, split.merge), settings)
    if workers.world.is_main and folder is not None:
        events = checkpointed(events, folder / CHECKPOINT_FILE, state)
    yield from note
    yield from events
