"""Checks before the load: what a model's config and tokenizer can tell about a run, checked
before its weights load (a minute on a 7B model, for a typo).

The runner reads the config and tokenizer once (`engine.models.memory.preview_model`), makes the memory
plan from them and calls `check_before_load`: the settings against the model's shape (layers in
range, component names its family knows, export folders: each experiment's `check_against`), the
evaluation texts against the tokenizer, and weight edits against a --device-map placement that
leaves layers offloaded. Each failure is one UserError line, as the run itself would raise it.

Before even that, `check_config` reads the model's numbers from its config.json (or the embedded
model's GGUF header) with neither torch nor transformers imported, so a layer out of range is
refused in about a second rather than after the imports and the preview (`--layers 99`: 4.5 s).
It bounds the config's sizes and the tokenizer's files first (`check_sizes`, `check_tokenizer_files`,
`load_model` too): a config of 10^7 layers otherwise builds its meta model for minutes, and a 225 MB
tokenizer.json takes 2.4 GB to read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import IO, TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.settings import Settings
from engine.data.text_settings import EvalTextSettings
from engine.models.bounds import check_sizes, check_tokenizer_files, hub_folder

if TYPE_CHECKING:
    from engine.models.memory import MemoryPlan, ModelPreview, ModelShape


def check_config(settings: Settings, model: str) -> None:
    """The settings against the model's config alone (`check_against` on `config_shape`), before
    torch is imported. A check that needs more than the config can say (a family named otherwise
    in a GGUF header than in transformers' config) is left to `check_before_load`, which sees it all."""
    shape = config_shape(model)
    if shape is None:
        return
    try:
        settings.check_against(shape)
    except UserError:
        raise
    except (KeyError, ValueError, TypeError, AttributeError):  # not decidable from the config: after the preview
        pass


def config_shape(model: str) -> ModelShape | None:
    """The depth, width and family of `model` as its config says them, without torch: a folder's
    config.json, a hub id's when the hub cache holds it (nothing is downloaded here), a GGUF file's
    dequantized copy's config.json, else its header. Parameter counts are left at 0 (they need the
    model built on the meta device). None where no config is on disk or it cannot be read; a model
    that cannot be named at all is the one-line UserError of `resolve`."""
    from engine.models.memory import ModelShape
    from engine.models.sources import resolve

    source = resolve(model)
    location = Path(source.location)
    try:
        folder = model_folder(source.kind, source.location)
        if source.kind == "gguf" and folder is None:
            where, raw = str(location), gguf_config(location)
        elif folder is not None:
            where, raw = str(folder / "config.json"), _read_json(folder / "config.json")
        else:
            return None
    except (OSError, ValueError, UnicodeDecodeError, struct.error):  # the load says what is wrong, in its words
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        return None
    check_sizes(raw, where)
    if folder is not None:
        check_tokenizer_files(folder)
    return ModelShape.from_numbers(SimpleNamespace(**raw))


def model_folder(kind: str, location: str) -> Path | None:
    """The folder on disk that holds a model's config.json and tokenizer: a folder model itself, a
    GGUF file's dequantized copy, a hub id's snapshot in the hub cache; None where there is none yet."""
    if kind == "folder":
        return Path(location)
    if kind == "gguf":
        from engine.models.gguf_cache import dequantized_copy

        return dequantized_copy(Path(location))
    return hub_folder(location)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


GGUF_TYPES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_STRING, GGUF_ARRAY = 8, 9
GGUF_KEYS = {"block_count": "num_hidden_layers", "embedding_length": "hidden_size",
             "feed_forward_length": "intermediate_size", "attention.head_count": "num_attention_heads"}


def gguf_config(path: Path) -> dict[str, Any]:
    """The config numbers in a GGUF file's header (`<arch>.block_count` and the like, named as a
    config.json names them; `model_type` the architecture), read until they are all found: the
    header's long token list, which `gguf.GGUFReader` parses whole (1.8 s), is skipped over."""
    found: dict[str, Any] = {}
    with open(path, "rb") as file:
        magic, _version, _tensors, count = struct.unpack("<4sIQQ", file.read(24))
        if magic != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        for _ in range(count):
            key = _gguf_string(file)
            value = _gguf_value(file, struct.unpack("<I", file.read(4))[0])
            if key == "general.architecture":
                found["model_type"] = value
            arch = found.get("model_type")
            if arch and key.startswith(f"{arch}.") and key[len(arch) + 1:] in GGUF_KEYS:
                found[GGUF_KEYS[key[len(arch) + 1:]]] = value
            if len(found) == len(GGUF_KEYS) + 1:
                break
    return found


def _gguf_string(file: IO[bytes]) -> str:
    (length,) = struct.unpack("<Q", file.read(8))
    return file.read(length).decode("utf-8", "replace")


def _gguf_value(file: IO[bytes], kind: int) -> Any:
    if kind == GGUF_STRING:
        return _gguf_string(file)
    if kind == GGUF_ARRAY:
        item, length = struct.unpack("<IQ", file.read(12))
        if item in GGUF_TYPES:  # numbers: skipped in one seek
            file.seek(length * struct.calcsize("<" + GGUF_TYPES[item]), 1)
            return None
        for _ in range(length):
            _gguf_value(file, item)
        return None
    if kind not in GGUF_TYPES:
        raise ValueError(f"unknown GGUF value type {kind}")
    form = "<" + GGUF_TYPES[kind]
    return struct.unpack(form, file.read(struct.calcsize(form)))[0]


def check_before_load(experiment: str, settings: Settings, preview: ModelPreview, plan: MemoryPlan | None) -> None:
    """One-line UserError for the first thing that would fail once the model has loaded."""
    settings.check_against(preview.shape)
    if isinstance(settings, EvalTextSettings):
        check_eval_tokens(settings, preview.tokenizer)
    if plan is not None:
        check_offload(experiment, settings, plan)


def check_eval_tokens(settings: EvalTextSettings, tokenizer: object) -> None:
    """The evaluation texts leave a token to predict (perplexity needs two tokens in some text),
    as the evaluator will tokenize them. Dataset windows (--eval-dataset) are cut by their own reader."""
    if settings.eval_dataset is not None:
        return
    from engine.data.text import NO_TOKENS
    from engine.models.memory import text_lengths

    texts = settings.eval_source(tokenizer)  # each text cut to what its first --max-length tokens need
    if sum(max(length - 1, 0) for length in text_lengths(tokenizer, texts, settings.max_length)) == 0:
        raise UserError(NO_TOKENS)


def check_offload(experiment: str, settings: Settings, plan: MemoryPlan) -> None:
    """A run that edits weights in place cannot run on layers accelerate keeps offloaded (their
    weights are put back at every forward: `LayerStack.check_editable` refuses them after the
    load); refused now, naming the layers the --max-memory budget leaves there."""
    offloaded = plan.offloaded_layers()
    if not offloaded or not settings.edits_weights():
        return
    from engine.models.placement import placement_text

    raise UserError(f"{experiment} edits weights, but the --device-map placement offloads {len(offloaded)} of "
                    f"{len(plan.layer_devices)} layers ({placement_text(list(plan.layer_devices))}), where an edit "
                    "is lost at the next forward; raise --max-memory until no layer is offloaded, or drop --device-map")
