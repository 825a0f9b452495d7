"""Layer weights kept in a session, e.g. each layer a recovery sweep fine-tuned (the engine writes
them into its checkpoint folder: engine.experiments.recovery.save_layer_weights), read back so the
console's prompt pane can generate with the recovered model later."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.disk.session_layout import CHECKPOINTS, LAYER_WEIGHTS
from engine.experiments.session_models import LAYER_FILE, layer_weights
from sessions.store import Session, SessionError


def _folder(session: Session, job: str) -> Path:
    return session.part(CHECKPOINTS, job, LAYER_WEIGHTS)  # part() refuses a linked folder on the way


def saved_layers(session: Session, job: str) -> list[int]:
    try:
        folder = _folder(session, job)
    except SessionError:  # a linked folder: its layers are not offered
        return []
    names = (LAYER_FILE.match(path.name) for path in folder.glob("layer-*.safetensors")) if folder.exists() else ()
    return sorted(int(match.group(1)) for match in names if match)


def load_layers(session: Session, job: str, model: str) -> dict[int, dict[str, Any]]:
    """Every saved layer of `job` made for `model` (files for another model are ignored)."""
    try:
        folder = _folder(session, job)
    except SessionError:
        return {}
    return layer_weights(folder, model)
