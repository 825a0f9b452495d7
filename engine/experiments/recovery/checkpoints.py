"""What a recovery sweep keeps on disk: its checkpoint, written after every finished layer (for
--resume), and each recovered layer's weights (for the console's prompt pane)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from engine.core.errors import UserError
from engine.core.events import Event
from engine.disk.session_layout import (
    LAYER_WEIGHTS,  # each recovered layer, for the prompt pane (sessions/layer_weights.py)
)
from engine.experiments.recovery.sweep import KeepWeights
from engine.experiments.recovery.vocabulary import RecoveryLayer
from engine.experiments.sweep_checkpoint import write_checkpoint


def checkpointed(events: Iterator[Event], path: Path, state: dict[str, Any]) -> Iterator[Event]:
    """Passes events through; each finished layer is added to the checkpoint at once."""
    write_checkpoint(path, state)
    for event in events:
        if isinstance(event, RecoveryLayer):
            state["layers"][str(event.layer)] = event.result
            write_checkpoint(path, state)
        yield event


def save_layer_weights(folder: Path, index: int, tensors: dict[str, torch.Tensor], model: str) -> Path:
    """One recovered layer as safetensors (written atomically), tagged with the model's name."""
    from safetensors.torch import save_file

    from engine.disk.atomic import atomic_write

    if Path(folder).is_symlink():  # a session folder from elsewhere must not lead writes outside it
        raise UserError(f"{folder} is a symbolic link; recovered layers are not written through it")
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / f"layer-{index}.safetensors"
    contiguous = {name: tensor.contiguous() for name, tensor in tensors.items()}
    atomic_write(path, lambda tmp: save_file(contiguous, str(tmp), metadata={"model": model}))
    return path


def weights_keeper(folder: Path, model_name: str) -> KeepWeights:
    """Saves each recovered layer under the checkpoint folder (the console's prompt pane reads them)."""

    def keep(index: int, tensors: dict[str, torch.Tensor]) -> None:
        save_layer_weights(Path(folder) / LAYER_WEIGHTS, index, tensors, model_name)

    return keep
