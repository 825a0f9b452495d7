"""What a session's results and folders say about the models it has made, read without any
experiment's code (so the experiments, the prompt pane's variants and the store can all use it):
the layers a prune run cut, the folders a growth run saved its models in, the layers a recovery
run fine-tuned."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.disk.atomic import inside, unlinked

if TYPE_CHECKING:  # read, never built: a reader of this module needs no experiment's vocabulary
    from engine.experiments.growth.vocabulary import GrowthResult
    from engine.experiments.prune.vocabulary import PruneResult

SAVED_ARMS = {"growth": "growth_100", "uniform": "uniform_100"}  # variant -> the growth run's arm


def pruned_layers(result: PruneResult | None) -> tuple[int, ...]:
    """The layers the session's prune run removed at its exported point (else its ppl criterion's
    deepest cut): what the `pruned` variant drops. () when there is no prune result (or one this
    version cannot read: `decode_or_none` made it None), or when its cuts are of blocks (`--unit
    block`: not a set of layers; prune's own --evaluate-tasks scores them)."""
    if result is None:
        return ()
    exported = result.exported_point if result.exported_point and not result.exported_point.blocks else None
    point = exported or max((cut for cut in result.curve if cut.method == "ppl" and not cut.blocks),
                            key=lambda cut: cut.removed, default=None)
    return tuple(int(layer) for layer in point.layers) if point is not None else ()


def saved_model_path(result: GrowthResult | None, name: str, session: Path | str) -> Path | None:
    """The folder a growth run saved the `growth` or `uniform` model in, if it still exists (None
    without a growth result). The result is the session's (`session`, its folder), untrusted: a folder
    outside it, or reached through a symbolic link, is a one-line UserError, never loaded."""
    wanted = SAVED_ARMS[name]
    arm = result.arms.get(wanted) if result is not None else None
    path = arm.model if arm is not None else None
    if not path:
        return None
    folder = inside(path, session, f"the growth result's {wanted} arm")
    return folder if folder.exists() else None


LAYER_FILE = re.compile(r"^layer-(\d+)\.safetensors$")  # recovery.save_layer_weights writes layer-<index>


def layer_weights(folder: Path, model: str) -> dict[int, dict[str, Any]]:
    """The layers saved in `folder` for `model` (files for another model, damaged files and other
    names are skipped): what the recovered variant puts in."""
    from safetensors import SafetensorError, safe_open

    found: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.glob("layer-*.safetensors")) if folder.is_dir() else []:
        match = LAYER_FILE.match(path.name)
        if match is None:
            continue
        unlinked(path)  # a linked layer file in a session: one line, never read
        try:
            with safe_open(str(path), framework="pt") as handle:
                if (handle.metadata() or {}).get("model") != model:
                    continue
                found[int(match.group(1))] = {name: handle.get_tensor(name) for name in handle.keys()}
        except (OSError, ValueError, SafetensorError):
            continue  # a damaged file: that layer is simply not offered
    return found
