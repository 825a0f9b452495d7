"""A sweep's checkpoint: the finished units of a sweep over layers (recovery's layers, the ablation
map's layers and blocks) in `<the experiment's checkpoint folder>/layers.json`, with the key their
numbers depend on, so a --resume run skips them and never mixes them with another model, precision,
device or settings:

    {"key": {"model": ..., "dtype": ..., "device": ..., "settings": {...}}, "layers": {unit: row}}

Written atomically after each unit; read back as untrusted JSON (never through a link)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import Event, Message
from engine.core.settings import Settings
from engine.disk.atomic import atomic_write_json, read_json

CHECKPOINT_FILE = "layers.json"


def sweep_key(settings: Settings, loaded: Any) -> dict[str, Any]:
    """What a finished unit's numbers depend on: the settings that are not free to change on
    resume, and the model with its precision and device (a float16 sweep never continues a float32
    one)."""
    return {"model": loaded.name, "dtype": loaded.dtype_name, "device": loaded.device,
            "settings": settings.resume_key()}  # fmt: skip


def load_finished(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint of an earlier sweep, checked against `key`; None when there is none (a sweep
    killed before its first checkpoint resumes from the start)."""
    if not path.exists():
        return None
    try:
        state: dict[str, Any] = read_json(path)  # never through a link, never too large or deep (engine.disk.atomic)
        saved, layers = state["key"], state["layers"]
        if not isinstance(saved, dict) or not isinstance(layers, dict):
            raise ValueError("not a sweep checkpoint")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path} is damaged ({exc}); run without --resume to start over") from exc
    for name in ("model", "dtype", "device"):
        if saved.get(name) != key[name]:
            raise UserError(f"the saved sweep used {name} {saved.get(name)}, not {key[name]}; "
                            f"resume with --{name} {saved.get(name)} or run without --resume")
    wanted, had = key["settings"], saved.get("settings") or {}
    changed = [name for name in wanted if had.get(name) != wanted[name]]
    if changed:
        name = changed[0]
        raise UserError(f"the saved sweep used {name}={had.get(name)!r}, not {wanted[name]!r}; "
                        "resume with the same settings or run without --resume")
    return state


def resumed(settings: Settings, loaded: Any, folder: Path | None, resume: bool) -> tuple[dict[str, Any], list[Event]]:
    """The checkpoint state a sweep starts from: with `resume` and a folder, the finished units of
    the earlier sweep there (checked against this sweep's key), else none; and the note to log when
    there was none to resume."""
    state: dict[str, Any] = {"key": sweep_key(settings, loaded), "layers": {}}
    if folder is None or not resume:
        return state, []
    found = load_finished(Path(folder) / CHECKPOINT_FILE, state["key"])
    if found is None:
        return state, [Message("no finished layer to resume from: the sweep starts from its first layer")]
    return found, []


def write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """The sweep's state, written atomically (a reader sees the old file or the new one)."""
    atomic_write_json(path, json_safe(state))
