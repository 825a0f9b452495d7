"""No code from the current folder, nothing listening beyond loopback (issue 40). In a folder where
a package of each of the project's names lies (its import writes a marker and exits 0, as a
planted `cli/main.py` once did, silently), the processes the project starts run the project's own
code: a console job, the served console's per-connection command, the workers of `--shards 2`, a
task on `--cluster local`. While the last two run, every socket their process tree listens on is
read (psutil): each must be on loopback."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cli.argv import job_argv, typed
from cli.flags import settings_from_args
from cli.launch import serve_command
from cli.main import build_parser, main
from engine.registry import experiment
from sessions.store import SessionStore

PACKAGES = ("tui", "engine", "sessions", "anatomy_tui", "figures")
TINY = ["run", "toy-depth", "--preset", "tiny", "--width", "8", "--outputs", "8", "--teacher-depth", "4",
        "--student-depths", "1,2", "--steps", "5", "--batch-size", "16", "--eval-size", "32", "--bootstrap", "5",
        "--log-every", "10"]  # a shardable run with no model: seconds
ENTRY = shutil.which("anatomy-tui") or str(Path(sys.executable).with_name("anatomy-tui"))  # as a user starts it


@pytest.fixture
def planted(tmp_path) -> Path:
    folder = tmp_path / "planted"
    for name in PACKAGES:
        (folder / name).mkdir(parents=True)
        marker = folder / f"MARKER-{name}"
        (folder / name / "__init__.py").write_text(
            f"import pathlib, sys\npathlib.Path({str(marker)!r}).write_text('planted code ran')\nsys.exit(0)\n")
    return folder


def markers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("MARKER-*"))


def environment() -> dict[str, str]:
    """This environment without PYTHONPATH: the project is found as an installed user finds it."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return {**env, "OMP_NUM_THREADS": "1"}


def ran_toy_depth(session: str) -> bool:
    """Session `session` holds the result of TINY: both regimes, students of depths 1 and 2."""
    result = SessionStore().open(session).load_result("toy-depth") or {}
    return {name: regime["depths"] for name, regime in result.get("regimes", {}).items()} == {
        "tied": [1, 2], "independent": [1, 2]}


def loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket on loopback
    return (mapped or address).is_loopback


def run_listening(argv: list[str], cwd: Path, log: Path) -> tuple[int, int, set[tuple[int, str, str, int]]]:
    """Runs `argv` to its end, reading every LISTEN socket of its process tree meanwhile: its exit
    code, its pid and the (pid, process name, address, port) seen."""
    seen: set[tuple[int, str, str, int]] = set()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(argv, cwd=cwd, env=environment(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while process.poll() is None and time.monotonic() < deadline:
            try:
                tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for member in tree:
                try:
                    name = member.name()
                    sockets = member.net_connections(kind="inet")
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                seen |= {(member.pid, name, s.laddr.ip, s.laddr.port) for s in sockets if s.status == "LISTEN"}
            time.sleep(0.05)
        if process.poll() is None:
            process.kill()
        return process.wait(), process.pid, seen


@pytest.mark.slow
def test_a_console_job_started_in_a_planted_folder_runs_this_project(planted):
    entry = experiment("toy-depth")
    settings = settings_from_args(entry, build_parser("toy-depth").parse_args(TINY))
    argv = job_argv("toy-depth", settings, None, "job", resume=False)
    assert typed(argv).startswith("anatomy-tui run toy-depth --preset=tiny ")  # shown to the user as before
    done = subprocess.run(argv, cwd=planted, env=environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert markers(planted) == []
    assert ran_toy_depth("job")


def test_the_served_console_command_run_in_a_planted_folder_runs_this_project(planted):
    command = serve_command(build_parser().parse_args(["--session", "s"]))
    done = subprocess.run(f"{command} --help", shell=True, cwd=planted, env=environment(), capture_output=True,
                          text=True, timeout=120)  # textual-serve runs it through a shell, in its folder
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: anatomy-tui") and markers(planted) == []


@pytest.mark.slow
def test_shards_started_in_a_planted_folder_run_this_project_on_loopback_only(planted, tmp_path):
    code, launcher, seen = run_listening([ENTRY, *TINY, "--shards", "2", "--session", "sharded"], planted,
                                         tmp_path / "log")
    assert code == 0, (tmp_path / "log").read_text()
    assert markers(planted) == []
    assert ran_toy_depth("sharded")
    listening = {pid for pid, *_ in seen}
    assert launcher in listening and len(listening) >= 3  # the launcher's rendezvous store, each worker's gloo
    assert [entry for entry in seen if not loopback(entry[2])] == []


def test_shard_workers_that_exit_0_without_a_result_fail_in_one_line(worker_env, monkeypatch, capsys):
    """What a planted `cli/main.py` once made of --shards: every worker exits 0, nothing written."""
    import cli.shards

    monkeypatch.setattr(cli.shards, "python_argv", lambda *options: [sys.executable, "-c", "pass"])
    assert main([*TINY, "--shards", "2", "--session", "empty"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == ["anatomy-tui: error: the --shards workers exited without a result (rank 0 wrote none, and "
                      "said nothing); run the command without --shards to see why"]


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.xdist_group("ray")  # beside tests/test_cluster.py's Ray, never at the same time
def test_cluster_local_started_in_a_planted_folder_runs_this_project_on_loopback_only(planted, tmp_path):
    pytest.importorskip("ray")
    code, _, seen = run_listening([ENTRY, *TINY, "--cluster", "local", "--session", "ray"], planted, tmp_path / "log")
    assert code == 0, (tmp_path / "log").read_text()
    assert markers(planted) == []  # the task ran in a Ray worker, whose sys.path Ray begins with the driver's folder
    assert ran_toy_depth("ray")
    names = {name for _, name, _, _ in seen}
    assert {"gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
    assert [entry for entry in seen if not loopback(entry[2])] == []
