"""Anatomy below the layer: each layer's attention and MLP blocks removed alone (`--part`), against
hand-built known answers and against transformers' own forward with the block's module replaced,
on a sequential family and a parallel-residual one; the blocks' proxies against the residual
stream read independently; `--proxies-only` equal to the map's proxies; old maps byte for byte."""

from __future__ import annotations

import json
import math
from typing import cast

import numpy as np
import pytest
import torch
from tiny_models import byte_tokenizer, tiny_model

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import Result
from engine.data.text import eval_texts
from engine.evaluation.perplexity import Evaluator
from engine.evaluation.statistics import importance_class
from engine.experiments.ablation import vocabulary
from engine.experiments.ablation.rankings import merge_shards
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationMap, AblationProxyMap, AblationSettings, LayerAblated
from engine.models import families
from engine.models.anatomy import LayerStack
from engine.models.memory import ModelShape

TEXTS = eval_texts(subset="paper")

# Where transformers keeps each block, replaced below by a module of zeros: the block itself (Gemma's
# post-norm of zero is zero), OPT's MLP its fc2 (the MLP has no module of its own).
BLOCKS = {"llama": ("self_attn", "mlp"), "gpt_neox": ("attention", "mlp"), "gemma2": ("self_attn", "mlp"),
          "opt": ("self_attn", "fc2"), "gpt2": ("attn", "mlp"), "phi": ("self_attn", "mlp")}  # fmt: skip


class Zeros(torch.nn.Module):
    """A block that adds nothing: attention modules return (output, weights), the MLP a tensor."""

    def __init__(self, attention: bool, width: int = 32) -> None:
        super().__init__()
        self.attention, self.width = attention, width  # the residual's width (OPT's fc2 reads the MLP's)

    def forward(self, hidden_states=None, *args, **kwargs):
        hidden = hidden_states if hidden_states is not None else args[0]
        zeros = hidden.new_zeros(*hidden.shape[:-1], self.width)
        return (zeros, None) if self.attention else zeros


def the_map(model, **settings) -> tuple[list, dict]:
    events = list(run_ablation(model, byte_tokenizer(), AblationSettings(eval_set="paper", **settings),
                               model_name="tiny"))
    assert isinstance(events[-1], Result)
    return events, events[-1].data


def direct_ppl(model) -> float:
    return Evaluator(model, byte_tokenizer(), TEXTS).perplexity()


