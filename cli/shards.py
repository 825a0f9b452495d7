"""`--shards N` and torchrun: the command relaunched as N workers, the refusals of what cannot be
split, and a worker's share of the sweep (the registry row's shard_plan; it names no experiment).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.plan import asked_device
from engine.core.errors import UserError
from engine.core.events import Event, Message, Result
from engine.core.process import python_argv
from engine.core.settings import Settings
from engine.experiments.context import RunContext
from engine.models.options import ModelOptions
from engine.registry import EXPERIMENTS, Experiment, experiment

if TYPE_CHECKING:
    from engine.models.distributed import ShardPlan, Workers, World


SHARDS_DONE = "ANATOMY_TUI_SHARDS_DONE"  # the file where rank 0 of --shards writes its session name, the result written


def launch_shards(argv: Sequence[str], shards: int) -> int:
    """This command again as `shards` workers (unbuffered, as torch's launcher starts Python). Exit 0
    from every worker counts only with rank 0's word that its result was written."""
    import tempfile

    from engine.models.distributed import launch

    with tempfile.TemporaryDirectory(prefix="anatomy-tui-shards-") as folder:
        done = Path(folder) / "done"
        code = launch([*python_argv("cli.main", "-u"), *argv], shards, {SHARDS_DONE: str(done)})
        if code == 0 and not done.exists():
            raise UserError("the --shards workers exited without a result (rank 0 wrote none, and said nothing); "
                            "run the command without --shards to see why")
    return code


def torchrun_world(experiment: Experiment, args: argparse.Namespace, options: ModelOptions | None,
           settings: Settings) -> World | None:
    """The torchrun world this process is a worker of (None when run alone), with the one-line
    refusals of what cannot be split."""
    shards = getattr(args, "shards", None)
    world = None
    if "WORLD_SIZE" in os.environ:  # started by torchrun (engine.models.distributed imports torch)
        from engine.models.distributed import world_from_env

        world = world_from_env()
    if (shards or world is not None) and options is not None and options.device_map is not None:
        raise UserError("--shards (or torchrun) runs a whole model in each worker, --device-map spreads one model "
                        "over the GPUs: use one of them")
    device = asked_device(options, settings)
    if (shards or world is not None) and device.startswith("cuda:"):
        raise UserError(f"--device {device} would put every worker on that one GPU; with --shards (or torchrun) "
                        "use --device auto: each worker takes its own GPU")
    if world is not None and not experiment.shardable:
        shardable = ", ".join(entry.name for entry in EXPERIMENTS if entry.shardable)
        raise UserError(f"{experiment.name} does not split over workers; run it without torchrun ({shardable} do)")
    if world is not None and shards not in (None, world.size):
        raise UserError(f"--shards {shards} but torchrun started {world.size} workers; drop --shards under torchrun")
    return world


def one_gpu_each(workers: int, what: str, device: str) -> None:
    """Workers on GPUs talk nccl, which refuses two workers on one GPU: at most one per GPU
    (workers on the CPU, --device cpu, share its threads instead)."""
    if device == "cpu":
        return
    from engine.models.placement import Hardware

    gpus = Hardware.read().gpus
    if 0 < gpus < workers:
        raise UserError(f"{what} {workers} but {gpus} GPU(s) are visible here: one worker per GPU, "
                        f"so at most {gpus} on this machine")


def sharded_events(name: str, settings: Settings, context: RunContext, workers: Workers) -> Iterator[Event]:
    """This worker's share of the sweep. On rank 0: every worker's events, then the merged Result;
    on the others: nothing. Rank 0 hands every worker the session results it read (manipulate
    chooses its layers from the ablation map) and, once it has prepared it, the checkpoint folder
    (toy-depth's students). An experiment whose plan has its own `sweep` runs the split itself
    (recovery: rank 0 reads and writes its checkpoint)."""

    loaded = context.model
    n_layers, model_name = (loaded.n_layers, loaded.name) if loaded is not None else (0, "")  # toy-depth: no model
    split = None
    if workers.world.is_main:  # a plan that cannot be made stops rank 0 before the others wait on it
        split = experiment(name).shard_plan(settings, n_layers, context.inputs, model_name)
        if split.prepare is not None:
            split.prepare(context.checkpoint_dir, context.resume)
    folder = str(context.checkpoint_dir) if context.checkpoint_dir is not None else None
    shared = workers.broadcast([context.inputs, folder])
    context = dataclasses.replace(context, inputs=shared[0])
    split = split or experiment(name).shard_plan(settings, n_layers, context.inputs, model_name)
    if split.sweep is not None:
        return split.sweep(split, context, workers)
    where = Path(shared[1]) if shared[1] else None
    share_context = RunContext(model=loaded, cancel=context.cancel, inputs=context.inputs,
                               checkpoint_dir=where if where is not None and where.is_dir() else None)

    def run_share(share: list[Any]) -> Iterator[Event]:
        return _run_share(name, split.restrict(share), dataclasses.replace(share_context, share=share))

    events = workers.sweep(run_share, split.items, split.merge)
    return _logged(events, split) if workers.world.is_main else events


def _logged(events: Iterator[Event], split: ShardPlan) -> Iterator[Event]:
    """Rank 0's events with the log lines a serial run writes on its own: why these layers, before
    the split, and the lines of what the merge computed (fits), before the Result."""
    yield from (Message(line) for line in split.notes)
    for event in events:
        if isinstance(event, Result) and split.summary is not None:
            yield from (Message(line) for line in split.summary(event.data))
        yield event


def _run_share(name: str, settings: Settings, context: RunContext) -> Iterator[Event]:
    from engine.registry import experiment

    return experiment(name).run(settings, context)
