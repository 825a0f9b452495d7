"""Ray as the engine (`--cluster local|auto`): one experiment run as one Ray task, its events
streamed back to the driver as they happen.

    connect(address)        Ray started here (`local`: this machine's GPUs, or its CPUs) or joined
                            (`auto`: RAY_ADDRESS or the cluster started on this machine); Ray
                            imported only now, and each refusal (no Ray, an unreachable address,
                            Ray Client's ray://) one line before any work
    task_resources(...)     what the task asks Ray for, from the memory plan
                            (engine/models/memory.py): one whole GPU for a model that fits one (so
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

Torch-free at import, and Ray-free too: `ray` is imported inside `connect` and the task.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import socket
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from unittest import mock

from engine.core.errors import UserError
from engine.core.events import Event, Message, TaskState, event_from_json
from engine.core.process import PROJECT_ROOT, interruption, say, stop_signal
from engine.models.placement import Hardware

INSTALL = "pip install 'anatomy-tui[cluster]' (Ray)"
DEFAULT_RETRIES = 2  # tries after the first, for a task whose worker died
MARGIN = 0.9  # as engine.models.memory.MARGIN: a GPU or node holds a plan of at most 90 % of its memory
PROGRESS_STEPS = 4  # a running task's progress line at each quarter


@dataclass(frozen=True)
class NodeShape:
    """One alive node of the cluster, as Ray reports it (`gpu_memory` and `gpu_capability`: each
    GPU's bytes and compute capability, read through NVML on the node; empty where NVML cannot say)."""

    node_id: str
    host: str
    cpus: float
    gpus: int
    memory: int
    gpu_memory: tuple[int, ...] = ()
    gpu_capability: tuple[tuple[int, int], ...] = ()


def cluster_hardware(nodes: Sequence[NodeShape]) -> Hardware:
    """The GPU a task may land on, as engine.models.placement's rules read it (a worker sees its GPU
    as `cuda`, index 0): the lowest compute capability and the smallest GPU of the GPU nodes, so a
    plan in the dtype it gives holds wherever Ray places the task; no GPU node: the CPU."""
    gpu_nodes = [node for node in nodes if node.gpus]
    capabilities = [capability for node in gpu_nodes for capability in node.gpu_capability]
    sizes = [size for node in gpu_nodes for size in node.gpu_memory]
    return Hardware(bool(gpu_nodes), max((node.gpus for node in gpu_nodes), default=0),
                    (min(capabilities),) if capabilities else (), (min(sizes),) if sizes else (),
                    max((node.memory for node in nodes), default=0), local=False)


@dataclass(frozen=True)
class TaskResources:
    """What one task asks Ray for: `gpus` whole GPUs (several: a STRICT_PACK placement group, so on
    one node), `cpus`, and `memory` bytes for a run on the CPU (Ray's scheduling resource)."""

    cpus: float
    gpus: int = 0
    memory: int = 0

    @property
    def packed(self) -> bool:
        return self.gpus > 1

    def text(self) -> str:
        if self.gpus:
            return f"{self.gpus} GPU{'s of one node' if self.packed else ''}"
        return f"{self.cpus:g} CPU{'s' if self.cpus != 1 else ''}" + (f", {size_text(self.memory)}" if self.memory
                                                                      else "")


def task_resources(what: str, plan_bytes: int | None, device: str, device_map: str | None,
                   max_memory: str | None, nodes: Sequence[NodeShape], cpus: float = 1) -> TaskResources:
    """The resources of a task that holds `plan_bytes` at its peak (None: no plan could be made),
    or the one line saying no node of `nodes` can hold it. A GPU run on a cluster with GPUs (any
    `device` but cpu): with `device_map`, the GPUs `max_memory` names, else as many as the plan
    needs of the node GPUs' memory, else every GPU of the largest node (accelerate spreads the
    layers over what the task is given); without, one whole GPU. Else a CPU run: `cpus` and the
    plan's bytes of a node's memory."""
    from engine.models.placement import parse_max_memory

    gpu_nodes = [node for node in nodes if node.gpus]
    if device != "cpu" and gpu_nodes:
        if device_map is None:
            sizes = [size for node in gpu_nodes for size in node.gpu_memory]
            if plan_bytes is not None and sizes and plan_bytes > MARGIN * max(sizes):
                raise UserError(f"{what} needs about {size_text(plan_bytes)} but the largest GPU of the cluster "
                                f"has {size_text(max(sizes))}; spread the model with --device-map auto, or use "
                                "--device cpu")
            return TaskResources(cpus, 1)
        most = max(node.gpus for node in gpu_nodes)
        named = [key for key in (parse_max_memory(max_memory) or {}) if isinstance(key, int)]
        if named:
            wanted = len(named)
        elif plan_bytes is not None and all(node.gpu_memory for node in gpu_nodes):
            each = min(size for node in gpu_nodes for size in node.gpu_memory)
            wanted = min(most, max(1, math.ceil(plan_bytes / (MARGIN * each))))  # the rest: CPU, disk
        else:
            wanted = most
        if wanted > most:
            raise UserError(f"{what}: --max-memory names {wanted} GPUs but no node of the cluster has more than "
                            f"{most}; name at most {most}")
        return TaskResources(cpus, wanted)
    if device.startswith("cuda"):
        raise UserError(f"{what} asks for --device {device} but the cluster has no GPU; use --device auto or cpu")
    memory = plan_bytes or 0
    if not any(node.cpus >= cpus and node.memory * MARGIN >= memory for node in nodes):
        largest = max((node.memory for node in nodes), default=0)
        raise UserError(f"{what} needs about {size_text(memory)} of memory but the largest node of the cluster "
                        f"has {size_text(largest)} for tasks; use a smaller model, --dtype float16, or a GPU "
                        "cluster")
    return TaskResources(cpus, 0, memory)


@dataclass(frozen=True)
class TaskSpec:
    """One run as data, all a worker needs: the experiment, its settings and model options
    (`to_dict()`, as a job file records them), the session results it reads, and the text of each
    file its settings name (path -> text)."""

    experiment: str
    settings: dict[str, Any]
    options: dict[str, Any] | None
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    resume: bool = False  # --resume: continue from `checkpoint`
    checkpoint: dict[str, bytes] = field(default_factory=dict)  # a resume's checkpoint folder: path in it -> bytes
    cwd: str = ""  # the driver's folder, where a task on its machine works (set by Cluster.run)


@dataclass(frozen=True)
class CheckpointChange:
    """What changed in a task's checkpoint folder since its last word: each file written (its path
    in the folder, POSIX, -> its bytes) in the order they were written, and the paths gone."""

    written: dict[str, bytes]
    gone: tuple[str, ...] = ()


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

        alive = [node for node in ray.nodes() if node.get("Alive")]
        probes = {node["NodeID"]: _gpu_memory().options(
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


def size_text(size: float) -> str:
    """Bytes as a line shows them: GB, or MB below one GB."""
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"


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
                progress = f"{event.label + ' ' if event.label else ''}{event.done}/{event.total}"
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
    return _task().options(**options), group


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
                    ray.init(address=address, logging_level="ERROR", log_to_driver=False,
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


def _gpu_memory_probe() -> list[tuple[int, int, int]]:
    """Each GPU's total bytes and compute capability (major, minor) on this node, through NVML (no
    CUDA context); [] without it."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            found.append((int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), int(major), int(minor)))
        return found
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def run_task(spec: TaskSpec) -> Iterator[dict[str, Any]]:
    """The worker's side: where it was placed, then the experiment run here, each event as its JSON
    document; a UserError as its one line. The model loads on this node (the hub or a path)."""
    import ray

    context = ray.get_runtime_context()
    gpus = tuple(str(g) for g in context.get_accelerator_ids().get("GPU", []))
    yield {"placed": {"node_id": context.get_node_id(), "host": ray.util.get_node_ip_address(), "gpus": gpus,
                      "pid": os.getpid()}}
    from engine.core.frozen_imports import one_job_process
    from engine.experiments.context import RunContext  # torch: after the word of where it runs
    from engine.models.options import ModelOptions
    from engine.registry import experiment

    one_job_process()  # its worker runs this task only (max_calls=1)
    if spec.cwd:  # on the driver's machine: its relative paths (a --model folder) mean what they meant there
        with contextlib.suppress(OSError):
            os.chdir(spec.cwd)
    with tempfile.TemporaryDirectory(prefix="anatomy-tui-task-") as folder:
        moved = _materialize(spec.files, Path(folder))
        try:
            entry = experiment(spec.experiment)
            entry.import_frozen(with_model=spec.options is not None)
            settings = entry.settings_class.from_dict(_swapped(spec.settings, moved))
            model = None
            if spec.options is not None:
                options = ModelOptions.from_dict(spec.options)
                model = options.load(say)
            back = {new: old for old, new in moved.items()}
            checkpoint = Path(folder) / "checkpoint" if entry.resumable else None
            if checkpoint is not None:
                apply_checkpoint(checkpoint, CheckpointChange(spec.checkpoint))
            mirror = _Mirror(checkpoint)
            context = RunContext(model=model, checkpoint_dir=checkpoint, resume=spec.resume, inputs=spec.inputs)
            for event in entry.run(settings, context):
                yield from mirror.changes()  # the checkpoint the experiment wrote before this event, first
                yield {"event": _swapped(event.to_json(), back)}  # the driver's paths, in results too
            yield from mirror.changes()
        except UserError as exc:
            yield {"error": str(exc)}


class _Mirror:
    """The worker's view of its checkpoint folder (None: the experiment keeps none): `changes()`
    yields, at most once a call, the files written and gone since the last call, as a document."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.seen = _marks(folder) if folder is not None else {}

    def changes(self) -> Iterator[dict[str, Any]]:
        if self.folder is None:
            return
        now = _marks(self.folder)
        written: dict[str, bytes] = {}
        for name in sorted((n for n in now if now[n] != self.seen.get(n)), key=lambda n: now[n][1]):
            try:
                written[name] = (self.folder / name).read_bytes()
            except FileNotFoundError:  # removed since: the next call says it is gone
                now.pop(name)
        gone = sorted(set(self.seen) - set(now))
        self.seen = now
        if written or gone:
            yield {"checkpoint": {"written": written, "gone": gone}}


def _marks(folder: Path) -> dict[str, tuple[int, int]]:
    """Each regular file in `folder` (its path there, POSIX) -> (size, mtime in ns); hidden names (an
    atomic write's temporary file) and links left out."""
    found: dict[str, tuple[int, int]] = {}
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in files:
            path = Path(root) / name
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if not name.startswith(".") and stat.S_ISREG(info.st_mode):
                found[path.relative_to(folder).as_posix()] = (info.st_size, info.st_mtime_ns)
    return found


def checkpoint_files(folder: Path) -> dict[str, bytes]:
    """The files of a checkpoint folder (the session's, for a resume), each read without following
    a link (a link in a session folder is a one-line UserError)."""
    from engine.disk.atomic import read_bytes

    return {name: read_bytes(folder / name) for name in _marks(folder)} if folder.is_dir() else {}


def apply_checkpoint(folder: Path, change: CheckpointChange) -> None:
    """Writes `change` into `folder` (each file atomically; a path that leaves the folder, or that is
    hidden, is a one-line UserError: it did not come from a checkpoint folder)."""
    from engine.disk.atomic import atomic_write_bytes, unlinked

    for name, data in change.written.items():
        atomic_write_bytes(_inside(folder, name), data, "checkpoint")
    for name in change.gone:
        unlinked(_inside(folder, name)).unlink(missing_ok=True)


def _inside(folder: Path, name: str) -> Path:
    parts = name.split("/")
    if not name or name.startswith("/") or any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        raise UserError(f"checkpoint file {name!r} is not a plain path inside the checkpoint folder")
    return folder.joinpath(*parts)


def _materialize(files: Mapping[str, str], folder: Path) -> dict[str, str]:
    """The driver's files on this node: where a file of the same lines is at the same path (a local
    cluster, a shared disk) it is read there; else its text is written into `folder`. Returns
    driver path -> path here, for those written."""
    from engine.core.files import path_kind, read_lines

    moved: dict[str, str] = {}
    for index, (path, text) in enumerate(sorted(files.items())):
        lines = [line for line in (piece.strip() for piece in text.splitlines()) if line]
        if path_kind(Path(path), "file") == "file" and read_lines(Path(path), "file") == lines:
            continue
        here = folder / f"{index}-{Path(path).name}"
        here.write_text(text, encoding="utf-8")
        moved[path] = str(here)
    return moved


def _swapped(doc: Any, paths: Mapping[str, str]) -> Any:
    """`doc` with every string that is a key of `paths` replaced by its value."""
    if not paths:
        return doc
    if isinstance(doc, str):
        return paths.get(doc, doc)
    if isinstance(doc, dict):
        return {key: _swapped(value, paths) for key, value in doc.items()}
    if isinstance(doc, list):
        return [_swapped(value, paths) for value in doc]
    return doc


@functools.cache
def _task() -> Any:
    """`run_task` as a Ray streaming generator, made at first use (Ray is imported then). Each task
    has a worker process of its own (max_calls=1): a task cancelled in the middle of an import or a
    load leaves no half-imported module to the next (a reused worker once failed every later task
    with scipy's `NameError: _ndimage_api`), and a model's memory goes back when its task ends."""
    import ray

    return ray.remote(num_returns="streaming", max_calls=1)(run_task)


@functools.cache
def _gpu_memory() -> Any:
    import ray

    return ray.remote(num_cpus=0)(_gpu_memory_probe)
