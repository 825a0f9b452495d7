"""Ray as the engine (`--cluster local|auto`): one experiment run as one Ray task, its events
streamed back to the driver as they happen.

    connect(address)        Ray started here (`local`: this machine's GPUs, or its CPUs) or joined
                            (`auto`: RAY_ADDRESS or the cluster started on this machine); Ray
                            imported only now, and each refusal (no Ray, an unreachable address,
                            Ray Client's ray://) one line before any work
    task_resources(...)     what the task asks Ray for, from the memory plan (engine/models/memory.py;
                            in engine/cluster/resources.py): one whole GPU for a model that fits one (so
                            small models are packed one per GPU), the GPUs of one node (a STRICT_PACK
                            placement group) for a model spread with --device-map, CPUs and memory
                            for a CPU run; a model no node can hold is one line
    Cluster.run(spec, ...)  the task: a Ray streaming generator (`num_returns="streaming"`) that
                            says where it was placed, loads the model there (from the hub or a path)
                            and yields every event as its JSON document; the driver decodes them in
                            order and the caller writes them into its session, the one record

Nodes share no disk: the task gets the session's inputs as data and writes nothing; the driver
writes everything. A resumable experiment checkpoints into a folder of the task's own, each change
of which comes back with the events (`CheckpointChange`) and is written into the session's
checkpoint folder by the driver; a resume sends that folder with the task. The task is not
retried by Ray (a streaming task's replay must yield the same number of items, and events carry
their times): the caller retries a task whose worker died (`TaskLost`), each try a job of its own in
the session, so nothing is written twice or half. The code reaches the workers through the
runtime_env: on this machine the driver's own `engine` on PYTHONPATH; on a remote cluster as the
job's py_modules (the embedded model's package with it).

Ray puts the driver's current folder first on every worker's sys.path, so an `engine/` lying in the
folder a run starts in would be imported by the workers in place of this project's: Ray starts
and joins from the project's root instead (`_starting`), and a task on this machine then works
in the driver's folder, for its relative paths. `local` starts Ray as it does on a laptop
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0): every one of its services, the GCS, the raylet and its
object manager, the dashboard agent and its metrics, the runtime env agent, on 127.0.0.1 only.

The worker's side of a task, and the checkpoint folder mirrored back, are engine/cluster/worker.py.
Torch-free at import, and Ray-free too: `ray` is imported inside `connect` and the task.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

from engine.cluster.resources import NodeShape, TaskResources
from engine.cluster.worker import CheckpointChange, TaskSpec, gpu_probe, task_function
from engine.core.errors import UserError
from engine.core.events import Event, Message, TaskState, event_from_json
from engine.core.process import PROJECT_ROOT, interruption, stop_signal

INSTALL = "pip install 'anatomy-tui[cluster]' (Ray)"
DEFAULT_RETRIES = 2  # tries after the first, for a task whose worker died
PROGRESS_STEPS = 4  # a running task's progress line at each quarter


@dataclass(frozen=True)
class Placement:
    """Where a task runs: the worker's first word."""

    node_id: str
    host: str
    gpus: tuple[str, ...]
    pid: int

    def text(self) -> str:
        where = f"GPU {','.join(self.gpus)}" if self.gpus else "CPU"
        return f"node {self.node_id[:8]} ({self.host}) {where}, pid {self.pid}"


class TaskLost(Exception):
    """The worker running a task died (killed, out of memory, its node lost): worth another try."""


class TaskFailed(UserError):
    """The experiment raised on the worker: its exception in one line (not retried: it would again)."""


