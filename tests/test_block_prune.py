"""`prune --unit block`: every criterion ranks and removes attention and MLP blocks apart, a count n
cuts blocks until their parameters reach n layers' worth. Against independent cases: the removed
parameters counted by hand, a block whose output weights are zero ranked first, a cut equal to
transformers' own forward with the blocks' modules replaced by zeros, SLEB's greedy search over
blocks against skipping each by hand, and exports that reload in plain transformers to the
in-memory cut's logits over several families."""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest
import torch
from test_prune import run_prune
from test_sublayer import BLOCKS, Zeros
from tiny_models import EVAL, tiny_model
from transformers import AutoModelForCausalLM
from tui_fixtures import ablation_map

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.evaluation.perplexity import Evaluator
from engine.experiments.ablation.vocabulary import AblationRow
from engine.experiments.prune.criteria import layers_worth
from engine.experiments.prune.vocabulary import PruneSettings
from engine.models import families
from engine.models.anatomy import LayerStack
from engine.models.families import PARTS
from engine.models.memory import ModelShape
from engine.models.pruning import blocks_removed, removed_params, split_cut

pytestmark = pytest.mark.usefixtures("one_thread")
IDS = torch.tensor([[5, 70, 33, 101, 9, 250, 17, 3], [44, 2, 200, 8, 8, 120, 61, 77]])
# tiny llama (tests/tiny_models.py): hidden 32, MLP 64, 4 heads of 8, 2 key-value heads, no biases
ATTENTION = 32 * 32 + 2 * (32 * 16) + 32 * 32  # q, k, v, o
MLP = 3 * 32 * 64  # gate, up, down
LAYER = ATTENTION + MLP + 2 * 32  # and the two RMSNorms


def cut_of(point: dict) -> tuple:
    return tuple((b["layer"], b["part"]) for b in point["blocks"])


def test_removed_parameters_by_hand():
    model = tiny_model("llama")
    assert removed_params(model, [(1, "attention")]) == ATTENTION
    assert removed_params(model, [(2, "mlp")]) == MLP
    assert removed_params(model, [(1, "attention"), (2, "mlp")]) == ATTENTION + MLP
    assert removed_params(model, [(3, "mlp"), (3, "attention")]) == LAYER  # both blocks: the layer, norms too
    assert layers_worth(model, 2) == 2 * LAYER
    assert split_cut([(3, "mlp"), (0, "mlp"), (3, "attention")]) == ((3,), ((0, "mlp"),))


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "phi", "gpt2", "opt"])
def test_a_block_cut_is_transformers_forward_with_the_blocks_replaced_by_zeros(family):
    """Blocks removed alone skip their term (a parallel layer keeps the other one); a layer that
    loses both is removed whole; equal to the model whose blocks' modules return zeros."""
    model = tiny_model(family)
    cut = [(1, "attention"), (2, "mlp"), (3, "attention"), (3, "mlp")]
    by_hand = copy.deepcopy(model)
    for layer, part in cut:
        path = f"{LayerStack(by_hand).spec.layers}.{layer}.{BLOCKS[family][PARTS.index(part)]}"
        owner, _, name = path.rpartition(".")
        width = by_hand.config.hidden_size if family != "gpt2" else by_hand.config.n_embd
        setattr(by_hand.get_submodule(owner), name, Zeros(part == "attention", width))
    with torch.no_grad():
        expected = by_hand(input_ids=IDS).logits
        before = model(input_ids=IDS).logits
        with blocks_removed(model, cut) as kept:
            assert kept == (0, 1, 2) and len(LayerStack(model)) == 3
            got = model(input_ids=IDS).logits
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(model(input_ids=IDS).logits, before, rtol=0, atol=0)  # put back exactly
    assert len(LayerStack(model)) == 4


def zeroed_mlp_model():
    """Tiny llama whose layer 2 MLP has a zero output projection: that block adds exactly nothing."""
    model = tiny_model("llama")
    with torch.no_grad():
        weight = LayerStack(model).part_output(2, "mlp").weight
        assert isinstance(weight, torch.Tensor)  # a Linear's
        weight.zero_()
    return model


