"""The prompt pane's model variants, without a terminal: each is what its experiment defines, and
the loaded model comes back bit for bit. The modified model's marked blocks against the sublayer
map's skip, a block cut and transformers' own forward with the block's module replaced by zeros,
on a sequential family and the parallel-residual ones."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from test_sublayer import BLOCKS, Zeros
from tiny_models import tiny_model
from tui_fixtures import cut, growth_doc, prune_result

from engine.core.errors import UserError
from engine.core.events import decode_or_none
from engine.experiments.ablation.removal import ablated_part, neighbour_mean
from engine.experiments.growth.vocabulary import GrowthResult
from engine.experiments.prune.vocabulary import PruneResult
from engine.experiments.variants import Variant, applied, modified, noised, recovered, saved_model_path
from engine.models.anatomy import LayerStack
from engine.models.families import PARTS
from engine.models.pruning import cut_removed


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in model.state_dict().items()}


def assert_same(model, before: dict[str, torch.Tensor]) -> None:
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_every_variant_restores_the_model_bit_for_bit() -> None:
    model = tiny_model("llama")
    before = snapshot(model)
    stack = LayerStack(model)
    weights = {2: {name: torch.randn_like(p) for name, p in stack.matrices(2).items()}}
    for variant in (
        Variant("original"),
        Variant("modified", layers=(1, 2)),
        Variant("noised", layers=(0, 3), sigma=0.7),
        Variant("recovered", weights=weights),
    ):
        with pytest.raises(KeyError), applied(model, variant):
            if variant.name != "original":
                assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
            raise KeyError("an error inside the block")  # the weights come back all the same
        assert_same(model, before)


def test_modified_is_the_ablation_neighbour_mean_of_the_original_weights() -> None:
    model = tiny_model("llama")
    before = snapshot(model)
    stack = LayerStack(model)
    expected = {i: neighbour_mean(stack, i) for i in (0, 1, 2)}  # adjacent layers: original neighbours
    with modified(model, [2, 1, 0]):
        for index, tensors in expected.items():
            for name, param in stack.matrices(index).items():
                assert torch.equal(param, tensors[name]), (index, name)
        for name, param in stack.matrices(3).items():
            assert torch.equal(param, before[f"model.layers.3.{dict(stack.spec.matrices)[name]}.weight"])
    assert_same(model, before)


IDS = torch.tensor([[5, 70, 33, 101, 9, 250, 17, 3], [44, 2, 200, 8, 8, 120, 61, 77]])


def zeroed_blocks(model, blocks):
    """A copy of `model` whose blocks' modules return zeros: transformers' own forward without them."""
    import copy

    by_hand = copy.deepcopy(model)
    family = by_hand.config.model_type
    for layer, part in blocks:
        path = f"{LayerStack(by_hand).spec.layers}.{layer}.{BLOCKS[family][PARTS.index(part)]}"
        owner, _, name = path.rpartition(".")
        setattr(by_hand.get_submodule(owner), name, Zeros(part == "attention", by_hand.config.hidden_size))
    return by_hand


def no_hooks(model) -> bool:
    return not any(module._forward_hooks for module in model.modules())


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "phi"])  # sequential, and the two parallel-residual
@pytest.mark.parametrize("block", [(1, "attention"), (2, "mlp")])
def test_a_marked_block_is_the_sublayer_maps_skip_and_a_block_cut(family: str, block: tuple[int, str]) -> None:
    """The modified model with one block marked: the same logits as the sublayer map's skip and as
    a block cut of that block (exactly), as transformers' forward with the block's module replaced by
    zeros (a parallel layer keeps the other term); the original's logits, bit for bit, afterwards."""
    model = tiny_model(family)
    stack = LayerStack(model)
    with torch.no_grad():
        before = model(input_ids=IDS).logits
        expected = zeroed_blocks(model, [block])(input_ids=IDS).logits
        with applied(model, Variant("modified", blocks=(block,))):
            got = model(input_ids=IDS).logits
        with ablated_part(stack, *block, "skip"):
            skipped = model(input_ids=IDS).logits
        with cut_removed(model, (block,)):
            cut_out = model(input_ids=IDS).logits
        assert torch.equal(got, skipped) and torch.equal(got, cut_out)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(got, before, atol=1e-4)  # the block mattered
        assert torch.equal(model(input_ids=IDS).logits, before) and no_hooks(model)


@pytest.mark.parametrize("family", ["llama", "phi"])
def test_the_modified_model_mixes_whole_layers_and_blocks(family) -> None:
    """Layer 1 marked whole (its matrices the mean of layers 0 and 2, made here from the state dict)
    and the attention of layer 2 and the MLP of layer 3 marked: transformers' forward of that model
    built by hand; everything back afterwards, weights and hooks, even after an error inside."""
    model = tiny_model(family)
    before, weights = snapshot(model), snapshot(model)
    blocks = [(2, "attention"), (3, "mlp")]
    by_hand = zeroed_blocks(model, blocks)
    prefix = LayerStack(model).spec.layers
    with torch.no_grad():
        for _, path in LayerStack(model).spec.matrices:
            mean = (weights[f"{prefix}.0.{path}.weight"] + weights[f"{prefix}.2.{path}.weight"]) / 2
            by_hand.get_parameter(f"{prefix}.1.{path}.weight").copy_(mean)
        expected = by_hand(input_ids=IDS).logits
        original = model(input_ids=IDS).logits
        with modified(model, [1], blocks):
            got = model(input_ids=IDS).logits
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        with pytest.raises(KeyError), modified(model, [1], blocks):
            raise KeyError("an error inside the block")
        assert_same(model, before)
        assert torch.equal(model(input_ids=IDS).logits, original) and no_hooks(model)


