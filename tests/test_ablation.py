"""The layer-importance map on tiny models, checked against direct computations."""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import tiny_model

from engine.core.errors import UserError
from engine.core.events import Cancelled, CancelToken, Result
from engine.data.text import eval_texts
from engine.evaluation.perplexity import Evaluator
from engine.evaluation.statistics import bootstrap_degradation, importance_class
from engine.experiments.ablation.removal import neighbour_mean
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings, LayerAblated
from engine.models.anatomy import LayerStack


def run(model, tokenizer, **settings):
    events = list(run_ablation(model, tokenizer, AblationSettings(**settings), model_name="tiny"))
    assert isinstance(events[-1], Result)
    return events, events[-1].data


def test_classes_follow_paper_thresholds():
    assert importance_class(100.0) == "critical"
    assert importance_class(99.9) == "important"
    assert importance_class(30.0) == "important"
    assert importance_class(29.9) == "minor"
    assert importance_class(10.0) == "minor"
    assert importance_class(9.99) == "redundant"
    assert importance_class(-5.0) == "redundant"


def test_neighbour_mean_and_edges(tiny_llama):
    model, _ = tiny_llama
    stack = LayerStack(model)
    mean = neighbour_mean(stack, 2)
    for name in stack.matrix_names:
        expected = (stack.matrices(1)[name] + stack.matrices(3)[name]) / 2
        assert torch.equal(mean[name], expected)
    first = neighbour_mean(stack, 0)
    last = neighbour_mean(stack, 3)
    for name in stack.matrix_names:
        assert torch.equal(first[name], stack.matrices(1)[name])
        assert torch.equal(last[name], stack.matrices(2)[name])


@pytest.mark.parametrize("method", ["mean", "skip", "zero"])
def test_map_matches_direct_computation_and_restores(tokenizer, method):
    model = tiny_model("llama", seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    events, doc = run(model, tokenizer, method=method, eval_set="paper")
    texts = eval_texts(subset="paper")
    baseline = Evaluator(model, tokenizer, texts).perplexity()
    assert math.isclose(doc["baseline_ppl"], baseline, rel_tol=1e-6)
    for row in doc["layers"]:
        index = row["layer"]
        # the straightforward way: a fresh copy of the model with the layer changed, full forward
        direct = tiny_model("llama", seed=3)
        direct_stack = LayerStack(direct)
        with torch.no_grad():
            if method == "skip":
                direct_stack.layers[index].forward = lambda hidden, *a, **k: hidden
            else:
                mats = direct_stack.matrices(index)
                neighbours = [i for i in (index - 1, index + 1) if 0 <= i < len(direct_stack)]
                for name, param in mats.items():
                    if method == "zero":
                        param.zero_()
                    else:
                        # a layer has one or two neighbours: their sum is a tensor
                        total = cast(torch.Tensor, sum(direct_stack.matrices(i)[name] for i in neighbours))
                        param.copy_(total / len(neighbours))
        expected = Evaluator(direct, tokenizer, texts).perplexity()
        assert math.isclose(row["ppl"], expected, rel_tol=1e-5)
        d = 100 * (expected - baseline) / baseline
        assert math.isclose(row["degradation_pct"], d, rel_tol=1e-4, abs_tol=1e-6)
        assert row["layer_class"] == importance_class(d)
        assert row["anti"] == (d < 0)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    live = [e for e in events if isinstance(e, LayerAblated)]
    assert [e.layer for e in live] == list(range(4))


def test_json_document_shape(tiny_llama):
    model, tokenizer = tiny_llama
    _, doc = run(model, tokenizer, eval_set="paper", bootstrap=200)
    assert set(doc) >= {"model", "method", "baseline_ppl", "eval_tokens", "seconds", "layers", "spearman"}
    for row in doc["layers"]:
        assert set(row) >= {"layer", "ppl", "degradation_pct", "layer_class", "anti", "ci_low", "ci_high",
                            "block_influence", "angular_distance", "angular_last_token"}
        assert row["ci_low"] <= row["degradation_pct"] <= row["ci_high"]
        assert row["anti"] == (row["ci_high"] < 0)
        assert 0 <= row["angular_distance"] <= 1 and 0 <= row["angular_last_token"] <= 1
    assert set(doc["spearman"]) == {"block_influence", "angular_distance", "angular_last_token"}
    assert doc["protocol"]["protocol"] == "texts" and doc["protocol"]["dataset"] == "builtin:paper"
    assert doc["protocol"]["tokens"] == doc["eval_tokens"] and doc["protocol"]["windows"] == 10


def test_block_influence_matches_hidden_states(tiny_llama):
    model, tokenizer = tiny_llama
    _, doc = run(model, tokenizer, eval_set="paper")
    texts = eval_texts(subset="paper")
    sums = np.zeros(4)
    count = 0
    outputs: list[torch.Tensor] = []
    last_layer = LayerStack(model).layers[3]
    for text in texts:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        # hidden_states[l] is the input of layer l for l < 4; the last entry is after the final norm,
        # so the last layer's output is taken from a hook instead
        outputs.clear()
        with torch.no_grad(), last_layer.register_forward_hook(lambda m, a, o: outputs.append(o)):
            model(input_ids=ids)
        states = list(hidden[:4]) + [outputs[0]]
        for layer in range(4):
            cos = torch.nn.functional.cosine_similarity(states[layer][0], states[layer + 1][0], dim=-1)
            sums[layer] += float((1 - cos).sum())
        count += ids.shape[1]
    expected = sums / count
    np.testing.assert_allclose([row["block_influence"] for row in doc["layers"]], expected, rtol=1e-4)


def test_bootstrap_interval_is_paired_and_covers_estimate():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 30, size=40).astype(float)
    base = tokens * 3.0
    ablated = base * 1.2  # every text 20% worse in log-likelihood
    low, high = bootstrap_degradation(ablated, base, tokens, 500)
    d = 100 * (math.exp((ablated.sum() - base.sum()) / tokens.sum()) - 1)
    assert low <= d <= high
    same_low, same_high = bootstrap_degradation(base, base, tokens, 500)
    assert same_low == same_high == 0.0