@pytest.mark.parametrize("method", ["angular", "angular_last", "bi"])
def test_a_block_that_adds_nothing_is_ranked_first(tokenizer, files, method):
    model = zeroed_mlp_model()
    settings = PruneSettings(method=method, unit="block", eval_file=files[0], remove=(1, 2), bootstrap=0)
    _, doc = run_prune(model, tokenizer, settings)
    scores = doc["scores"][method]
    # (2, mlp) in running order: zero up to float32 rounding, which arccos near 1 turns into 1e-4
    assert len(scores) == 8 and scores[2 * 2 + 1] == pytest.approx(0.0, abs=1e-3)
    assert min(range(8), key=scores.__getitem__) == 5
    for point in doc["curve"]:
        cut = cut_of(point)
        assert (2, "mlp") in cut
        params = point["removed_params"]
        assert params == removed_params(model, cut) >= point["removed"] * LAYER  # reaches n layers' worth
        last = max(cut, key=lambda b: scores[2 * b[0] + PARTS.index(b[1])])  # the block taken last
        assert removed_params(model, [b for b in cut if b != last]) < point["removed"] * LAYER  # none more
        assert point["layers"] == list(split_cut(cut)[0])


def test_last_and_map_orders(tokenizer, files):
    model = tiny_model("llama")
    # a sublayer map (ablation --part both) where layer 0's attention and layer 1's MLP hurt least
    degradation = {(0, "attention"): 0.5, (1, "mlp"): 1.0}
    parts = [AblationRow(i, None, degradation.get((i, part), 50.0 + i), "minor", part=part)
             for i in range(4) for part in PARTS]
    doc_map = ablation_map([AblationRow(i, None, 10.0, "minor") for i in range(4)], model="tiny")
    doc_map["parts"] = json_safe(parts)
    settings = PruneSettings(method="all", unit="block", eval_file=files[0], remove=(1,), bootstrap=0)
    _, doc = run_prune(model, tokenizer, settings, {"ablation": doc_map})
    by = {p["method"]: p for p in doc["curve"]}
    assert cut_of(by["last"]) == ((3, "attention"), (3, "mlp"))  # the last MLP (6144 < 9280), then its attention
    assert by["last"]["layers"] == [3] and by["last"]["removed_params"] == LAYER
    # 3072 + 6144 = 9216 < 9280: a third block, layer 0's MLP (D 50), which takes layer 0 whole
    assert cut_of(by["map"]) == ((0, "attention"), (0, "mlp"), (1, "mlp"))
    assert by["map"]["layers"] == [0] and by["map"]["removed_params"] == LAYER + MLP
    assert doc["depth_fit"] is None


def test_ppl_criterion_is_greedy_over_blocks(tokenizer, files):
    model = tiny_model("qwen3", seed=3)
    settings = PruneSettings(method="ppl", unit="block", eval_file=files[0], remove=(1,), bootstrap=0)
    _, doc = run_prune(model, tokenizer, settings)
    stack = LayerStack(model)

    def skipping(blocks) -> float:
        evaluator = Evaluator(model, tokenizer, EVAL, 8, 256)
        with contextlib.ExitStack() as skips:
            for layer, part in blocks:
                skips.enter_context(stack.part_skipped(layer, part))
            return evaluator.perplexity()

    units = [(i, part) for i in range(4) for part in PARTS]
    singles = [skipping([unit]) for unit in units]
    assert doc["scores"]["ppl"] == pytest.approx(singles, rel=1e-6)
    order = [min(units, key=lambda u: singles[units.index(u)])]
    while removed_params(model, order) < layers_worth(model, 1):
        rest = [u for u in units if u not in order]
        order.append(min(rest, key=lambda u: skipping([*order, u])))
    assert set(cut_of(doc["curve"][0])) == set(order)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "phi"])
def test_block_export_reloads_to_identical_logits(tokenizer, files, tmp_path, family):
    model = tiny_model(family)
    folder = tmp_path / "out"
    settings = PruneSettings(method="bi", unit="block", eval_file=files[0], remove=(1, 2), bootstrap=0,
                             export=str(folder), export_count=2)
    _, doc = run_prune(model, tokenizer, settings)
    point = doc["exported_point"]
    cut = cut_of(point)
    whole, alone = split_cut(cut)
    assert alone, "the cut should hold blocks removed alone, which the export zeroes"
    with blocks_removed(model, cut), torch.no_grad():
        expected = model(input_ids=IDS).logits
    reloaded = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert type(reloaded) is type(model) and reloaded.config.num_hidden_layers == 4 - len(whole)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=IDS).logits, expected, rtol=0, atol=0)
    kept = [i for i in range(4) if i not in whole]
    stack = LayerStack(reloaded)
    for layer, part in alone:
        for param in stack.part_output(kept.index(layer), part).parameters():
            assert not param.any()
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "still costs its compute" in card and not (folder / "mergekit.yaml").exists()
    assert all(f"{layer} {part}" in card for layer, part in cut)


