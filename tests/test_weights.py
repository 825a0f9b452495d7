"""Weight predictability, delta correlation and their nulls, checked on hand-built layer stacks with
known answers, against sklearn refits, and end to end on a tiny model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from tui_fixtures import round_trips

from engine.core.errors import UserError
from engine.core.events import Result
from engine.experiments.weights.run import (
    Analysis,
    delta_correlations,
    gram_of,
    hat_matrix,
    independent_gram,
    index_features,
    predicted_weights,
    ridge_fit,
    run_weights,
)
from engine.experiments.weights.vocabulary import WeightsSettings
from engine.models.anatomy import LayerStack


def _stack(layers: np.ndarray) -> list[torch.Tensor]:
    return [torch.tensor(layer, dtype=torch.float32) for layer in layers]


def _result(events) -> dict:
    doc = [e for e in events if isinstance(e, Result)][-1].data
    assert round_trips("weights", doc)  # built from WeightsResult, read back the same
    return doc


def test_gram_matches_direct_products():
    rng = np.random.default_rng(0)
    layers = rng.normal(0.3, 2.0, size=(5, 7, 9))
    g = gram_of(_stack(layers), chunk=10)  # several chunks, last one partial
    flat = layers.reshape(5, -1)
    np.testing.assert_allclose(g.gram, flat @ flat.T, rtol=1e-5)
    np.testing.assert_allclose(g.means, flat.mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(g.stds(), flat.std(axis=1), rtol=1e-4)


def test_shapes_that_differ_across_layers_are_refused():
    with pytest.raises(UserError, match="shape differs"):
        gram_of([torch.zeros(2, 3), torch.zeros(3, 2)])


def test_ridge_statistics_match_sklearn_refits():
    """In-sample and leave-one-layer-out predictions rebuilt with sklearn's Ridge, one refit per layer."""
    rng = np.random.default_rng(1)
    n, p, alpha = 9, 40, 0.7
    y = rng.normal(size=(n, p)) + np.linspace(0, 3, n)[:, None] * rng.normal(size=p)
    features = index_features(n, 2, (1.0,))
    rows = np.arange(n)
    fit = ridge_fit(gram_of(_stack(y), chunk=16), hat_matrix(features, alpha), rows)

    inside = Ridge(alpha=alpha).fit(features, y).predict(features)
    loo = np.stack([
        Ridge(alpha=alpha).fit(np.delete(features, i, 0), np.delete(y, i, 0)).predict(features[i : i + 1])[0]
        for i in range(n)
    ])
    total = ((y - y.mean(axis=0)) ** 2).sum()
    assert fit.r2_in_sample == pytest.approx(1 - ((y - inside) ** 2).sum() / total, rel=1e-5)
    assert fit.r2_loo == pytest.approx(1 - ((y - loo) ** 2).sum() / total, rel=1e-5)

    def cos(a, b):
        return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    np.testing.assert_allclose(fit.layer_cos_in, cos(inside, y), rtol=1e-5)
    np.testing.assert_allclose(fit.layer_cos_loo, cos(loo, y), rtol=1e-5)
    # the weights put into the model for the paradox are the same predictions
    got = predicted_weights(_stack(y), hat_matrix(features, alpha), rows, [2, 5], loo=True)
    np.testing.assert_allclose(got[5].numpy(), loo[5], rtol=1e-4, atol=1e-5)
    got = predicted_weights(_stack(y), hat_matrix(features, alpha), rows, [2, 5], loo=False)
    np.testing.assert_allclose(got[2].numpy(), inside[2], rtol=1e-4, atol=1e-5)


def test_half_precision_predictions_are_summed_in_float32_and_cast_once():
    rng = np.random.default_rng(3)
    layers = [torch.tensor(rng.normal(size=(40, 24)) * 0.02, dtype=torch.bfloat16) for _ in range(12)]
    rows = np.arange(12)
    hat = hat_matrix(index_features(12, 2, (1.0,)), 1.0)
    got = predicted_weights(layers, hat, rows, [4, 9], loo=True)
    for layer in (4, 9):
        exact = sum(float(hat[layer, j]) * layers[j].double() for j in rows)
        exact = layers[layer].double() - (layers[layer].double() - exact) / (1.0 - float(hat[layer, layer]))
        assert got[layer].dtype == torch.bfloat16 and got[layer].device.type == "cpu"
        # one rounding at the end: within bfloat16's unit roundoff of the exact value
        torch.testing.assert_close(got[layer].double(), exact, rtol=2**-8 * 1.01, atol=1e-7)