def test_cancel_stops_between_layers(tiny_llama):
    model, tokenizer = tiny_llama
    cancel = CancelToken()
    events = run_ablation(model, tokenizer, AblationSettings(eval_set="paper"), cancel)
    seen = 0
    with pytest.raises(Cancelled):
        for event in events:
            if isinstance(event, LayerAblated):
                seen += 1
                cancel.cancel()
    assert seen == 1


def test_bad_settings_are_one_line_errors(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    with pytest.raises(UserError, match="--method drop"):
        list(run_ablation(model, tokenizer, AblationSettings(method="drop")))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match="empty"):
        list(run_ablation(model, tokenizer, AblationSettings(eval_file=str(empty))))
    with pytest.raises(UserError, match="does not exist"):
        list(run_ablation(model, tokenizer, AblationSettings(eval_file=str(tmp_path / "nope.txt"))))


@pytest.mark.embedded
def test_embedded_map_has_30_layers_and_restores_exactly(embedded, tmp_path):
    model, tokenizer = embedded.model, embedded.tokenizer
    before = {k: v.clone() for k, v in model.state_dict().items()}
    texts = eval_texts(subset="paper")[:2]  # two 16-token texts: every layer, a fifteenth of the paper set's work
    (tmp_path / "texts.txt").write_text("\n".join(texts), encoding="utf-8")
    _, doc = run(model, tokenizer, eval_file=str(tmp_path / "texts.txt"), max_length=16)
    assert [row["layer"] for row in doc["layers"]] == list(range(30))
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    # the cached value of one middle layer equals a plain full forward with the same swap
    stack = LayerStack(model)
    evaluator = Evaluator(model, tokenizer, texts, max_length=16)
    with stack.preserved([11]):
        with torch.no_grad():
            for name, param in stack.matrices(11).items():
                param.copy_((stack.matrices(10)[name] + stack.matrices(12)[name]) / 2)
        full = evaluator.perplexity()
    assert math.isclose(doc["layers"][11]["ppl"], full, rel_tol=1e-5)


@given(st.lists(st.tuples(st.integers(-3, 3), st.floats(-1e3, 1e3, allow_nan=False)), min_size=3, max_size=40))
def test_spearman_is_scipys_with_ties_nan_and_constants(pairs):
    """The rank correlation every map reports, against scipy.stats.spearmanr (ties from the small
    integers; a NaN pair left out; constant input undefined for both)."""
    from scipy.stats import spearmanr

    from engine.evaluation.statistics import spearman

    a = [float(x) for x, _ in pairs] + [math.nan]
    b = [y for _, y in pairs] + [1.0]
    found = spearman(a, b)
    if len(set(a[:-1])) == 1 or len(set(b[:-1])) == 1:
        assert found is None
    else:
        assert found == pytest.approx(float(spearmanr(a[:-1], b[:-1]).statistic), abs=1e-12)
