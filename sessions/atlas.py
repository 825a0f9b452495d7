"""An atlas in the store: a session of its own (no model) that names the sessions of its models.

    <home>/<ATLAS>/manifest.json                 settings: the atlas's spec (models, measures, texts)
                   checkpoints/atlas/state.json  each step (model, variant, experiment): the session
                                                 that holds it and whether it was run or reused
                   checkpoints/atlas/texts/      calibration texts the atlas made (--calib-seeds)
                   results/atlas.json            the merged table, agreement, stability, bands
                   dataset/                      atlas.parquet, atlas.csv, README.md (the datasheet)
    <home>/<ATLAS>-<model>[-<variant>]/          each model's own session, as `anatomy-tui run` makes it

A measure is reused from any session of the store whose model is the same and whose result of that
experiment was made with the same settings (the run's own, less those a resume may change), so a
killed atlas, run again, continues with the first measure that no session holds yet.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.atlas.table import DEFAULT_BINS, MAIN, AtlasDocument, AtlasRow, build, rows_of, with_depth
from engine.core.errors import UserError
from engine.disk.atomic import atomic_write_json, read_text
from sessions.store import Session, SessionError, SessionExists, SessionStore

STATE = "state.json"
ATLAS_RESULT = "atlas"


def member_name(atlas: str, model: str, variant: str, taken: Mapping[str, str]) -> str:
    """The session name of one model (and calibration variant) of an atlas: the atlas's name and the
    model's last path part, made a valid session name; `taken` (slug -> model) keeps two models
    apart that end alike."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model.rstrip("/")).name or model).strip("-.").lower() or "model"
    slug = slug[:40]
    base, n = slug, 2
    while taken.get(slug, model) != model:
        slug, n = f"{base}-{n}", n + 1
    taken[slug] = model  # type: ignore[index]
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
            if session.manifest.get("model") != model:
                continue
            doc = session.load_result(result)
        except (SessionError, UserError):
            continue
        if doc is not None and doc.get("partial") is not True and same_settings(doc.get("settings"), wanted, free,
                                                                                 defaults):
            return session
    return None


@dataclass
class AtlasState:
    """What an atlas has done so far, step by step, saved after each (atomically)."""

    path: Path
    spec: dict[str, Any]
    steps: dict[str, dict[str, str]]  # "model|variant|experiment" -> {"session", "status": run or reused}

    @staticmethod
    def key(model: str, variant: str, experiment: str) -> str:
        return f"{model}|{variant}|{experiment}"

    def done(self, model: str, variant: str, experiment: str, session: str, status: str) -> None:
        self.steps[self.key(model, variant, experiment)] = {"session": session, "status": status}
        self.save()

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
        if session.manifest.get("settings", {}).get("atlas") != spec:
            raise UserError(f"atlas {name} was started with other models, measures or texts "
                            f"({json.dumps(session.manifest.get('settings', {}).get('atlas'))}); "
                            "run it with those, or choose another --name")
    path = session.checkpoint_dir(ATLAS_RESULT) / STATE
    steps: dict[str, dict[str, str]] = {}
    if path.is_file():
        try:
            doc = json.loads(read_text(path))  # never through a link (engine.disk.atomic.unlinked)
            if isinstance(doc, dict) and isinstance(doc.get("steps"), dict):
                steps = {str(k): {"session": str(v.get("session", "")), "status": str(v.get("status", ""))}
                         for k, v in doc["steps"].items() if isinstance(v, dict)}
        except (OSError, ValueError, UserError):
            steps = {}  # a damaged state file: every step is found again in the sessions
    return session, AtlasState(path, spec, steps)


PER_LAYER_RESULTS = ("ablation", "prune", "dynamics", "recovery")  # the results whose values are per layer


def saved_atlas(store: SessionStore, name: str) -> AtlasDocument:
    """The atlas document an atlas session holds (results/atlas.json)."""
    doc = store.open(name).load_result(ATLAS_RESULT)
    if doc is None:
        raise UserError(f"session {name} holds no atlas (results/atlas.json); run `anatomy-tui atlas` first")
    return AtlasDocument.from_json(doc)


def compare_sessions(store: SessionStore, names: Sequence[str], n_bins: int = DEFAULT_BINS) -> AtlasDocument:
    """Sessions side by side as an atlas of their own: each one a model (its name where two hold the
    same model), with every per-layer result it has."""
    if len(names) < 2:
        raise UserError("compare needs two or more sessions (or --atlas NAME)")
    if n_bins < 1:
        raise UserError("--bins must be at least 1")
    opened = [store.open(name) for name in names]
    models = [str(s.manifest.get("model", "")) or s.name for s in opened]
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


def console_comparison(store: SessionStore, current: str, most: int = 6) -> AtlasDocument:
    """What the console's Compare view shows for session `current`: its atlas, when it is an atlas
    session; else it beside the newest other sessions with per-layer results (`most` in all)."""
    session = store.open(current)
    if session.load_result(ATLAS_RESULT) is not None:
        return saved_atlas(store, current)
    others = [info.name for info in store.list()
              if info.openable and info.name != current and set(info.results) & set(PER_LAYER_RESULTS)]
    if not set(session.result_names()) & set(PER_LAYER_RESULTS):
        raise UserError(f"session {current} has no per-layer result yet; compute the layer map (a) first")
    if not others:
        raise UserError("no other session with per-layer results to compare with; run `anatomy-tui atlas` or "
                        "`anatomy-tui run ablation --session NAME` on another model")
    return compare_sessions(store, [current, *others[: most - 1]])
