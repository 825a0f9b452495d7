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
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.cluster_run import cluster_of, on_cluster
from cli.drive import CANCELLED, drive, stopped
from cli.flags import model_options_from_args, settings_from_args
from cli.plan import asked_device, memory_plan
from cli.shards import SHARDS_DONE, launch_shards, one_gpu_each, sharded_events, torchrun_world
from engine.core.errors import UserError
from engine.core.events import Event
from engine.core.process import Stopped, exit_code, say
from engine.core.settings import Settings
from engine.disk.atomic import check_free_space, check_writable_path
from engine.experiments.context import RunContext
from engine.models.options import ModelOptions, check_device
from engine.models.preflight import check_config
from engine.registry import Experiment
from sessions.store import Session, SessionExists, SessionStore

if TYPE_CHECKING:
    from engine.models.distributed import Workers, World


def _inputs(session: Session | None, experiment: Experiment) -> dict[str, dict[str, Any]]:
    return session.results_named(experiment.reads) if session is not None else {}


def run_command(experiment: Experiment, args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    settings = settings_from_args(experiment, args)
    options = model_options_from_args(args) if experiment.needs_model else None
    world = torchrun_world(experiment, args, options, settings)  # flags that cannot go together: one line first
    cluster = cluster_of(args, world)  # --cluster: refusals, Ray missing, no cluster there: one line each
    if cluster is None:
        check_device(asked_device(options, settings))  # a GPU this machine lacks: one line before any file is read
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
    device = asked_device(options, settings)
    if world is None and shards > 1:
        one_gpu_each(shards, "--shards", device)
        return launch_shards(argv, shards)
    if world is not None:
        one_gpu_each(world.local_size, "torchrun's --nproc-per-node", device)
    source = settings.inputs_from()
    inputs = _inputs(store.open(source) if source else session, experiment) if main else {}
    if cluster is None:  # this process computes: its heavy modules, kept from the collector
        experiment.import_frozen(with_model=options is not None)

    with _workers(world, device) as workers, _claimed(store, session, args.session if main else None, main,
                                                      options, settings) as session:
        if cluster is not None:
            assert session is not None  # a cluster's run has no torchrun world: it is the main one, with a session
            return on_cluster(cluster, experiment, settings, options, session, inputs, args, resume)
        loaded, plan = None, None
        if options is not None:
            if workers is not None:  # one worker per GPU (LOCAL_RANK), or the CPU
                options = dataclasses.replace(options, device=workers.device)
            streamed = bool(getattr(settings, "stream", False))  # read layer by layer
            if streamed and options.device_map is not None:
                raise UserError("--stream reads each layer onto one device; drop --device-map")
            plan = memory_plan(experiment, settings, options, quiet=not main)  # --max-memory: a streamed budget too
            streamed = streamed or (plan is not None and plan.stream is not None)  # or only streaming fits
            # the placement the plan decided and was checked in (device, dtype and why) is the one that loads
            # (the job file keeps `auto`)
            placement = plan.placement if plan is not None else None
            export: str | None = getattr(settings, "export", None)  # prune's --export folder
            if main and plan is not None and export:  # the whole model, written
                check_free_space(export, plan.weights, "--export")
            if main and plan is not None and plan.checkpoints and session is not None and experiment.resumable:
                check_free_space(session.path, plan.checkpoints, f"{experiment.name}'s checkpoints")
            if streamed:
                from engine.models.streaming import open_streamed

                loaded = open_streamed(options.model, options.device, options.dtype, say, options.trust_remote_code,
                                       options.max_memory, placement)
            else:  # a budget without a device map was the streamed plan's: the whole model fits it
                loaded = (options if options.device_map else dataclasses.replace(options, max_memory=None)).load(
                    say, placement)
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
            return stopped(experiment, settings, options, session, f"interrupted by {stop.name}", exit_code(stop))
    if result is None:
        return stopped(experiment, settings, options, session, "cancelled", CANCELLED)
    from cli.printers import print_result

    print_result(experiment.name, result.data)
    if world is not None and os.environ.get(SHARDS_DONE):
        Path(os.environ[SHARDS_DONE]).write_text(session.name, encoding="utf-8")
    return 0


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


def _workers(world: World | None, device: str) -> contextlib.AbstractContextManager[Workers | None]:
    if world is None:
        return contextlib.nullcontext()
    from engine.models.distributed import Workers

    return Workers(world, device)


