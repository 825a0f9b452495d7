"""The five manipulation strategies: each checked against a direct computation on a tiny model,
exact restoration, --together, the default layers from an ablation map, and bad input."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from tui_fixtures import ablation_map, round_trips

from engine.core.errors import UserError
from engine.core.events import Result
from engine.data.text import eval_texts
from engine.evaluation.perplexity import Evaluator
from engine.experiments.ablation.removal import neighbour_mean
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow
from engine.experiments.manipulate.run import blend_weights, clone_source, manipulated, run_manipulation, trials
from engine.experiments.manipulate.vocabulary import ManipulationSettings
from engine.models.anatomy import LayerStack


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _expected(stack: LayerStack, index: int, strategy: str, param, changed: set[int]) -> dict:
    """The new matrices of layer `index`, computed by hand from the untouched weights."""
    mats = {i: {n: p.detach().clone() for n, p in stack.matrices(i).items()} for i in range(len(stack))}
    kept = [i for i in range(len(stack)) if i not in changed]
    below = max((i for i in kept if i < index), default=None)
    above = min((i for i in kept if i > index), default=None)
    if below is not None and above is not None:
        t = (index - below) / (above - below)
        blend = {n: (1 - t) * mats[below][n] + t * mats[above][n] for n in mats[index]}
    else:
        nearest = below if above is None else above
        assert nearest is not None  # some layer is kept
        blend = mats[nearest]
    out = {}
    for name, w in mats[index].items():
        if strategy == "zero":
            out[name] = torch.zeros_like(w)
        elif strategy == "scale":
            out[name] = param * w
        elif strategy == "clone":
            nearest = min(kept, key=lambda i: (abs(i - index), i))
            out[name] = mats[nearest][name]
        elif strategy == "blend":
            out[name] = blend[name]
        else:  # svd: blend + best rank-r approximation of (W - blend), via numpy
            import numpy as np

            diff = (w - blend[name]).double().numpy()
            u, s, vh = np.linalg.svd(diff, full_matrices=False)
            r = int(param)
            out[name] = blend[name] + torch.tensor((u[:, :r] * s[:r]) @ vh[:r], dtype=w.dtype)
    return out


@pytest.mark.parametrize(
    "strategy, param, layers",
    [
        ("zero", None, [2]),
        ("scale", 0.3, [1]),
        ("clone", None, [2]),
        ("clone", None, [0]),
        ("blend", None, [1]),
        ("blend", None, [3]),
        ("svd", 2, [2]),
        ("blend", None, [1, 2]),  # together: interpolate between layers 0 and 3
        ("clone", None, [1, 2]),
        ("svd", 3, [1, 2]),
    ],
)
def test_each_strategy_writes_the_hand_computed_weights_and_restores(tiny_llama, strategy, param, layers):
    model, _ = tiny_llama
    stack = LayerStack(model)
    expected = {i: _expected(stack, i, strategy, param, set(layers)) for i in layers}
    before = _snapshot(model)
    with manipulated(stack, layers, strategy, param):
        for index in layers:
            for name, weight in stack.matrices(index).items():
                torch.testing.assert_close(weight, expected[index][name], rtol=1e-5, atol=1e-6)
        others = [i for i in range(len(stack)) if i not in layers]
        for index in others:
            for weight in stack.matrices(index).values():
                key = next(k for k, v in model.state_dict().items() if v.data_ptr() == weight.data_ptr())
                assert torch.equal(weight, before[key])
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_blend_one_at_a_time_is_the_ablation_neighbour_mean(tiny_llama):
    stack = LayerStack(tiny_llama[0])
    for index in range(len(stack)):
        got, mean = blend_weights(stack, index, {index}), neighbour_mean(stack, index)
        for name in stack.matrix_names:
            torch.testing.assert_close(got[name], mean[name])


def test_clone_takes_the_nearest_kept_layer_below_on_a_tie():
    assert clone_source(6, 3, {3}) == 2
    assert clone_source(6, 0, {0}) == 1
    assert clone_source(6, 2, {1, 2}) == 3  # 3 is at distance 1, 0 at distance 2
    assert clone_source(6, 1, {1, 2}) == 0


def test_zeroing_a_llama_layer_equals_skipping_it(tiny_llama):
    """No biases in Llama blocks: zero attention and MLP outputs leave only the residual."""
    model, tok = tiny_llama
    evaluator = Evaluator(model, tok, ["The cat sat on the mat.", "One two three."])
    stack = evaluator.stack
    with manipulated(stack, [2], "zero"):
        zeroed = evaluator.perplexity()
    with stack.skipped([2]):
        skipped = evaluator.perplexity()
    assert zeroed == pytest.approx(skipped, rel=1e-5)


@pytest.fixture
def short_texts(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("The cat sat on the mat.\nRivers run to the sea.\nOne two three.\n", encoding="utf-8")
    return path


def _run(model, tok, settings) -> dict:
    events = run_manipulation(model, tok, settings, model_name="tiny")
    doc = [e for e in events if isinstance(e, Result)][0].data
    assert round_trips("manipulate", doc)  # built from ManipulateResult, read back the same
    return doc


def test_run_matches_direct_evaluation_and_restores_weights(tiny_llama, short_texts):
    model, tok = tiny_llama
    settings = ManipulationSettings(layers=(1, 2), strategies=("svd", "scale"), alphas=(0.5,), rank=2,
                                    together=True, eval_file=str(short_texts), sample_tokens=2)
    before = _snapshot(model)
    doc = _run(model, tok, settings)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert [r["layers"] for r in doc["results"]] == [[1], [1], [2], [2], [1, 2], [1, 2]]
    texts = eval_texts(short_texts)
    base = Evaluator(model, tok, texts).perplexity()
    assert doc["baseline_ppl"] == pytest.approx(base, rel=1e-5)
    for row in doc["results"]:
        assert set(row) >= {"layers", "strategy", "param", "ppl", "degradation_pct", "sample"}
        assert isinstance(row["sample"], str)
        direct = copy.deepcopy(model)
        stack = LayerStack(direct)
        with torch.no_grad():
            for index in row["layers"]:
                new = _expected(LayerStack(model), index, row["strategy"], row["param"], set(row["layers"]))
                for name, weight in stack.matrices(index).items():
                    weight.copy_(new[name])
        ppl = Evaluator(direct, tok, texts).perplexity()
        assert row["ppl"] == pytest.approx(ppl, rel=1e-4), row
        assert row["degradation_pct"] == pytest.approx(100 * (ppl - base) / base, rel=1e-3, abs=1e-3)


def test_scale_one_is_the_baseline(tiny_llama, short_texts):
    model, tok = tiny_llama
    settings = ManipulationSettings(layers=(2,), strategies=("scale",), alphas=(1.0,),
                                    eval_file=str(short_texts), sample_tokens=3)
    doc = _run(model, tok, settings)
    row = doc["results"][0]
    assert row["ppl"] == pytest.approx(doc["baseline_ppl"], rel=1e-6)
    assert row["sample"] == doc["baseline_sample"]


def test_trial_plan_counts():
    settings = ManipulationSettings(together=True)
    plan = trials(settings, [3, 5])
    assert len(plan) == 3 * (4 + 6)
    assert plan[-1] == ((3, 5), "scale", 0.9)
    assert len(trials(ManipulationSettings(), [3, 5])) == 2 * 10


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"strategies": ("melt",)}, "--strategies melt"),
        ({"strategies": ()}, "--strategies is empty"),
        ({"layers": (9,)}, "out of range"),
        ({"rank": 0}, "--rank"),
        ({"alphas": ()}, "--alphas"),
        ({"layers": (0, 1, 2, 3), "together": True}, "need a layer left"),
    ],
)
def test_bad_input_gets_one_line_error(tiny_llama, short_texts, changes, message):
    model, tok = tiny_llama
    base = ManipulationSettings(eval_file=str(short_texts), sample_tokens=0)
    settings = dataclasses.replace(base, **changes)
    with pytest.raises(UserError, match=message) as info:
        list(run_manipulation(model, tok, settings))
    assert "\n" not in str(info.value)


def test_default_layers_come_from_the_sessions_ablation_map():
    from engine.experiments.manipulate.run import default_layers

    assert default_layers(None, "m")[0] == ()
    rows = [AblationRow(i, 1.0, 1.0, c, anti=a) for i, (c, a) in
            enumerate([("critical", False), ("redundant", False), ("minor", True), ("minor", False)])]
    ablation = AblationMap.from_json(ablation_map(rows, model="m"))
    assert default_layers(ablation, "m")[0] == (1, 2)
    assert default_layers(ablation, "other")[0] == ()


def test_cli_runs_into_the_session(tmp_path, isolated_home, short_texts):
    """`anatomy-tui run manipulate` end to end on a tiny saved model, JSON written, result in the session."""
    import json

    from tiny_models import save_tiny

    from cli.main import main

    folder = save_tiny(tmp_path / "tiny")
    out = tmp_path / "m.json"
    code = main(["run", "manipulate", "--model", str(folder), "--session", "s", "--layers", "1",
                 "--strategies", "zero,scale", "--alphas", "0.5", "--eval-file", str(short_texts),
                 "--sample-tokens", "2", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert [r["strategy"] for r in doc["results"]] == ["zero", "scale"]
    assert (isolated_home / "s" / "results" / "manipulate.json").exists()
    assert main(["run", "manipulate", "--model", str(folder), "--session", "s", "--rank", "0"]) == 2


@pytest.mark.embedded
def test_embedded_scale_grid_point(embedded, short_texts):
    settings = ManipulationSettings(layers=(28,), strategies=("scale",), alphas=(0.9,),
                                    eval_file=str(short_texts), sample_tokens=3)
    doc = _run(embedded.model, embedded.tokenizer, settings)
    assert doc["results"][0]["ppl"] > 0
    assert isinstance(doc["results"][0]["sample"], str)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "opt", "phi3", "gemma2", "qwen3"])
def test_both_experiments_run_on_every_family(family, tokenizer, short_texts):
    from tiny_models import tiny_model

    from engine.experiments.weights.run import run_weights
    from engine.experiments.weights.vocabulary import WeightsSettings

    model = tiny_model(family)
    before = _snapshot(model)
    weights = WeightsSettings(first_layer=1, null_draws=1, paradox_counts=(1,), eval_file=str(short_texts))
    doc = [e for e in run_weights(model, tokenizer, weights) if isinstance(e, Result)][0].data
    assert set(doc["components"]) == set(LayerStack(model).matrix_names)
    settings = ManipulationSettings(layers=(1, 2), alphas=(0.9,), together=True, eval_file=str(short_texts),
                                    sample_tokens=2)
    assert len(_run(model, tokenizer, settings)["results"]) == 3 * 5
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize(("rows", "cols", "rank"), [(300, 80, 8), (64, 200, 5), (50, 50, 1)])
def test_low_rank_from_the_gram_matrix_equals_the_truncated_svd(rows, cols, rank):
    from engine.experiments.manipulate.run import low_rank

    generator = torch.Generator().manual_seed(rows + cols)
    # a decaying spectrum, like a weight difference: the top directions are well separated
    u = torch.linalg.qr(torch.randn(rows, min(rows, cols), generator=generator, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(cols, min(rows, cols), generator=generator, dtype=torch.float64))[0]
    spectrum = 0.8 ** torch.arange(min(rows, cols), dtype=torch.float64)
    matrix = ((u * spectrum) @ v.T).float()
    big_u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    reference = (big_u[:, :rank] * s[:rank]) @ vh[:rank]
    approx = low_rank(matrix, rank)
    assert approx.dtype == torch.float32 and approx.shape == matrix.shape
    assert float((approx.double() - reference).norm() / reference.norm()) < 1e-5
    half = low_rank(matrix.to(torch.bfloat16), rank)
    assert half.dtype == torch.bfloat16
    assert float((half.double() - reference).norm() / reference.norm()) < 2e-2
    assert torch.equal(low_rank(matrix, min(rows, cols)), matrix)  # full rank: the matrix itself
