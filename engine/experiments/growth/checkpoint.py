"""Checkpoints of a growth run in progress: tensors in safetensors, everything else in JSON.

The tensor file gets a new name each time (`state-<tag>.safetensors`) and is written atomically
before `state.json`, which names it; a kill at any moment therefore leaves a JSON that points at a
complete tensor file. Older tensor files are deleted only after the JSON is replaced.
Optimizer state: each AdamW moment and step counter is a tensor `opt.<index>.<key>`, the parameter
groups (lr, betas, ...) go to JSON, and so does float16's GradScaler state (the loss scale and its
growth counter, a few numbers); the torch RNG state is the uint8 tensor `rng.torch`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save_file

from engine.core.errors import UserError
from engine.disk.atomic import atomic_write, atomic_write_json, read_bytes, read_json

STATE_FILE = "state.json"
FORMAT = 1


def optimizer_tensors(
    optimizer: torch.optim.Optimizer,
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    doc = optimizer.state_dict()
    tensors = {
        f"opt.{index}.{key}": value.detach().clone().contiguous()
        for index, state in doc["state"].items()
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    }
    return tensors, doc["param_groups"]


def restore_optimizer(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list[dict[str, Any]]
) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("opt."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(folder: Path, tag: str, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    """Writes the tensors, then the JSON that names them, then removes stale tensor files."""
    folder = Path(folder)
    name = f"state-{tag}.safetensors"
    if tensors:
        flat = {k: v.contiguous() for k, v in tensors.items()}
        atomic_write(folder / name, lambda tmp: save_file(flat, str(tmp)))
    atomic_write_json(folder / STATE_FILE, {**state, "format": FORMAT, "tensors": name if tensors else None})
    for old in folder.glob("state-*.safetensors"):
        if old.name != name:
            old.unlink(missing_ok=True)


def load_checkpoint(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """(state, tensors) of the last checkpoint in `folder`, or None when there is none."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        return None
    from safetensors import SafetensorError

    try:  # never through a link (engine.disk.atomic.unlinked), never a file outside the folder
        state = read_json(path)
        name = state.get("tensors")
        if name is not None and not (isinstance(name, str) and name == Path(name).name
                                     and name.startswith("state-") and name.endswith(".safetensors")):
            raise ValueError(f"its tensors {name!r} are not a state-*.safetensors file beside it")
        tensors = load(read_bytes(Path(folder) / name)) if name else {}
    except (OSError, ValueError, AttributeError, SafetensorError) as exc:
        raise UserError(f"the growth checkpoint in {folder} is damaged ({' '.join(str(exc).split())[:120]}); "
                        "run without --resume to start over") from None
    return state, tensors
