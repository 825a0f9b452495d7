"""The model families anatomy-tui knows: where each keeps its layers, each layer's weight matrices by
canonical name, and its attention and MLP blocks. Torch-free, so the settings' checks against a
model's family (`check_matrix_names`, `check_parts`) run from its config before torch is imported;
engine.models.anatomy's LayerStack reads a loaded model through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.errors import UserError

_LLAMA_MATRICES = (
    ("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
    ("o", "self_attn.o_proj"), ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj"),
)

_LLAMA_PARTS = ("self_attn", "mlp")
_GEMMA_PARTS = ("post_attention_layernorm", "post_feedforward_layernorm")  # norms of the blocks' outputs

PARTS = ("attention", "mlp")  # the blocks of a layer, in the order they run
Block = tuple[int, str]  # one block: (layer, "attention" or "mlp")
PART_MATRICES = {"attention": ("q", "k", "v", "qkv", "o"), "mlp": ("gate", "up", "gate_up", "down")}


@dataclass(frozen=True)
class Family:
    """Where a family keeps its layers (dotted path from the model) and each layer's matrices."""

    label: str
    layers: str
    matrices: tuple[tuple[str, str], ...]
    # (attention, mlp): in each layer, the module whose output (its first element, for attention's
    # tuple) is the block's term in the residual sum; None where anatomy-tui cannot name them
    parts: tuple[str, str] | None = None


FAMILIES: dict[str, Family] = {
    "llama": Family("Llama / SmolLM", "model.layers", _LLAMA_MATRICES, _LLAMA_PARTS),
    "mistral": Family("Mistral", "model.layers", _LLAMA_MATRICES, _LLAMA_PARTS),
    "qwen2": Family("Qwen2", "model.layers", _LLAMA_MATRICES, _LLAMA_PARTS),
    "qwen3": Family("Qwen3", "model.layers", _LLAMA_MATRICES, _LLAMA_PARTS),
    "gemma2": Family("Gemma 2", "model.layers", _LLAMA_MATRICES, _GEMMA_PARTS),
    "gemma3_text": Family("Gemma 3", "model.layers", _LLAMA_MATRICES, _GEMMA_PARTS),
    "phi3": Family(
        "Phi-3", "model.layers",
        (("qkv", "self_attn.qkv_proj"), ("o", "self_attn.o_proj"),
         ("gate_up", "mlp.gate_up_proj"), ("down", "mlp.down_proj")),
        _LLAMA_PARTS,
    ),
    "phi": Family(
        "Phi-1 / Phi-2", "model.layers",
        (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
         ("o", "self_attn.dense"), ("up", "mlp.fc1"), ("down", "mlp.fc2")),
        _LLAMA_PARTS,
    ),
    "gpt2": Family(
        "GPT-2", "transformer.h",
        (("qkv", "attn.c_attn"), ("o", "attn.c_proj"), ("up", "mlp.c_fc"), ("down", "mlp.c_proj")),
        ("attn", "mlp"),
    ),
    "gpt_neox": Family(
        "GPT-NeoX / Pythia", "gpt_neox.layers",
        (("qkv", "attention.query_key_value"), ("o", "attention.dense"),
         ("up", "mlp.dense_h_to_4h"), ("down", "mlp.dense_4h_to_h")),
        ("attention", "mlp"),
    ),
    "opt": Family(
        "OPT", "model.decoder.layers",
        (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
         ("o", "self_attn.out_proj"), ("up", "fc1"), ("down", "fc2")),
        ("self_attn", "fc2"),
    ),
}


def supported_families() -> str:
    return ", ".join(sorted({f.label for f in FAMILIES.values()}))


def check_matrix_names(model_type: str, names: Sequence[str] | None) -> tuple[str, ...]:
    """`names` (all of the family's when None), each a canonical matrix name of the family of
    this config model_type (known before its weights load)."""
    family = FAMILIES[model_type]
    known = tuple(name for name, _ in family.matrices)
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise UserError(f"unknown component {unknown[0]!r} for {family.label}; use {', '.join(known)}")
    return known if names is None else tuple(names)


def check_parts(model_type: str, flag: str = "--part") -> None:
    """A family whose attention and MLP blocks anatomy-tui can name (known from the config's
    model_type, before the weights load); otherwise one line naming it and the option (`--part`,
    `--unit`) to set back to whole layers."""
    family = FAMILIES.get(model_type)
    if family is not None and family.parts is None:
        raise UserError(f"{flag}: anatomy-tui cannot name the attention and MLP blocks of {family.label} "
                        f"({model_type}); use {flag} layer")
