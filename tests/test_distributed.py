"""Sweeps split over worker processes: the same rows as a serial run, one writer, a dead worker named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_model

from engine.distributed import World, _Failed, _Merger, cpu_threads, launch, shard, world_from_env
from engine.errors import UserError
from engine.events import Progress, Result
from engine.experiments.ablation import merge_shards, run_ablation

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "shard_worker.py"


@pytest.fixture
def worker_env(monkeypatch):
    """Workers import this tree's engine and the tiny models, like the test process does."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS.parent), str(TESTS)]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_shard_is_a_deterministic_partition():
    items = list(range(30))
    parts = [shard(items, rank, 4) for rank in range(4)]
    assert sorted(sum(parts, [])) == items
    assert parts[1] == [1, 5, 9, 13, 17, 21, 25, 29]
    assert shard(items, 2, 4) == parts[2]
    assert shard([0, 1], 2, 3) == []


def test_world_from_env():
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert world_from_env(env) == World(1, 4, 1, 2)
    assert not world_from_env(env).is_main
    assert world_from_env({}) is None
    assert world_from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None
    with pytest.raises(UserError, match="integers"):
        world_from_env({"RANK": "x", "WORLD_SIZE": "2"})
    assert cpu_threads(10**6) == 1


def test_merger_sums_progress_and_names_a_failed_worker():
    merger = _Merger()
    (first,) = merger.take(0, Progress(1, 2, "ablation"))
    assert (first.done, first.total, first.label) == (1, 2, "ablation")
    (summed,) = merger.take(1, Progress(2, 3, "ablation"))
    assert (summed.done, summed.total) == (3, 5)
    assert list(merger.take(1, Result("ablation", {"layers": []}))) == []
    with pytest.raises(UserError, match="^worker rank 1 failed: CUDA out of memory; the sharded job stopped$"):
        list(merger.take(1, _Failed("CUDA out of memory")))


def test_two_workers_give_the_serial_rows(tokenizer, worker_env, tmp_path):
    import shard_worker

    out = tmp_path / "sharded.json"
    assert launch([str(WORKER), str(out)], 2) == 0
    sharded = json.loads(out.read_text(encoding="utf-8"))
    threads = torch.get_num_threads()
    torch.set_num_threads(cpu_threads(2))  # the workers' share, so every sum is reduced alike
    try:
        events = list(run_ablation(tiny_model("llama", seed=3), tokenizer, shard_worker.SETTINGS))
    finally:
        torch.set_num_threads(threads)
    assert isinstance(events[-1], Result)
    serial = json.loads(json.dumps(events[-1].data))
    assert sharded["result"]["layers"] == serial["layers"]
    assert sharded["result"]["spearman"] == serial["spearman"]
    assert sharded["result"]["baseline_ppl"] == serial["baseline_ppl"]
    assert sharded["kinds"].count("ablation.layer") == 4 and sharded["kinds"][-1] == "result"
    assert sharded["last_progress"] == [4, 4]
    assert merge_shards([serial], shard_worker.SETTINGS)["layers"] == serial["layers"]


def test_a_dead_worker_fails_the_job_in_one_line(worker_env, tmp_path, capsys):
    out = tmp_path / "sharded.json"
    assert launch([str(WORKER), str(out), "die"], 2) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert lines == ["error: worker rank 1 failed (killed by SIGKILL); the sharded job stopped"]
    assert not out.exists()


def test_launch_needs_two_workers():
    with pytest.raises(UserError, match="at least 2"):
        launch([str(WORKER)], 1)
