"""The console's long jobs as their own process: where one runs (beside the console's model, on
another GPU, or after the console releases its model), started with the `anatomy-tui run ...
--session S` a user would type (cli/argv.py builds it from data), stopped, reaped.

Each job starts in a new process session (its own process group, no controlling terminal), with
its output going to a log file in the session, so closing the console, a dropped SSH connection
(SIGHUP) or a crash of the UI does not stop it. The console follows it through the event log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.argv import shards_flag
from engine.core.errors import UserError
from engine.core.process import job_identity_matches, pid_alive
from engine.core.settings import Settings
from engine.disk.atomic import open_unlinked, unlinked
from engine.models.options import ModelOptions
from engine.registry import BY_NAME
from sessions.job_runner import started_at
from sessions.store import Session

if TYPE_CHECKING:
    from engine.models.memory import Beside


@dataclass
class BackgroundJob:
    """A job this console started; `pid` is also its process group id. `starting` names the entry
    the console shows for it until its process writes its job file and first event (its model loads
    first), "" after (tui/lab_jobs.py `LabJobs.adopt_started`)."""

    experiment: str
    pid: int
    log_path: Path
    argv: list[str]
    process: subprocess.Popen | None = None
    starting: str = ""

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid)


def job_options(options: ModelOptions, loaded: Any | None) -> ModelOptions:
    """The console's model options with `auto` replaced by what its model resolved to (device and
    dtype), so a job loads the model the console shows, not a re-resolved one (a 2B model is
    float32 in the console but would be float16 in a job that resolved `auto` again). A model
    spread by --device-map keeps its placement flags; only its dtype is pinned."""
    if loaded is None:
        return options
    device = options.device if options.device_map is not None else loaded.device
    return replace(options, device=device, dtype=loaded.dtype_name)


def job_placement(experiment: str, settings: Settings, options: ModelOptions, loaded: Any | None,
                  free_bytes: int | None = None) -> Beside | str:
    """Whether a model job can run beside the console's loaded model: 'beside' (on the CPU, or the
    GPU holds both), another GPU with room for it ('cuda:1', when the console's cannot hold both,
    the job is not split over every GPU and the console was not pinned to its GPU with
    --device cuda:N), 'release' (the console must free its copy first: also for a model spread over
    GPUs, and when the job cannot be planned); a job that cannot fit even then is a one-line
    UserError. `free_bytes` is the GPU's free memory (read from the driver when not given)."""
    if loaded is None or not str(loaded.device).startswith("cuda"):
        return "beside"
    if loaded.device_map is not None:
        return "release"
    from engine.models.memory import check_fits, fits_beside, free_memory, model_bytes, other_gpu, plan_run

    try:  # the plan's sizes depend on the dtype, not the device: planned on "cpu", touching no GPU
        plan = plan_run(options.model, settings, "cpu", loaded.dtype_name, options.trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError, RuntimeError):
        return "release"
    plan = replace(plan, device=loaded.device)
    free = free_memory(loaded.device) if free_bytes is None else free_bytes
    held = model_bytes(loaded.model)
    placement = fits_beside(plan, held, free)
    if placement != "beside" and options.device == "cuda" and not shards_flag(experiment, settings, options):
        from engine.models.placement import Hardware

        elsewhere = other_gpu(plan, loaded.device, Hardware.read().gpus, free_memory)
        if elsewhere is not None:
            return elsewhere
    if placement == "never":
        check_fits(plan, free + held, f"the {experiment} job")  # one line: what it needs, what to change
    return placement


def resumable_job(jobs: Mapping[str, Mapping[str, Any]]) -> tuple[str, Mapping[str, Any]] | None:
    """The newest interrupted job that is the latest of its experiment (not resumed since) and
    whose experiment resumes (the registry says), or None."""
    latest: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for job_id, doc in sorted(jobs.items(), key=lambda item: started_at(item[1])):
        latest[str(doc.get("experiment"))] = (job_id, doc)
    found = [
        (job_id, doc) for name, (job_id, doc) in latest.items()
        if doc.get("status") == "interrupted" and name in BY_NAME and BY_NAME[name].resumable
    ]  # fmt: skip
    return max(found, key=lambda item: started_at(item[1]), default=None)


def launch_job(session: Session, experiment: str, argv: Sequence[str]) -> BackgroundJob:
    """Starts `argv` (from `job_argv`) detached from the console, its output to the session's logs."""
    argv = list(argv)
    logs = session.logs_dir
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    env = {**os.environ, "ANATOMY_TUI_HOME": str(session.path.parent)}
    unlinked(log_path)  # the logs folder was checked (part); the file is opened without following a link
    with open(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644), "ab") as log:
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
    """Asks the job of job file `doc` to stop, only while its pid provably still is that job (start
    time, command line and process group as recorded; never pid 1). A group leader gets the signal
    for its whole group, any other process alone. SIGINT, the console's cancel, is Ctrl-C: the job
    checkpoints and records itself cancelled; a SIGTERM from elsewhere (`kill`, a scheduler) does
    the same but records it interrupted, which the console offers to resume. A job split over
    workers records rank 0's pid: it stops, and the launcher stops the others and exits likewise."""
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


def interrupt(job: BackgroundJob) -> bool:
    """Ctrl-C (SIGINT) to the process group of a job this console launched and has not reaped (so
    its pid is still that job's): how a job is cancelled before it has written its job file, while
    its model loads."""
    if not isinstance(job.process, subprocess.Popen) or job.process.poll() is not None:
        return False
    try:
        os.killpg(job.pid, signal.SIGINT)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def last_line(path: Path) -> str:
    """The last line a job wrote to its log (why it ended before it began), "" when none."""
    try:
        with open_unlinked(path) as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            lines = log.read().decode("utf-8", "replace").strip().splitlines()
    except (OSError, UserError):
        return ""
    return lines[-1].strip() if lines else ""


def reap(jobs: list[BackgroundJob]) -> None:
    """Collects exit statuses of finished children so they do not linger as zombies."""
    for job in jobs:
        if job.process is not None:
            job.process.poll()
