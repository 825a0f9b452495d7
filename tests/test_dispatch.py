"""Models placed by accelerate (`--device-map`): the experiments see the same model through its hooks.

On the CPU, `dispatch_model(..., force_hooks=True)` installs exactly the hooks a multi-GPU map
installs (a wrapper `forward` on every mapped module that moves inputs to the module's device), and
a "disk" entry offloads a layer the way a full GPU does: its weights become placeholders that the
hook refills on every forward."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from accelerate import dispatch_model
from tiny_models import tiny_model

from engine.core.errors import UserError
from engine.core.events import Result
from engine.data.text import eval_texts
from engine.evaluation.perplexity import Evaluator
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.experiments.dynamics.run import run_dynamics
from engine.experiments.dynamics.vocabulary import DynamicsSettings
from engine.experiments.recovery.run import run_recovery
from engine.experiments.recovery.vocabulary import RecoverySettings
from engine.models.anatomy import LayerStack
from engine.models.placement import layer_runs, parse_max_memory, placement_text

TRAIN = "\n".join(f"The cat number {i} sat on the mat and looked at the dog for a while." for i in range(40))
EVAL = ["The dog sat on the mat.", "A cat looked at the dog.", "Number seven sat for a while."]


def dispatched(model, offload: tuple[int, ...] = (), folder=None):
    """The tiny llama with accelerate's hooks on every layer; layers in `offload` live on disk."""
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    for index in range(model.config.num_hidden_layers):
        device_map[f"model.layers.{index}"] = "disk" if index in offload else "cpu"
    return dispatch_model(model, device_map, offload_dir=folder, force_hooks=True)


def result(events) -> dict:
    events = list(events)
    assert isinstance(events[-1], Result)
    return events[-1].data


@pytest.fixture
def pair():
    """The same tiny model twice: as it is, and dispatched with hooks."""
    return tiny_model("llama", seed=3), dispatched(tiny_model("llama", seed=3))


def test_dispatch_installs_accelerate_wrappers(pair):
    _, model = pair
    for layer in LayerStack(model).layers:
        assert "forward" in layer.__dict__ and hasattr(layer, "_hf_hook")


def test_starting_at_and_skipped_give_back_accelerates_forward(pair):
    _, model = pair
    stack = LayerStack(model)
    wrappers = [layer.__dict__["forward"] for layer in stack.layers]
    hidden = torch.zeros(1, 3, model.config.hidden_size)
    with stack.starting_at(3, hidden):
        assert all(stack.layers[i].__dict__["forward"] is not wrappers[i] for i in range(3))
        assert stack.layers[3].__dict__["forward"] is wrappers[3]
    with stack.skipped([1, 2]):
        assert stack.layers[1].__dict__["forward"] is not wrappers[1]
    assert all(layer.__dict__["forward"] is wrapper for layer, wrapper in zip(stack.layers, wrappers, strict=True))


def test_plain_model_gets_its_class_forward_back(tiny_llama):
    model, _ = tiny_llama
    stack = LayerStack(model)
    with stack.skipped([0]):
        pass
    assert all("forward" not in layer.__dict__ for layer in stack.layers)


def test_prefix_cache_perplexities_match(pair, tokenizer):
    plain, hooked = pair
    texts = eval_texts(subset="paper")
    expected = Evaluator(plain, tokenizer, texts, batch_size=4)
    got = Evaluator(hooked, tokenizer, texts, batch_size=4)
    base = expected.build_cache().perplexity
    assert got.build_cache().perplexity == base
    for layer in range(len(got.stack)):
        assert got.perplexity(layer) == expected.perplexity(layer)
        assert math.isclose(got.perplexity(layer), base, rel_tol=1e-5)


@pytest.mark.parametrize("method", ["mean", "skip", "zero"])
def test_ablation_map_matches(pair, tokenizer, method):
    plain, hooked = pair
    before = {k: v.clone() for k, v in hooked.state_dict().items()}
    settings = AblationSettings(method=method, eval_set="paper", eval_batch_size=4)
    expected = result(run_ablation(plain, tokenizer, settings))
    got = result(run_ablation(hooked, tokenizer, settings))
    assert got["baseline_ppl"] == expected["baseline_ppl"]
    keys = ("layer", "ppl", "degradation_pct", "layer_class", "block_influence", "angular_distance")
    assert [{k: row[k] for k in keys} for row in got["layers"]] == [
        {k: row[k] for k in keys} for row in expected["layers"]
    ]
    after = hooked.state_dict()
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_recovery_curve_matches(pair, tokenizer, tmp_path):
    plain, hooked = pair
    (tmp_path / "train.txt").write_text(TRAIN, encoding="utf-8")
    (tmp_path / "eval.txt").write_text("\n".join(EVAL), encoding="utf-8")
    settings = RecoverySettings(layers=(1, 2), sigma=3.0, steps=3, lr=1e-2, batch_size=2, block_size=16,
                                train_blocks=4, train_file=str(tmp_path / "train.txt"),
                                eval_file=str(tmp_path / "eval.txt"), eval_every=1)  # auto varies with the load
    expected = result(run_recovery(plain, tokenizer, settings))
    got = result(run_recovery(hooked, tokenizer, settings))
    assert [row["curve"] for row in got["layers"]] == [row["curve"] for row in expected["layers"]]
    assert [row["train_loss"] for row in got["layers"]] == [row["train_loss"] for row in expected["layers"]]
    assert not any(p.requires_grad for p in hooked.parameters())


