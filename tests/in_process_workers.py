"""Split sweeps without processes: `InProcessWorkers` keeps Workers' contract (broadcast, sweep,
world, device) and runs every rank's share here, in rank order, through the same merger rank 0
uses. `rank_zero_here` makes `anatomy-tui run` take this process for rank 0 of a torchrun world
whose other ranks' shares also run here, so a sharded run through the command line (its session,
checkpoints, resume, merge) needs no launcher. What only real processes show (the relaunch, events
pickled over gloo, a dead worker) is tested with torchrun in tests/test_run_scale.py and
tests/test_distributed.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from engine.core.events import Event
from engine.models.distributed import World, _Merger, shard


class InProcessWorkers:
    """Workers.sweep's contract without processes, on the CPU: every rank's share run here, in
    rank order, through the same merger rank 0 uses."""

    device = "cpu"

    def __init__(self, size: int) -> None:
        self.world = World(0, size, 0, size)

    def broadcast(self, objects: list[Any]) -> list[Any]:
        return objects

    def sweep(self, run_shard, items, merge) -> Iterator[Event]:
        merger = _Merger()
        for rank in range(self.world.size):
            for event in run_shard(shard(items, rank, self.world.size)):
                yield from merger.take(rank, event)
        yield merger.result(merge)


@contextlib.contextmanager
def rank_zero_here(monkeypatch: pytest.MonkeyPatch, size: int = 2) -> Iterator[None]:
    """Inside: `anatomy-tui run` sees torchrun's environment for rank 0 of `size` workers (so its
    checks of what splits run as under torchrun) and gets InProcessWorkers for the sweep."""
    import cli.runner

    with monkeypatch.context() as patch:
        for name, value in (("RANK", 0), ("WORLD_SIZE", size), ("LOCAL_RANK", 0), ("LOCAL_WORLD_SIZE", size)):
            patch.setenv(name, str(value))
        patch.setattr(cli.runner, "_workers", lambda world, device: contextlib.nullcontext(InProcessWorkers(size)))
        yield
