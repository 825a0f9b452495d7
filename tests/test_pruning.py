"""Removing layers (engine.models.pruning): equal to skipping them, for every family; generation with a
cache; exact undo; one-line errors."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from tiny_models import TINY_CONFIGS, tiny_model
from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer

from engine.core.errors import UserError
from engine.models.anatomy import LayerStack
from engine.models.pruning import check_removal, removed

IDS = torch.tensor([[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 1, 200], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 10, 20]])


def logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
@pytest.mark.parametrize("cut", [(1,), (0, 2), (1, 2, 3)])
def test_removal_equals_skipping(family, cut):
    model = tiny_model(family)
    stack = LayerStack(model)
    with stack.skipped(cut):
        skipped = logits(model)
    full = logits(model)
    with removed(model, cut) as kept:
        assert kept == tuple(i for i in range(4) if i not in cut)
        assert len(LayerStack(model)) == 4 - len(cut)
        assert model.config.num_hidden_layers == 4 - len(cut)
        layer_types = getattr(model.config, "layer_types", None)
        if layer_types is not None:
            assert len(layer_types) == 4 - len(cut)
        cut_logits = logits(model)
    torch.testing.assert_close(cut_logits, skipped, rtol=0, atol=1e-6)
    assert not torch.allclose(cut_logits, full)
    torch.testing.assert_close(logits(model), full, rtol=0, atol=0)  # undone exactly
    assert model.config.num_hidden_layers == 4


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_generate_with_cache_after_removal(family):
    """Greedy generation with the KV cache equals greedy decoding without it (the cache slots of
    the kept layers were renumbered)."""
    model = tiny_model(family)
    prompt = IDS[:1, :6]
    with removed(model, (0, 2)):
        with torch.no_grad():
            cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=256)
        ids = prompt
        for _ in range(6):
            ids = torch.cat([ids, logits(model, ids)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(cached, ids)


def attention_indices(model) -> list[int]:
    """Each layer's attention's `layer_idx` (a gemma2 model's)."""
    return [cast(Gemma2DecoderLayer, layer).self_attn.layer_idx for layer in LayerStack(model).layers]


def test_sliding_layer_types_follow_their_layers():
    model = tiny_model("gemma2")
    before = list(model.config.layer_types)
    with removed(model, (1,)):
        assert list(model.config.layer_types) == [before[0], before[2], before[3]]
        idx = attention_indices(model)
        assert idx == [0, 1, 2]
    assert list(model.config.layer_types) == before
    assert attention_indices(model) == [0, 1, 2, 3]


def test_qwen_sliding_window_threshold_follows_the_kept_layers(tmp_path):
    """Qwen2 slides the window from `max_window_layers` on: after a cut the threshold is lowered by
    the layers removed below it, so a config rebuilt from it (layer_types derived again) agrees with
    the sliced `layer_types`, and the saved folder reloads to the same logits."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = TINY_CONFIGS["qwen2"]()
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 4, 2
    config.layer_types = None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**config.to_dict()), attn_implementation="eager").eval()
    assert model.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    with removed(model, (0, 3)):  # keeps layer 1 (full) and layer 2 (sliding)
        assert model.config.max_window_layers == 1
        assert model.config.layer_types == ["full_attention", "sliding_attention"]
        rebuilt = model.config.to_dict()
        rebuilt.pop("layer_types")
        assert Qwen2Config(**rebuilt).layer_types == ["full_attention", "sliding_attention"]
        expected = logits(model)
        model.save_pretrained(tmp_path)
    assert model.config.max_window_layers == 2
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")),
                               expected, rtol=0, atol=0)


def test_one_line_errors():
    with pytest.raises(UserError, match="cannot remove all 4 layers"):
        check_removal(4, (0, 1, 2, 3))
    with pytest.raises(UserError, match="layer 7 is out of range"):
        check_removal(4, (7,))
    model = tiny_model("llama")
    with pytest.raises(UserError), removed(model, (0, 1, 2, 3)):
        pass
    assert len(LayerStack(model)) == 4