def test_polynomial_weights_are_predicted_exactly_in_and_out_of_sample():
    """W_l = A + x B + x² C with x the normalised index: R² = 1 and cosine 1 both ways (tiny alpha)."""
    rng = np.random.default_rng(2)
    n = 12
    x = np.arange(n) / (n - 1)
    a, b, c = rng.normal(size=(3, 6, 5))
    layers = a + x[:, None, None] * b + x[:, None, None] ** 2 * c
    analysis = Analysis(n, WeightsSettings(degree=2, frequencies=(), alpha=1e-9, first_layer=2))
    values, fit, _ = analysis.summary(gram_of(_stack(layers)))
    assert values["r2_in_sample"] == pytest.approx(1.0, abs=1e-4)
    assert values["r2_loo"] == pytest.approx(1.0, abs=1e-4)
    assert values["cosine_loo"] == pytest.approx(1.0, abs=1e-5)
    assert fit.rows.tolist() == list(range(2, n))


def test_independent_layers_are_unpredictable_with_delta_correlation_minus_half():
    rng = np.random.default_rng(3)
    layers = rng.normal(size=(30, 64, 64))
    values, _, deltas = Analysis(30, WeightsSettings()).summary(gram_of(_stack(layers)))
    assert values["r2_loo"] <= 0
    assert values["delta_corr_mean"] == pytest.approx(-0.5, abs=0.01)
    assert len(deltas) == 28


def test_delta_correlation_matches_numpy_pearson():
    rng = np.random.default_rng(4)
    layers = rng.normal(size=(6, 50)).cumsum(axis=0) + rng.normal(size=(6, 1))
    d = np.diff(layers, axis=0)
    expected = [np.corrcoef(d[i], d[i + 1])[0, 1] for i in range(4)]
    np.testing.assert_allclose(delta_correlations(gram_of(_stack(layers))), expected, rtol=1e-5)


def test_independent_null_against_theory():
    """Independent layers of equal variance: corr(Δ_l, Δ_{l+1}) = -0.5 in expectation; the exact Gram
    draw has E[G] = size * (μ μᵀ + diag σ²)."""
    rng = np.random.default_rng(5)
    n, size = 20, 10_000
    means = rng.normal(0, 0.1, n)
    draws = [independent_gram(means, np.full(n, 0.5), size, rng) for _ in range(200)]
    mean_corr = np.mean([delta_correlations(g).mean() for g in draws])
    assert mean_corr == pytest.approx(-0.5, abs=0.003)
    expected = size * (np.outer(means, means) + np.diag(np.full(n, 0.25)))
    np.testing.assert_allclose(np.mean([g.gram for g in draws], axis=0), expected, atol=0.05 * size * 0.25)
    np.testing.assert_allclose(np.mean([g.means for g in draws], axis=0), means, atol=0.002)


def test_unequal_variances_move_the_null_away_from_minus_half():
    """The null is not a constant: with std growing along depth the expected value differs from -0.5."""
    rng = np.random.default_rng(6)
    stds = np.geomspace(0.1, 3.0, 10)
    g = independent_gram(np.zeros(10), stds, 200_000, rng)
    var = stds**2
    theory = -var[1:-1] / np.sqrt((var[:-2] + var[1:-1]) * (var[1:-1] + var[2:]))
    np.testing.assert_allclose(delta_correlations(g), theory, atol=0.01)