@dataclass
class Cluster:
    """A connection to Ray (made by `connect`): its nodes, and tasks run on it."""

    address: str
    remote: bool  # another machine's cluster: the code travels as py_modules
    _live: dict[int, Any] = field(default_factory=dict)  # the streaming generators under way, by id
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: KeyboardInterrupt | None = None  # set by `cancel_all`: what every task of this driver stops with

    def nodes(self) -> list[NodeShape]:
        """The alive nodes, each with its GPUs' memory (an NVML probe run on each GPU node)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [node for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]  # unannotated in Ray
        probes = {node["NodeID"]: gpu_probe().options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
            for node in alive if node["Resources"].get("GPU", 0) >= 1}
        gpus = dict(zip(probes, ray.get(list(probes.values())), strict=True)) if probes else {}
        return [NodeShape(node["NodeID"], str(node.get("NodeManagerAddress", "")), float(node["Resources"].get(
            "CPU", 0)), int(node["Resources"].get("GPU", 0)), int(node["Resources"].get("memory", 0)),
            tuple(total for total, _, _ in gpus.get(node["NodeID"], ())),
            tuple((major, minor) for _, major, minor in gpus.get(node["NodeID"], ()))) for node in alive]

    def run(self, spec: TaskSpec, resources: TaskResources, say: Callable[[str], None],
            keep: Callable[[CheckpointChange], None] | None = None) -> Iterator[Event]:
        """The task's events as they arrive, in order, after one Message naming where it was placed;
        at each change of the task's state (queued, placed, running at each quarter of its progress,
        done) `say` gets a line and a TaskState event comes in the stream (the session's record of
        it); `keep` each change of its checkpoint folder, before the
        event that followed it (what `keep` raises cancels the task). A worker that dies raises
        TaskLost; an error of the experiment raises TaskFailed (a UserError of the worker: its own
        line); Ctrl-C (or `cancel_all`) cancels the task and raises as it was stopped."""
        import ray

        if self.stopping is not None:  # cancelled before it was sent
            raise self._stop()
        if not self.remote:
            spec = replace(spec, cwd=os.getcwd())
        task, placement_group = _options(self, spec, resources)
        generator = task.remote(spec)
        with self._lock:
            self._live[id(generator)] = generator
        try:
            yield _told(say, "queued", resources.text(), f"queued ({resources.text()})")
            yield from _events(generator, say, keep)
        except (KeyboardInterrupt, GeneratorExit):
            ray.cancel(generator)
            raise
        except ray.exceptions.TaskCancelledError:
            raise self._stop() from None
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, ray.exceptions.TaskCancelledError) or self.stopping is not None:
                raise self._stop() from None
            cause = exc.cause
            raise TaskFailed(f"{type(cause).__name__}: {_first_line(str(cause))}" if cause is not None
                             else _first_line(str(exc))) from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OutOfMemoryError,
                ray.exceptions.LocalRayletDiedError, ray.exceptions.ObjectLostError) as exc:
            if self.stopping is not None:
                raise self._stop() from None
            raise TaskLost(_first_line(str(exc))) from None
        except Exception:  # the driver could not take what came (a checkpoint it cannot write): the task stops too
            ray.cancel(generator)
            raise
        finally:
            with self._lock:
                self._live.pop(id(generator), None)
            if placement_group is not None:
                ray.util.remove_placement_group(placement_group)

    def _stop(self) -> KeyboardInterrupt:
        """What a cancelled task raises: a new exception of the stop `cancel_all` was given (Ctrl-C
        when none was: this thread's own), one per thread."""
        return interruption(stop_signal(self.stopping) if self.stopping is not None else signal.SIGINT)

    def cancel_all(self, why: KeyboardInterrupt) -> None:
        """Cancels every task this driver has under way; each one's `run` raises `why`."""
        import ray

        self.stopping = why
        with self._lock:
            live = list(self._live.values())
        for generator in live:
            ray.cancel(generator)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"


def _events(generator: Any, say: Callable[[str], None],
            keep: Callable[[CheckpointChange], None] | None) -> Iterator[Event]:
    import ray

    from engine.core.events import Progress, Result

    shown = -1
    for ref in generator:
        doc = ray.get(ref)
        if "placed" in doc:
            placement = Placement(**{**doc["placed"], "gpus": tuple(doc["placed"]["gpus"])})
            yield Message(f"running on the cluster: {placement.text()}")
            yield _told(say, "placed", placement.text(), f"placed on {placement.text()}")
            continue
        if "error" in doc:  # a UserError of the worker: its one line
            raise UserError(doc["error"])
        if "checkpoint" in doc:
            if keep is not None:
                keep(CheckpointChange(doc["checkpoint"]["written"], tuple(doc["checkpoint"]["gone"])))
            continue
        event = event_from_json(doc["event"])
        if isinstance(event, Progress) and event.total:
            step = PROGRESS_STEPS * event.done // event.total
            if step != shown:
                shown = step
                progress = f"{event.label + ': ' if event.label else ''}{event.count}"  # `ablation: layers 3/30`
                yield _told(say, "running", progress, f"running: {progress}")
        if isinstance(event, Result):
            yield _told(say, "done", "", "done")
        yield event


def _told(say: Callable[[str], None], state: str, detail: str, line: str) -> TaskState:
    """A change of the task's state: its line said now, its event for the session."""
    say(line)
    return TaskState(state, detail)


def _options(cluster: Cluster, spec: TaskSpec, resources: TaskResources) -> tuple[Any, Any]:
    """The remote task with its resources and runtime_env, and the placement group made for it
    (None when it needs at most one GPU)."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    options: dict[str, Any] = {"num_cpus": resources.cpus, "num_gpus": resources.gpus, "max_retries": 0,
                               **({} if cluster.remote else {"runtime_env": runtime_env(remote=False)})}
    if resources.memory:
        options["memory"] = resources.memory
    group = None
    if resources.packed:  # the GPUs of one node, reserved together
        group = placement_group([{"CPU": resources.cpus, "GPU": resources.gpus}], strategy="STRICT_PACK")
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    return task_function().options(**options), group


def runtime_env(remote: bool) -> dict[str, Any]:
    """How this driver's code reaches the workers: on this machine, the folder its `engine` was
    imported from on PYTHONPATH (each task's); on a remote cluster, the job's, uploaded by ray.init:
    `engine` as py_modules, with the embedded model's package when this machine has it installed
    (its GGUF file: a worker finds it as this machine does, never importing the package)."""
    import importlib.util

    from engine.models.sources import EMBEDDED_PACKAGE

    if not remote:
        path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        return {"env_vars": {"PYTHONPATH": path}}
    modules = [str(PROJECT_ROOT / "engine")]
    found = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if found is not None and found.submodule_search_locations:
        modules.append(str(next(iter(found.submodule_search_locations))))
    return {"py_modules": modules}


def check_address(address: str) -> None:
    """One line for an address that is not local or auto, and for Ray Client's `ray://` (as the
    address, or as the RAY_ADDRESS `auto` joins): it runs no streaming generator, so a task's events
    could not come back as they happen."""
    if address.startswith("ray://"):
        raise UserError(ray_client_refused(f"--cluster {address}"))
    if address == "auto" and os.environ.get("RAY_ADDRESS", "").startswith("ray://"):
        raise UserError(ray_client_refused(f"--cluster auto (RAY_ADDRESS={os.environ['RAY_ADDRESS']})"))
    if address not in ("local", "auto"):
        raise UserError(f"--cluster {address}: use local, or auto (RAY_ADDRESS=HEAD:6379, or the cluster `ray "
                        "start` runs on this machine)")


def ray_client_refused(what: str) -> str:
    """The line refusing Ray Client (`ray://`), which Ray gives no streaming generators (a task's
    `.remote()` raises "... not currently supported when using Ray Client"), and what to do instead."""
    return (f"{what}: Ray Client (ray://) cannot stream a task's events; run this command on the cluster's head "
            "with RAY_ADDRESS=HEAD:6379 and --cluster auto (or submit it there: ray job submit --address "
            "http://HEAD:8265 -- anatomy-tui ... --cluster auto)")


def connect(address: str) -> Cluster:
    """Ray started here (`local`) or joined (`auto`: RAY_ADDRESS, else the cluster `ray start` runs
    on this machine); in this process once (a second call, an atlas's next measure, gets the same
    Cluster; Ray started by this process's caller, a test's, is used as it is). No Ray installed,
    or an address where no cluster answers: one line."""
    check_address(address)
    with _starting(address):
        try:
            import ray
        except ImportError:
            raise UserError(f"--cluster needs Ray: {INSTALL}") from None
        if address in _CONNECTED and ray.is_initialized():
            return _CONNECTED[address]
        _check_reachable(address)
        if ray.is_initialized() and (address != "local" or _CONNECTED):
            raise UserError(f"--cluster {address}: this process is connected to another Ray cluster already; "
                            "use that one, or run this command on its own")
        if not ray.is_initialized():
            try:
                with _own_sigterm():
                    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False,
                             **({"include_dashboard": False} if address == "local" else
                                {"runtime_env": runtime_env(remote=True)}))
            except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
                where = f" ({os.environ['RAY_ADDRESS']})" if address == "auto" and os.environ.get("RAY_ADDRESS") else ""
                raise UserError(f"--cluster {address}{where}: no Ray cluster answers ({_first_line(str(exc))}); "
                                "start one with `ray start --head`, or check the address") from None
    _CONNECTED[address] = Cluster(address, remote=address != "local")
    return _CONNECTED[address]


def _check_reachable(address: str) -> None:
    """The HOST:PORT RAY_ADDRESS names for `auto` answers a TCP connection within CONNECT_TIMEOUT
    seconds: else one line now (Ray itself waits minutes for a GCS that is not there)."""
    target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else ""
    if not target or target == "auto":
        return
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--cluster auto: RAY_ADDRESS={target} is not HOST:PORT (HOST:6379, the head's GCS)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise UserError(f"--cluster {address}: nothing answers at {host}:{port} ({exc.strerror or exc}); start the "
                        "cluster (`ray start --head`), or check the address and the port") from None


CONNECT_TIMEOUT = 5.0


LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray as on a laptop, every service on 127.0.0.1


@contextlib.contextmanager
def _starting(address: str) -> Iterator[None]:
    """While Ray is imported and started or joined: for `local`, LOCAL_ONLY=0 (unless the user set
    it), read by Ray at its import and by each process it starts, so the node's address is
    127.0.0.1 and every service listens there alone; and the project's root as the current folder,
    the folder Ray puts first on every worker's sys.path (its processes here start in it too)."""
    here = os.getcwd()
    local = {LOCAL_ONLY: "0"} if address == "local" and LOCAL_ONLY not in os.environ else {}
    with mock.patch.dict(os.environ, local):
        os.chdir(PROJECT_ROOT)
        try:
            yield
        finally:
            os.chdir(here)


@contextlib.contextmanager
def _own_sigterm() -> Iterator[None]:
    """ray.init sets its own SIGTERM handler (sys.exit); a run keeps its own (engine.core.process
    stop_on_signals: the job marked interrupted, exit 143)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


_CONNECTED: dict[str, Cluster] = {}  # one Cluster an address: an atlas's measures, each run in a thread, share it


