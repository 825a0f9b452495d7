"""Sweeps split over worker processes: the same rows as a serial run (shards merged here; the run
through torch's launcher is tests/test_run_scale.py's), one writer, a dead worker named."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import tiny_model

from engine.core.errors import UserError
from engine.core.events import Progress, Result
from engine.experiments.ablation.rankings import merge_shards
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationMap, AblationSettings
from engine.models.distributed import (
    World,
    _Done,
    _Failed,
    _Merger,
    _signals_held,
    cpu_threads,
    launch,
    shard,
    world_from_env,
)
from engine.registry import experiment

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "shard_worker.py"


def test_shard_deals_in_snake_order():
    items = list(range(10))
    parts = [shard(items, rank, 4) for rank in range(4)]
    assert parts == [[0, 7, 8], [1, 6, 9], [2, 5], [3, 4]]  # rounds 0-3, 7-4, 8-9
    assert shard(items, 2, 4) == parts[2]
    assert shard([0, 1], 2, 3) == []


@given(st.integers(0, 60), st.integers(1, 9))
def test_shares_partition_the_items_evenly(n, world):
    items = [f"item{i}" for i in range(n)]
    parts = [shard(items, rank, world) for rank in range(world)]
    assert sorted(sum(parts, [])) == sorted(items)
    assert all(part == sorted(part, key=items.index) for part in parts)  # each share keeps the items' order
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_world_from_env():
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    world = world_from_env(env)
    assert world == World(1, 4, 1, 2)
    assert world is not None and not world.is_main
    assert world_from_env({}) is None
    assert world_from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None
    with pytest.raises(UserError, match="integers"):
        world_from_env({"RANK": "x", "WORLD_SIZE": "2"})
    assert cpu_threads(10**6) == 1


@pytest.mark.parametrize(("device", "taken", "backend"), [("cpu", "cpu", "gloo"), ("auto", "cuda:1", "nccl"),
                                                       ("cuda", "cuda:1", "nccl")])
def test_workers_use_the_device_the_run_asked_for(device, taken, backend, monkeypatch):
    """On a machine with GPUs, --device cpu keeps every worker on the CPU (gloo, a share of the
    threads); otherwise a worker takes the GPU of its LOCAL_RANK."""
    import torch.distributed as dist

    from engine.models.distributed import Workers

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 0))  # Hardware.read asks too
    gpus: list[int] = []
    threads: list[int] = []
    backends: list[str] = []
    monkeypatch.setattr(torch.cuda, "set_device", gpus.append)
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: backends.append(backend))
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: "events")
    workers = Workers(World(1, 2, 1, 2), device)
    assert workers.device == taken and backends == [backend]
    assert (gpus, bool(threads)) == (([], True) if device == "cpu" else ([1], False))


def test_merger_sums_progress_and_names_a_failed_worker():
    merger = _Merger()
    (first,) = merger.take(0, Progress(1, 2, "ablation"))
    assert isinstance(first, Progress)
    assert (first.done, first.total, first.label) == (1, 2, "ablation")
    (summed,) = merger.take(1, Progress(2, 3, "ablation"))
    assert isinstance(summed, Progress)
    assert (summed.done, summed.total) == (3, 5)
    assert list(merger.take(1, Result("ablation", {"layers": []}))) == []
    assert list(merger.take(1, _Done())) == [] and merger.finished == 1  # counted wherever it is read
    with pytest.raises(UserError, match="^worker rank 1 failed: CUDA out of memory; the sharded job stopped$"):
        list(merger.take(1, _Failed("CUDA out of memory")))


def test_a_stop_signal_waits_until_a_message_is_wholly_sent():
    """A SIGTERM between a message's size and its bytes once garbled rank 0's next read. No sleep
    decides the order: Python's own signal handler, in whichever thread takes the signal, marks it
    due and then writes its number to the wakeup socket; once that byte is read, the main thread runs
    the due handlers at its next call, so `handler` would have run before "inside", were it not held."""
    delivered: list[str] = []
    release = threading.Event()

    def handler(*_: object) -> None:
        delivered.append("after")

    reader, writer = socket.socketpair()
    writer.setblocking(False)
    reader.settimeout(30)
    previous = signal.signal(signal.SIGTERM, handler)
    wakeup = signal.set_wakeup_fd(writer.fileno())
    other = threading.Thread(target=release.wait)  # a thread that could take the signal
    other.start()
    try:
        with _signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            assert reader.recv(1) == bytes([signal.SIGTERM])  # taken, and due
            delivered.append("inside")
        assert delivered == ["inside", "after"]
        assert signal.getsignal(signal.SIGTERM) is handler  # the handler it was meant for, back in place
    finally:
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGTERM, previous)
        release.set()
        other.join()
        reader.close()
        writer.close()


def test_a_dead_worker_fails_the_job_in_one_line(worker_env, tmp_path, capsys):
    out = tmp_path / "sharded.json"
    assert launch([sys.executable, str(WORKER), str(out), "die"], 2) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert lines == ["error: worker rank 1 failed (killed by SIGKILL); the sharded job stopped"]
    assert not out.exists()


def test_plans_split_layers_and_refuse_other_experiments():
    from engine.experiments.recovery.vocabulary import RecoverySettings

    split = experiment("ablation").shard_plan(AblationSettings(), 4)
    assert split.items == [0, 1, 2, 3] and split.restrict([1, 3]).layers == (1, 3)
    assert experiment("ablation").shard_plan(AblationSettings(layers=(3, 1)), 4).items == [1, 3]
    recovery = experiment("recovery").shard_plan(RecoverySettings(layers=(3, 1, 3), repeats=2), 4)
    assert recovery.items == [(3, 0), (3, 1), (1, 0), (1, 1)]
    assert recovery.restrict([(1, 1), (3, 0), (1, 0)]).layers == (1, 3)
    with pytest.raises(UserError, match="dynamics does not split"):
        experiment("dynamics").shard_plan(experiment("dynamics").defaults(), 4)  # refused before its settings


def test_a_split_manipulation_logs_why_its_layers_as_a_serial_run_does():
    from engine.experiments.manipulate.vocabulary import ManipulationSettings

    chosen = experiment("manipulate").shard_plan(ManipulationSettings(), 4, {}, "tiny")
    assert chosen.notes == ("layers: no ablation map of this model in the session: every layer",)
    assert chosen.restrict([0]).layers == ()  # () is every layer, as in a serial run
    assert experiment("manipulate").shard_plan(ManipulationSettings(layers=(1, 2)), 4, {}, "tiny").notes == ()


def test_launch_needs_two_workers():
    with pytest.raises(UserError, match="at least 2"):
        launch([sys.executable, str(WORKER)], 1)


def result_of(events) -> dict:
    events = list(events)
    assert isinstance(events[-1], Result)
    return json.loads(json.dumps(events[-1].data))


def test_ablation_shards_merge_to_the_serial_map(tokenizer):
    from dataclasses import replace

    import shard_worker

    model, settings = tiny_model("llama", seed=3), shard_worker.SETTINGS
    serial = result_of(run_ablation(model, tokenizer, settings))
    shards = [result_of(run_ablation(model, tokenizer, replace(settings, layers=tuple(shard(range(4), r, 3)))))
              for r in range(3)]
    assert [row["layer"] for row in shards[1]["layers"]] == [1]
    merged = merge_shards(shards, settings)
    assert {k: v for k, v in merged.items() if k != "seconds"} == {k: v for k, v in serial.items() if k != "seconds"}
    assert merge_shards([serial], settings)["layers"] == serial["layers"]  # one shard: itself


def untimed(doc):
    """A result without its wall-clock times (every `seconds...` key, at any depth)."""
    if isinstance(doc, dict):
        return {k: untimed(v) for k, v in doc.items() if not k.startswith("seconds")}
    return [untimed(v) for v in doc] if isinstance(doc, list) else doc


def test_recovery_shards_of_layer_repeat_runs_merge_to_the_serial_result(tokenizer, tmp_path):
    from engine.experiments.recovery.run import run_recovery
    from engine.experiments.recovery.shards import whole_layers
    from engine.experiments.recovery.vocabulary import RecoveryLayer, RecoverySettings

    (tmp_path / "train.txt").write_text("\n".join(f"The cat {i} sat on the mat." for i in range(40)), encoding="utf-8")
    (tmp_path / "eval.txt").write_text("The dog sat on the mat.\nA cat looked at the dog.", encoding="utf-8")
    settings = RecoverySettings(layers=(3, 1, 2), sigma=3.0, steps=2, lr=1e-2, batch_size=2, block_size=16,
                                train_blocks=4, repeats=2, train_file=str(tmp_path / "train.txt"),
                                eval_file=str(tmp_path / "eval.txt"), eval_every=1)  # auto differs under load
    model = tiny_model("llama", seed=3)
    ablation = result_of(run_ablation(model, tokenizer, AblationSettings(eval_set="paper", eval_batch_size=4)))
    serial = result_of(run_recovery(model, tokenizer, settings, ablation=AblationMap.from_json(ablation)))
    split = experiment("recovery").shard_plan(settings, 4, {"ablation": ablation})
    assert split.items == [(3, 0), (3, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    shares = [shard(split.items, rank, 2) for rank in range(2)]
    assert shares[0] == [(3, 0), (1, 1), (2, 0)]  # every layer's repeats are on both workers
    events = [list(run_recovery(model, tokenizer, split.restrict(share), ablation=AblationMap.from_json(ablation),
                                runs=set(share)))
              for share in shares]
    merged = split.merge([result_of(part) for part in events])
    assert [row["layer"] for row in merged["layers"]] == [3, 1, 2]
    assert untimed(merged) == untimed(serial)
    interleaved = [event for pair in itertools.zip_longest(*events) for event in pair if event is not None]
    joined = [e for e in whole_layers(interleaved, settings) if isinstance(e, RecoveryLayer)]
    assert [e.layer for e in joined] == [3, 1, 2]  # each layer once, when its second run is in
    assert untimed(json.loads(json.dumps([e.result for e in joined], default=vars))) == untimed(serial["layers"])
