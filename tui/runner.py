"""`anatomy-tui run EXPERIMENT`: one path for every experiment of the registry.

Everything that can fail fast is checked before the slow model load, most before torch is imported:
the settings, the settings against the model's config (layers in range), every input file, the
--json path, the sessions folder, the session name (and, for --resume, that the session exists),
room on disk for a model export. A new session is made before the model loads (so two runs
naming it cannot both load a model for it) and removed again when the run fails before writing
anything, so a failed start leaves nothing behind. A cancelled run exits 130 (Ctrl-C), 143
(SIGTERM) or 129 (SIGHUP) and prints the command that resumes it; a user error 2.

Before the model loads, its memory plan (engine/models/memory.py) is printed and checked against the free
memory of the device. `--shards N` relaunches the command as N workers through torch's launcher
(this project's code, engine.core.process python_argv, never a `tui/` of the current folder);
under torchrun (or that launcher) every worker loads the model on its own device and computes its
share of the sweep, and rank 0 alone opens the session and writes events, checkpoints and results.
Workers that all exit 0 without rank 0 having written a result are a failure, not a success.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import functools
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.events import Cancelling, Event, Message, Progress, Result, TaskState
from engine.core.process import Stopped, exit_code, python_argv, say
from engine.core.settings import Settings
from engine.disk.atomic import atomic_write_json, check_free_space, check_writable_path
from engine.experiments.context import RunContext
from engine.models.options import ModelOptions, check_device
from engine.models.preflight import check_config
from engine.registry import EXPERIMENTS, Experiment, experiment
from sessions.job_runner import run_job
from sessions.store import Session, SessionExists, SessionStore
from tui.flags import model_options_from_args, settings_from_args
from tui.jobs import job_argv, typed

if TYPE_CHECKING:
    from engine.cluster import Cluster
    from engine.models.distributed import ShardPlan, Workers, World
    from engine.models.memory import MemoryPlan
    from engine.models.placement import Hardware

CANCELLED = 130
SHARDS_DONE = "ANATOMY_TUI_SHARDS_DONE"  # the file where rank 0 of --shards writes its session name, the result written
UNREADABLE_PATH = (errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES, errno.EPERM)  # no load would read it either


def _inputs(session: Session | None, experiment: Experiment) -> dict[str, dict[str, Any]]:
    return session.results_named(experiment.reads) if session is not None else {}


def run_command(experiment: Experiment, args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    settings = settings_from_args(experiment, args)
    options = model_options_from_args(args) if experiment.needs_model else None
    world = _world(experiment, args, options, settings)  # flags that cannot go together: one line first
    cluster = _cluster(args, world)  # --cluster: refusals, Ray missing, no cluster there: one line each
    if cluster is None:
        check_device(_asked_device(options, settings))  # a GPU this machine lacks: one line before any file is read
    settings.check_inputs()
    main = world is None or world.is_main
    if args.json is not None and main:
        check_writable_path(args.json, "--json")
    if options is not None:  # the settings against the model's config (layers in range), still without torch
        check_config(settings, options.model)
    store = SessionStore()
    if main:
        store.check_home(writing=False)  # a file: one line now (one that cannot be written: when it is made)
    resume = bool(getattr(args, "resume", False))
    session: Session | None = None
    if main:  # only rank 0 touches the session (the other workers may be on another machine)
        if resume:
            if args.session is None:
                raise UserError(f"--resume needs --session NAME, the session of the interrupted {experiment.name} run")
            session = store.open(args.session)
        elif args.session is not None and store.exists(args.session):  # exists() also checks the name
            session = store.open(args.session)
        if session is not None:
            session.check_writable(experiment.writes)  # the event log and the result file: one line now
    shards = getattr(args, "shards", None) or 1
    if getattr(settings, "stream", False) and (shards > 1 or world is not None):
        raise UserError("--stream reads each weight once in one process; it does not split over workers: "
                        "drop --shards")
    device = _asked_device(options, settings)
    if world is None and shards > 1:
        _one_gpu_each(shards, "--shards", device)
        return _launch_shards(argv, shards)
    if world is not None:
        _one_gpu_each(world.local_size, "torchrun's --nproc-per-node", device)
    source = settings.inputs_from()
    inputs = _inputs(store.open(source) if source else session, experiment) if main else {}
    if cluster is None:  # this process computes: its heavy modules, kept from the collector
        experiment.import_frozen(with_model=options is not None)

    with _workers(world, device) as workers, _claimed(store, session, args.session if main else None, main,
                                                      options, settings) as session:
        if cluster is not None:
            return _on_cluster(cluster, experiment, settings, options, session, inputs, args, resume)
        loaded, plan = None, None
        if options is not None:
            if workers is not None:  # one worker per GPU (LOCAL_RANK), or the CPU
                options = dataclasses.replace(options, device=workers.device)
            streamed = bool(getattr(settings, "stream", False))  # read layer by layer: the run says its own plan
            if streamed and options.device_map is not None:
                raise UserError("--stream reads each layer onto one device; drop --device-map")
            plan = None if streamed else memory_plan(experiment, settings, options, quiet=not main)
            # the dtype the plan names and was checked in is the one that loads (the job file keeps `auto`)
            planned = dataclasses.replace(options, dtype=plan.dtype) if plan is not None else options
            if main and plan is not None and getattr(settings, "export", None):  # the whole model, written
                check_free_space(settings.export, plan.weights, "--export")
            if main and plan is not None and plan.checkpoints and session is not None and experiment.resumable:
                check_free_space(session.path, plan.checkpoints, f"{experiment.name}'s checkpoints")
            if streamed:
                from engine.models.streaming import open_streamed

                loaded = open_streamed(planned.model, planned.device, planned.dtype, say, planned.trust_remote_code)
            else:
                loaded = planned.load(say)
            if main:
                say(f"model {loaded.name}: {loaded.n_layers} layers on {loaded.device} in {loaded.dtype_name}")
        context = RunContext(
            model=loaded,
            checkpoint_dir=session.checkpoint_dir(experiment.name) if experiment.resumable and session else None,
            output_dir=session.path if session else None, resume=resume, inputs=inputs,
        )  # fmt: skip
        if workers is None:
            events: Iterable[Event] = experiment.run(settings, context)
        else:
            events = sharded_events(experiment.name, settings, context, workers)
        if session is None:  # a worker other than rank 0: its events went to rank 0 as they came
            for _ in events:
                pass
            return 0
        try:
            result = drive(session, experiment.name, settings, options, loaded, events, args.json, resume,
                           plan.to_dict() if plan is not None else None)
        except Stopped as stop:  # SIGTERM, SIGHUP: recorded as interrupted, exits 143, 129
            return _stopped(experiment, settings, options, session, f"interrupted by {stop.name}", exit_code(stop))
    if result is None:
        return _stopped(experiment, settings, options, session, "cancelled", CANCELLED)
    from tui.printers import print_result

    print_result(experiment.name, result.data)
    if world is not None and os.environ.get(SHARDS_DONE):
        Path(os.environ[SHARDS_DONE]).write_text(session.name, encoding="utf-8")
    return 0


def _launch_shards(argv: Sequence[str], shards: int) -> int:
    """This command again as `shards` workers (unbuffered, as torch's launcher starts Python). Exit 0
    from every worker counts only with rank 0's word that its result was written."""
    import tempfile

    from engine.models.distributed import launch

    with tempfile.TemporaryDirectory(prefix="anatomy-tui-shards-") as folder:
        done = Path(folder) / "done"
        code = launch([*python_argv("tui.cli", "-u"), *argv], shards, {SHARDS_DONE: str(done)})
        if code == 0 and not done.exists():
            raise UserError("the --shards workers exited without a result (rank 0 wrote none, and said nothing); "
                            "run the command without --shards to see why")
    return code


def _cluster(args: argparse.Namespace, world: World | None) -> Cluster | None:
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


def _on_cluster(cluster: Cluster, experiment: Experiment, settings: Settings, options: ModelOptions | None,
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
    device = _asked_device(options, settings)
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
                resume, mirrored = True, False
                spec = dataclasses.replace(spec, resume=True, checkpoint=checkpoint_files(folder))
            tries, why = f"{attempt + 1} of {retries + 1}", f"its worker died ({lost})" + (
                "; from its checkpoint" if resume else "")
            say(f"{label}: retried ({tries}): {why}")
            retried = [TaskState("retried", f"try {tries}: {why}")]
        except TaskFailed as failed:
            raise UserError(f"{label} failed on the cluster: {failed}") from None
        except Stopped as stop:
            return _stopped(experiment, settings, options, session, f"interrupted by {stop.name}", exit_code(stop),
                            cluster.address)
    if result is None:
        return _stopped(experiment, settings, options, session, "cancelled", CANCELLED, cluster.address)
    from tui.printers import print_result

    print_result(experiment.name, result.data)
    return 0


def _after(first: list[Event], events: Iterator[Event]) -> Iterator[Event]:
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


def _stopped(experiment: Experiment, settings: Settings, options: ModelOptions | None, session: Session,
             what: str, code: int, cluster: str | None = None) -> int:
    """One line for a run stopped before its end: what stopped it and, where it resumes from its
    checkpoint, the exact command that continues it (the settings as flags, as the console offers it;
    on the cluster it ran on)."""
    line = f"{experiment.name} {what}"
    if experiment.resumable:
        argv = job_argv(experiment.name, settings, options, session.name, resume=True, cluster=cluster)
        line += f"; continue with: {typed(argv)}"
    say(line)
    return code


@contextlib.contextmanager
def _claimed(store: SessionStore, session: Session | None, name: str | None, main: bool,
             options: ModelOptions | None, settings: Settings) -> Iterator[Session | None]:
    """The run's session: the one opened already, else one made now, before the model loads (of two
    runs naming the same new session the first makes it, the other joins it). One this run made is
    removed again if the run fails before it writes anything, so a failed start leaves nothing."""
    if session is not None or not main:
        yield session
        return
    try:
        made = store.create(name, model=options.model if options else "", settings=settings.to_dict())
    except SessionExists:
        if name is None or not store.exists(name):
            raise
        joined = store.open(name)
        say(f"session {name} was just made by another run; this run adds to it")
        yield joined
        return
    try:
        yield made
    except BaseException:
        store.discard_unused(made)
        raise


def _world(experiment: Experiment, args: argparse.Namespace, options: ModelOptions | None,
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
    device = _asked_device(options, settings)
    if (shards or world is not None) and device.startswith("cuda:"):
        raise UserError(f"--device {device} would put every worker on that one GPU; with --shards (or torchrun) "
                        "use --device auto: each worker takes its own GPU")
    if world is not None and not experiment.shardable:
        shardable = ", ".join(entry.name for entry in EXPERIMENTS if entry.shardable)
        raise UserError(f"{experiment.name} does not split over workers; run it without torchrun ({shardable} do)")
    if world is not None and shards not in (None, world.size):
        raise UserError(f"--shards {shards} but torchrun started {world.size} workers; drop --shards under torchrun")
    return world


def _asked_device(options: ModelOptions | None, settings: Settings) -> str:
    """The --device of the run: the model's, or the settings' own (toy-depth trains on its own)."""
    return str(options.device if options is not None else getattr(settings, "device", "auto"))


def _one_gpu_each(workers: int, what: str, device: str) -> None:
    """Workers on GPUs talk nccl, which refuses two workers on one GPU: at most one per GPU
    (workers on the CPU, --device cpu, share its threads instead)."""
    if device == "cpu":
        return
    from engine.models.placement import Hardware

    gpus = Hardware.read().gpus
    if 0 < gpus < workers:
        raise UserError(f"{what} {workers} but {gpus} GPU(s) are visible here: one worker per GPU, "
                        f"so at most {gpus} on this machine")


def _workers(world: World | None, device: str) -> contextlib.AbstractContextManager[Workers | None]:
    if world is None:
        return contextlib.nullcontext()
    from engine.models.distributed import Workers

    return Workers(world, device)


def memory_plan(experiment: Experiment, settings: Settings, options: ModelOptions, quiet: bool = False,
                fits: bool = True, hardware: Hardware | None = None) -> MemoryPlan | None:
    """The run's memory plan, printed and checked against the device's free memory before the
    model loads (one line and exit 2 when it cannot fit), after what the model's config and
    tokenizer can tell is checked (engine/models/preflight.py: layers, components, texts, export folder,
    weight edits on offloaded layers); a config that cannot be read is one line too. A model that
    cannot be planned without loading it (an unusual config) gets a one-line note and no plan.
    `hardware`: where it will run when not this machine (a cluster's GPU: engine/cluster/resources.py)."""
    from engine.models.memory import check_fits, free_memory, plan_run, preview_model
    from engine.models.preflight import check_before_load

    preview, plan, skipped = None, None, ""
    try:
        preview = preview_model(options.model, options.trust_remote_code)
        plan = plan_run(options.model, settings, options.device, options.dtype, options.trust_remote_code,
                        options.device_map, options.max_memory, preview, hardware)
    except UserError:
        raise
    except OSError as exc:
        if exc.errno in UNREADABLE_PATH and exc.filename:  # a --model path the user gave: one line (tui/cli.py)
            raise
        skipped = _first_line(exc)
    except (ValueError, KeyError, TypeError, AttributeError, ImportError, RuntimeError,
            struct.error) as exc:  # a damaged GGUF header: the load says so in its own words
        lines = str(exc).strip().splitlines()
        skipped = lines[0] if lines else type(exc).__name__
    if preview is not None:  # what the config and tokenizer tell, even when no plan could be made
        check_before_load(experiment.name, settings, preview, plan)
    if plan is None:
        if not quiet:
            say(f"memory plan skipped ({skipped}); loading the model")
        return None
    if options.device_map is not None:  # spread over several devices: no single device to check against
        if not quiet:
            say(f"{plan.line()} in all, spread by --device-map {options.device_map}")
        return plan
    if not quiet:
        say(plan.line())
    if fits:  # against this machine's device (a cluster's task: against its nodes, engine/cluster/resources.py)
        check_fits(plan, free_memory(plan.device), experiment.name)
    return plan


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


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


def drive(
    session: Session,
    experiment: str,
    settings: Settings,
    options: ModelOptions | None,
    loaded: Any,
    events: Iterable[Event],
    json_path: Path | None,
    resume: bool = False,
    memory: dict[str, Any] | None = None,
    progress_bar: bool = True,
) -> Result | None:
    """Runs the experiment into the session, its progress on stderr: on a terminal one line that
    updates (phase, count, time left at the measured rate), otherwise plain lines (`ProgressLines`);
    without `progress_bar`, only the events' own lines (a cluster's task states). `memory` is the
    memory plan, recorded in the job file with the model."""
    from rich.console import Console

    console = Console(stderr=True)
    spec = {**settings.to_dict(), "model": loaded.describe() if loaded is not None else None}
    if memory is not None:
        spec["memory_plan"] = memory
    job = {"settings": settings.to_dict(), "model": options.to_dict() if options is not None else None,
           "resume": resume}
    kept: list[Result] = []  # a stopped run's partial Result (the ablation map's finished layers)

    def seen(event: Event, show: Callable[[Event], None] | None = None) -> None:
        if isinstance(event, Result):
            kept.append(event)
        if show is not None:
            show(event)

    try:
        if not progress_bar:
            result = run_job(session, experiment, spec, events, on_event=seen, **job)
        else:
            with _progress_display(console, experiment) as show:
                result = run_job(session, experiment, spec, events, on_event=functools.partial(seen, show=show), **job)
    except Stopped:
        _print_partial(experiment, kept)
        raise
    if result is None:
        _print_partial(experiment, kept)
    if result is not None and json_path is not None:
        try:
            atomic_write_json(json_path, result.data, "--json")
        except (OSError, UserError) as exc:
            raise UserError(f"{exc}; the result is kept in session {session.name} ({session.path})") from None
        console.print(f"wrote {json_path}", highlight=False)
    console.print(f"session {session.name}: {session.path}", highlight=False)
    return result


def _print_partial(experiment: str, kept: list[Result]) -> None:
    """What a stopped run handed over before it stopped (kept in the session too), printed as its
    result is (the ablation map says `partial: 12 of 30 layers`)."""
    if kept:
        from tui.printers import print_result

        print_result(experiment, kept[-1].data)


def progress_text(event: Progress) -> str:
    """A progress event in words: `baseline: 12/48 texts, 3.1 texts/s, about 12 s left`."""
    what = event.label or event.phase
    if event.phase and event.phase not in what:
        what = f"{what} ({event.phase})"
    if event.total <= 0 and not event.unit:
        return what
    count = f"{event.done}/{event.total}" if event.total > 0 else f"{event.done}"
    text = f"{what}: {count} {event.unit}".rstrip()
    if event.rate:
        text += f", {event.rate:.3g} {event.unit or 'units'}/s"
    left = event.seconds_left
    if left is not None and event.done < event.total:
        text += f", about {_duration(left)} left"
    return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class ProgressLines:
    """Which progress events a log (stderr that is not a terminal) gets a line for: the first of each
    phase, its end, and every tenth of the way between, so a long run says where it is without a
    line for each of its thousand steps."""

    STEPS = 10

    def __init__(self) -> None:
        self._phase: tuple[str, str, str, int] | None = None
        self._tenth = -1

    def line(self, event: Progress) -> str | None:
        phase = (event.phase, event.label, event.unit, event.total)
        tenth = self.STEPS * event.done // event.total if event.total > 0 else 0
        if phase != self._phase:
            self._phase, self._tenth = phase, tenth
            return progress_text(event)
        if tenth > self._tenth:
            self._tenth = tenth
            return progress_text(event)
        return None


@contextlib.contextmanager
def _progress_display(console: Any, experiment: str) -> Iterator[Callable[[Event], None]]:
    """`show(event)` for run_job: progress as one updating line on a terminal, plain lines elsewhere;
    messages always as lines."""
    if not console.is_terminal:
        lines = ProgressLines()

        def show_plain(event: Event) -> None:
            if isinstance(event, Progress) and (line := lines.line(event)) is not None:
                console.print(f"[progress] {line}", markup=False, highlight=False, soft_wrap=True)
            elif isinstance(event, (Message, Cancelling)):
                console.print(_message_line(event), markup=False, highlight=False, soft_wrap=True)

        yield show_plain
        return
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    with Bar(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
             transient=False) as bar:  # fmt: skip
        task = bar.add_task(experiment, total=None)

        def show(event: Event) -> None:
            if isinstance(event, Progress):
                bar.update(task, completed=event.done, total=event.total or None, description=progress_text(event))
            elif isinstance(event, (Message, Cancelling)):
                bar.console.print(_message_line(event), markup=False, highlight=False, soft_wrap=True)

        try:  # how a run ends is said once, by the caller: a failure as the one error line
            yield show
        except Exception:
            if not bar.tasks[0].completed:
                bar.live.transient = True  # no empty bar left above the error line
            raise


def _message_line(event: Message | Cancelling) -> str:
    if isinstance(event, Cancelling):
        return "[warning] cancelling: the run stops at its next forward"
    return f"[{event.level}] {event.text}"
