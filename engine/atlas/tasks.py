"""An atlas's measures as tasks, each in one state, folded from event documents as they are read.

The atlas's own log holds a `job.state` event (engine/core/events.py TaskState) for each change of a
measure it sees: waiting (each measure of the spec when the atlas starts), running or queued (when it
starts it, with the session it runs into and the byte of that session's log from which its job
follows), done, reused, failed, interrupted. While a measure is under way, the session it runs into
says more: its job's start, progress, its task's states on a cluster (queued, placed, retried) and
its end. Pure: documents in, rows out, no store; a document that does not fit is skipped (nothing
in a session folder is trusted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.events import Finished, Progress, Started, TaskState

STATES = ("waiting", "queued", "placed", "running", "retried", "done", "reused", "failed", "interrupted")
UNDER_WAY = ("queued", "placed", "running", "retried")  # the atlas started the measure: its session says more
ENDS = {"done": "done", "failed": "failed", "interrupted": "interrupted", "cancelled": "interrupted"}
DETAIL_CHARS = 200  # a detail longer than this is cut (a forged line of a megabyte stays one line)


def task_key(model: str, variant: str, experiment: str) -> str:
    """A measure's name in `TaskState.task` (and in the atlas's state file)."""
    return f"{model}|{variant}|{experiment}"


@dataclass(frozen=True)
class TaskRow:
    """One measure of an atlas as the Compare view lists it: its state, a detail (where it runs, its
    progress, why it failed, the session it was reused from) and the session it runs into."""

    model: str
    variant: str
    experiment: str
    state: str
    detail: str = ""
    session: str = ""


@dataclass
class _Task:
    model: str
    variant: str
    experiment: str
    state: str = "waiting"
    detail: str = ""
    session: str = ""
    followed: bool = False  # under way by the atlas's word: its session's log is read from `offset`
    offset: int = 0
    job: str = ""  # its job in that session, once started
    tries: int = 1


class AtlasTasks:
    """The fold: `atlas(doc)` for each document of the atlas's log, `member(key, doc)` for each of
    the log of the session a measure under way runs into (`following()` says which, from which
    byte; `read_to` records how far it was read), `rows()` the table now."""

    def __init__(self) -> None:
        self.tasks: dict[str, _Task] = {}

    def atlas(self, doc: Mapping[str, Any]) -> None:
        if doc.get("kind") != TaskState.kind:
            return
        key, state = doc.get("task"), doc.get("state")
        if not isinstance(key, str) or state not in STATES:
            return
        parts = key.rsplit("|", 2)
        if len(parts) != 3 or not all(parts):
            return
        model, variant, experiment = parts
        task = self.tasks.setdefault(key, _Task(model, variant, experiment))
        task.state, task.detail, task.session = str(state), _text(doc.get("detail")), _text(doc.get("session"))
        task.followed = state in UNDER_WAY and bool(task.session)
        since = doc.get("since")
        task.offset = since if isinstance(since, int) and not isinstance(since, bool) and since > 0 else 0
        task.job, task.tries = "", 1

    def following(self) -> list[tuple[str, str, int]]:
        """(key, session, byte to read its log from) of each measure under way."""
        return [(key, task.session, task.offset) for key, task in self.tasks.items() if task.followed]

    def read_to(self, key: str, offset: int) -> None:
        if key in self.tasks:
            self.tasks[key].offset = offset

    def member(self, key: str, doc: Mapping[str, Any]) -> None:
        task = self.tasks.get(key)
        if task is None or not task.followed:
            return
        kind, job = doc.get("kind"), doc.get("job")
        if kind == Started.kind:
            if doc.get("experiment") == task.experiment and isinstance(job, str) and job:
                task.job, task.state, task.detail = job, "running", "started"
            return
        if not task.job or job != task.job:
            return  # another measure's job in the same session, or what came before this one's
        if kind == TaskState.kind and not doc.get("task") and doc.get("state") in UNDER_WAY + ("done",):
            task.state, task.detail = str(doc["state"]), _text(doc.get("detail"))
            task.tries += task.state == "retried"
        elif kind == Progress.kind:
            done, total = doc.get("done"), doc.get("total")
            if _count(done) and _count(total):
                label = _text(doc.get("label")) or _text(doc.get("phase"))
                task.state, task.detail = "running", f"{label} {done}/{total}".strip() if total else label
        elif kind == Finished.kind and doc.get("status") in ENDS:
            task.state, task.detail = ENDS[doc["status"]], _text(doc.get("error"))

    def jobs_under_way(self) -> list[tuple[str, str, str]]:
        """(key, session, job) of each measure under way whose job has started and not ended."""
        return [(key, task.session, task.job) for key, task in self.tasks.items()
                if task.followed and task.job and task.state in UNDER_WAY]

    def gone(self, key: str) -> None:
        """The process of the measure's job is gone without a word of its end (a driver killed -9)."""
        if key in self.tasks:
            self.tasks[key].state, self.tasks[key].detail = "interrupted", "its process is gone"

    def rows(self) -> list[TaskRow]:
        return [TaskRow(t.model, t.variant, t.experiment, t.state,
                        f"{t.detail} (try {t.tries})".strip() if t.tries > 1 and t.state != "retried" else t.detail,
                        t.session) for t in self.tasks.values()]


def counts(rows: list[TaskRow]) -> dict[str, int]:
    """How many measures are in each state, in the order of STATES, those with none left out."""
    return {state: n for state in STATES if (n := sum(row.state == state for row in rows))}


def _text(value: Any) -> str:
    """A string of a document as one short line ('' for anything else)."""
    if not isinstance(value, str):
        return ""
    line = " ".join(value.split())
    return line if len(line) <= DETAIL_CHARS else line[: DETAIL_CHARS - 1] + "…"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
