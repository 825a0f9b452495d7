"""`run --cluster`: the run as a Ray task (engine/cluster), its memory plan made here, its events
and checkpoint changes written into the session by the driver, a dead worker's try retried.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.drive import CANCELLED, drive, stopped
from cli.plan import asked_device, memory_plan
from engine.core.errors import UserError
from engine.core.events import Event, TaskState
from engine.core.process import Stopped, exit_code, say
from engine.core.settings import Settings
from engine.disk.atomic import check_free_space
from engine.models.options import ModelOptions
from engine.registry import Experiment
from sessions.store import Session

if TYPE_CHECKING:
    from engine.cluster import Cluster
    from engine.models.distributed import World


def cluster_of(args: argparse.Namespace, world: World | None) -> Cluster | None:
    """The Ray cluster `--cluster` names, connected (None without it), after the one-line refusals
    of what a task on it cannot do."""
    address = getattr(args, "cluster", None)
    if address is None:
        if getattr(args, "retries", None) is not None:
            raise UserError("--retries applies to tasks on a cluster; add --cluster local or auto")
        return None
    if getattr(args, "shards", None) or world is not None:
        raise UserError("--cluster runs the whole experiment as one task; --shards (torchrun) splits one sweep over "
                        "the GPUs of this machine: use one of them")
    from engine.cluster import connect

    return connect(address)


def on_cluster(cluster: Cluster, experiment: Experiment, settings: Settings, options: ModelOptions | None,
                session: Session, inputs: dict[str, dict[str, Any]], args: argparse.Namespace, resume: bool) -> int:
    """The run as a Ray task: its resources from the memory plan (made here, from the model's config),
    its events written into the session as they arrive, and so is each change of a resumable
    experiment's checkpoint (a resume sends the session's checkpoint with the task); a try whose
    worker died retried as a job of its own (`--retries`), the failure after the last one line
    naming the experiment and the model; a resumable run's retry continues from the checkpoint the
    try that died sent back."""
    from engine.cluster import DEFAULT_RETRIES, TaskFailed, TaskLost
    from engine.cluster.resources import cluster_hardware, size_text, task_resources
    from engine.cluster.worker import CheckpointChange, TaskSpec, apply_checkpoint, checkpoint_files

    model = options.model if options is not None else ""
    label = f"{Path(model.rstrip('/')).name or model} · {experiment.name}" if model else experiment.name
    device = asked_device(options, settings)
    nodes = cluster.nodes()
    on_gpu = device != "cpu" and any(node.gpus for node in nodes)
    plan = None
    if options is not None:  # planned as the worker will run it: its GPU (as `cuda`) by the cluster's hardware
        options = dataclasses.replace(options, device="cuda" if device.startswith("cuda") else device)
        planned = dataclasses.replace(options, device=options.device if on_gpu else "cpu", device_map=None,
                                      max_memory=None)
        with _PLANNING:  # an atlas plans its measures in threads; the meta-device model patches torch.nn
            plan = memory_plan(experiment, settings, planned, quiet=True, fits=False,
                               hardware=cluster_hardware(nodes))
    resources = task_resources(label, plan.total if plan is not None else None, device,
                               options.device_map if options is not None else None,
                               options.max_memory if options is not None else None, nodes)
    say(f"{label}: on the Ray cluster ({cluster.address}, {len(nodes)} node(s))"
            + (f"; memory plan {size_text(plan.total)} in {plan.dtype}" if plan is not None else ""))
    folder = session.checkpoint_dir(experiment.name) if experiment.resumable else None
    if folder is not None and plan is not None and plan.checkpoints:
        check_free_space(session.path, plan.checkpoints, f"{experiment.name}'s checkpoints")
    spec = TaskSpec(experiment.name, settings.to_dict(), options.to_dict() if options is not None else None, inputs,
                    settings_files(settings), resume, checkpoint_files(folder) if resume and folder else {})
    mirrored = False  # this try's checkpoint came back: a retry continues from it

    def keep(change: CheckpointChange) -> None:
        nonlocal mirrored
        assert folder is not None  # keep is passed to the cluster only with a checkpoint folder
        apply_checkpoint(folder, change)
        mirrored = True

    retries = DEFAULT_RETRIES if args.retries is None else args.retries
    retried: list[TaskState] = []  # a try after one whose worker died: that state first in its job
    for attempt in range(1, retries + 2):
        try:
            task = cluster.run(spec, resources, lambda line: say(f"{label}: {line}"),
                               keep if folder is not None else None)
            result = drive(session, experiment.name, settings, options, None, _after(retried, task), args.json,
                           resume, memory=plan.to_dict() if plan is not None else None, progress_bar=False)
            break
        except TaskLost as lost:
            if attempt > retries:
                raise UserError(f"{label} failed: its worker died on each of {attempt} tries (last: {lost})") from None
            if mirrored:  # resumes the job that died (it then reads resumed)
                assert folder is not None  # only keep, given a folder, sets mirrored
                resume, mirrored = True, False
                spec = dataclasses.replace(spec, resume=True, checkpoint=checkpoint_files(folder))
            tries, why = f"{attempt + 1} of {retries + 1}", f"its worker died ({lost})" + (
                "; from its checkpoint" if resume else "")
            say(f"{label}: retried ({tries}): {why}")
            retried = [TaskState("retried", f"try {tries}: {why}")]
        except TaskFailed as failed:
            raise UserError(f"{label} failed on the cluster: {failed}") from None
        except Stopped as stop:
            return stopped(experiment, settings, options, session, f"interrupted by {stop.name}", exit_code(stop),
                            cluster.address)
    if result is None:
        return stopped(experiment, settings, options, session, "cancelled", CANCELLED, cluster.address)
    from cli.printers import print_result

    print_result(experiment.name, result.data)
    return 0


def _after(first: Sequence[Event], events: Iterator[Event]) -> Iterator[Event]:
    """`first`, then `events`: a generator still, so a stop between two events reaches the task's
    own (run_job passes it in: the task is cancelled)."""
    yield from first
    yield from events


_PLANNING = threading.Lock()


def settings_files(settings: Settings) -> dict[str, str]:
    """The text of each file a setting names (they were read once already, `check_inputs`): a
    cluster's worker may not see this machine's disk."""
    from engine.core.files import read_lines

    return {str(value): "\n".join(read_lines(Path(value), spec.meta["file"])) + "\n"
            for spec in settings.fields() if spec.meta.get("file") and (value := getattr(settings, spec.name))}