def dynamics_rows(model, tokenizer, text_file) -> tuple[list, list]:
    settings = DynamicsSettings(text_file=str(text_file), max_tokens=200, max_length=64, logit_lens=True)
    doc = result(run_dynamics(model, tokenizer, settings))
    return doc["layers"], doc["logit_lens"]["loss"]


def test_dynamics_match_and_may_run_offloaded(tokenizer, tmp_path):
    text_file = tmp_path / "texts.txt"
    text_file.write_text("\n".join(EVAL * 3), encoding="utf-8")
    expected = dynamics_rows(tiny_model("llama", seed=3), tokenizer, text_file)
    assert dynamics_rows(dispatched(tiny_model("llama", seed=3)), tokenizer, text_file) == expected
    offloaded = dispatched(tiny_model("llama", seed=3), offload=(2, 3), folder=tmp_path / "offload")
    assert dynamics_rows(offloaded, tokenizer, text_file) == expected


def test_offloaded_layer_refuses_weight_edits(tokenizer, tmp_path):
    model = dispatched(tiny_model("llama", seed=3), offload=(3,), folder=tmp_path / "offload")
    stack = LayerStack(model)
    assert stack.layer_devices() == ["cpu", "cpu", "cpu", "disk"]
    assert [stack.is_offloaded(i) for i in range(4)] == [False, False, False, True]
    stack.check_editable([0, 1, 2])
    message = "layer 3 is offloaded; weight edits need it on a GPU: raise --max-memory or drop --device-map"
    with pytest.raises(UserError, match=message), stack.preserved([3]):
        pass
    with pytest.raises(UserError, match="layer 3 is offloaded"):  # layer 2's neighbour mean reads layer 3
        result(run_ablation(model, tokenizer, AblationSettings(eval_set="paper")))
    skip = result(run_ablation(model, tokenizer, AblationSettings(method="skip", eval_set="paper")))
    plain = result(run_ablation(tiny_model("llama", seed=3), tokenizer,
                                AblationSettings(method="skip", eval_set="paper")))
    assert [row["ppl"] for row in skip["layers"]] == [row["ppl"] for row in plain["layers"]]


def test_max_memory_parsing():
    assert parse_max_memory("0=14GiB, 1=14GiB,cpu=30GiB") == {0: "14GiB", 1: "14GiB", "cpu": "30GiB"}
    assert parse_max_memory(None) is None
    for bad, words in (("0:14GiB", "DEVICE=SIZE"), ("gpu0=1GiB", "GPU index"), ("0=14", "14GiB"),
                       ("0=1GiB,0=2GiB", "twice")):
        with pytest.raises(UserError, match=words):
            parse_max_memory(bad)


def test_placement_runs():
    devices = ["cuda:0"] * 3 + ["cuda:1"] * 2 + ["disk"]
    assert layer_runs(devices) == [{"device": "cuda:0", "layers": [0, 2]}, {"device": "cuda:1", "layers": [3, 4]},
                                  {"device": "disk", "layers": [5, 5]}]
    assert placement_text(devices) == "layers 0-2 cuda:0, 3-4 cuda:1, 5 disk"


def test_weights_reads_offloaded_layers_and_refuses_to_replace_them(tokenizer, tmp_path):
    """Offloaded layers' parameters are `meta` placeholders: the statistics read accelerate's store."""
    from engine.experiments.weights.run import run_weights
    from engine.experiments.weights.vocabulary import WeightsSettings

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(EVAL), encoding="utf-8")
    settings = WeightsSettings(first_layer=0, eval_file=str(texts), null_draws=2, paradox=False)
    expected = result(run_weights(tiny_model("llama", seed=3), tokenizer, settings))
    offloaded = dispatched(tiny_model("llama", seed=3), offload=(2, 3), folder=tmp_path / "offload")
    got = result(run_weights(offloaded, tokenizer, settings))
    assert got["components"] == expected["components"]
    with pytest.raises(UserError, match="layer [23] is offloaded"):
        result(run_weights(offloaded, tokenizer, dataclasses.replace(settings, paradox=True, paradox_counts=(0,))))
