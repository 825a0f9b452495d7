"""Bounds on a model's sizes, checked before anything is built or read from them, torch-free: by
`engine.models.preflight.check_config` on config.json (or a GGUF header) before torch is imported,
and by `load_model` on the config transformers read, before the model is built from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.errors import UserError

# The sizes a config may give, bounded before anything is built from them: far above any released
# model, far below what takes minutes to build (a meta model of 10^7 layers grows 16 MB/s) or hangs.
SIZE_BOUNDS = (
    (("num_hidden_layers", "n_layer"), "layer count", 1_000),
    (("hidden_size", "n_embd", "d_model"), "hidden size", 65_536),
    (("intermediate_size", "ffn_dim", "n_inner"), "intermediate size", 2**20),
    (("vocab_size",), "vocabulary", 2**20),
    (("num_attention_heads", "n_head"), "attention head count", 4_096),
    (("num_key_value_heads",), "key-value head count", 4_096),
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")
TOKENIZER_FILE_BOUND = 50 * 2**20  # the largest released tokenizer.json is under 35 MB


def check_sizes(raw: dict[str, Any], where: str) -> None:
    """One-line UserError for a size out of `SIZE_BOUNDS` or not a whole number, and for attention
    heads that do not divide the hidden size (no `head_dim` given) or are not a multiple of the
    key-value heads, in a config (and its `text_config`) as read from `where`."""
    for config in (raw, raw.get("text_config")):
        if not isinstance(config, dict):
            continue
        sizes: dict[str, int] = {}
        for keys, what, bound in SIZE_BOUNDS:
            for key in (key for key in keys if config.get(key) is not None):
                value = config[key]
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
                    raise UserError(f"{where}: {key} is {value!r}; the {what} must be a whole number from 1 to "
                                    f"{bound:,} (larger than any released model); fix the config")
                sizes.setdefault(what, value)
        hidden, heads = sizes.get("hidden size"), sizes.get("attention head count")
        if hidden and heads and config.get("head_dim") is None and hidden % heads:
            raise UserError(f"{where}: the hidden size {hidden} is not a multiple of the {heads} attention heads "
                            "(each head gets hidden size / heads); fix the config")
        kv_heads = sizes.get("key-value head count")
        if heads and kv_heads and heads % kv_heads:
            raise UserError(f"{where}: the {heads} attention heads are not a multiple of the {kv_heads} key-value "
                            "heads (num_key_value_heads); fix the config")


def check_tokenizer_files(folder: Path) -> None:
    """One-line UserError for a tokenizer file over `TOKENIZER_FILE_BOUND`, before it is read whole."""
    for name in TOKENIZER_FILES:
        try:
            size = (folder / name).stat().st_size
        except OSError:  # absent (or unreadable: the load says so in its words)
            continue
        if size > TOKENIZER_FILE_BOUND:
            raise UserError(f"{folder / name} is {size / 2**20:,.0f} MB; a tokenizer file of more than "
                            f"{TOKENIZER_FILE_BOUND // 2**20} MB is refused before it is read (no released "
                            "model's is); check the file")


def hub_folder(repo: str) -> Path | None:
    """The snapshot folder of a hub id in the hub cache (its config.json's), None when not cached;
    nothing is downloaded."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, "config.json")
    return Path(found).parent if isinstance(found, str) else None
