"""`prune`: each criterion's cuts, the curve against skipping by hand, SLEB's greedy order,
healing that restores the model exactly, export round-trips for every family, one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from tiny_models import EVAL, TINY_CONFIGS, out_of_memory_in_training, tiny_model
from transformers import AutoModelForCausalLM
from tui_fixtures import ablation_map as fixture_map
from tui_fixtures import round_trips

from engine.core.errors import UserError
from engine.core.events import Result
from engine.evaluation.perplexity import Evaluator
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow
from engine.experiments.context import RunContext
from engine.experiments.prune.criteria import map_degradation
from engine.experiments.prune.healing import neighbours_of_cuts
from engine.experiments.prune.vocabulary import PrunePoint, PruneScores, PruneSettings
from engine.models.anatomy import LayerStack
from engine.models.loading import LoadedModel
from engine.registry import experiment

CURVE_KEYS = {"method", "removed", "layers", "ppl", "ci_low", "ci_high", "healed_ppl", "removed_params"}


pytestmark = pytest.mark.usefixtures("one_thread")


def loaded(model, tokenizer, name="tiny") -> LoadedModel:
    n = len(LayerStack(model))
    return LoadedModel(model, tokenizer, name, "test", "cpu", "float32", model.config.model_type, n)


def run_prune(model, tokenizer, settings: PruneSettings, inputs=None, name="tiny") -> tuple[list, dict]:
    context = RunContext(model=loaded(model, tokenizer, name), inputs=inputs or {})
    events = list(experiment("prune").run(settings, context))
    assert isinstance(events[-1], Result) and events[-1].name == "prune"
    assert round_trips("prune", events[-1].data)  # built from PruneResult, read back the same
    return events, events[-1].data


def ppl_skipping(model, tokenizer, layers, eval_file) -> float:
    """The perplexity on the texts of `eval_file` (EVAL) with those layers skipped, by hand."""
    evaluator = Evaluator(model, tokenizer, EVAL, 8, 256)
    with evaluator.stack.skipped(layers):
        return evaluator.perplexity()


def ablation_map(degradations, key="layer", model="tiny"):
    """A session's ablation map with these D %; `key="index"`: its rows as version 1 spelled them."""
    doc = fixture_map([AblationRow(i, None, d, "minor") for i, d in enumerate(degradations)], model=model)
    doc["layers"] = [{(key if k == "layer" else k): v for k, v in row.items()} for row in doc["layers"]]
    return doc


def test_curve_equals_skipping_and_document_shape(tokenizer, files):
    model = tiny_model("llama")
    before = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    settings = PruneSettings(eval_file=files[0], remove=(1, 2, 3), bootstrap=50)
    events, doc = run_prune(model, tokenizer, settings, {"ablation": ablation_map([50.0, 3.0, 1.0, 20.0])})
    assert set(doc) >= {"model", "baseline_ppl", "eval_tokens", "settings", "curve", "agreement", "depth_fit",
                        "exported"}
    assert doc["exported"] is None and doc["methods"] == ["angular", "angular_last", "bi", "ppl", "map", "last"]
    assert len(doc["curve"]) == 18
    for point in doc["curve"]:
        assert set(point) == CURVE_KEYS
        assert point["removed"] == len(point["layers"])
        assert point["ppl"] == pytest.approx(ppl_skipping(model, tokenizer, point["layers"], files[0]), rel=1e-6)
        assert point["ci_low"] <= point["ppl"] <= point["ci_high"] and point["healed_ppl"] is None
    by = {(p["method"], p["removed"]): p["layers"] for p in doc["curve"]}
    assert by[("map", 1)] == [2] and by[("map", 2)] == [1, 2] and by[("map", 3)] == [1, 2, 3]
    scores = next(e.scores for e in events if isinstance(e, PruneScores) and e.method == "bi")
    bi = [score for score in scores if score is not None]
    assert len(bi) == len(scores)  # bi scores every layer
    assert by[("bi", 2)] == sorted(np.argsort(bi)[:2].tolist())
    for count in (1, 2, 3):  # an angular cut is a block of consecutive layers
        for method in ("angular", "angular_last"):
            layers = by[(method, count)]
            assert layers == list(range(layers[0], layers[0] + count))
    assert set(doc["agreement"]) == {"angular", "angular_last", "bi", "map"}
    assert len([e for e in events if isinstance(e, PrunePoint)]) == 18
    torch.testing.assert_close(model(input_ids=torch.tensor([[1, 2, 3]])).logits, before, rtol=0, atol=0)


