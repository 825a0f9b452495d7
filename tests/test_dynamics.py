"""B1 hidden-state dynamics: angles on hand-built states, streaming against an all-at-once
reference, clustering of synthetic profiles with known clusters, the logit lens identity."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tiny_models import TINY_CONFIGS, save_tiny, tiny_model
from tui_fixtures import round_trips

from engine.core.codec import from_doc
from engine.core.errors import UserError
from engine.core.events import Result
from engine.evaluation.perplexity import Evaluator, tokenize_batches
from engine.experiments.dynamics.clusters import cluster_profiles, scatter_sample
from engine.experiments.dynamics.lens import LastBlockLens, LogitLens
from engine.experiments.dynamics.profiles import (
    Profiles,
    angle_degrees,
    keep_mask,
    profiles_from_states,
    stream_profiles,
    trajectory,
)
from engine.experiments.dynamics.run import run_dynamics
from engine.experiments.dynamics.vocabulary import DynamicsSettings, PcaSample
from engine.models.anatomy import LayerStack

TEXTS = [
    "The cat sat on the mat.",
    "A much longer sentence follows here, so that the batch has padding to exclude.",
    "Short one.",
    "Numbers: 1, 2, 3, 4, 5 and the rest.",
    "def f(x):\n    return x * 2",
]


def result_of(events) -> dict:
    last = list(events)[-1]
    assert isinstance(last, Result) and round_trips("dynamics", last.data)  # built from DynamicsResult
    return last.data


def profiles_of(model, tokenizer, batch_size: int, include_first: bool = False) -> Profiles:
    batches = tokenize_batches(tokenizer, TEXTS, batch_size, 128, "cpu")
    return [p for p in stream_profiles(model, batches, include_first) if isinstance(p, Profiles)][0]


def sorted_rows(p: Profiles) -> np.ndarray:
    """Token order by (text, position), so runs with different batching line up."""
    return np.lexsort((p.where[:, 1], p.where[:, 0]))


# --- angles ------------------------------------------------------------------------------------------


def test_angle_degrees_known_values():
    e = torch.eye(4)
    a = torch.stack([e[0], e[0], e[0], e[0], e[0] * 3])
    b = torch.stack([e[1], e[0] * 5, -e[0], e[0] + e[1], e[0] + math.sqrt(3) * e[1]])
    got = angle_degrees(a, b)
    assert torch.allclose(got, torch.tensor([90.0, 0.0, 180.0, 45.0, 60.0]), atol=1e-4)
    assert torch.isnan(angle_degrees(torch.zeros(4), e[0]))


def test_orthogonal_updates_give_90_degrees():
    """h_l+1 = h_l + e_l+1: every update is orthogonal to the previous one, and
    theta(h_l, h_l+1) = arccos(sqrt(l+1) / sqrt(l+2)) for h_0 = e_0."""
    n_layers, width = 5, 8
    e = torch.eye(width)
    states = [e[0].clone()]
    for layer in range(n_layers):
        states.append(states[-1] + e[layer + 1])
    states = [s.view(1, 1, width) for s in states]
    got = profiles_from_states(states, torch.ones(1, 1, dtype=torch.bool))
    assert torch.allclose(got["angle_update"], torch.full((1, n_layers - 1), 90.0), atol=1e-4)
    expected = torch.tensor([math.degrees(math.acos(math.sqrt((i + 1) / (i + 2)))) for i in range(n_layers)])
    assert torch.allclose(got["angle_state"][0], expected, atol=1e-4)
    assert torch.allclose(got["update_norm"], torch.ones(1, n_layers))
    assert torch.allclose(got["norm"][0], torch.sqrt(torch.arange(2, n_layers + 2, dtype=torch.float32)))


def test_parallel_and_reversing_updates():
    """Row 0: the same update every layer (0 degrees); row 1: the update flips sign (180)."""
    width = 6
    g = torch.Generator().manual_seed(1)
    start, step = torch.randn(2, width, generator=g), torch.randn(2, width, generator=g)
    signs = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0]])
    states = [start]
    for layer in range(4):
        states.append(states[-1] + signs[:, layer : layer + 1] * step)
    states = [s.view(2, 1, width) for s in states]
    got = profiles_from_states(states, torch.ones(2, 1, dtype=torch.bool))
    assert torch.allclose(got["angle_update"][0], torch.zeros(3), atol=1e-3)
    assert torch.allclose(got["angle_update"][1], torch.full((3,), 180.0), atol=1e-3)


def test_keep_mask_drops_padding_and_optionally_the_first_position():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert keep_mask(mask, include_first=True).tolist() == mask.bool().tolist()
    without = [[False, True, True, False], [False, True, False, False]]
    assert keep_mask(mask, include_first=False).tolist() == without


def test_trajectory_by_hand():
    """h_0 = (1, 0), h_1 = (1, 1), h_2 = (0, 2): h_2 - h_0 = (-1, 2), |.|^2 = 5, so
    s = 0, <(0, 1), (-1, 2)> / 5 = 0.4, 1; angles to h_2: 90, 45, 0 degrees."""
    states = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 2.0])]
    got = profiles_from_states([h.view(1, 1, 2) for h in states], torch.ones(1, 1, dtype=torch.bool))
    assert got["progress"][0].tolist() == pytest.approx([0.0, 0.4, 1.0], abs=1e-7)
    assert got["angle_final"][0].tolist() == pytest.approx([90.0, 45.0, 0.0], abs=1e-4)


def test_trajectory_ends_exactly_at_0_and_1():
    g = torch.Generator().manual_seed(3)
    states = [torch.randn(50, 16, generator=g) * (i + 1) for i in range(7)]
    got = trajectory(states)
    assert got["progress"].shape == (50, 7) and got["angle_final"].shape == (50, 7)
    assert (got["progress"][:, 0] == 0.0).all() and (got["progress"][:, -1] == 1.0).all()
    assert (got["angle_final"][:, -1] == 0.0).all()
    # s_l is the projection of h_l - h_0 onto the h_0 -> h_L direction, in units of its length
    d = states[-1] - states[0]
    manual = ((states[3] - states[0]) * d).sum(-1) / (d.norm(dim=-1) ** 2)
    torch.testing.assert_close(got["progress"][:, 3], manual, rtol=1e-5, atol=1e-6)


# --- streaming on a real (tiny) model ----------------------------------------------------------------


def test_streaming_equals_all_at_once_reference(tiny_llama):
    """The hook-based stream (batch size 2, padded) against output_hidden_states of one text at a
    time. HF applies the final norm to its last hidden state, so the last layer's columns are
    compared only between the two streams (batch size 1 and 2)."""
    model, tokenizer = tiny_llama
    streamed = profiles_of(model, tokenizer, batch_size=2)
    single = profiles_of(model, tokenizer, batch_size=1)
    assert streamed.n_tokens == sum(len(tokenizer(t)["input_ids"]) - 1 for t in TEXTS)
    a, b = sorted_rows(streamed), sorted_rows(single)
    np.testing.assert_array_equal(streamed.where[a], single.where[b])
    for name in ("angle_state", "angle_update", "norm", "update_norm", "embedding_norm"):
        np.testing.assert_allclose(getattr(streamed, name)[a], getattr(single, name)[b], atol=2e-3, rtol=1e-4)

    reference = []
    for text in TEXTS:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[:-1]
        keep = keep_mask(torch.ones_like(ids), include_first=False)
        reference.append(profiles_from_states(list(hidden), keep))
    n = len(model.model.layers)
    state = torch.cat([r["angle_state"] for r in reference]).numpy()
    update = torch.cat([r["angle_update"] for r in reference]).numpy()
    assert state.shape[1] == n - 1 and update.shape[1] == n - 2
    np.testing.assert_allclose(streamed.angle_state[a][:, : n - 1], state, atol=2e-3)
    np.testing.assert_allclose(streamed.angle_update[a][:, : n - 2], update, atol=2e-3)


def test_first_position_flag_counts(tiny_llama):
    model, tokenizer = tiny_llama
    without = profiles_of(model, tokenizer, 4, include_first=False)
    with_first = profiles_of(model, tokenizer, 4, include_first=True)
    assert with_first.n_tokens == without.n_tokens + len(TEXTS)
    assert (with_first.where[:, 1] == 0).sum() == len(TEXTS)
    assert (without.where[:, 1] == 0).sum() == 0


# --- clustering --------------------------------------------------------------------------------------


def test_clustering_recovers_known_synthetic_clusters():
    """900 tokens with updates near 90 degrees, 60 near 30 and 40 near 150: silhouette must choose
    k=3, the bulk is the 90-degree group (90 %), and every token lands with its own group."""
    rng = np.random.default_rng(0)
    centres = [(90.0, 900), (30.0, 60), (150.0, 40)]
    matrix = np.concatenate([rng.normal(c, 3.0, size=(n, 12)) for c, n in centres])
    truth = np.repeat([0, 1, 2], [n for _, n in centres])
    c = cluster_profiles(matrix, components=5)
    assert c.k == 3
    assert set(c.silhouette) == {2, 3, 4, 5, 6} and max(c.silhouette, key=c.silhouette.__getitem__) == 3
    np.testing.assert_array_equal(c.labels, truth)
    assert c.explained[0] > 0.9


def test_scatter_sample_is_a_fixed_bounded_sample_at_its_pca_coordinates():
    """The sample's coordinates are sklearn's PCA transform of those very tokens, its labels their
    clusters; at most the asked size, without repeats, the same for the same seed."""
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(2)
    matrix = np.concatenate([rng.normal(90.0, 3.0, size=(700, 6)), rng.normal(40.0, 3.0, size=(50, 6))])
    c = cluster_profiles(matrix, components=4, clusters=2)
    sample = scatter_sample(c, seed=5, size=120)
    assert len(sample.token) == 120 == len(set(sample.token)) and sample.token == sorted(sample.token)
    expected = PCA(n_components=4, random_state=0).fit(matrix).transform(matrix[sample.token])
    np.testing.assert_allclose(np.stack([sample.pc1, sample.pc2], axis=1), expected[:, :2], atol=1e-8)
    assert sample.label == c.labels[sample.token].tolist() and set(sample.label) == {0, 1}
    assert scatter_sample(c, seed=5, size=120) == sample and scatter_sample(c, seed=6, size=120) != sample
    assert scatter_sample(c, seed=5, size=10_000).token == list(range(750))  # fewer tokens: all of them
    one = scatter_sample(cluster_profiles(matrix, components=1, clusters=2), seed=5, size=10)
    assert one.pc2 == [0.0] * 10


def test_fixed_cluster_count_and_too_many_clusters():
    rng = np.random.default_rng(1)
    matrix = rng.normal(90.0, 5.0, size=(50, 4))
    assert cluster_profiles(matrix, components=3, clusters=4).k == 4
    with pytest.raises(UserError):
        cluster_profiles(matrix[:3], components=3, clusters=4)


# --- logit lens --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(set(TINY_CONFIGS) - {"opt"}))
def test_logit_lens_last_layer_is_the_model_loss(family, tokenizer):
    """Read through the final norm and head, the last layer's output must give the model's own loss."""
    model = tiny_model(family)
    batches = tokenize_batches(tokenizer, TEXTS, 2, 64, "cpu")
    lens = LogitLens(model, len(LayerStack(model)))
    list(stream_profiles(model, batches, False, lens))
    scores = Evaluator(model, tokenizer, TEXTS, batch_size=2, max_length=64).scores()
    expected = float(scores.nll.sum() / scores.tokens.sum())
    assert lens.losses()[-1] == pytest.approx(expected, rel=1e-4)
    assert lens.count == scores.tokens.sum()


@pytest.mark.parametrize("family", sorted(set(TINY_CONFIGS) - {"opt"}))
def test_last_block_lens_is_the_model_with_the_layers_between_skipped(family, tokenizer):
    """Layer l's input through the last block, the final norm and head is exactly what the model
    computes when layers l..L-2 pass their input through: then the last block receives h_l. For
    the last layer nothing is skipped, so that entry is the model's own loss."""
    model = tiny_model(family)
    stack = LayerStack(model)
    n = len(stack)
    batches = tokenize_batches(tokenizer, TEXTS, 2, 64, "cpu")
    lens = LastBlockLens(model, n)
    list(stream_profiles(model, batches, False, lens))
    plain = LogitLens(model, n)
    list(stream_profiles(model, batches, False, plain))
    for layer in range(n):
        with stack.skipped(range(layer, n - 1)):
            scores = Evaluator(model, tokenizer, TEXTS, batch_size=2, max_length=64).scores()
        expected = float(scores.nll.sum() / scores.tokens.sum())
        assert lens.losses()[layer] == pytest.approx(expected, rel=1e-4), layer
    assert lens.losses()[-1] == pytest.approx(plain.losses()[-1], rel=1e-5)
    assert lens.count == plain.count


