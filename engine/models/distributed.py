"""Sweeps split over worker processes with torch.distributed (`--shards N`, or under torchrun).

Every worker loads the model (if the experiment has one) and computes its share of the sweep's
units (layers, (layer, repeat) runs, trials or students: see `plan`) on its own GPU (LOCAL_RANK)
or on an equal share of the CPU threads. Workers send every event to rank 0 as it happens
(pickled objects between our own processes, over gloo); rank 0 alone yields them, so one writer
appends the session's log and saves checkpoints, and at the end rank 0 merges the shards' results
into the result a serial run gives. The world comes from the environment torchrun sets (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT), and `launch` starts the same command
through torch's own launcher.

Nothing `launch` starts listens beyond loopback: a TCPStore listens on every interface whatever
host it is given (and the stores carry no authentication), so the launcher's rendezvous store and
rank 0's store are handed a socket already bound to 127.0.0.1 (`loopback_store`), and gloo's and
NCCL's sockets are put on the loopback interface. Spanning machines is torchrun's, run by the user.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from unittest import mock

import torch
import torch.distributed as dist

from engine.core.errors import UserError
from engine.core.events import Event, Progress, Result
from engine.core.process import STOP_EXIT_CODES, STOP_SIGNALS, interruption, say, stop_signal
from engine.models.placement import Hardware, device_rule

T = TypeVar("T")
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class World:
    """This process's place among the workers, as torchrun describes it."""

    rank: int
    size: int
    local_rank: int
    local_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_from_env(env: Mapping[str, str] = os.environ) -> World | None:
    """The world torchrun set up, or None outside torchrun (a world of one is not split)."""
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return None
    try:
        size, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_size = int(env.get("LOCAL_WORLD_SIZE", size))
    except ValueError:
        raise UserError("RANK, WORLD_SIZE and LOCAL_RANK must be integers; start workers with torchrun") from None
    if size < 2:
        return None
    return World(rank, size, local_rank, local_size)


def shard(items: Sequence[T], rank: int, world: int) -> list[T]:
    """This rank's items, dealt in snake order: round r deals one item to each of ranks 0..world-1
    when r is even and world-1..0 when it is odd. Deterministic; shares differ by at most one item,
    and since later layers cost less (the prefix cache starts there), no rank always gets the
    dearer item of its round."""
    return [item for i, item in enumerate(items) if _dealt_to(i, world) == rank]


def _dealt_to(index: int, world: int) -> int:
    round_, seat = divmod(index, world)
    return seat if round_ % 2 == 0 else world - 1 - seat


