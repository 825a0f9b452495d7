"""An atlas in the store: a session of its own (no model) that names the sessions of its models.

    <home>/<ATLAS>/manifest.json                 settings: the atlas's spec (models, measures, texts)
                   events.jsonl                  each change of a measure's state (job.state), in order
                   checkpoints/atlas/state.json  each step (model, variant, experiment): the session
                                                 that holds it and whether it was run or reused
                   checkpoints/atlas/texts/      calibration texts the atlas made (--calib-seeds)
                   results/atlas.json            the merged table, agreement, stability, bands
                   dataset/                      atlas.parquet, atlas.csv, README.md (the datasheet)
    <home>/<ATLAS>-<model>[-<variant>]/          each model's own session, as `anatomy-tui run` makes it

A measure is reused from any session of the store whose model is the same and whose result of that
experiment was made with the same settings (the run's own, less those a resume may change), so a
killed atlas, run again, continues with the first measure that no session holds yet.

`AtlasWatch` reads an atlas's measures' states back (engine/atlas/tasks.py folds them): the atlas's
log, and the log of each session a measure under way runs into, each from where it was read last.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.atlas.table import DEFAULT_BINS, MAIN, AtlasDocument, AtlasRow, build, rows_of, with_depth
from engine.atlas.tasks import AtlasTasks, TaskRow, task_key
from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import TaskState
from engine.disk.atomic import atomic_write_json, read_json
from sessions.documents import ATLAS_RESULT
from sessions.store import Session, SessionError, SessionExists, SessionStore

STATE = "state.json"


def member_name(atlas: str, model: str, variant: str, taken: MutableMapping[str, str]) -> str:
    """The session name of one model (and calibration variant) of an atlas: the atlas's name and the
    model's last path part, made a valid session name; `taken` (slug -> model) keeps two models
    apart that end alike."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model.rstrip("/")).name or model).strip("-.").lower() or "model"
    slug = slug[:40]
    base, n = slug, 2
    while taken.get(slug, model) != model:
        slug, n = f"{base}-{n}", n + 1
    taken[slug] = model
    name = f"{atlas}-{slug}" + ("" if variant == "main" else f"-{variant}")
    return name[:100]


def same_settings(found: Any, wanted: Mapping[str, Any], free: set[str], defaults: Mapping[str, Any]) -> bool:
    """Whether a result's recorded settings are the wanted ones, less the resume-free fields. A
    setting the result does not record was added since it was written, and it ran as that setting's
    default does (a new setting's default keeps the old behaviour: `--part layer`)."""
    if not isinstance(found, dict):
        return False
    return all(found.get(key, defaults.get(key)) == value for key, value in wanted.items() if key not in free)


def reusable(store: SessionStore, model: str, result: str, wanted: Mapping[str, Any], free: set[str],
             first: str, defaults: Mapping[str, Any]) -> Session | None:
    """A session holding `result` of `model` made with the wanted settings, whole (not the partial
    result of a stopped run): the session `first` (the atlas's own for this model) when it does,
    else any other of the store, newest first."""
    names = [first] + [info.name for info in store.list() if info.openable and info.name != first]
    for name in names:
        try:
            if not store.exists(name):
                continue
            session = store.open(name)
            if session.header.model != model:
                continue
            found = session.result(result)  # the one reader: a result this version cannot read is not reused
        except (SessionError, UserError):
            continue
        if found is not None and getattr(found, "partial", False) is not True and same_settings(
                json_safe(getattr(found, "settings", None)), wanted, free, defaults):
            return session
    return None


JOB_CHECK_SECONDS = 5.0  # how often a watch reads the job files of the measures under way
STATE_OF_STATUS = {"run": "done", "reused": "reused", "failed": "failed", "interrupted": "interrupted"}