@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_skip_equals_transformers_forward_with_the_block_replaced(family):
    """Each (layer, part) row of `--part both --method skip` is the perplexity of a fresh model whose
    block module is replaced by one returning zeros, evaluated by a plain full forward."""
    model = tiny_model(family, seed=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    events, doc = the_map(model, method="skip", part="both")
    blocks = [(i, p) for i in range(4) for p in ("attention", "mlp")]
    assert [(row["layer"], row["part"]) for row in doc["parts"]] == blocks
    assert [row["layer"] for row in doc["layers"]] == list(range(4)) and all("part" not in r for r in doc["layers"])
    for row in doc["parts"]:
        direct = tiny_model(family, seed=4)
        layer = LayerStack(direct).layers[row["layer"]]
        path = BLOCKS[family][0 if row["part"] == "attention" else 1]
        parent, _, name = path.rpartition(".")
        setattr(layer.get_submodule(parent) if parent else layer, name, Zeros(row["part"] == "attention"))
        expected = direct_ppl(direct)
        assert math.isclose(row["ppl"], expected, rel_tol=1e-5), (row["layer"], row["part"])
        d = 100 * (expected - doc["baseline_ppl"]) / doc["baseline_ppl"]
        assert math.isclose(row["degradation_pct"], d, rel_tol=1e-4, abs_tol=1e-5)
        assert row["layer_class"] == importance_class(row["degradation_pct"])
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    live = [e for e in events if isinstance(e, LayerAblated)]
    units = [(i, p) for i in range(4) for p in ("layer", "attention", "mlp")]
    assert [(e.layer, e.part or "layer") for e in live] == units


def test_gpt_neox_is_parallel_and_keeps_the_other_term():
    """Pythia adds attention and MLP to one residual: removing the attention keeps the MLP's term,
    which a sequential reading (the MLP fed the attention's sum) would change; Phi-1/2 too."""
    assert LayerStack(tiny_model("phi")).parallel_residual and not LayerStack(tiny_model("phi3")).parallel_residual
    model = tiny_model("gpt_neox", seed=4)
    assert model.config.use_parallel_residual and LayerStack(model).parallel_residual
    _, doc = the_map(model, method="skip", part="attention", layers=(1,))
    direct = tiny_model("gpt_neox", seed=4)
    layer = direct.gpt_neox.layers[1]
    mlp = layer.mlp
    outputs = []
    handle = mlp.register_forward_hook(lambda m, a, out: outputs.append(out))
    layer.attention = Zeros(True)
    expected = direct_ppl(direct)
    handle.remove()
    assert math.isclose(doc["parts"][0]["ppl"], expected, rel_tol=1e-5)
    assert all(float(out.abs().max()) > 0 for out in outputs)  # the MLP still adds its term


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_zero_and_mean_edit_only_the_blocks_matrices(method):
    model = tiny_model("llama", seed=5)
    _, doc = the_map(model, method=method, part="both")
    for row in doc["parts"]:
        direct = tiny_model("llama", seed=5)
        stack = LayerStack(direct)
        index = row["layer"]
        neighbours = [i for i in (index - 1, index + 1) if 0 <= i < len(stack)]
        names = ("q", "k", "v", "o") if row["part"] == "attention" else ("gate", "up", "down")
        with torch.no_grad():
            for name in names:
                param = stack.matrices(index)[name]
                if method == "zero":
                    param.zero_()
                else:
                    total = sum(stack.matrices(i)[name] for i in neighbours)
                    assert isinstance(total, torch.Tensor)  # a layer has neighbours
                    param.copy_(total / len(neighbours))
        assert math.isclose(row["ppl"], direct_ppl(direct), rel_tol=1e-5), (index, row["part"])


@pytest.mark.parametrize("method", ["skip", "zero"])
def test_a_block_that_adds_nothing_changes_nothing(method):
    """Hand-built: layer 2's MLP has its down projection zeroed, so its term is exactly zero;
    removing it leaves the perplexity exactly the baseline (D = 0, redundant, not anti), and the
    residual stream passes it unchanged (Block Influence and the angles 0)."""
    model = tiny_model("llama", seed=6)
    with torch.no_grad():
        model.model.layers[2].mlp.down_proj.weight.zero_()
    _, doc = the_map(model, method=method, part="mlp", bootstrap=50)
    row = next(r for r in doc["parts"] if r["layer"] == 2)
    assert row["ppl"] == doc["baseline_ppl"] and row["degradation_pct"] == 0.0
    assert row["layer_class"] == "redundant" and not row["anti"] and not row["anti_within_noise"]
    assert row["ci_low"] == row["ci_high"] == 0.0
    assert row["block_influence"] == pytest.approx(0.0, abs=1e-6)
    assert row["angular_distance"] == pytest.approx(0.0, abs=2e-3)  # arccos near 1 in float32: ~1e-3
    assert row["angular_last_token"] == pytest.approx(0.0, abs=1e-6)
    assert [r["part"] for r in doc["parts"]] == ["mlp"] * 4


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gpt_neox", "phi"])
def test_block_proxies_match_the_residual_stream(family):
    """The blocks' proxies against the stream read another way: a Llama layer's middle is the
    input of its post-attention norm; a parallel layer's blocks (NeoX, Phi) each go from the
    layer's input to the input plus their own module's output."""
    model, tokenizer = tiny_model(family, seed=7), byte_tokenizer()
    _, doc = the_map(model, part="both", method="skip")
    proxies = {(row["layer"], row["part"]): row for row in doc["parts"]}
    stack = LayerStack(model)
    sums = {key: np.zeros(3) for key in [(i, p) for i in range(4) for p in ("attention", "mlp")]}
    tokens = 0
    seen: dict[str, torch.Tensor] = {}
    for text in TEXTS:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        seen.clear()
        handles = []
        for index, layer in enumerate(stack.layers):
            handles.append(layer.register_forward_pre_hook(
                lambda m, a, k, i=index: seen.__setitem__(f"in{i}", (a[0] if a else k["hidden_states"])[0]),
                with_kwargs=True))
            handles.append(layer.register_forward_hook(lambda m, a, out, i=index: seen.__setitem__(f"out{i}", out[0])))
            if family == "llama":
                handles.append(layer.get_submodule("post_attention_layernorm").register_forward_pre_hook(
                    lambda m, a, i=index: seen.__setitem__(f"mid{i}", a[0][0])))
            else:
                handles.append(layer.get_submodule(BLOCKS[family][0]).register_forward_hook(
                    lambda m, a, out, i=index: seen.__setitem__(f"attn{i}", out[0][0])))
                handles.append(layer.get_submodule("mlp").register_forward_hook(
                    lambda m, a, out, i=index: seen.__setitem__(f"mlp{i}", out[0])))
        model(input_ids=ids)
        for handle in handles:
            handle.remove()
        tokens += ids.shape[1]
        for i in range(4):
            h = seen[f"in{i}"]
            if family == "llama":
                pairs = {"attention": (h, seen[f"mid{i}"]), "mlp": (seen[f"mid{i}"], seen[f"out{i}"])}
            else:
                pairs = {"attention": (h, h + seen[f"attn{i}"]), "mlp": (h, h + seen[f"mlp{i}"])}
            for part, (a, b) in pairs.items():
                cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).clamp(-1, 1)
                unit = torch.nn.functional.normalize(torch.stack([a[-1], b[-1]]).double(), dim=-1)
                last = float(torch.arccos((unit[0] @ unit[1]).clamp(-1, 1)) / math.pi)
                sums[(i, part)] += [float((1 - cos).sum()), float((torch.arccos(cos) / math.pi).sum()), last]
    for key, (influence, angular, last) in sums.items():
        row = proxies[key]
        assert row["block_influence"] == pytest.approx(influence / tokens, rel=1e-4, abs=1e-6), key
        assert row["angular_distance"] == pytest.approx(angular / tokens, rel=1e-4, abs=1e-5), key
        assert row["angular_last_token"] == pytest.approx(last / len(TEXTS), rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("part", ["layer", "both"])
def test_proxies_only_equal_the_maps_proxies(part):
    """One pass, no ablation: every layer's (and block's) Block Influence and angles, the baseline
    and the last-token block search, equal to what the full map records; in a file of its own."""
    model = tiny_model("llama", seed=8)
    _, full = the_map(model, part=part, method="skip")
    events, only = the_map(model, part=part, proxies_only=True)
    assert events[-1].name == "ablation-proxies" and not any(isinstance(e, LayerAblated) for e in events)
    assert only == json_safe(AblationProxyMap.from_json(only))
    assert only["baseline_ppl"] == full["baseline_ppl"]
    assert only["angular_blocks"] == full["angular_blocks"] and only["angular_block_best"] == full["angular_block_best"]
    keys: tuple[str, ...] = ("layer", "block_influence", "angular_distance", "angular_last_token")
    assert [{k: r[k] for k in keys} for r in only["layers"]] == [{k: r[k] for k in keys} for r in full["layers"]]
    if part == "layer":
        assert "parts" not in only
    else:
        keys += ("part",)
        assert [{k: r[k] for k in keys} for r in only["parts"]] == [{k: r[k] for k in keys} for r in full["parts"]]


def test_a_layer_map_is_byte_for_byte_what_it_was():
    """A layer map has no `part` on its rows and no `parts`: an old document (the sample, and one
    written before the blocks) reads and writes the same bytes; a part map round-trips too."""
    old = json_safe(vocabulary.sample())
    text = json.dumps(old)
    assert "parts" not in old and not any("part" in row for row in old["layers"])  # (its settings say part: layer)
    assert json.dumps(json_safe(AblationMap.from_json(json.loads(text)))) == text
    with_parts = json.dumps(json_safe(vocabulary.sample_parts()))
    assert json.dumps(json_safe(AblationMap.from_json(json.loads(with_parts)))) == with_parts
    event = LayerAblated(1, 4, 20.0, 19.0, 5.0, "redundant")
    assert "part" not in event.to_json()


def test_a_new_layer_map_writes_no_part():
    _, doc = the_map(tiny_model("llama", seed=9), method="skip")
    assert "parts" not in doc and not any("part" in row for row in doc["layers"])
    assert set(doc["spearman"]) == {"block_influence", "angular_distance", "angular_last_token"}


def test_the_sweep_costs_one_evaluation_per_unit_from_its_layer(monkeypatch):
    """With the prefix cache every removal is evaluated from its layer's input: a part map runs the
    baseline pass and one evaluation per (layer, unit), each starting at that layer."""
    model = tiny_model("llama", seed=10)
    starts = []
    original = Evaluator.scoring

    def counted(self, start_layer=0, *args, **kwargs):
        starts.append(start_layer)
        return original(self, start_layer, *args, **kwargs)

    monkeypatch.setattr(Evaluator, "scoring", counted)
    _, doc = the_map(model, method="skip", part="both")
    assert starts == [i for i in range(4) for _ in range(3)]
    assert set(doc["spearman"]) >= {"attention:block_influence", "mlp:angular_distance"}


def test_shards_merge_to_the_serial_map():
    model = tiny_model("llama", seed=11)
    settings = AblationSettings(eval_set="paper", method="skip", part="both")
    _, serial = the_map(model, method="skip", part="both")
    shares = [the_map(model, method="skip", part="both", layers=share)[1] for share in ((0, 2), (1, 3))]
    merged = merge_shards(shares, settings)
    strip = lambda rows: [{k: v for k, v in r.items()} for r in rows]  # noqa: E731
    assert strip(merged["parts"]) == strip(serial["parts"]) and merged["spearman"] == serial["spearman"]


def test_a_family_without_named_blocks_is_one_line_before_the_load(monkeypatch):
    shape = ModelShape(params=1, n_layers=4, hidden=32, intermediate=64, heads=4, vocab=260, family="llama")
    AblationSettings(part="both").check_against(shape)
    unnamed = families.Family("Llama / SmolLM", "model.layers", families.FAMILIES["llama"].matrices)
    monkeypatch.setitem(families.FAMILIES, "llama", unnamed)
    AblationSettings().check_against(shape)  # the layer map needs no blocks
    with pytest.raises(UserError, match=r"Llama / SmolLM \(llama\)") as caught:
        AblationSettings(part="mlp").check_against(shape)
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match="--part"):
        list(run_ablation(tiny_model("llama"), byte_tokenizer(), AblationSettings(eval_set="paper", part="attention")))