def test_ppl_criterion_is_greedy_sleb(tokenizer, files):
    model = tiny_model("qwen3", seed=3)
    _, doc = run_prune(model, tokenizer, PruneSettings(method="ppl", eval_file=files[0], remove=(1, 2), bootstrap=0))
    singles = [ppl_skipping(model, tokenizer, [i], files[0]) for i in range(4)]
    first = int(np.argmin(singles))
    assert doc["scores"]["ppl"] == pytest.approx(singles, rel=1e-6)
    rest = [i for i in range(4) if i != first]
    second = min(rest, key=lambda i: ppl_skipping(model, tokenizer, [first, i], files[0]))
    assert doc["curve"][0]["layers"] == [first]
    assert doc["curve"][1]["layers"] == sorted([first, second])
    assert doc["agreement"] == {}


def test_map_reads_layer_and_old_index_rows():
    assert map_degradation(AblationMap.from_json(ablation_map([5.0, 1.0]))) == {0: 5.0, 1: 1.0}
    assert map_degradation(AblationMap.from_json(ablation_map([5.0, 1.0], key="index"))) == {0: 5.0, 1: 1.0}
    assert map_degradation(None) == {}


def test_neighbours_of_cuts():
    assert neighbours_of_cuts(10, [3, 4, 7]) == (2, 5, 6, 8)
    assert neighbours_of_cuts(4, [0]) == (1,)


@pytest.mark.parametrize("heal", ["adjacent", "lora"])
def test_healing_restores_the_model_exactly(tokenizer, files, heal):
    model = tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 8]])
    before = model(input_ids=ids).logits
    settings = PruneSettings(method="bi", eval_file=files[0], train_file=files[1], remove=(1, 2), bootstrap=0,
                             heal_steps=3, heal=heal, lr=1e-2, block_size=16, batch_size=2, train_blocks=4)
    _, doc = run_prune(model, tokenizer, settings)
    for point in doc["curve"]:
        assert point["healed_ppl"] is not None and point["healed_ppl"] != point["ppl"]
    assert doc["heal"]["what"] == heal
    torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)
    assert not any(p.requires_grad for p in model.parameters())
    assert "lora" not in " ".join(name for name, _ in model.named_modules())


def reloaded_ppl(folder, tokenizer, eval_file) -> float:
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    model.eval()
    return Evaluator(model, tokenizer, EVAL, 8, 256).perplexity()


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_export_round_trips(tokenizer, files, tmp_path, family):
    model = tiny_model(family)
    folder = tmp_path / "out"
    settings = PruneSettings(method="bi", eval_file=files[0], remove=(1, 2), bootstrap=0, export=str(folder),
                             export_count=2)
    _, doc = run_prune(model, tokenizer, settings)
    assert doc["exported"] == str(folder)
    point = doc["exported_point"]
    assert point["removed"] == 2
    reloaded = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    assert reloaded.config.num_hidden_layers == 2 and len(LayerStack(reloaded)) == 2
    assert reloaded_ppl(folder, tokenizer, files[0]) == point["ppl"]
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert ", ".join(map(str, point["layers"])) in card and "bi" in card


def test_export_of_a_lora_healed_model_gives_the_healed_ppl(tokenizer, files, tmp_path):
    model = tiny_model("llama")
    folder = tmp_path / "healed"
    settings = PruneSettings(method="ppl", eval_file=files[0], train_file=files[1], remove=(1,), bootstrap=0,
                             heal_steps=3, heal="lora", lr=1e-2, block_size=16, batch_size=2, train_blocks=4,
                             export=str(folder))
    _, doc = run_prune(model, tokenizer, settings)
    healed = doc["exported_point"]["healed_ppl"]
    assert healed != doc["exported_point"]["ppl"]
    assert reloaded_ppl(folder, tokenizer, files[0]) == healed


