"""Ray as the engine (issue 32): `--cluster` on a real local Ray cluster of this machine's CPUs with
two GPUs declared (so Ray's placement is what is checked: which task got which GPU index, a
device-mapped model's task both GPUs of its node), tiny models of two families; the atlas gives the
serial atlas's table; a worker killed mid-task is retried to the same result; a driver interrupted
and run again recomputes nothing (an atlas's finished measures; a run's checkpointed layers, its
checkpoint carried back and forth with the task); the events reach the session in order, none
lost, and the console that started the job shows them live; bad input (Ray Client's ray://
included) is one line. One Ray start for the module (Ray is heavy on two shared cores): a driver
in a process of its own joins it with RAY_ADDRESS and --cluster auto."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tiny_models import EVAL, save_tiny

from cli.main import main
from engine.cluster.resources import NodeShape, TaskResources, task_resources
from engine.core.errors import UserError
from engine.models.options import ModelOptions
from sessions.atlas import atlas_tasks
from sessions.store import Session, SessionStore

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("ray")]  # one worker of ./test runs them all: one Ray start

FAMILIES = ("llama", "qwen2")
GB = 10**9
RAY_CLIENT = ("{}: Ray Client (ray://) cannot stream a task's events; run this command on the cluster's head with "
              "RAY_ADDRESS=HEAD:6379 and --cluster auto")  # Ray gives it no streaming generators


def node(gpus: int = 0, memory: int = 64 * GB, gpu_memory: tuple[int, ...] = (), cpus: float = 8) -> NodeShape:
    return NodeShape(f"n{gpus}-{memory}", "10.0.0.1", cpus, gpus, memory, gpu_memory)


def test_task_resources_from_the_memory_plan():
    gpus = [node(4, gpu_memory=(24 * GB,) * 4), node(2, gpu_memory=(80 * GB,) * 2)]
    assert task_resources("m", 10 * GB, "auto", None, None, gpus) == TaskResources(1, 1)  # one GPU holds it
    assert task_resources("m", 70 * GB, "auto", None, None, gpus) == TaskResources(1, 1)  # the 80 GB GPUs do
    with pytest.raises(UserError, match="needs about 80.00 GB but the largest GPU of the cluster has 80.00 GB; "
                                        "spread the model with --device-map auto"):
        task_resources("m", 80 * GB, "auto", None, None, gpus)  # 90 % of 80 GB is 72 GB
    # spread: as many GPUs as the plan needs of the smallest GPU (21.6 GB usable each), at most a node's
    assert task_resources("m", 50 * GB, "auto", "auto", None, gpus) == TaskResources(1, 3)
    assert task_resources("m", 500 * GB, "auto", "auto", None, gpus) == TaskResources(1, 4)  # the rest offloaded
    assert task_resources("m", 50 * GB, "auto", "auto", "0=20GiB,1=20GiB,cpu=100GiB", gpus) == TaskResources(1, 2)
    with pytest.raises(UserError, match="--max-memory names 5 GPUs but no node of the cluster has more than 4"):
        task_resources("m", GB, "auto", "auto", "0=1GiB,1=1GiB,2=1GiB,3=1GiB,4=1GiB", gpus)
    unknown = [node(2), node(8)]  # no NVML: a spread model takes every GPU of the largest node
    assert task_resources("m", 50 * GB, "cuda", "auto", None, unknown) == TaskResources(1, 8)
    assert task_resources("m", None, "auto", None, None, unknown) == TaskResources(1, 1)
    # the CPU: asked for, or a cluster without GPUs; the plan's bytes are Ray's memory resource
    assert task_resources("m", GB, "cpu", None, None, gpus) == TaskResources(1, 0, GB)
    assert task_resources("m", GB, "auto", None, None, [node()]) == TaskResources(1, 0, GB)
    with pytest.raises(UserError, match="needs about 100.00 GB of memory but the largest node of the cluster has "
                                        "64.00 GB for tasks"):
        task_resources("m", 100 * GB, "auto", None, None, [node(), node(memory=32 * GB)])
    with pytest.raises(UserError, match="asks for --device cuda:1 but the cluster has no GPU"):
        task_resources("m", GB, "cuda:1", None, None, [node()])
    assert TaskResources(1, 2).text() == "2 GPUs of one node"
    assert TaskResources(1, 0, 5 * 10**6).text() == "1 CPU, 5.0 MB"


def test_a_checkpoint_folder_travels_as_its_changes(tmp_path):
    """The worker's side sends what changed in its checkpoint folder (in the order written, hidden
    temporary files left out, what it started with not sent back); the driver's side writes it and
    refuses a path that leaves the folder; a resume reads the folder back whole."""
    from engine.cluster.worker import CheckpointChange, _Mirror, apply_checkpoint, checkpoint_files

    worker, driver = tmp_path / "worker", tmp_path / "driver"
    apply_checkpoint(worker, CheckpointChange({"old.json": b"old"}))  # a resume's checkpoint, restored
    mirror = _Mirror(worker)
    assert list(mirror.changes()) == []
    (worker / "weights").mkdir()
    (worker / "weights" / "layer-1.bin").write_bytes(b"\0\1")
    (worker / "layers.json").write_text("{}")
    (worker / ".layers.json.x.tmp").write_text("half")  # an atomic write under way
    os.utime(worker / "weights" / "layer-1.bin", ns=(2_000, 2_000))
    os.utime(worker / "layers.json", ns=(1_000, 1_000))
    (worker / "old.json").unlink()
    [doc] = mirror.changes()
    change = CheckpointChange(doc["checkpoint"]["written"], tuple(doc["checkpoint"]["gone"]))
    assert change == CheckpointChange({"layers.json": b"{}", "weights/layer-1.bin": b"\0\1"}, ("old.json",))
    assert list(change.written) == ["layers.json", "weights/layer-1.bin"]  # as they were written
    assert list(mirror.changes()) == []  # nothing new
    (worker / "layers.json").write_text('{"layers": 1}')
    assert [d["checkpoint"]["written"] for d in mirror.changes()] == [{"layers.json": b'{"layers": 1}'}]

    apply_checkpoint(driver, CheckpointChange({"old.json": b"old"}))
    apply_checkpoint(driver, change)
    assert checkpoint_files(driver) == {"layers.json": b"{}", "weights/layer-1.bin": b"\0\1"}
    assert checkpoint_files(tmp_path / "none") == {}
    for name in ("../x", "/etc/x", ".hidden", "a/../../x", "a//b", ""):
        with pytest.raises(UserError, match="is not a plain path inside the checkpoint folder"):
            apply_checkpoint(driver, CheckpointChange({name: b"x"}))
        with pytest.raises(UserError, match="is not a plain path inside the checkpoint folder"):
            apply_checkpoint(driver, CheckpointChange({}, (name,)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["driver", "worker"]


def test_cluster_flags_refused_in_one_line_before_any_work(tiny_folder, capsys, monkeypatch, isolated_home):
    base = ["run", "ablation", "--model", str(tiny_folder), "--session", "s"]
    cases = [
        (["--cluster", "somewhere"], "--cluster somewhere: use local, or auto (RAY_ADDRESS=HEAD:6379"),
        (["--retries", "1"], "--retries applies to tasks on a cluster; add --cluster local"),
        (["--cluster", "local", "--shards", "2"], "--cluster runs the whole experiment as one task; --shards"),
        (["--cluster", "ray://head:10001"], RAY_CLIENT.format("--cluster ray://head:10001")),
    ]
    for flags, line in cases:
        assert main([*base, *flags]) == 2
        err = capsys.readouterr().err
        assert line in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert main([*base, "--cluster", "auto"]) == 2
    assert "--cluster auto: nothing answers at 127.0.0.1:1" in capsys.readouterr().err
    monkeypatch.setenv("RAY_ADDRESS", "nohost")
    assert main([*base, "--cluster", "auto"]) == 2
    assert "--cluster auto: RAY_ADDRESS=nohost is not HOST:PORT" in capsys.readouterr().err
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # Ray Client by the environment: refused alike
    for argv in ([*base, "--cluster", "auto"], ["atlas", "--models", str(tiny_folder), "--name", "a", "--cluster",
                                                "auto"], ["--cluster", "auto"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert RAY_CLIENT.format("--cluster auto (RAY_ADDRESS=ray://head:10001)") in err, err
        assert len(err.strip().splitlines()) == 1
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setitem(sys.modules, "ray", None)  # the cluster extra not installed
    assert main([*base, "--cluster", "local"]) == 2
    assert capsys.readouterr().err.strip() == ("anatomy-tui: error: --cluster needs Ray: pip install "
                                               "'anatomy-tui[cluster]' (Ray)")
    assert main(["atlas", "--models", str(tiny_folder), "--name", "a", "--cluster", "local"]) == 2
    assert "--cluster needs Ray" in capsys.readouterr().err
    assert main(["--cluster", "local"]) == 2  # the console's: before any screen
    assert "--cluster needs Ray" in capsys.readouterr().err
    monkeypatch.delitem(sys.modules, "ray")
    assert main(["--cluster", "elsewhere"]) == 2
    assert "--cluster elsewhere: use local, or auto" in capsys.readouterr().err
    assert main(["--cluster", "ray://head:10001"]) == 2  # the console's Ray Client: refused before any screen
    assert RAY_CLIENT.format("--cluster ray://head:10001") in capsys.readouterr().err
    assert not (isolated_home / "s").exists() and not (isolated_home / "a").exists()  # no work was done


def test_the_console_starts_its_jobs_on_its_cluster(monkeypatch):
    from test_lab import flag, make_lab, stub_model

    from tui.console_settings import ConsoleSettings

    lab, console, started = make_lab(monkeypatch, placement="release")  # this GPU could not hold both
    lab.settings = ConsoleSettings(cluster="auto")
    stub = stub_model()
    lab.model_loaded(stub)
    lab.map_job()
    [argv] = started
    assert argv[-4:] == ["--cluster", "auto", "--session", "demo"]
    assert lab.loaded is stub  # the job is not on this machine: the console keeps its model
    assert not flag(argv, "shards") and not flag(argv, "device=cuda")  # the model flags the console was given
    settings = lab.settings_for("recovery", layers=(1,))
    assert settings is not None
    lab.start_job("recovery", settings, resume=True)  # its checkpoint goes along
    assert started[1][-5:] == ["--cluster", "auto", "--session", "demo", "--resume"]


@pytest.fixture(scope="module")
def ray_cluster():
    """This machine as a Ray cluster of its two CPUs, with two GPUs declared: Ray hands out GPU
    indices (CUDA_VISIBLE_DEVICES) as on a real node, and the CPU build of torch runs on the CPU."""
    ray = pytest.importorskip("ray")
    import engine.cluster

    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")  # "local": a new one, never a cluster `ray start` left on this machine
    yield ray
    engine.cluster._CONNECTED.clear()
    ray.shutdown()


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: save_tiny(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="module")
def long_eval(tmp_path_factory) -> str:
    """Enough texts that a tiny model's ablation runs for a few seconds (time to kill its worker)."""
    path = tmp_path_factory.mktemp("long") / "long.txt"
    path.write_text("\n".join(f"{text} ({i})" for i in range(60) for text in EVAL), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def serial_long(families, long_eval, tmp_path_factory, one_thread) -> list[dict]:
    """The serial atlas's table of `long_eval` (made once: the tables of the atlases on the cluster
    that are stopped, killed and resumed are each this one)."""
    return serial_table(families, long_eval, tmp_path_factory.mktemp("serial"))


def result_of(session: Session, name: str) -> dict[str, Any]:
    """The session's result `name`, which the run saved."""
    result = session.load_result(name)
    assert result is not None, f"{session.name}: no {name} result"
    return result


def events(home: Path, session: str) -> list[dict]:
    return [json.loads(line) for line in (home / session / "events.jsonl").read_text().splitlines()]


def placements(docs: list[dict]) -> list[str]:
    return [doc["text"] for doc in docs
            if doc["kind"] == "job.message" and doc["text"].startswith("running on the cluster")]


def task_states(docs: list[dict]) -> list[tuple[str, str]]:
    """The task's states a run on the cluster logged (job.state), with their details."""
    return [(doc["state"], doc["detail"]) for doc in docs if doc["kind"] == "job.state"]


def comparable(doc: object) -> object:
    """Events less what differs run to run: times, job ids, the job's spec (the device asked),
    timings, and what only a run on the cluster says: the line of where it ran, its task's states."""
    if isinstance(doc, list):
        return [comparable(d) for d in doc
                if not (isinstance(d, dict) and (str(d.get("text", "")).startswith("running on the cluster")
                                                 or d.get("kind") == "job.state"))]
    if isinstance(doc, dict):
        return {k: comparable(v) for k, v in doc.items() if k not in ("t", "job", "seconds", "spec", "rate")}
    return doc


@pytest.mark.slow
def test_runs_on_the_cluster_get_their_gpus_and_stream_every_event_in_order(ray_cluster, families, files,
                                                                           isolated_home, capsys, one_thread):
    model = str(families["llama"])
    common = ["run", "ablation", "--model", model, "--eval-file", files[0]]
    assert main([*common, "--device", "cpu", "--session", "serial"]) == 0
    assert main([*common, "--session", "one", "--cluster", "local"]) == 0
    err = capsys.readouterr().err
    for state in ("queued (1 GPU)", "placed on node", "running: ablation: layers 4/4", "done"):
        assert f"llama · ablation: {state}" in err
    store = SessionStore(isolated_home)
    layers = result_of(store.open("serial"), "ablation")["layers"]
    assert result_of(store.open("one"), "ablation")["layers"] == layers
    # every event of the serial run, in its order, nothing lost or added but the line of where it ran
    assert comparable(events(isolated_home, "one")) == comparable(events(isolated_home, "serial"))
    one = placements(events(isolated_home, "one"))
    assert len(one) == 1 and re.search(r"GPU [01], pid \d+$", one[0])
    # the states the lines said, in the session too (the console's Compare view of an atlas reads them)
    states = task_states(events(isolated_home, "one"))
    assert states[:2] == [("queued", "1 GPU"), ("placed", one[0].removeprefix("running on the cluster: "))]
    assert states[-2:] == [("running", "ablation: layers 4/4"), ("done", "")]
    assert {s for s, _ in states[2:-1]} == {"running"}

    # a device-mapped model's task (both GPUs of one node): the atlas stopped by SIGTERM below

    # a model no node can hold: one line, before any work
    assert main([*common, "--session", "big", "--device-map", "auto", "--max-memory", "0=1GiB,1=1GiB,2=1GiB",
                 "--cluster", "local"]) == 2
    err = capsys.readouterr().err
    assert "--max-memory names 3 GPUs but no node of the cluster has more than 2" in err and "queued" not in err
    assert not store.exists("big") or not store.open("big").jobs()


@pytest.mark.slow
def test_a_checkpoint_the_driver_cannot_keep_stops_its_task(ray_cluster, families, files, monkeypatch):
    """What `keep` raises (the session's disk full, a link in its checkpoint folder) reaches the
    caller, and the task is cancelled, not left running on the cluster."""
    from cli.cluster_run import settings_files
    from engine.cluster import connect
    from engine.cluster.resources import TaskResources
    from engine.cluster.worker import TaskSpec
    from engine.registry import BY_NAME

    cancelled: list[object] = []
    real = ray_cluster.cancel

    def cancel(ref, **kw):
        cancelled.append(ref)
        return real(ref, **kw)

    monkeypatch.setattr(ray_cluster, "cancel", cancel)
    settings = BY_NAME["recovery"].defaults().override({"layers": (1,), "steps": 2, "eval_file": files[0],
                                                         "train_file": files[1]})
    spec = TaskSpec("recovery", settings.to_dict(), ModelOptions(str(families["llama"]), "cpu", "float32").to_dict(),
                    files=settings_files(settings))

    def keep(change):
        raise UserError("no space left on the session's disk")

    with pytest.raises(UserError, match="no space left"):
        list(connect("local").run(spec, TaskResources(1), lambda line: None, keep))
    assert len(cancelled) == 1


def atlas_argv(families: dict[str, Path], evaluation: str, name: str, *extra: str) -> list[str]:
    return ["atlas", "--models", ",".join(str(families[f]) for f in FAMILIES), "--name", name,
            "--eval-file", evaluation, "--measures", "map,proxies", "--bins", "4", *extra]


def table(home: Path, name: str) -> list[dict]:
    return result_of(SessionStore(home).open(name), "atlas")["rows"]


def serial_table(families: dict[str, Path], evaluation: str, home: Path) -> list[dict]:
    """The serial atlas's table, made in a store of its own (a store's sessions are reused)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANATOMY_TUI_HOME", str(home))
        assert main(atlas_argv(families, evaluation, "serial", "--device", "cpu")) == 0
    return table(home, "serial")


def without_sessions(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "session"} for row in rows]


def jobs(home: Path) -> dict[str, list[str]]:
    """Each member session's jobs' statuses: one job is one computation."""
    store = SessionStore(home)
    return {info.name: sorted(doc["status"] for doc in store.open(info.name).jobs().values())
            for info in store.list() if info.openable and store.open(info.name).jobs()}


@pytest.mark.slow
def test_atlas_on_the_cluster_stopped_by_sigterm_continues_without_recomputing_to_the_serial_table(
        ray_cluster, families, long_eval, serial_long, isolated_home, capsys, one_thread):
    """A real SIGTERM to an atlas's driver, a process of its own on this module's Ray (RAY_ADDRESS,
    --cluster auto), once one model's measure is done and kept: the other measure's task is
    cancelled and marked interrupted, exit 143; the same atlas again reuses the finished one and
    computes the other once, and its table is the serial atlas's. Each task holds both GPUs of one
    node (--device-map auto: a device-mapped model's placement), so they run one after the other
    and the second is under way (or queued) when the first is done."""
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    argv = atlas_argv(families, long_eval, "sig", "--device-map", "auto")
    driver = subprocess.Popen([sys.executable, "-m", "cli.main", *argv, "--cluster", "auto"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    members = ("sig-llama", "sig-qwen2")
    deadline = time.monotonic() + 300
    while not any("done" in statuses for statuses in jobs(isolated_home).values()):
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()[1][-3000:]
        time.sleep(0.05)
    driver.send_signal(signal.SIGTERM)
    err = driver.communicate(timeout=120)[1]
    assert driver.returncode == 143, err[-3000:]
    assert "atlas sig interrupted by SIGTERM" in err
    before = jobs(isolated_home)
    [first] = [name for name in members if before.get(name) == ["done"]]
    [other] = set(members) - {first}
    assert before.get(other, ["interrupted"]) == ["interrupted"]  # its task cancelled, nothing half written
    if other in before:
        assert SessionStore(isolated_home).open(other).load_result("ablation") is None
    states = {row.session: row.state for row in atlas_tasks(SessionStore(isolated_home), "sig")}
    assert states[first] == "done" and states[other] in ("interrupted", "waiting")  # waiting: never started
    # the device-mapped task: both GPUs, of one node (a STRICT_PACK placement group)
    assert "queued (2 GPUs of one node)" in err
    spread = placements(events(isolated_home, first))
    assert len(spread) == 1 and "GPU 0,1, pid" in spread[0]
    assert task_states(events(isolated_home, first))[0] == ("queued", "2 GPUs of one node")

    assert main([*argv, "--cluster", "local"]) == 0
    assert f"reused from session {first}" in capsys.readouterr().err
    after = jobs(isolated_home)
    assert after[first] == ["done"] and after[other].count("done") == 1  # none computed twice
    assert [row.state for row in atlas_tasks(SessionStore(isolated_home), "sig")] == ["done", "done"]
    assert without_sessions(table(isolated_home, "sig")) == without_sessions(serial_long)


@pytest.mark.slow
def test_a_worker_killed_mid_task_is_retried_to_the_same_table(ray_cluster, families, long_eval, serial_long,
                                                               isolated_home, capsys, one_thread):
    killed = kill_once(isolated_home / "killed-llama" / "events.jsonl")
    assert main(atlas_argv(families, long_eval, "killed", "--cluster", "local", "--retries", "1")) == 0
    killed.join()
    err = capsys.readouterr().err
    assert "llama · ablation: retried (2 of 2): its worker died" in err
    # the killed try (resumed when a layer of it was kept before the kill), and the one that finished
    assert jobs(isolated_home)["killed-llama"] in (["done", "failed"], ["done", "resumed"])
    states = task_states(events(isolated_home, "killed-llama"))
    retried = states.index(next(state for state in states if state[0] == "retried"))
    assert [s for s, _ in states[:retried]][:2] == ["queued", "placed"] and "done" not in dict(states[:retried])
    assert states[retried][1].startswith("try 2 of 2: its worker died (")
    assert [s for s, _ in states[retried + 1:retried + 3]] == ["queued", "placed"] and states[-1] == ("done", "")
    store = SessionStore(isolated_home)
    assert [(r.state, r.detail) for r in atlas_tasks(store, "killed")] == [("done", "")] * 2  # the retry's, atlas: done
    assert without_sessions(table(isolated_home, "killed")) == without_sessions(serial_long)
    results = SessionStore(isolated_home).open("killed-llama").path / "results"
    assert sorted(p.name for p in results.iterdir()) == ["ablation.json"]  # written once, whole (no temp left)

    # no retry left: the atlas says which model and measure failed and why, and goes on with the rest
    killed = kill_once(isolated_home / "failing-llama" / "events.jsonl")
    failing = atlas_argv(families, long_eval, "failing", "--cluster", "local", "--retries", "0", "--max-length", "200")
    assert main(failing) == 1  # other settings than the first atlas's: nothing to reuse
    killed.join()
    err = capsys.readouterr().err
    assert re.search(r"error: llama · ablation failed: its worker died on each of 1 tries \(last: .+\)\n", err)
    assert f"atlas failing: 1 measure(s) failed ({families['llama']} · ablation on main)" in err
    assert jobs(isolated_home)["failing-qwen2"] == ["done"]
    assert {row["model"] for row in table(isolated_home, "failing")} == {str(families["qwen2"])}
    assert [row.state for row in atlas_tasks(store, "failing")] == ["failed", "done"]


def kill_once(log: Path, kind: str = "job.progress") -> threading.Thread:
    """A thread that kills the worker of the run logging into `log` once an event of `kind` is
    there (by default its first progress: it has begun computing), by the pid the run's placement
    line names."""

    def watch() -> None:
        deadline = time.time() + 240
        while time.time() < deadline:
            docs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            running = placements(docs)
            if running and any(doc["kind"] == kind for doc in docs):
                os.kill(int(running[0].rsplit("pid ", 1)[1]), signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_console_follows_its_job_on_the_cluster_live(ray_cluster, families, long_eval, isolated_home,
                                                               monkeypatch):
    """The console started with --cluster auto (RAY_ADDRESS: this module's Ray) starts its map as
    `anatomy-tui run ... --cluster auto`, its own process; the Ray task's events are written into
    the session as they arrive, and the console's layer panel shows the map growing before the run
    ends (its rows, the panel's `k/n` line), then the result. "Before the end" is made sure of, not
    raced: the task's worker is held (SIGSTOP) from the first row in the session on, so the task
    cannot have ended while the console shows part of the map (a driver that wrote the events only
    once the task had ended would have written the result too)."""
    from test_tui import until

    from tui.app import AnatomyApp
    from tui.console_settings import ConsoleSettings
    from tui.screens.console import ConsoleScreen

    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.get_runtime_context().gcs_address)
    model = str(families["llama"])
    app = AnatomyApp(session="live", options=ModelOptions(model, "cpu", "float32"), load_model=False,
                     console=ConsoleSettings(auto_map=False, cluster="auto"))
    log = isolated_home / "live" / "events.jsonl"
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, ConsoleScreen)
        settings = app.lab.settings_for("ablation", eval_file=long_eval)
        assert settings is not None
        job = app.lab.start_job("ablation", settings)
        assert job is not None and job.process is not None  # a job in its own process
        assert job.argv[-4:] == ["--cluster", "auto", "--session", "live"]
        panel = app.screen.query_one("#layers")
        worker = None
        try:
            deadline = time.monotonic() + 300
            while not (log.exists() and '"kind": "ablation.layer"' in log.read_text()):
                assert time.monotonic() < deadline and job.process.poll() is None, job.log_path.read_text()[-3000:]
                await pilot.pause(0.02)
            [where] = placements(events(isolated_home, "live"))
            worker = int(where.rsplit("pid ", 1)[1])
            os.kill(worker, signal.SIGSTOP)  # the task held after its first row
            await until(pilot, lambda: len(app.state.ablation) > 0)
            await until(pilot, lambda: "map own process" in str(panel.border_subtitle), 30)
            await pilot.pause(1.0)  # time for anything more to arrive: nothing does
            shown, line = len(app.state.ablation), str(panel.border_subtitle)
            assert "ablation" not in app.state.results and '"kind": "job.finished"' not in log.read_text()
        finally:
            if worker is not None:
                os.kill(worker, signal.SIGCONT)
        n = app.state.n_layers
        assert 0 < shown < n and re.fullmatch(r"map own process: layers \d+/\d+ · c cancels", line), (shown, n, line)
        await until(pilot, lambda: "ablation" in app.state.results, 300)
        assert job.process.wait(60) == 0, job.log_path.read_text()[-3000:]
        await until(pilot, lambda: [view.status for view in app.state.jobs.values()] == ["done"])
        saved = result_of(SessionStore(isolated_home).open("live"), "ablation")
        assert [row.ppl for _, row in sorted(app.state.ablation.items())] == [r["ppl"] for r in saved["layers"]]
        assert len(app.state.ablation) == n and panel.border_subtitle == ""  # the whole map, no map running
    ran = placements(events(isolated_home, "live"))
    assert len(ran) == 1 and re.search(r"\) CPU, pid \d+$", ran[0])  # --device cpu: a CPU task


ROOT = Path(__file__).resolve().parent.parent


def recovered(result: dict) -> list[tuple]:
    """A recovery result's layers less their timings: the layer, its steps to each threshold, its curve."""
    return [(row["layer"], row["steps_to"], row["curve"]) for row in result["layers"]]


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_or_whose_worker_died_continues_from_its_checkpoint(
        ray_cluster, families, files, isolated_home, capsys, one_thread):
    """Recovery (resumable) on the cluster: each change of its checkpoint comes back with the events
    and the driver writes it into the session's checkpoint folder. The driver, a process of its own
    (RAY_ADDRESS: this module's Ray), stopped by SIGTERM once a layer is finished, records the job
    interrupted and says the command that continues it on the cluster; that resume sends the
    checkpoint with the task, recomputes no finished layer and gives the uninterrupted run's
    result, written once. A worker killed after a finished layer: the retry continues likewise."""
    evaluation, train = files
    common = ["run", "recovery", "--model", str(families["llama"]), "--device", "cpu", "--layers", "1,2", "--sigma",
              "3", "--steps", "300", "--lr", "1e-2", "--batch-size", "2", "--block-size", "16", "--train-blocks", "4",
              "--eval-every", "100", "--train-file", train, "--eval-file", evaluation]
    assert main([*common, "--session", "serial"]) == 0
    store = SessionStore(isolated_home)
    serial = result_of(store.open("serial"), "recovery")

    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, "-m", "cli.main", *common, "--session", "rs", "--cluster", "auto"],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    checkpoint = isolated_home / "rs" / "checkpoints" / "recovery"
    kept = checkpoint / "layers.json"
    deadline = time.monotonic() + 300
    while not (kept.exists() and json.loads(kept.read_text())["layers"]):
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()[1][-3000:]
        time.sleep(0.05)
    driver.send_signal(signal.SIGTERM)  # one layer finished and kept, the other under way
    err = driver.communicate(timeout=120)[1]
    assert driver.returncode == 143, err[-3000:]
    [first] = map(int, json.loads(kept.read_text())["layers"])
    assert (checkpoint / "weights" / f"layer-{first}.safetensors").is_file()  # the worker's file, on the driver's disk
    assert ("recovery interrupted by SIGTERM; continue with: anatomy-tui run recovery " in err
            and err.rstrip().endswith("--cluster auto --session rs --resume")), err[-2000:]
    [stopped] = store.open("rs").jobs().values()
    assert stopped["status"] == "interrupted"

    # the resume: on the same cluster (this process's Ray), from the checkpoint the driver kept
    capsys.readouterr()
    assert main([*common, "--session", "rs", "--cluster", "local", "--resume"]) == 0
    session = store.open("rs")
    result = result_of(session, "recovery")
    assert result["resumed_layers"] == [first]
    assert recovered(result) == recovered(serial)
    jobs = session.jobs()
    assert sorted(doc["status"] for doc in jobs.values()) == ["done", "resumed"]
    [resumed] = [job for job, doc in jobs.items() if doc["status"] == "done"]
    started = [doc["layer"] for doc in events(isolated_home, "rs")
               if doc["kind"] == "recovery.start" and doc["job"] == resumed]
    assert started == [3 - first]  # the finished layer is not computed again
    assert sorted(p.name for p in (session.path / "results").iterdir()) == ["recovery.json"]  # once, whole
    assert sorted(json.loads(kept.read_text())["layers"]) == ["1", "2"]
    assert sorted(p.name for p in (checkpoint / "weights").iterdir()) == ["layer-1.safetensors",
                                                                         "layer-2.safetensors"]

    # the worker killed once its first layer is kept: the retry resumes the dead try's job from there
    killed = kill_once(isolated_home / "rk" / "events.jsonl", "recovery.layer")
    assert main([*common, "--session", "rk", "--cluster", "local", "--retries", "1"]) == 0
    killed.join()
    assert re.search(r"recovery: retried \(2 of 2\): its worker died \(.+\); from its checkpoint\n",
                     capsys.readouterr().err)
    session = store.open("rk")
    again = result_of(session, "recovery")
    assert len(again["resumed_layers"]) == 1 and recovered(again) == recovered(serial)
    assert sorted(doc["status"] for doc in session.jobs().values()) == ["done", "resumed"]