def test_proxies_only_does_not_split():
    from engine.registry import experiment

    with pytest.raises(UserError, match="--proxies-only"):
        experiment("ablation").shard_plan(AblationSettings(proxies_only=True), 4)


def test_the_console_keeps_blocks_beside_their_layer():
    """A block's live row never takes its layer's place; a map with parts fills `ablation_parts`;
    an event with its `part` absent survives the pickling that carries it between workers."""
    import pickle

    from engine.core.events import event_from_json
    from tui.state import SessionState

    state = SessionState()
    state.apply(LayerAblated(2, 4, 30.0, 20.0, 50.0, "important"))
    state.apply(LayerAblated(2, 4, 21.0, 20.0, 5.0, "redundant", part="mlp"))
    assert state.ablation[2].degradation_pct == 50.0 and state.ablation_parts[(2, "mlp")].degradation_pct == 5.0
    state.set_result("ablation", json_safe(vocabulary.sample_parts()))
    assert len(state.ablation_parts) == 12 and state.ablation[0].layer_class == "critical"
    sent = pickle.loads(pickle.dumps(LayerAblated(1, 4, 20.0, 19.0, 5.0, "redundant")))
    assert "part" not in sent.to_json() and event_from_json(sent.to_json()) == sent


@pytest.mark.embedded
def test_embedded_blocks_of_one_layer_equal_the_replaced_forward(embedded):
    """SmolLM2-135M: layer 11's attention and MLP removed alone through the prefix cache equal a
    plain forward with the block's module returning zeros; the weights come back exactly."""
    model, tokenizer = embedded.model, embedded.tokenizer
    before = {k: v.clone() for k, v in model.state_dict().items()}
    events = list(run_ablation(model, tokenizer, AblationSettings(eval_set="paper", method="skip", part="both",
                                                                  layers=(11,))))
    doc = cast(Result, events[-1]).data
    layer = model.model.layers[11]
    evaluator = Evaluator(model, tokenizer, TEXTS)
    for row in doc["parts"]:
        name = "self_attn" if row["part"] == "attention" else "mlp"
        original = getattr(layer, name)
        setattr(layer, name, Zeros(row["part"] == "attention", model.config.hidden_size))
        try:
            expected = evaluator.perplexity()
        finally:
            setattr(layer, name, original)
        assert math.isclose(row["ppl"], expected, rel_tol=1e-5), row["part"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