def cpu_threads(local_size: int) -> int:
    """An equal share of this machine's CPUs for each of its workers (at least one)."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, available // local_size)


class Workers:
    """The process group of a split sweep; use as a context manager (it leaves the group on exit).
    `device` is the run's --device: a worker takes the GPU of its LOCAL_RANK unless it is `cpu`
    (or no GPU is visible), when it takes its share of the CPU threads."""

    def __init__(self, world: World, device: str = "auto") -> None:
        self.world = world
        hardware = Hardware.read()
        if device != "cpu" and device_rule("auto", hardware) == "cuda":
            index = world.local_rank % hardware.gpus
            torch.cuda.set_device(index)
            self.device, backend = f"cuda:{index}", "nccl"
        else:
            torch.set_num_threads(cpu_threads(world.local_size))
            self.device, backend = "cpu", "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend, store=_world_store(world), rank=world.rank, world_size=world.size)
        # Events travel as pickled bytes over gloo even when the GPUs talk nccl: gloo can receive
        # from whichever worker sends next, and the objects never touch the GPUs.
        self.group = dist.new_group(backend="gloo") if backend != "gloo" else None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- objects between our own processes --------------------------------------------------------
    def broadcast(self, objects: list[Any]) -> list[Any]:
        """Rank 0's `objects` on every worker, in place (each passes a list of the same length)."""
        dist.broadcast_object_list(objects, src=0, group=self.group)
        return objects

    def _send(self, item: Any) -> None:
        """A message is its size, then its bytes: a stop signal between the two would leave rank 0
        reading the next message's size as these bytes, so the stop signals wait until both are sent."""
        data = torch.frombuffer(bytearray(pickle.dumps(item)), dtype=torch.uint8)
        with _signals_held():
            dist.send(torch.tensor([data.numel()], dtype=torch.int64), dst=0, group=self.group)
            dist.send(data, dst=0, group=self.group)

    def _receive(self) -> tuple[int, Any]:
        size = torch.zeros(1, dtype=torch.int64)
        source = dist.recv(size, group=self.group)  # from whichever worker sends next
        data = torch.empty(int(size), dtype=torch.uint8)
        dist.recv(data, src=source, group=self.group)
        return source, pickle.loads(data.numpy().tobytes())

    # --- the sweep --------------------------------------------------------------------------------
    def sweep(
        self,
        run_shard: Callable[[list[T]], Iterator[Event]],
        items: Sequence[T],
        merge: Callable[[list[dict[str, Any]]], dict[str, Any]],
    ) -> Iterator[Event]:
        """Runs `run_shard` on this worker's share of `items`. On rank 0, yields every worker's
        events as they come (progress summed over workers), then one Result made by `merge` from
        the shards' result documents in rank order; on the other ranks, yields nothing."""
        mine = shard(items, self.world.rank, self.world.size)
        if not self.world.is_main:
            self._work(run_shard, mine)
            dist.barrier(group=self.group)
            return
        inbox: queue.Queue[tuple[int, Any]] = queue.Queue()
        listener = threading.Thread(target=self._listen, args=(inbox,), daemon=True)
        listener.start()
        merger = _Merger()
        for event in run_shard(mine) if mine else ():
            yield from merger.take(0, event)
            while not inbox.empty():
                yield from merger.take(*inbox.get())
        while merger.finished < self.world.size - 1:
            yield from merger.take(*inbox.get())
        listener.join()
        dist.barrier(group=self.group)
        yield merger.result(merge)

    def _work(self, run_shard: Callable[[list[T]], Iterator[Event]], mine: list[T]) -> None:
        try:
            for event in run_shard(mine) if mine else ():
                self._send(event)
        except BaseException as exc:
            with contextlib.suppress(RuntimeError):  # rank 0 may be gone already (stopped with us)
                self._send(_Failed(_one_line(exc), stop_signal(exc)))
            raise
        self._send(_Done())

    def _listen(self, inbox: queue.Queue[tuple[int, Any]]) -> None:
        finished = 1
        try:
            while finished < self.world.size:
                rank, item = self._receive()
                inbox.put((rank, item))
                if isinstance(item, (_Done, _Failed)):
                    finished += 1
        except Exception as exc:  # a broken link or a garbled message: the job cannot go on either way
            inbox.put((-1, _Failed(f"lost contact with the workers: {_one_line(exc)}")))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and the stop signals are noted, not acted on, until the block ends, then raised again
    for the handlers they were meant for. (Blocking them would not do: the process's other threads,
    gloo's and torch's, would take them and Python would still run the handler in the block.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sets handlers, and Python runs them only there
        return
    noted: list[int] = []
    before = {sig: signal.signal(sig, lambda signum, _frame: noted.append(signum))
              for sig in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


@dataclass(frozen=True)
class _Done:
    """A worker's last word: its share is finished."""


@dataclass(frozen=True)
class _Failed:
    """A worker's last word when its share raised: the error in one line, or the signal that
    stopped it (Ctrl-C, SIGTERM, SIGHUP: the job stops as interrupted, not failed)."""

    line: str
    signal: int = 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _Merger:
    """Rank 0's view of the whole job: progress summed over workers, results kept for the merge."""

    def __init__(self) -> None:
        self.finished = 0  # workers other than rank 0 that sent their last word
        self.progress: dict[int, Progress] = {}
        self.results: dict[int, Result] = {}

    def take(self, rank: int, item: Any) -> Iterator[Event]:
        if isinstance(item, _Failed) and item.signal:
            raise interruption(item.signal)
        if isinstance(item, _Failed):
            who = f"worker rank {rank}" if rank >= 0 else "a worker"
            raise UserError(f"{who} failed: {item.line}; the sharded job stopped")
        if isinstance(item, _Done):
            self.finished += 1
            return
        if isinstance(item, Result):
            self.results[rank] = item
        elif isinstance(item, Progress):
            self.progress[rank] = item  # summed over the workers in the same phase as this one
            same = [p for p in self.progress.values() if (p.phase, p.unit) == (item.phase, item.unit)]
            rates = [p.rate for p in same if p.rate is not None]
            rate = sum(rates) if len(rates) == len(same) else None
            yield Progress(sum(p.done for p in same), sum(p.total for p in same), item.label, phase=item.phase,
                           unit=item.unit, rate=rate)
        else:
            yield item

    def result(self, merge: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> Result:
        ranks = sorted(self.results)
        return Result(self.results[ranks[0]].name, merge([self.results[r].data for r in ranks]))


# --- starting the workers --------------------------------------------------------------------------


def launch(argv: Sequence[str], nproc: int, env: Mapping[str, str] | None = None) -> int:
    """Starts the command `argv` (a program and its arguments: engine.core.process `python_argv`, or
    the interpreter and a script) as `nproc` workers on this machine through torch.distributed.run,
    `env` added to their environment. Returns 0 when every worker finished; a worker that died is
    named in one line. A stop signal (Ctrl-C, SIGTERM, SIGHUP) to this launcher goes on to every
    worker (torch's launcher does that, and waits for them), which checkpoint and say how to
    resume; it returns 128 + the signal's number, as it does when a worker stopped by one is the
    first to end. Its rendezvous and the workers' links listen on 127.0.0.1 only (`_loopback_env`)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import get_args_parser, run

    if nproc < 2:
        raise UserError("--shards must be at least 2 to split a sweep (1 runs it in this process)")
    rendezvous_handler_registry.register(LOOPBACK_RENDEZVOUS, _loopback_rendezvous)
    args = ["--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", LOOPBACK_RENDEZVOUS,
            "--rdzv-endpoint", f"{LOOPBACK}:0", "--rdzv-id", uuid.uuid4().hex, "--local-addr", LOOPBACK,
            "--no-python", *argv]
    try:
        with mock.patch.dict(os.environ, {**_loopback_env(), **(env or {})}):
            run(get_args_parser().parse_args(args))
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode in STOP_EXIT_CODES:  # the worker said it was stopped, and how to resume
            return failure.exitcode
        first = exc.failures.get(0)
        if first is not None and first.exitcode == 2:  # rank 0 said why in one line (its own, or a worker's)
            return 2
        if failure.exitcode == 2 and isinstance(failure.message, str) and failure.message:  # hand_to_launcher
            say(f"anatomy-tui: error: worker rank {rank}: {failure.message}")
            return 2
        why = f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        say(f"error: worker rank {rank} failed ({why}); the sharded job stopped")
        return 2
    return 0


LOOPBACK_RENDEZVOUS = "anatomy-tui-loopback"  # torch's c10d rendezvous, its store on 127.0.0.1 only


def loopback_store(port: int = 0, world_size: int | None = None) -> dist.TCPStore:
    """A TCPStore server listening on 127.0.0.1:`port` only (0: a free port). Given a host,
    TCPStore still listens on every interface; given a socket already listening, it serves there."""
    from torch.distributed.constants import default_pg_timeout

    listener = socket.create_server((LOOPBACK, port))
    return dist.TCPStore(LOOPBACK, listener.getsockname()[1], world_size, is_master=True, multi_tenant=True,
                         timeout=default_pg_timeout, wait_for_workers=False, master_listen_fd=listener.detach())


def _loopback_rendezvous(params: Any) -> Any:
    """torch's c10d rendezvous handler (what --standalone makes) over a `loopback_store`."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    class Backend(C10dRendezvousBackend):
        name = LOOPBACK_RENDEZVOUS  # the backend a handler is made by must be the one named on the command line

    store = loopback_store()
    return create_handler(store, Backend(store, params.run_id), params)


def _loopback_env() -> dict[str, str]:
    """What keeps the workers' sockets on loopback: no store shared from the launcher (torch would
    open a second one on every interface); rank 0 opens the workers' store (`_world_store`) at the
    MASTER_ADDR `--local-addr` made 127.0.0.1; gloo and NCCL on the loopback interface, unless the
    user named one."""
    import psutil  # accelerate's dependency, so installed with this project

    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    names = [name for name, addresses in psutil.net_if_addrs().items()
             if any(address.address == LOOPBACK for address in addresses)]
    if names:
        env.update({key: names[0] for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if key not in os.environ})
    return env


def _world_store(world: World) -> dist.TCPStore | None:
    """The store the workers meet at, when it is on this machine's loopback (MASTER_ADDR 127.0.0.1,
    as `launch` sets it, and not the launcher's own store): rank 0 serves it on loopback only. None
    otherwise (a torchrun of the user's, over machines): init_process_group's own env:// store."""
    from torch.distributed.constants import default_pg_timeout

    if os.environ.get("MASTER_ADDR") != LOOPBACK or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None
    port = int(os.environ["MASTER_PORT"])
    if world.is_main:
        return loopback_store(port, world.size)
    return dist.TCPStore(LOOPBACK, port, world.size, is_master=False, timeout=default_pg_timeout)


# --- which sweeps split, and how -------------------------------------------------------------------


@dataclass(frozen=True)
class ShardPlan:
    """How one experiment's sweep splits, as its module's `shard_plan` declares it: its units
    (layers, (layer, repeat) runs, trials or students), the settings a share runs with, the merge of
    the shares' results, and what rank 0 does to the checkpoint folder before the split (with the
    folder and --resume)."""

    items: list[Any]
    restrict: Callable[[list[Any]], Any]  # a share's units -> that share's settings
    merge: Callable[[list[dict[str, Any]]], dict[str, Any]]
    prepare: Callable[[Any, bool], None] | None = None
    notes: tuple[str, ...] = ()  # lines rank 0 logs before the split (why these layers)
    summary: Callable[[dict[str, Any]], list[str]] | None = None  # lines from the merged result (the fits)
    # the experiment's own run of the split, (this plan, RunContext, Workers) -> rank 0's events, in
    # place of the shared one (recovery: rank 0 reads the checkpoint, hands out the finished layers
    # and checkpoints each layer as its runs come in)
    sweep: Callable[[ShardPlan, Any, Workers], Iterator[Event]] | None = None
