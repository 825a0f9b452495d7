"""Layer access for every supported family: layers and matrices found, forward runs, ablation and
restore exact, and the prefix cache equal to a full forward."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_CONFIGS, tiny_model

from engine.core.errors import UserError
from engine.experiments.ablation.removal import ablated
from engine.models.anatomy import LayerStack
from engine.models.families import FAMILIES

EXPECTED_MATRICES = {
    "llama": ("q", "k", "v", "o", "gate", "up", "down"),
    "phi3": ("qkv", "o", "gate_up", "down"),
    "gpt2": ("qkv", "o", "up", "down"),
    "gpt_neox": ("qkv", "o", "up", "down"),
    "opt": ("q", "k", "v", "o", "up", "down"),
    "phi": ("q", "k", "v", "o", "up", "down"),
}


def test_every_supported_family_has_a_tiny_model():
    assert set(TINY_CONFIGS) == set(FAMILIES)


@pytest.fixture(params=sorted(FAMILIES))
def family_model(request):
    return request.param, tiny_model(request.param)


def _inputs():
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


def test_layers_and_matrices_found(family_model):
    model_type, model = family_model
    stack = LayerStack(model)
    assert len(stack) == 4
    expected = EXPECTED_MATRICES.get(model_type, EXPECTED_MATRICES["llama"])
    assert stack.matrix_names == expected
    seen = set()
    for index in range(len(stack)):
        mats = stack.matrices(index)
        assert tuple(mats) == expected
        for param in mats.values():
            assert param.dim() == 2
            seen.add(id(param))
    # every matrix of every layer is a distinct parameter of the model
    assert len(seen) == 4 * len(expected)
    model_params = {id(p) for p in model.parameters()}
    assert seen <= model_params


def test_ablate_and_restore_is_exact(family_model):
    _, model = family_model
    stack = LayerStack(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = _inputs()
    reference = model(input_ids=ids, attention_mask=mask).logits
    for method in ("mean", "zero", "skip"):
        for index in range(len(stack)):
            with ablated(stack, index, method):
                changed = model(input_ids=ids, attention_mask=mask).logits
                assert not torch.equal(changed, reference)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, reference)


def test_prefix_cache_equals_full_forward(family_model):
    _, model = family_model
    stack = LayerStack(model)
    ids, mask = _inputs()
    inputs: dict[int, torch.Tensor] = {}
    with torch.no_grad(), stack.capture(lambda _, i, h_in, h_out: inputs.__setitem__(i, h_in.clone())):
        full = model(input_ids=ids, attention_mask=mask).logits
    for start in range(1, len(stack)):
        with torch.no_grad(), stack.starting_at(start, inputs[start]):
            partial = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(partial, full, rtol=0, atol=1e-6)


def test_starting_at_really_skips_lower_layers():
    model = tiny_model("llama")
    stack = LayerStack(model)
    ids, mask = _inputs()
    with torch.no_grad(), stack.starting_at(2, torch.zeros(2, 12, 32)):
        a = model(input_ids=ids, attention_mask=mask).logits
    with torch.no_grad(), stack.starting_at(2, torch.zeros(2, 12, 32)):
        b = model(input_ids=ids * 0, attention_mask=mask).logits
    torch.testing.assert_close(a, b)  # the embedding of the real ids never reached layer 2


def test_unknown_family_is_one_line_error():
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(vocab_size=50, hidden_size=16, n_layer=2, n_head=2))
    with pytest.raises(UserError) as info:
        LayerStack(model)
    message = str(info.value)
    assert "\n" not in message and "bloom" in message and "GPT-2" in message and "Gemma 3" in message


def test_bad_layer_index_and_component():
    stack = LayerStack(tiny_model("llama"))
    with pytest.raises(UserError, match="out of range"):
        stack.matrices(4)
    with pytest.raises(UserError, match="unknown component"):
        stack.check_matrix_names(["q", "c_attn"])


@pytest.mark.parametrize("host", [False, True])
def test_preserved_restores_every_parameter_from_device_or_host_copies(host, monkeypatch):
    """Training changes norms too: all of a layer's parameters come back; with `host` the copies
    wait in CPU memory, queued there from a GPU (test_two_devices checks they are only copied back)."""
    model = tiny_model("llama")
    stack = LayerStack(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copies = stack.copies
    kept = []

    def spy(indices, on_host=False, queued=False):
        kept.append((on_host, queued))
        return copies(indices, on_host, queued)

    monkeypatch.setattr(stack, "copies", spy)
    with torch.no_grad(), stack.preserved([1, 2], host=host):
        for param in model.model.layers[1].parameters():
            param.add_(1.0)
        model.model.layers[2].input_layernorm.weight.zero_()
    assert kept == [(host, True)]  # queued: only ever copied back
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_holding_takes_canonical_or_parameter_names():
    model = tiny_model("llama")
    stack = LayerStack(model)
    layer = model.model.layers[1]
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    new_q = torch.full_like(layer.self_attn.q_proj.weight, 0.5)
    new_norm = torch.full_like(layer.post_attention_layernorm.weight, 2.0)
    with stack.holding({1: {"q": new_q, "post_attention_layernorm.weight": new_norm}}):
        assert torch.equal(layer.self_attn.q_proj.weight, new_q)
        assert torch.equal(layer.post_attention_layernorm.weight, new_norm)
        assert torch.equal(layer.mlp.down_proj.weight, before["mlp.down_proj.weight"])
    assert all(torch.equal(layer.state_dict()[k], v) for k, v in before.items())
    assert stack.copies([1], host=True)[1]["self_attn.q_proj.weight"].device.type == "cpu"
