"""A model's shape as the memory plan and the checks before a load need it: its numbers read from
its config (`ModelShape`), and the config, tokenizer and meta-device model read before any weight
loads (`preview_model`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.core.errors import UserError


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model the plan needs, read from its config."""

    params: int
    n_layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int
    layer_matrices: int = 0  # parameters in one layer's weight matrices (what recovery trains)
    layer_params: int = 0  # every parameter of one layer, norms too (what prune's adjacent healing trains)
    layer_matrix_sides: int = 0  # rows + columns of one layer's matrices (a rank-1 LoRA on each has this many)
    family: str = ""  # the config's model_type (engine.models.families FAMILIES: its layers and matrix names)

    @classmethod
    def from_config(cls, config: Any, trust_remote_code: bool = False) -> ModelShape:
        """Counts parameters on the meta model (no memory is allocated), as `loading.model_placement` counts them."""
        from engine.models.loading import meta_model

        return cls.from_meta(config, meta_model(config, trust_remote_code))

    @classmethod
    def from_meta(cls, config: Any, model: Any) -> ModelShape:
        """The shape of `model`, the config's model built on the meta device."""
        from engine.models.anatomy import LayerStack
        from engine.models.loading import parameter_count

        stack = LayerStack(model)
        matrices = stack.matrices(0).values()
        return replace(
            cls.from_numbers(config),
            params=parameter_count(model),
            layer_matrices=sum(p.numel() for p in matrices),
            layer_params=sum(p.numel() for p in stack.layers[0].parameters()),
            layer_matrix_sides=sum(sum(p.shape) for p in matrices),
        )

    @classmethod
    def from_numbers(cls, config: Any) -> ModelShape:
        """What the config's numbers say alone (no model built, parameter counts 0): the checks of
        the settings against the model's depth and family, before torch (engine/models/preflight.py)."""
        hidden = _first(config, *HIDDEN_KEYS)
        return cls(
            params=0,
            n_layers=_first(config, *LAYER_KEYS),
            hidden=hidden,
            intermediate=_first(config, "intermediate_size", "ffn_dim", "n_inner") or 4 * hidden,
            heads=_first(config, "num_attention_heads", "n_head"),
            vocab=int(getattr(config, "vocab_size", 0) or 0),
            family=str(config.model_type),
        )


LAYER_KEYS = ("num_hidden_layers", "n_layer")  # a config's layer count, by the names the families use
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")  # and its hidden size


def _first(config: Any, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value:
            return int(value)
    return 0


@dataclass(frozen=True)
class ModelPreview:
    """A model as its config and tokenizer describe it, read before its weights load (a second or
    two, even for a 7B model): what the memory plan and the checks before the load need."""

    config: Any
    tokenizer: Any
    meta: Any  # the model built on the meta device: every parameter's shape, no memory
    shape: ModelShape


def preview_model(name: str, trust_remote_code: bool = False) -> ModelPreview:
    """The config and tokenizer of `name` (the embedded model's from its GGUF header, or the folder
    its dequantization saved). A config that cannot be read, or a folder's config.json that lacks
    the layer count or hidden size (transformers would fill in its own defaults and the load then
    fails on every weight), is a one-line UserError, as the load would say it."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoTokenizer

    from engine.models.bounds import check_sizes
    from engine.models.gguf_cache import gguf_config_source
    from engine.models.loading import friendly_load_error, meta_model
    from engine.models.sources import resolve

    source = resolve(name)
    where: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    location = source.location
    if source.kind == "gguf":
        location, where = gguf_config_source(Path(location))
    try:
        config = AutoConfig.from_pretrained(location, **where)
    except (OSError, ValueError, KeyError, TypeError, struct.error, StrictDataclassError) as exc:  # struct: bad GGUF
        raise friendly_load_error(exc, source) from None
    if source.kind == "folder":
        _check_config_keys(Path(location) / "config.json")
    check_sizes(config.to_dict(), source.display)  # a hub config check_config had no copy of: before the meta model
    meta = meta_model(config, trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(location, **where)
    return ModelPreview(config, tokenizer, meta, ModelShape.from_meta(config, meta))


def _check_config_keys(path: Path) -> None:
    import json

    raw = json.loads(path.read_text(encoding="utf-8"))  # AutoConfig has read it: valid JSON
    for keys, what in ((LAYER_KEYS, "layer count"), (HIDDEN_KEYS, "hidden size")):
        if not isinstance(raw, dict) or not any(key in raw for key in keys):
            raise UserError(f"{path} has no {keys[0]} (the model's {what}); it is not a complete "
                            "Hugging Face config: save the model again")