def test_noised_is_reproducible_and_scaled_by_sigma() -> None:
    model = tiny_model("llama")
    before = snapshot(model)
    stack = LayerStack(model)
    original = {name: p.clone() for name, p in stack.matrices(1).items()}
    with noised(model, [1], 0.5):
        first = {name: p.clone() for name, p in stack.matrices(1).items()}
    with noised(model, [1], 0.5):
        again = {name: p.clone() for name, p in stack.matrices(1).items()}
    with noised(model, [1], 1.0):
        double = {name: p.clone() for name, p in stack.matrices(1).items()}
    for name, weight in original.items():
        assert torch.equal(first[name], again[name])  # seed 0 each time
        assert not torch.equal(first[name], weight)
        # the same draw, twice the scale
        torch.testing.assert_close(double[name] - weight, 2 * (first[name] - weight))
        assert float((first[name] - weight).std()) == pytest.approx(0.5 * float(weight.std()), rel=0.2)
    assert_same(model, before)


def test_recovered_holds_the_saved_layers() -> None:
    model = tiny_model("llama")
    before = snapshot(model)
    stack = LayerStack(model)
    weights = {3: {name: torch.randn_like(p) for name, p in stack.matrices(3).items()}}
    with recovered(model, weights):
        for name, param in stack.matrices(3).items():
            assert torch.equal(param, weights[3][name])
    assert_same(model, before)


def test_variant_checks_what_it_is_given(tmp_path) -> None:
    with pytest.raises(UserError, match="unknown model variant"):
        Variant("distilled")
    with pytest.raises(UserError, match="sigma"):
        Variant("noised", layers=(1,), sigma=0.0)
    with pytest.raises(UserError, match="out of range"), modified(tiny_model("llama"), [9]):
        pass
    with pytest.raises(UserError, match="layer 1 is marked whole and its mlp block too"):
        Variant("modified", layers=(1,), blocks=((1, "mlp"),))
    with pytest.raises(UserError, match="unknown block 'attn' of layer 2; use one of attention, mlp"):
        Variant("modified", blocks=((2, "attn"),))
    with pytest.raises(UserError, match="only the modified model removes blocks"):
        Variant("noised", layers=(1,), blocks=((2, "mlp"),))
    model = tiny_model("llama")
    with pytest.raises(UserError, match="layer 9 is out of range"), modified(model, [], [(1, "mlp"), (9, "mlp")]):
        pass
    assert no_hooks(model)  # the block marked before the bad one is put back
    folder = tmp_path / "growth_100"
    result = GrowthResult.from_json(growth_doc({"growth_100": str(folder), "uniform_100": str(tmp_path / "gone")}))
    assert saved_model_path(result, "growth", tmp_path) is None  # not saved yet
    folder.mkdir()
    assert saved_model_path(result, "growth", tmp_path) == folder
    assert saved_model_path(result, "uniform", tmp_path) is None and saved_model_path(None, "growth", tmp_path) is None
    with pytest.raises(UserError, match="not inside session folder"):  # a folder outside the session: refused
        saved_model_path(result, "growth", tmp_path / "other-session")


def test_pruned_drops_the_prune_runs_layers_and_comes_back() -> None:
    """The `pruned` variant is the model with the exported point's layers really removed (the same
    logits as skipping them), and the model is whole again afterwards."""
    from engine.experiments.variants import pruned_layers
    from engine.models.anatomy import LayerStack

    model = tiny_model("llama", seed=5)
    ids = torch.tensor([[5, 9, 13, 21, 34]])
    curve = [cut("ppl", [3]), cut("ppl", [3, 4]), cut("bi", [0, 1, 2])]
    assert pruned_layers(PruneResult.from_json(prune_result(curve, exported_point=cut("bi", [1, 2])))) == (1, 2)
    assert pruned_layers(PruneResult.from_json(prune_result(curve))) == (3, 4) and pruned_layers(None) == ()
    assert decode_or_none(PruneResult, {"curve": []}) is None  # a result this version cannot read removes nothing
    with torch.no_grad():
        whole = model(ids).logits
        with LayerStack(model).skipped([1, 2]):
            skipped = model(ids).logits
        with applied(model, Variant("pruned", layers=(1, 2))):
            assert len(model.model.layers) == 2
            pruned = model(ids).logits
        assert torch.allclose(pruned, skipped, atol=1e-6)
        assert len(model.model.layers) == 4 and torch.equal(model(ids).logits, whole)


def test_out_of_memory_in_a_prompt_column_is_said_there_and_the_others_go_on(monkeypatch, tokenizer, tmp_path):
    """A console thread must not die with the allocator's traceback (which pins the tensors)."""
    import threading

    from textual.message import Message

    import engine.evaluation.generation
    from engine.core.turns import ModelTurns
    from engine.experiments.variants import SavedModels
    from engine.models.loading import LoadedModel
    from sessions.session import Session
    from tui.messages import GenerationDone, TextGenerated
    from tui.workers import Column, GenerationPlan, generate_work

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(engine.evaluation.generation, "generate_text", exhausted)
    posted: list[Message] = []
    loaded = LoadedModel(tiny_model("llama"), tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)
    plan = GenerationPlan(1, "The cat", (Column("left", Variant("original")), Column("right", problem="no model")),
                          4, loaded, ModelTurns(), threading.Event(),
                          cast(Session, None), cast(SavedModels, None))  # neither used: no column loads a model
    generate_work(posted.append, plan)
    texts = [m for m in posted if isinstance(m, TextGenerated)]
    assert [(m.column, m.note) for m in texts] == [
        ("left", "out of memory in generation; try stopping the job that holds the GPU, or --dtype float16"),
        ("right", "no model")]
    assert isinstance(posted[-1], GenerationDone) and not plan.turns.busy