def test_one_line_errors(tokenizer, files, tmp_path):
    model = tiny_model("llama")

    def fails(match, inputs=None, **changes):
        settings = PruneSettings(**{"eval_file": files[0], "bootstrap": 0, "method": "bi", **changes})
        with pytest.raises(UserError, match=match) as info:
            run_prune(model, tokenizer, settings, inputs)
        assert "\n" not in str(info.value)

    fails("cannot remove 4 layers: this model has 4", remove=(4,))
    fails("cannot remove 9 layers", remove=(1, 9))
    fails("removes none", max_fraction=0.1)
    full = tmp_path / "full"
    full.mkdir()
    (full / "something.txt").write_text("x")
    fails("exists and is not empty", remove=(1,), export=str(full))
    fails("not a count of the curve", remove=(1,), export=str(tmp_path / "new"), export_count=2)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    fails("is empty", remove=(1,), heal_steps=2, train_file=str(empty))
    fails("needs the session's ablation map", remove=(1,), method="map")
    fails("needs the session's ablation map", {"ablation": ablation_map([1.0] * 4, model="other")},
          remove=(1,), method="map")
    with pytest.raises(UserError, match="--export-count needs --export"):
        PruneSettings(export_count=2).validate()
    _, doc = run_prune(model, tokenizer, PruneSettings(eval_file=files[0], bootstrap=0, method="bi", remove=(1,),
                                                       export=str(full), force=True))
    assert (full / "config.json").exists() and (full / "something.txt").exists()