@dataclass
class AtlasState:
    """What an atlas has done so far, step by step, saved after each (atomically); each change of a
    step's state, finished or not, is also an event of the atlas session's log (`log`)."""

    path: Path
    spec: dict[str, Any]
    steps: dict[str, dict[str, str]]  # "model|variant|experiment" -> {"session", "status": run or reused}
    log: Session | None = None

    key = staticmethod(task_key)

    def done(self, model: str, variant: str, experiment: str, session: str, status: str) -> None:
        self.steps[self.key(model, variant, experiment)] = {"session": session, "status": status}
        self.save()
        self.mark(model, variant, experiment, STATE_OF_STATUS[status], session,
                  f"from session {session}" if status == "reused" else "")

    def mark(self, model: str, variant: str, experiment: str, state: str, session: str = "", detail: str = "",
             since: int = 0) -> None:
        """A step's state now (engine/atlas/tasks.py STATES), into the atlas's log."""
        if self.log is not None:
            self.log.append_event(TaskState(state, detail, self.key(model, variant, experiment), session, since))

    def save(self) -> None:
        atomic_write_json(self.path, {"spec": self.spec, "steps": self.steps}, "atlas state")


def open_atlas(store: SessionStore, name: str, spec: dict[str, Any],
               say: Callable[[str], None] = lambda text: None) -> tuple[Session, AtlasState]:
    """The atlas session `name` with its state: created with `spec`, or, when it exists, checked to
    have been started with the same spec (a different one is a one-line error). Of two atlases that
    create it at once the first makes it (whole, store.create) and the second joins it, as two runs
    of one session do; `say` tells that one so."""
    session = None
    if not store.exists(name):
        try:
            session = store.create(name, model="", settings={"atlas": spec})
        except SessionExists:
            if not store.exists(name):
                raise
            say(f"atlas {name} was just made by another atlas command; this one adds to it")
    if session is None:
        session = store.open(name)
        if session.header.settings.get("atlas") != spec:
            raise UserError(f"atlas {name} was started with other models, measures or texts "
                            f"({json.dumps(session.header.settings.get('atlas'))}); "
                            "run it with those, or choose another --name")
    path = session.checkpoint_dir(ATLAS_RESULT) / STATE
    return session, AtlasState(path, spec, saved_steps(path), session)


def saved_steps(path: Path) -> dict[str, dict[str, str]]:
    """The steps of an atlas's state file; none when it is missing or damaged (every step is then
    found again in the sessions)."""
    if not path.is_file():
        return {}
    try:
        doc = read_json(path)  # never through a link, never too large or deep (engine.disk.atomic)
    except (OSError, ValueError, UserError):
        return {}
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), dict):
        return {}
    return {str(k): {"session": str(v.get("session", "")), "status": str(v.get("status", ""))}
            for k, v in doc["steps"].items() if isinstance(v, dict)}


class AtlasWatch:
    """An atlas's measures and their states, read again by each `tasks()` from where the last read
    stopped (the atlas's log, the logs of the sessions its measures under way run into), and its
    table once it is saved (`result()`). An atlas made before its log held the states shows the
    finished steps of its state file. Nothing read is trusted: what does not fit is skipped."""

    def __init__(self, store: SessionStore, name: str) -> None:
        self.store, self.name = store, name
        self.fold = AtlasTasks()
        self.offset = 0
        self.read_once = False
        self.next_check = 0.0  # when the job files of the measures under way are read next (monotonic)
        self.opened: dict[str, Session] = {}  # each session once: a read of a few lines opens no manifest

    def tasks(self) -> list[TaskRow]:
        if self.name not in self.opened:  # the atlas's own session: what stops it opening is the caller's to say
            self.opened[self.name] = self.store.open(self.name)
        atlas = self.opened[self.name]
        docs, self.offset = atlas.read_event_docs(self.offset)
        for doc in docs:
            self.fold.atlas(doc)
        if not self.read_once and not self.fold.tasks:  # an older atlas: its state file's finished steps
            for key, step in saved_steps(atlas.checkpoint_dir(ATLAS_RESULT) / STATE).items():
                self.fold.atlas({"kind": TaskState.kind, "task": key, "session": step["session"],
                                 "state": STATE_OF_STATUS.get(step["status"], "")})
        self.read_once = True
        for key, member, offset in self.fold.following():
            session = self._member(member)
            if session is None:  # not made yet, not a session name, or damaged: its state as the atlas said
                continue
            docs, end = session.read_event_docs(offset)
            for doc in docs:
                self.fold.member(key, doc)
            self.fold.read_to(key, end)
        if time.monotonic() >= self.next_check:
            self.next_check = time.monotonic() + JOB_CHECK_SECONDS
            self._check_jobs()
        return self.fold.rows()

    def _check_jobs(self) -> None:
        """A measure whose job's process is gone with no end in its log (the atlas killed -9) reads
        interrupted: its job file says so (Session.jobs)."""
        for key, member, job in self.fold.jobs_under_way():
            session = self._member(member)
            record = session.job_records().get(job) if session is not None else None
            if record is not None and record.status == "interrupted":
                self.fold.gone(key)

    def _member(self, name: str) -> Session | None:
        """Session `name`, opened at its first read (None while it does not exist, or when it cannot
        be opened)."""
        if name not in self.opened:
            try:
                if not self.store.exists(name):
                    return None
                self.opened[name] = self.store.open(name)
            except (SessionError, UserError):
                return None
        return self.opened[name]

    def result(self) -> AtlasDocument | None:
        """The atlas's table once it is saved (results/atlas.json), None before; a damaged one is a
        one-line UserError or SessionError."""
        return _atlas_of(self.store.open(self.name))


