"""A job's process: proof that a pid still is the job a job file describes, before anything
signals it, and how a run stops on a signal.

A job file is only text: its pid may be 1 (`kill(-1)` would reach every process the user owns),
a number the kernel has since given to another program, or a hostile value. A job records, from
inside its own process, its process group, its start time (/proc/<pid>/stat field 22, clock
ticks since boot) and its command line; a pid is signalled only while all three still match.

SIGTERM (`kill`, a scheduler, `docker stop`, the end of a Kaggle session) and SIGHUP (a closed
terminal) stop a run the way Ctrl-C does: `stop_on_signals` turns them into `Stopped`, a
KeyboardInterrupt, so every path that checkpoints and records a cancelled job on Ctrl-C does so
on them too; the run then exits 128 + the signal's number (143, 129), as a shell expects.

Every process this project starts to run its own code (a console job, the served console's
console, the workers of --shards) runs it through `python_argv`: never `python -m` in the user's
folder, where a `tui/` or `engine/` lying there would be imported in place of this project's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeGuard

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding engine/, tui/, sessions/
PID_LIMIT = 2**31 - 1  # the largest value a pid_t holds; os.kill overflows beyond it


def valid_pid(pid: Any) -> TypeGuard[int]:
    """A real int in the range a pid_t holds (bool is not a pid)."""
    return isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= PID_LIMIT


def pid_alive(pid: Any) -> bool:
    """The process exists and is not a zombie (a pid we may not signal still counts as alive)."""
    if not valid_pid(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child counts as gone
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
        return int(text.rsplit(")", 1)[1].split()[19])  # field 22; the name in (...) may hold spaces
    except (OSError, IndexError, ValueError):
        return None


def command_line(pid: int) -> list[str] | None:
    """The process's argv as the kernel holds it, or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return [part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0")[:-1]] if raw else None


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """What a job records about its own process (pid, pgid, start_time, cmdline) to be found later."""
    pid = os.getpid() if pid is None else pid
    try:
        pgid: int | None = os.getpgid(pid)
    except OSError:
        pgid = None
    return {"pid": pid, "pgid": pgid, "start_time": start_time(pid), "cmdline": command_line(pid)}


def identity_problem(doc: dict[str, Any]) -> str:
    """Why the pid in job file `doc` cannot be proven to be that job ("" when it can)."""
    pid = doc.get("pid")
    if not valid_pid(pid) or pid <= 1:
        return f"pid {pid!r} is not a job's process"
    recorded = (doc.get("pgid"), doc.get("start_time"), doc.get("cmdline"))
    if any(value is None for value in recorded):
        return "the job file does not record its process group, start time and command line"
    current = process_identity(pid)
    if current["start_time"] is None:
        return f"process {pid} is gone"
    if (current["pgid"], current["start_time"], current["cmdline"]) != recorded:
        return f"process {pid} is no longer this job (another program has its pid)"
    return ""


def job_identity_matches(doc: dict[str, Any]) -> bool:
    """True only while the job file's pid provably is the job that wrote it."""
    return identity_problem(doc) == ""


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOP_EXIT_CODES = frozenset(128 + sig for sig in (signal.SIGINT, *STOP_SIGNALS))  # 130, 143, 129


class Stopped(KeyboardInterrupt):
    """The run was stopped by `signum` (SIGTERM, SIGHUP; Ctrl-C's SIGINT stays KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def stop_signal(exc: BaseException) -> int:
    """The signal an interruption stands for: SIGINT for Ctrl-C's KeyboardInterrupt, 0 for anything else."""
    if isinstance(exc, Stopped):
        return exc.signum
    return int(signal.SIGINT) if isinstance(exc, KeyboardInterrupt) else 0


def interruption(signum: int) -> KeyboardInterrupt:
    """The exception `stop_signal` reads back as `signum` (a worker's stop, raised again on rank 0)."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


def exit_code(exc: KeyboardInterrupt) -> int:
    """What a run stopped by `exc` exits with: 128 + the signal's number (130 for Ctrl-C)."""
    return 128 + stop_signal(exc)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Stopped` in the main thread for as long as this lasts. Only the
    first does: a second signal (a launcher passing on the one its group already got, `docker stop`
    repeating itself) is let go, so the checkpoint and the finish event it interrupts are written
    whole (SIGKILL still ends a run that will not stop).

    SIGINT (Ctrl-C, and the console's cancel) raises KeyboardInterrupt meanwhile even in a process
    started with it ignored or blocked, as a shell script's background job is, or a child forked
    while its parent's thread held it blocked: such a run would otherwise go on to its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopped = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def hand_to_launcher(line: str) -> bool:
    """A worker of torch's launcher other than rank 0 leaves its one-line error in the reply file
    the launcher reads back (TORCHELASTIC_ERROR_FILE) instead of printing it, so an error every
    worker finds is said once: by rank 0, or by the launcher naming the worker when rank 0 did not
    fail with it (engine/models/distributed.py launch). True when handed over."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.environ.get("RANK", "0") == "0":
        return False
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"message": line, "timestamp": int(time.time())}, handle)
    except OSError:
        return False
    return True


def say(line: str) -> None:
    """One line on stderr in one write: the processes that share it (the workers of --shards and
    their launcher) never cut into each other's lines, even unbuffered (python -u, PYTHONUNBUFFERED=1,
    where print writes the text and its newline apart)."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def python_argv(module: str, *options: str) -> list[str]:
    """The argv that runs this project's `module` as `python [OPTIONS] -m MODULE` would, its
    arguments to follow, but with the project's root first on sys.path and the current folder
    nowhere on it: Python's own `-P` (3.11+) only drops the folder, and `-I` would also drop
    PYTHONPATH and the user's site-packages, so the first statement of a `-c` program does both
    (sys.path[0] is the folder there, written ''). The module runs as `__main__`, sys.argv[0] its
    file, as under -m; the argv is 3 + len(options) items before the module's own arguments."""
    program = (f"import runpy, sys; sys.path[:] = [{str(PROJECT_ROOT)!r}, *(p for p in sys.path if p)]; "
               f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, *options, "-c", program]
