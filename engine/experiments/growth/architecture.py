"""The growth model and its uniform baseline, both transformers Llama models.

Why Llama classes and not a compact model of our own: the final models must load with
`AutoModelForCausalLM` (the console's prompt pane, `generate`, any HF tool). A Llama decoder layer
has one FFN width for all layers, so `GrowthLlamaConfig` (model_type "growth_llama") adds
`intermediate_sizes`, one width per layer, and `GrowthLlamaForCausalLM` swaps each layer's MLP for
one of its width. Both are registered with AutoConfig / AutoModelForCausalLM when this module is
imported, so `import engine.experiments.growth.architecture` (or `load_growth_model`) before loading a saved
growth model. The uniform baseline is a plain `LlamaForCausalLM` and loads anywhere.

Growing: the model is built with every final layer; `GrowingModel` keeps them all and puts only
the layers that exist so far into `model.model.layers`, so a forward and backward pass costs only
what exists. Layers not yet in it get no gradient, so AdamW (which skips parameters without a
gradient) leaves them and their state untouched until they are cloned and join.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP

from engine.core.errors import UserError

if TYPE_CHECKING:
    from engine.experiments.growth.data import CharTokenizer


@strict
class GrowthLlamaConfig(LlamaConfig):
    """A Llama config whose layers may each have their own FFN width."""

    model_type = "growth_llama"
    intermediate_sizes: list[int] | None = None


class GrowthLlamaForCausalLM(LlamaForCausalLM):
    """LlamaForCausalLM with layer i's MLP `intermediate_sizes[i]` wide."""

    config_class = GrowthLlamaConfig

    def __init__(self, config: GrowthLlamaConfig) -> None:
        super().__init__(config)
        widths = config.intermediate_sizes or [config.intermediate_size] * config.num_hidden_layers
        if len(widths) != config.num_hidden_layers:
            raise ValueError(f"{len(widths)} intermediate_sizes for {config.num_hidden_layers} layers")
        for layer, width in zip(self.model.layers, widths, strict=True):
            layer.mlp = LlamaMLP(
                SimpleNamespace(
                    hidden_size=config.hidden_size,
                    intermediate_size=width,
                    mlp_bias=config.mlp_bias,
                    hidden_act=config.hidden_act,
                )
            )
        self.post_init()  # type: ignore[no-untyped-call]  # transformers leaves post_init unannotated


