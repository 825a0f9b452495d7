"""Long jobs as their own process: the same `anatomy-tui run ... --session S` a user would type.

Each job starts in a new process session (its own process group, no controlling terminal), with
its output going to a log file in the session, so closing the console, a dropped SSH connection
(SIGHUP) or a crash of the UI does not stop it. The console follows it through the event log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessions.process import job_identity_matches
from sessions.store import Session, pid_alive


@dataclass
class BackgroundJob:
    """A job this console started; `pid` is also its process group id."""

    experiment: str
    pid: int
    log_path: Path
    argv: list[str]
    process: subprocess.Popen | None = None

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid)


def job_command(experiment: str, session: Session, args: Sequence[str]) -> list[str]:
    """The command line for one experiment into `session` (store home passed through the env)."""
    return [sys.executable, "-m", "tui.cli", "run", experiment, *args, "--session", session.name]


def start_job(session: Session, experiment: str, args: Sequence[str]) -> BackgroundJob:
    """Starts `anatomy-tui run EXPERIMENT ARGS --session S` detached from the console."""
    argv = job_command(experiment, session, args)
    logs = session.logs_dir
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    env = {**os.environ, "ANATOMY_TUI_HOME": str(session.path.parent)}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    return BackgroundJob(experiment, process.pid, log_path, argv, process)


def stop_job(doc: dict[str, Any], sig: int = signal.SIGINT) -> bool:
    """Asks the job of job file `doc` to stop (SIGINT: it records itself as cancelled), only while
    its pid provably still is that job (start time, command line and process group as recorded;
    never pid 1). A group leader gets the signal for its whole group, any other process alone."""
    if not job_identity_matches(doc):
        return False
    pid = int(doc["pid"])
    try:
        if doc.get("pgid") == pid:
            os.killpg(pid, sig)
        else:  # a job started from a shell without job control: not its group to stop
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def reap(jobs: list[BackgroundJob]) -> None:
    """Collects exit statuses of finished children so they do not linger as zombies."""
    for job in jobs:
        if job.process is not None:
            job.process.poll()