def atlas_tasks(store: SessionStore, name: str) -> list[TaskRow]:
    """Every measure of atlas `name` with its state now (one read from the start of the logs)."""
    return AtlasWatch(store, name).tasks()


PER_LAYER_RESULTS = ("ablation", "prune", "dynamics", "recovery")  # the results whose values are per layer


def saved_atlas(store: SessionStore, name: str) -> AtlasDocument:
    """The atlas document an atlas session holds (results/atlas.json)."""
    found = _atlas_of(store.open(name))
    if found is None:
        raise UserError(f"session {name} holds no atlas (results/atlas.json); run `anatomy-tui atlas` first")
    return found


def _atlas_of(session: Session) -> AtlasDocument | None:
    """results/atlas.json read by the one reader (sessions/documents.py); a damaged one is a
    one-line SessionError naming the file and the field."""
    found = session.result(ATLAS_RESULT)
    if found is not None and not isinstance(found, AtlasDocument):
        raise SessionError(f"session {session.name}: results/{ATLAS_RESULT}.json is not an atlas's table")
    return found


def compare_sessions(store: SessionStore, names: Sequence[str], n_bins: int = DEFAULT_BINS) -> AtlasDocument:
    """Sessions side by side as an atlas of their own: each one a model (its name where two hold the
    same model), with every per-layer result it has."""
    if len(names) < 2:
        raise UserError("compare needs two or more sessions (or --atlas NAME)")
    if n_bins < 1:
        raise UserError("--bins must be at least 1")
    opened = [store.open(name) for name in names]
    models = [s.header.model or s.name for s in opened]
    labels = [m if models.count(m) == 1 else f"{m} ({s.name})" for m, s in zip(models, opened, strict=True)]
    rows: list[AtlasRow] = []
    sessions: dict[str, dict[str, dict[str, str]]] = {}
    for label, session in zip(labels, opened, strict=True):
        results = {name: doc for name in PER_LAYER_RESULTS if (doc := session.load_result(name)) is not None}
        found = rows_of(label, MAIN, session.name, results)
        if not found:
            raise UserError(f"session {session.name} has no per-layer result ({', '.join(PER_LAYER_RESULTS)})")
        rows += with_depth(found, max(row.n_layers for row in found))
        sessions[label] = {MAIN: {name: session.name for name in results}}
    return build("compare", labels, [], sessions, {MAIN: {}}, rows, n_bins)


def console_comparison(store: SessionStore, current: str, most: int = 6) -> AtlasDocument | AtlasWatch:
    """What the console's Compare view shows for session `current`: when it is an atlas session, its
    watch (its measures' states as they change, its table once saved), even before its first result;
    else it beside the newest other sessions with per-layer results (`most` in all)."""
    session = store.open(current)
    if session.is_atlas:
        return AtlasWatch(store, current)
    others = [info.name for info in store.list()
              if info.openable and info.name != current and set(info.results) & set(PER_LAYER_RESULTS)]
    if not set(session.result_names()) & set(PER_LAYER_RESULTS):
        raise UserError(f"session {current} has no per-layer result yet; compute the layer map (a) first")
    if not others:
        raise UserError("no other session with per-layer results to compare with; run `anatomy-tui atlas` or "
                        "`anatomy-tui run ablation --session NAME` on another model")
    return compare_sessions(store, [current, *others[: most - 1]])