def test_logit_lens_refuses_unclear_family():
    with pytest.raises(UserError, match="logit lens"):
        LogitLens(tiny_model("opt"), 4)


# --- the experiment and the command ------------------------------------------------------------------


def test_run_dynamics_document(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    text_file = tmp_path / "texts.txt"
    text_file.write_text("\n".join(TEXTS * 4), encoding="utf-8")
    settings = DynamicsSettings(text_file=str(text_file), max_tokens=200, max_length=64, logit_lens=True)
    doc = result_of(run_dynamics(model, tokenizer, settings, model_name="tiny"))
    assert doc["model"] == "tiny" and 0 < doc["tokens"] <= 200
    assert len(doc["layers"]) == 4 and doc["layers"][-1]["angle_update"]["median"] is None
    for row in doc["layers"]:
        q = row["angle_state"]
        assert 0 <= q["q1"] <= q["median"] <= q["q3"] <= 180
    clusters = doc["pca"]["clusters"]
    assert sum(c["size"] for c in clusters) == doc["tokens"]
    assert clusters[0]["bulk"] and clusters[0]["fraction"] == doc["pca"]["bulk_fraction"]
    assert [c["size"] for c in clusters] == sorted((c["size"] for c in clusters), reverse=True)
    assert all("[[" in example for c in clusters for example in c["examples"])
    sample = from_doc(PcaSample, doc["pca"]["sample"])
    assert len(sample.token) == min(doc["tokens"], 300) and set(sample.label) <= {c["label"] for c in clusters}
    assert len(doc["logit_lens"]["loss"]) == 4 and doc["logit_lens"]["lens"] == "plain"
    last = doc["layers"][-1]
    assert last["progress"] == {"median": 1.0, "q1": 1.0, "q3": 1.0}
    assert last["angle_final"] == {"median": 0.0, "q1": 0.0, "q3": 0.0}
    for row in doc["layers"]:
        q = row["angle_final"]
        assert 0 <= q["q1"] <= q["median"] <= q["q3"] <= 180
    json.dumps(doc, allow_nan=False)
    last_block = result_of(run_dynamics(model, tokenizer, DynamicsSettings(
        text_file=str(text_file), max_tokens=200, max_length=64, lens="last-block"), model_name="tiny"))
    assert last_block["logit_lens"]["lens"] == "last-block"
    assert last_block["logit_lens"]["final_loss"] == pytest.approx(doc["logit_lens"]["final_loss"], rel=1e-5)
    assert last_block["logit_lens"]["loss"][:-1] != pytest.approx(doc["logit_lens"]["loss"][:-1], rel=1e-3)


def test_bad_settings_are_user_errors():
    for bad in (dict(max_tokens=0), dict(profile="x"), dict(clusters=-1), dict(eval_batch_size=0),
                dict(lens="x")):
        with pytest.raises(UserError):
            DynamicsSettings(**bad).validate()


def test_command_writes_json(tmp_path, capsys):
    from cli.main import main

    folder = save_tiny(tmp_path / "tiny")
    text_file = tmp_path / "texts.txt"
    text_file.write_text("\n".join(TEXTS * 3), encoding="utf-8")
    out = tmp_path / "dyn.json"
    assert main(["run", "dynamics", "--model", str(folder), "--device", "cpu", "--text-file", str(text_file),
                 "--max-tokens", "150", "--json", str(out), "--clusters", "2"]) == 0
    doc = json.loads(out.read_text())
    assert doc["pca"]["k"] == 2 and len(doc["pca"]["clusters"]) == 2
    assert "bulk fraction" in capsys.readouterr().out


@pytest.mark.embedded
def test_embedded_model_profile(embedded):
    """SmolLM2 on ~256 held-out tokens: one row per layer, angles in range, the embedding-sized
    first update much larger than the core's (|dh|/|h| > 1 at layer 0, < 1 in the core)."""
    settings = DynamicsSettings(max_tokens=256)
    doc = result_of(run_dynamics(embedded.model, embedded.tokenizer, settings, model_name=embedded.name))
    assert len(doc["layers"]) == embedded.n_layers
    assert 150 <= doc["tokens"] <= 256
    assert 0 < doc["core"]["angle_update_median"] < 180
    assert doc["layers"][0]["relative_update"]["median"] > 1 > doc["core"]["relative_update_median"]
