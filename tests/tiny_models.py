"""Tiny randomly initialised models of every supported family, built from configs (no downloads),
and a byte-level tokenizer to go with them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    Phi3Config,
    PhiConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

VOCAB = 260  # 256 bytes + pad, bos, eos, unk
_COMMON: dict[str, Any] = dict(vocab_size=VOCAB, pad_token_id=256, bos_token_id=257, eos_token_id=258)
_DECODER: dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                max_position_embeddings=128, **_COMMON)

TINY_CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "llama": lambda: LlamaConfig(num_key_value_heads=2, **_DECODER),
    "mistral": lambda: MistralConfig(num_key_value_heads=2, sliding_window=None, **_DECODER),
    "qwen2": lambda: Qwen2Config(num_key_value_heads=2, **_DECODER),
    "qwen3": lambda: Qwen3Config(num_key_value_heads=2, head_dim=8, **_DECODER),
    "gemma2": lambda: Gemma2Config(num_key_value_heads=2, head_dim=8, sliding_window=16,
                                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0, **_DECODER),
    "gemma3_text": lambda: Gemma3TextConfig(num_key_value_heads=2, head_dim=8, sliding_window=16, **_DECODER),
    "phi3": lambda: Phi3Config(num_key_value_heads=4, **_DECODER),
    "phi": lambda: PhiConfig(resid_pdrop=0.0, **_DECODER, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),  # half the head rotated
    "gpt2": lambda: GPT2Config(n_embd=32, n_layer=4, n_head=4, n_positions=128, **_COMMON),
    "gpt_neox": lambda: GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, max_position_embeddings=128, **_COMMON),
    "opt": lambda: OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=4, num_attention_heads=4,
                             word_embed_proj_dim=32, max_position_embeddings=128, **_COMMON),
}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: every byte is one token, ids 0-255, then the special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for token in ("<pad>", "<s>", "</s>", "<unk>"):
        vocab[token] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_model(model_type: str = "llama", seed: int = 0):
    """A tiny float32 model in eval mode with gradients off, like engine.models.loading.load_model gives."""
    config: PretrainedConfig = TINY_CONFIGS[model_type]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.eval()
    model.requires_grad_(False)
    return model


def save_tiny(folder: Path, model_type: str = "llama", seed: int = 0) -> Path:
    """A tiny model and tokenizer saved as a Hugging Face folder (usable as --model FOLDER)."""
    tiny_model(model_type, seed).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def out_of_memory_in_training(monkeypatch, module) -> None:
    """`module` raises CUDA's out-of-memory error in every forward with gradients on (a training
    step) and runs as before otherwise (evaluation)."""
    original = module.forward

    def forward(*args, **kwargs):
        if torch.is_grad_enabled():
            raise torch.OutOfMemoryError("CUDA out of memory")
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "forward", forward)


EVAL = ["The dog sat on the mat.", "A cat looked at the dog for a while.", "Number seven sat on the mat."]
TRAIN = "\n".join(f"The cat number {i} sat on the mat and looked at the dog for a while." for i in range(40))
