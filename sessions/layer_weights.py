"""Layer weights kept in a session, e.g. each layer a recovery sweep fine-tuned (the engine writes
them into its checkpoint folder: engine.experiments.recovery.save_layer_weights), read back so the
console's prompt pane can generate with the recovered model later."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.session_layout import CHECKPOINTS, LAYER_WEIGHTS
from sessions.store import Session, SessionError

_FILE = re.compile(r"^layer-(\d+)\.safetensors$")


def _folder(session: Session, job: str) -> Path:
    return session.part(CHECKPOINTS, job, LAYER_WEIGHTS)  # part() refuses a linked folder on the way


def saved_layers(session: Session, job: str) -> list[int]:
    try:
        folder = _folder(session, job)
    except SessionError:  # a linked folder: its layers are not offered
        return []
    names = (_FILE.match(path.name) for path in folder.glob("layer-*.safetensors")) if folder.exists() else ()
    return sorted(int(match.group(1)) for match in names if match)


def load_layers(session: Session, job: str, model: str) -> dict[int, dict[str, Any]]:
    """Every saved layer of `job` made for `model` (files for another model are ignored)."""
    from safetensors import SafetensorError, safe_open

    try:
        folder = _folder(session, job)
    except SessionError:
        return {}
    found: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.glob("layer-*.safetensors")) if folder.exists() else []:
        match = _FILE.match(path.name)
        if match is None:
            continue
        try:
            with safe_open(str(path), framework="pt") as handle:
                if (handle.metadata() or {}).get("model") != model:
                    continue
                found[int(match.group(1))] = {name: handle.get_tensor(name) for name in handle.keys()}
        except (OSError, ValueError, SafetensorError):
            continue  # a damaged file: that layer is simply not offered
    return found
