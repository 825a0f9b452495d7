"""Saving a model the experiments made as a Hugging Face folder that loads anywhere.

`save_model_folder` is the one way out: weights and config by `save_pretrained`, the tokenizer,
and a README card saying what was done to the model. Experiments call it for their models
(`prune --export`); `export_recovered` and `export_growth` serve `anatomy-tui export SESSION
--model recovered|growth|uniform DIR`. The folder is written next to its final place and renamed,
so a failed export leaves no half-written model behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.errors import UserError

EXPORT_STAGING = ".anatomy-export-"  # a folder being written; one a killed export (kill -9) left, the next removes


def check_export_folder(folder: str | Path, force: bool = False) -> Path:
    """The folder to export into: new or empty, or any with --force (its model files replaced)."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(f"export folder {path} is a file; give a folder path")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise UserError(f"export folder {path} exists and is not empty; choose another or add --force")
    return path


def save_model_folder(model: Any, tokenizer: Any, folder: str | Path, card: str, force: bool = False) -> Path:
    """`save_pretrained` of the model and tokenizer plus README.md, written atomically."""
    from engine.models import STAGING_OWNER, clean_stale_staging

    path = check_export_folder(folder, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(path.parent, EXPORT_STAGING)  # what a killed export left beside it
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f"{EXPORT_STAGING}{path.name}.") as tmp:
        (Path(tmp) / STAGING_OWNER).write_text(str(os.getpid()))  # a live owner: not stale
        staging = Path(tmp) / "model"
        _quiet_save(model, staging)
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(staging)
        elif tokenizer is not None and hasattr(tokenizer, "save"):
            tokenizer.save(staging)
        (staging / "README.md").write_text(card, encoding="utf-8")
        if path.is_dir():  # --force into an existing folder: replace file by file
            for item in staging.iterdir():
                target = path / item.name
                if target.is_dir():
                    shutil.rmtree(target)
                item.replace(target)
        else:
            staging.replace(path)
    return path


def _quiet_save(model: Any, folder: Path) -> None:
    from transformers.utils import logging

    bars_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
    finally:
        if bars_on:
            logging.enable_progress_bar()


def export_recovered(
    model: Any,
    tokenizer: Any,
    layers: Mapping[int, Mapping[str, Any]],
    folder: str | Path,
    model_name: str = "",
    force: bool = False,
) -> Path:
    """The model with recovery's fine-tuned layers put in (`{layer: {matrix: tensor}}`, canonical
    matrix names as `LayerStack.matrices` gives them), saved; the model itself is left unchanged."""
    from engine.anatomy import LayerStack

    if not layers:
        raise UserError("the session has no recovered layers of this model; run recovery first")
    stack = LayerStack(model)
    for index in layers:
        stack.check_index(index)
    listed = ", ".join(map(str, sorted(layers)))
    card = (f"# {model_name or 'model'} with recovered layers\n\nExported by anatomy-tui. Layers {listed} "
            "(from 0) hold the weights the recovery experiment fine-tuned after noising them; every other "
            "weight is the original model's.\n\nLoad with `AutoModelForCausalLM.from_pretrained(folder)`.\n")
    with stack.holding({i: dict(tensors) for i, tensors in layers.items()}):
        return save_model_folder(model, tokenizer, folder, card, force)


def export_growth(source: str | Path, folder: str | Path, force: bool = False) -> Path:
    """A saved growth or uniform model folder (growth experiment), saved again with a card. The
    uniform model is a plain Llama; the growth one needs `engine.experiments.growth.architecture`
    imported (its per-layer FFN widths are a config Llama lacks)."""
    from engine.experiments.growth.architecture import load_growth_model

    source = Path(source)
    if not (source / "config.json").is_file():
        raise UserError(f"{source} is not a saved model folder; run growth in this session first")
    model, tokenizer = load_growth_model(source)
    growth = model.config.model_type == "growth_llama"
    load = "`AutoModelForCausalLM.from_pretrained(folder)`"
    how = f"`import engine.experiments.growth.architecture` (registers growth_llama), then {load}" if growth else load
    card = (f"# {'growth' if growth else 'uniform'} model from anatomy-tui\n\nTrained by the growth experiment "
            f"({model.config.num_hidden_layers} layers). The tokenizer is one token per character "
            f"(growth_tokenizer.json).\n\nLoad with {how}.\n")
    return save_model_folder(model, tokenizer, folder, card, force)
