"""Saving a model the experiments made as a Hugging Face folder that loads anywhere.

`save_model_folder` is the one way out: weights and config by `save_pretrained` (safetensors),
the tokenizer, a model card (`engine.export.model_card`: README.md with the Hub's YAML metadata saying what
was done to the model), and what else the folder carries (a prune's mergekit configuration, a LoRA
healing's PEFT adapter). Experiments call it for their models (`prune --export`); `export_recovered`
(and growth's own `export_growth`) serve `anatomy-tui export SESSION --model recovered|growth|uniform DIR`, and
`push_to_hub` uploads a folder (`--push-to-hub REPO`). The folder is written next to its final
place and renamed, so a failed export leaves no half-written model behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.files import check_folder_target
from engine.export.model_card import CARD, CardFacts, model_card

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

ADAPTER = "adapter"  # the subfolder of a LoRA-healed export holding the PEFT adapter
EXPORT_STAGING = ".anatomy-export-"  # a folder being written; one a killed export (kill -9) left, the next removes


def check_export_folder(folder: str | Path, force: bool = False) -> Path:
    """The folder to export into: new or empty, or any with --force (its model files replaced), and
    writable there (`check_folder_target`: a dangling link, a read-only folder)."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(f"export folder {path} is a file; give a folder path")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise UserError(f"export folder {path} exists and is not empty; choose another or add --force")
    check_folder_target(path, "export folder")
    return path


def save_model_folder(model: Any, tokenizer: Any, folder: str | Path, card: ModelCard, force: bool = False, *,
                      files: Mapping[str, str] | None = None, adapter: Path | None = None,
                      weights: bool = True) -> Path:
    """`save_pretrained` of the model and tokenizer, the card as README.md, `files` (name: text)
    and a PEFT adapter folder (`adapter`: into `adapter/`, or, without `weights`, the adapter alone
    in place of the model's weights and config), written atomically."""
    from engine.disk.atomic import check_free_space, no_space_is_one_line
    from engine.models.gguf_cache import STAGING_OWNER, clean_stale_staging

    path = check_export_folder(folder, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(path.parent, EXPORT_STAGING)  # what a killed export left beside it
    if weights:  # the weights are most of it: refused in one line before gigabytes are written
        check_free_space(path.parent, sum(p.numel() * p.element_size() for p in model.parameters()), "the export")
    with no_space_is_one_line(path, "removed the half-written export"), \
            tempfile.TemporaryDirectory(dir=path.parent, prefix=f"{EXPORT_STAGING}{path.name}.") as tmp:
        (Path(tmp) / STAGING_OWNER).write_text(str(os.getpid()))  # a live owner: not stale
        staging = Path(tmp) / "model"
        if weights:
            _quiet_save(model, staging)
        staging.mkdir(exist_ok=True)
        if adapter is not None:  # PEFT's own card there is boilerplate: the folder's card describes the adapter
            shutil.copytree(adapter, staging / ADAPTER if weights else staging, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(CARD))
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(staging)
        elif tokenizer is not None and hasattr(tokenizer, "save"):
            tokenizer.save(staging)
        for name, text in (files or {}).items():
            (staging / name).write_text(text, encoding="utf-8")
        card.save(staging / CARD)
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
    *,
    base_model: str | None = None,
    recovery: Mapping[str, Any] | None = None,
) -> Path:
    """The model with recovery's fine-tuned layers put in (`{layer: {matrix: tensor}}`, canonical
    matrix names as `LayerStack.matrices` gives them), saved; the model itself is left unchanged.
    `recovery`, the session's results/recovery.json, gives the card each layer's perplexities."""
    from engine.models.anatomy import LayerStack

    if not layers:
        raise UserError("the session has no recovered layers of this model; run recovery first")
    stack = LayerStack(model)
    for index in layers:
        stack.check_index(index)
    listed = ", ".join(map(str, sorted(layers)))
    doc = recovery if recovery is not None and recovery.get("model") == model_name else {}
    rows = [{key: row.get(key) for key in ("layer", "ppl_after_noise", "final_ppl", "best_ppl")}
            for row in doc.get("layers") or [] if row.get("layer") in layers]
    details = {"experiment": "recovery", "source_model": model_name, "recovered_layers": sorted(layers),
               "baseline_ppl": doc.get("baseline_ppl"), "per_layer": rows, "settings": doc.get("settings"),
               "protocol": doc.get("protocol")}
    card = model_card(CardFacts(
        title=f"{model_name or 'model'} with recovered layers", base_model=base_model, tags=["layer-recovery"],
        details=details,
        body=f"Exported by anatomy-tui. Layers {listed} (from 0) hold the weights the recovery experiment "
             "fine-tuned after noising them; every other weight is the original model's. Each layer was "
             "noised and recovered alone: the perplexities in the metadata (`per_layer`) are of the model "
             "with that one layer recovered.\n\nLoad with `AutoModelForCausalLM.from_pretrained(folder)`.",
    ))
    with stack.holding({i: dict(tensors) for i, tensors in layers.items()}):
        return save_model_folder(model, tokenizer, folder, card, force)


def hub_token() -> str:
    """The user's Hugging Face token (HF_TOKEN, else the one `hf auth login` saved)."""
    from huggingface_hub import get_token

    token = get_token()
    if token is None:
        raise UserError("pushing to the Hub needs your Hugging Face token: set HF_TOKEN or run `hf auth login`")
    return token


def push_to_hub(folder: str | Path, repo: str, private: bool = False) -> str:
    """Uploads an exported folder to the Hub model repository `repo` (made when missing) with the
    user's token (HF_TOKEN or `hf auth login`); returns the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    # a bad repo id or card metadata (ValueError), the Hub's answers and the HTTP library's own errors
    failures: tuple[type[BaseException], ...] = (OSError, ValueError, *HfHubHTTPError.__bases__)
    path = Path(folder)
    if not (path / CARD).is_file():
        raise UserError(f"{path} is not an exported folder (no {CARD}); export it first")
    api = HfApi(token=hub_token())
    try:
        url = api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(folder_path=path, repo_id=url.repo_id, repo_type="model",
                                   commit_message="Upload a model exported by anatomy-tui")
    except failures as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise UserError(f"could not push {path} to the Hub repository {repo}: {lines[0]}") from None
    return commit.commit_url