def test_max_fraction_counts():
    assert PruneSettings(max_fraction=0.5).counts(8) == (1, 2, 3, 4)
    assert PruneSettings(remove=(4, 1, 2)).counts(30) == (1, 2, 4)


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_healing_lowers_heldout_ppl_and_export_round_trips(embedded, tmp_path, files):
    """SmolLM2 cut by 4 layers, the layers next to the cut fine-tuned on the training half of the
    built-in corpus: held-out perplexity falls; the exported folder gives the healed perplexity."""
    folder = tmp_path / "smol-pruned"
    settings = PruneSettings(method="bi", eval_file=files[0], remove=(4,), bootstrap=0, heal_steps=4, lr=3e-4,
                             block_size=32, batch_size=2, train_blocks=16, export=str(folder))
    _, doc = run_prune(embedded.model, embedded.tokenizer, settings, name=embedded.name)
    point = doc["curve"][0]
    assert math.isfinite(point["ppl"]) and point["healed_ppl"] < point["ppl"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.eval()
    assert model.config.num_hidden_layers == 26
    assert Evaluator(model, embedded.tokenizer, EVAL, 8, 256).perplexity() == pytest.approx(point["healed_ppl"],
                                                                                           rel=1e-6)
    card = ModelCard.load(folder / "README.md").data  # the Hub model the embedded GGUF was quantized from
    assert card.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.to_dict()["anatomy_tui"]["removed_layers"] == point["layers"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heal", ["adjacent", "lora"])
def test_half_precision_healing_trains_float32_masters_and_restores(tokenizer, files, monkeypatch, heal, dtype):
    """A half model heals under autocast (float32 masters), float16 with every step's loss scaled
    (its gradients below 6e-8 would flush to zero), as recovery's; it is half and unchanged after."""
    scaled = []
    scale = torch.amp.GradScaler.scale

    def spy(self, outputs):
        scaled.append(self.is_enabled())
        return scale(self, outputs)

    monkeypatch.setattr(torch.amp.GradScaler, "scale", spy)
    model = tiny_model("llama").to(dtype)
    ids = torch.tensor([[5, 6, 7, 8]])
    before = model(input_ids=ids).logits
    settings = PruneSettings(method="bi", eval_file=files[0], train_file=files[1], remove=(1,), bootstrap=0,
                             heal_steps=3, heal=heal, lr=1e-2, block_size=16, batch_size=2, train_blocks=4)
    _, doc = run_prune(model, tokenizer, settings)
    point = doc["curve"][0]
    assert math.isfinite(point["healed_ppl"]) and point["healed_ppl"] < point["ppl"]
    assert scaled == [dtype == torch.float16] * 3
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert torch.equal(model(input_ids=ids).logits, before)


def test_depth_fit_recovers_a_known_law():
    from engine.evaluation.depth_law import fit_depth
    from engine.evaluation.perplexity import TextScores
    from engine.experiments.prune.depth_law import depth_law

    depths = np.array([30.0, 29, 28, 26, 22, 18])
    fit = fit_depth(depths, 2.0 + 30.0 / depths**1.2)
    assert fit["a"][0] == pytest.approx(1.2) and fit["c"][0] == pytest.approx(30.0)
    assert fit["L0"][0] == pytest.approx(2.0)
    tokens = np.full(6, 10.0)
    points = [(30 - int(d), TextScores(tokens * (2.0 + 30.0 / d**1.2), tokens)) for d in depths]
    law = depth_law(30, points, 200, 0)
    assert law is not None
    assert law.a == pytest.approx(1.2) and law.ci95 == pytest.approx([1.2, 1.2])
    assert "exploratory" in law.label and law.chinchilla.a_l == 1.2
    assert depth_law(30, points[:3], 200, 0) is None


def test_angular_block_by_hand(tokenizer, files):
    """The angular cut of 2 is the block whose input and the input two layers on are closest."""
    model = tiny_model("gemma2", seed=1)
    _, doc = run_prune(model, tokenizer, PruneSettings(method="angular", eval_file=files[0], remove=(1, 2),
                                                       bootstrap=0))
    evaluator = Evaluator(model, tokenizer, EVAL, 8, 256)
    states: dict[int, list] = {}

    def keep(_batch, index, layer_input, layer_output):
        states.setdefault(index, []).append(layer_input)
        if index == 3:
            states.setdefault(4, []).append(layer_output)

    with torch.no_grad(), evaluator.stack.capture(keep):
        for batch in evaluator.batches:
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    distance = []
    for start in range(3):
        total = count = 0.0
        for b, batch in enumerate(evaluator.batches):
            cos = torch.nn.functional.cosine_similarity(states[start][b], states[start + 2][b], dim=-1)
            total += float((torch.arccos(cos.clamp(-1, 1)) / math.pi * batch.attention_mask).sum())
            count += float(batch.attention_mask.sum())
        distance.append(total / count)
    start = int(np.argmin(distance))
    assert doc["curve"][1]["layers"] == [start, start + 1]
    assert len(doc["scores"]["angular"]) == 4


@pytest.mark.parametrize("heal", ["adjacent", "lora"])
def test_healing_refuses_an_offloaded_layer_before_training(tokenizer, files, tmp_path, heal):
    """Layer 3 lives on disk (accelerate refills it at every forward, so training it would change
    nothing): the cut of layer 2 has it as a neighbour, and LoRA trains every kept layer."""
    from test_dispatch import dispatched

    model = dispatched(tiny_model("llama"), offload=(3,), folder=tmp_path / "offload")
    settings = PruneSettings(method="map", eval_file=files[0], train_file=files[1], remove=(1,), bootstrap=0,
                             heal_steps=2, heal=heal, lr=1e-2, block_size=16, batch_size=2, train_blocks=4)
    with pytest.raises(UserError, match="^layer 3 is offloaded; .*--device-map") as info:
        run_prune(model, tokenizer, settings, {"ablation": ablation_map([50.0, 40.0, 1.0, 30.0])})
    assert "\n" not in str(info.value)


def test_out_of_memory_in_healing_is_one_line_and_restores(tokenizer, files, monkeypatch):
    from engine.models import oom

    freed = []
    monkeypatch.setattr(oom, "release_memory", lambda: freed.append(True))
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out_of_memory_in_training(monkeypatch, model.model.layers[3])
    settings = PruneSettings(method="map", eval_file=files[0], train_file=files[1], remove=(1,), bootstrap=0,
                             heal_steps=2, lr=1e-2, block_size=16, batch_size=2, train_blocks=4)
    with pytest.raises(UserError, match=r"^out of memory in prune healing; try .*--batch-size") as info:
        run_prune(model, tokenizer, settings, {"ablation": ablation_map([50.0, 40.0, 1.0, 30.0])})
    assert "\n" not in str(info.value) and freed == [True]
    monkeypatch.undo()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert not any(p.requires_grad for p in model.parameters())
