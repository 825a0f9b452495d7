"""Layer weights kept in a session (the recovered layers) and put into a model exactly."""

from __future__ import annotations

import torch
from test_recovery import settings_for, texts  # noqa: F401  (texts is a fixture)
from tiny_models import tiny_model

from engine.experiments.recovery.checkpoints import save_layer_weights
from engine.experiments.recovery.run import run_recovery
from engine.models.anatomy import LayerStack
from sessions.layer_weights import load_layers, saved_layers
from sessions.store import SessionStore


def test_round_trip_other_model_and_damaged_file():
    session = SessionStore().create("w")
    tensors = {"q": torch.randn(4, 4), "down": torch.randn(4, 8)}
    folder = session.checkpoint_dir("recovery") / "weights"
    save_layer_weights(folder, 3, tensors, "tiny")
    save_layer_weights(folder, 5, tensors, "another-model")
    damaged = session.path / "checkpoints" / "recovery" / "weights" / "layer-7.safetensors"
    damaged.write_bytes(b"not safetensors")
    assert saved_layers(session, "recovery") == [3, 5, 7]
    loaded = load_layers(session, "recovery", "tiny")
    assert list(loaded) == [3]
    assert all(torch.equal(loaded[3][name], tensors[name]) for name in tensors)
    assert saved_layers(SessionStore().create("empty"), "recovery") == []


def test_holding_swaps_in_and_restores_exactly():
    model = tiny_model("llama")
    stack = LayerStack(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    new = {name: torch.randn_like(param) for name, param in stack.matrices(1).items()}
    with stack.holding({1: new}):
        assert all(torch.equal(stack.matrices(1)[name], new[name]) for name in new)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_recovery_hands_over_each_recovered_layer(tiny_llama, texts):  # noqa: F811
    model, tokenizer = tiny_llama
    stack = LayerStack(model)
    original = {i: {n: p.clone() for n, p in stack.matrices(i).items()} for i in (1, 2)}
    kept: dict[int, dict[str, torch.Tensor]] = {}
    list(run_recovery(model, tokenizer, settings_for(texts, steps=3),
                      keep_weights=lambda index, tensors: kept.__setitem__(index, tensors)))
    assert sorted(kept) == [1, 2]
    for index, tensors in kept.items():
        # noised and fine-tuned: not the original layer, which is itself back in the model
        assert not torch.equal(tensors["q"], original[index]["q"])
        assert all(torch.equal(stack.matrices(index)[n], original[index][n]) for n in tensors)