AutoConfig.register("growth_llama", GrowthLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(GrowthLlamaConfig, GrowthLlamaForCausalLM, exist_ok=True)


def _config_kwargs(vocab_size: int, hidden_size: int, heads: int, n_layers: int, max_len: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "max_position_embeddings": max_len,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


def param_count(vocab_size: int, hidden_size: int, widths: Sequence[int]) -> int:
    """Parameters of a Llama with these per-layer FFN widths (full attention, untied head)."""
    d = hidden_size
    per_layer = [4 * d * d + 2 * d + 3 * d * w for w in widths]
    return 2 * vocab_size * d + d + sum(per_layer)


def growth_widths(profile: Sequence[str], base_ffn: int, multipliers: dict[str, float]) -> list[int]:
    """FFN width of each kept layer: base width times its class multiplier, rounded."""
    return [max(1, round(base_ffn * multipliers[c])) for c in profile if c != "anti"]


def solve_uniform_width(vocab_size: int, hidden_size: int, n_layers: int, target_params: int) -> int:
    """The one FFN width that makes an `n_layers` Llama closest to `target_params`."""
    fixed = param_count(vocab_size, hidden_size, [0] * n_layers)
    width = round((target_params - fixed) / (3 * hidden_size * n_layers))
    if width < 1:
        raise UserError("the growth model is too small for a uniform baseline with these dimensions")
    return width


def build_model(
    vocab_size: int,
    hidden_size: int,
    heads: int,
    widths: Sequence[int],
    max_len: int,
    seed: int,
    uniform: bool,
) -> LlamaForCausalLM:
    """A freshly initialised model (seeded); plain Llama when `uniform`, else GrowthLlama."""
    if hidden_size % heads:
        raise UserError(f"hidden size {hidden_size} is not divisible by {heads} heads")
    kwargs = _config_kwargs(vocab_size, hidden_size, heads, len(widths), max_len)
    torch.manual_seed(seed)
    if uniform:
        if len(set(widths)) != 1:
            raise ValueError("a uniform model needs one width")
        model = LlamaForCausalLM(LlamaConfig(intermediate_size=widths[0], **kwargs))
    else:
        config = GrowthLlamaConfig(intermediate_size=max(widths), intermediate_sizes=list(widths), **kwargs)
        model = GrowthLlamaForCausalLM(config)
    model.config.use_cache = False
    return cast(LlamaForCausalLM, model.float())


@torch.no_grad()
def clone_layer(source: LlamaDecoderLayer, target: LlamaDecoderLayer, ffn_scale: float = 1.0) -> None:
    """Makes `target` a copy of `source`, its FFN output scaled by `ffn_scale`.

    Attention and norms are copied exactly. FFN neurons: when the target is narrower, it keeps the
    source's strongest neurons (largest |gate row| * |up row| * |down column|, in their original
    order); when wider, the extra neurons keep their fresh gate/up weights with a zero down column,
    so the clone computes exactly the source's function (times the scale) either way.
    """
    src_mlp, dst_mlp = source.mlp, target.mlp
    for name in ("input_layernorm", "post_attention_layernorm", "self_attn"):
        getattr(target, name).load_state_dict(getattr(source, name).state_dict())
    w_src, w_dst = src_mlp.gate_proj.out_features, dst_mlp.gate_proj.out_features
    if w_dst <= w_src:
        strength = src_mlp.gate_proj.weight.norm(dim=1) * src_mlp.up_proj.weight.norm(dim=1)
        strength = strength * src_mlp.down_proj.weight.norm(dim=0)
        keep = torch.topk(strength, w_dst).indices.sort().values
        dst_mlp.gate_proj.weight.copy_(src_mlp.gate_proj.weight[keep])
        dst_mlp.up_proj.weight.copy_(src_mlp.up_proj.weight[keep])
        dst_mlp.down_proj.weight.copy_(src_mlp.down_proj.weight[:, keep] * ffn_scale)
    else:
        dst_mlp.gate_proj.weight[:w_src].copy_(src_mlp.gate_proj.weight)
        dst_mlp.up_proj.weight[:w_src].copy_(src_mlp.up_proj.weight)
        dst_mlp.down_proj.weight.zero_()
        dst_mlp.down_proj.weight[:, :w_src].copy_(src_mlp.down_proj.weight * ffn_scale)


class GrowingModel:
    """A model whose decoder layers join one phase at a time.

    `positions` maps a profile layer index to its place in the final model (anti layers are left
    out, so the two differ). `named` is the full parameter table in a fixed order, used for the
    optimizer and for checkpoints whatever the current set of layers.
    """

    def __init__(self, model: LlamaForCausalLM, profile_layers: Sequence[int]) -> None:
        self.model = model
        self.layers = cast(list[LlamaDecoderLayer], list(model.model.layers))
        self.positions = {layer: n for n, layer in enumerate(profile_layers)}
        self.named = dict(model.named_parameters())
        self.active: tuple[int, ...] = tuple(profile_layers)

    def set_active(self, profile_layers: Iterable[int]) -> None:
        self.active = tuple(sorted(profile_layers))
        self.model.model.layers = nn.ModuleList([self.layers[self.positions[i]] for i in self.active])

    def clone(self, target: int, source: int, ffn_scale: float) -> None:
        clone_layer(self.layers[self.positions[source]], self.layers[self.positions[target]], ffn_scale)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.named.values())

    def save(self, folder: Path) -> None:
        """`save_pretrained` with every layer in place."""
        current = self.active
        self.set_active(self.positions)
        try:
            with no_progress_bars():
                self.model.save_pretrained(folder)
        finally:
            self.set_active(current)


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """Keeps transformers' tqdm bars off the terminal (a console may be drawing on it)."""
    from transformers.utils import logging

    bars_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_on:
            logging.enable_progress_bar()


def load_growth_model(path: str | Path) -> tuple[Any, CharTokenizer]:
    """(model, tokenizer) for a saved growth or uniform model folder; the tokenizer has encode/decode."""
    from safetensors import SafetensorError

    from engine.experiments.growth.data import CharTokenizer
    from engine.models.sources import safetensors_only

    folder = Path(path)
    safetensors_only(folder)  # a session's folder is untrusted: its weights never come from a pickle
    tokenizer = CharTokenizer.load(folder)
    with no_progress_bars():
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
        except (OSError, SafetensorError) as exc:
            raise UserError(f"could not load the model in {folder}: {' '.join(str(exc).split())[:160]}") from None
    model.eval()
    return model, tokenizer