@pytest.fixture
def short_texts(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("The cat sat on the mat.\nRivers run to the sea.\n", encoding="utf-8")
    return str(path)


def test_run_weights_on_tiny_model_restores_weights_and_writes_every_field(tiny_llama, short_texts):
    model, tok = tiny_llama
    before = {k: v.clone() for k, v in model.state_dict().items()}
    settings = WeightsSettings(first_layer=0, eval_file=short_texts, null_draws=3, paradox_counts=(1, 0),
                               components=("q", "gate"))
    doc = _result(run_weights(model, tok, settings, model_name="tiny"))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert set(doc["components"]) == {"q", "gate"}
    gate = doc["components"]["gate"]
    for key in ("r2_in_sample", "r2_loo", "cosine_loo", "delta_corr_mean", "delta_corr_sd"):
        assert isinstance(gate[key], float)
        assert isinstance(gate["null_shuffled"][key], float)
        assert isinstance(gate["null_independent"][key], float)
        assert isinstance(gate["reading"][key], str)
    assert len(gate["per_layer"]) == 4
    assert [row["layers_replaced"] for row in doc["paradox"]][1] == [0, 1, 2, 3]
    assert len(doc["paradox"][0]["layers_replaced"]) == 1
    assert all(row["ppl"] > 0 for row in doc["paradox"])


def test_paradox_perplexity_equals_a_model_with_the_predicted_weights(tiny_llama, short_texts):
    from engine.data.text import eval_texts
    from engine.evaluation.perplexity import Evaluator

    model, tok = tiny_llama
    settings = WeightsSettings(first_layer=1, eval_file=short_texts, null_draws=1, paradox_counts=(2,),
                               paradox_layers=(3, 2), paradox_prediction="loo")
    doc = _result(run_weights(model, tok, settings))
    stack = LayerStack(model)
    analysis = Analysis(4, settings)
    with stack.preserved([2, 3]):
        for name in stack.matrix_names:
            tensors = [stack.matrices(i)[name] for i in range(4)]
            new = predicted_weights(tensors, analysis.hat_predicted, analysis.predicted, [2, 3], loo=True)
            for layer, weight in new.items():
                tensors[layer].copy_(weight)
        direct = Evaluator(model, tok, eval_texts(short_texts)).perplexity()
    assert doc["paradox"][0]["layers_replaced"] == [2, 3]
    assert doc["paradox"][0]["ppl"] == pytest.approx(direct, rel=1e-4)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"components": ("nope",)}, "unknown component"),
        ({"paradox_layers": (99,)}, "out of range"),
        ({"paradox_layers": (0,)}, "not predicted"),
        ({"first_layer": 2}, "--first-layer"),
        ({"alpha": 0}, "--alpha"),
        ({"degree": 0, "frequencies": ()}, "no features"),
        ({"null_draws": 0}, "--null-draws"),
        ({"paradox_prediction": "best"}, "--paradox-prediction"),
    ],
)
def test_bad_input_gets_one_line_error(tiny_llama, changes, message):
    model, tok = tiny_llama
    settings = dataclasses.replace(WeightsSettings(first_layer=1), **changes)
    with pytest.raises(UserError, match=message) as info:
        list(run_weights(model, tok, settings))
    assert "\n" not in str(info.value)


@pytest.mark.embedded
def test_embedded_gate_proj_statistics(embedded):
    settings = WeightsSettings(components=("gate",), paradox=False, null_draws=2)
    doc = _result(run_weights(embedded.model, embedded.tokenizer, settings))
    gate = doc["components"]["gate"]
    assert len(gate["per_layer"]) == 30
    assert -1.0 < gate["delta_corr_mean"] < 0.0
    assert gate["r2_loo"] < gate["r2_in_sample"] <= 1.0


def test_cli_runs_into_the_session(tmp_path, isolated_home, short_texts):
    """`anatomy-tui run weights` end to end on a tiny saved model; bad component -> exit code 2."""
    import json

    from tiny_models import save_tiny

    from cli.main import main

    folder = save_tiny(tmp_path / "tiny")
    out = tmp_path / "w.json"
    code = main(["run", "weights", "--model", str(folder), "--session", "s", "--first-layer", "1",
                 "--null-draws", "2", "--paradox-counts", "1,all", "--eval-file", short_texts,
                 "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert [len(row["layers_replaced"]) for row in doc["paradox"]] == [1, 3]
    assert (isolated_home / "s" / "results" / "weights.json").exists()
    assert main(["run", "weights", "--model", str(folder), "--components", "nope", "--first-layer", "1"]) == 2
