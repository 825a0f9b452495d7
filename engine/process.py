"""Proof that a pid still is the job a job file describes, before anything signals it.

A job file is only text: its pid may be 1 (`kill(-1)` would reach every process the user owns),
a number the kernel has since given to another program, or a hostile value. A job records, from
inside its own process, its process group, its start time (/proc/<pid>/stat field 22, clock
ticks since boot) and its command line; a pid is signalled only while all three still match.
"""

from __future__ import annotations

import os
from typing import Any

PID_LIMIT = 2**31 - 1  # the largest value a pid_t holds; os.kill overflows beyond it


def valid_pid(pid: Any) -> bool:
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