def test_healing_a_block_cut_restores_the_model_exactly(tokenizer, files):
    model = tiny_model("llama")
    before = {name: p.clone() for name, p in model.named_parameters()}
    settings = PruneSettings(method="bi", unit="block", eval_file=files[0], train_file=files[1], remove=(1,),
                             bootstrap=0, heal_steps=3, lr=1e-2, block_size=16, batch_size=2, train_blocks=4)
    _, doc = run_prune(model, tokenizer, settings)
    assert doc["curve"][0]["healed_ppl"] not in (None, doc["curve"][0]["ppl"])
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_one_line_errors_before_the_load(monkeypatch):
    shape = ModelShape(params=1, n_layers=4, hidden=32, intermediate=64, heads=4, vocab=260, family="llama")
    PruneSettings(unit="block", remove=(1,)).check_against(shape)
    unnamed = families.Family("Llama / SmolLM", "model.layers", families.FAMILIES["llama"].matrices)
    monkeypatch.setitem(families.FAMILIES, "llama", unnamed)
    PruneSettings(remove=(1,)).check_against(shape)  # whole layers need no blocks
    with pytest.raises(UserError, match=r"--unit: .*Llama / SmolLM \(llama\); use --unit layer") as caught:
        PruneSettings(unit="block", remove=(1,)).check_against(shape)
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match="--replace works on whole layers"):
        PruneSettings(method="angular", unit="block", replace=("linear",)).validate()
    opt = ModelShape(params=1, n_layers=4, hidden=32, intermediate=64, heads=4, vocab=260, family="opt")
    with pytest.raises(UserError, match="LoRA would wrap"):
        PruneSettings(unit="block", heal="lora", heal_steps=1, remove=(1,)).check_against(opt)


def test_the_console_names_a_block_cut():
    from engine.experiments.prune.vocabulary import PruneCut, PrunedBlock
    from tui.views.prune import cut_text

    blocks = [PrunedBlock(3, "attention"), PrunedBlock(3, "mlp"), PrunedBlock(1, "mlp"), PrunedBlock(12, "attention")]
    point = PruneCut(method="bi", removed=2, layers=[3], ppl=1.0, ci_low=None, ci_high=None, healed_ppl=None,
                     blocks=blocks, removed_params=10)
    assert cut_text(point) == "1m,3,12a"
    assert cut_text(PruneCut(method="bi", removed=3, layers=[4, 5, 7], ppl=1.0, ci_low=None, ci_high=None,
                             healed_ppl=None)) == "4-5,7"


def test_a_block_cut_is_not_taken_for_the_pruned_layers():
    """The `pruned` variant (evaluate, the prompt pane) drops layers: a block cut exported is not one."""
    from engine.experiments.prune.vocabulary import PruneCut, PrunedBlock, sample
    from engine.experiments.session_models import pruned_layers

    block = PruneCut(method="bi", removed=1, layers=[], ppl=1.0, ci_low=None, ci_high=None, healed_ppl=None,
                     blocks=[PrunedBlock(2, "mlp")], removed_params=1)
    layer = PruneCut(method="ppl", removed=2, layers=[1, 3], ppl=1.0, ci_low=None, ci_high=None, healed_ppl=None)
    result = dataclasses.replace(sample(), curve=[block, layer], exported_point=block)
    assert pruned_layers(result) == (1, 3)
    assert pruned_layers(dataclasses.replace(result, curve=[block])) == ()


def test_adjacent_healing_of_a_block_cut_is_planned_for_every_layer():
    """One layer's worth of tiny llama's blocks can be four attention blocks (4 x 3072 >= 9280 > 3 x
    3072), one in every layer: adjacent healing may then train them all, and the memory plan holds that."""
    model = tiny_model("llama")
    shape = ModelShape.from_config(model.config)
    assert removed_params(model, [(i, "attention") for i in range(3)]) < layers_worth(model, 1)
    training = PruneSettings(unit="block", heal_steps=5, remove=(1,)).training_needs(shape)
    assert training is not None  # heal_steps: it trains
    assert training.params == shape.n_layers * LAYER == shape.n_layers * shape.layer_params
