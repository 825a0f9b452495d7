"""Recovery speed (A5): thresholds, noise and training on a tiny model, restore, NaN, resume, CLI."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from tiny_models import save_tiny
from tui_fixtures import ablation_map, round_trips

from cli import main as cli
from engine.core.errors import UserError
from engine.core.events import Cancelled, CancelToken, Result
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow
from engine.experiments.recovery.run import run, run_recovery
from engine.experiments.recovery.summary import (
    difficulty,
    layer_row,
    steps_to_thresholds,
    summarise_run,
    training_budget,
    versus_ablation,
)
from engine.experiments.recovery.vocabulary import (
    RecoveryLayer,
    RecoveryPoint,
    RecoveryRepeat,
    RecoveryRow,
    RecoverySettings,
    RecoveryStart,
)
from engine.registry import RunContext
from sessions.job_runner import run_job
from sessions.store import SessionStore

TRAIN = "\n".join(f"The cat number {i} sat on the mat and looked at the dog for a while." for i in range(40))
EVAL = ["The dog sat on the mat.", "A cat looked at the dog.", "Number seven sat for a while."]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def texts(tmp_path):
    train, evaluation = tmp_path / "train.txt", tmp_path / "eval.txt"
    train.write_text(TRAIN, encoding="utf-8")
    evaluation.write_text("\n".join(EVAL), encoding="utf-8")
    return train, evaluation


@pytest.fixture(scope="module")
def trained(tokenizer):
    """A tiny llama that has learned the training text a little, so noise has something to break."""
    from tiny_models import tiny_model

    model = tiny_model("llama")
    ids = torch.tensor(tokenizer(TRAIN)["input_ids"][:512]).view(8, 64)
    model.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(25):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.requires_grad_(False)
    model.zero_grad(set_to_none=True)
    return model, tokenizer


def settings_for(texts, **changes) -> RecoverySettings:
    train, evaluation = texts
    base = dict(layers=(1, 2), sigma=3.0, steps=6, lr=1e-2, batch_size=2, block_size=16, train_blocks=4,
                train_file=str(train), eval_file=str(evaluation), eval_every=1)  # auto varies with the load
    return RecoverySettings(**{**base, **changes})


def drain(events) -> tuple[list, dict]:
    seen = list(events)
    assert isinstance(seen[-1], Result) and round_trips(seen[-1].name, seen[-1].data)
    return seen, seen[-1].data


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def assert_same_weights(model, before) -> None:
    after = model.state_dict()
    assert all(torch.equal(after[name], before[name]) for name in before)
    assert not any(p.requires_grad for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())


# --- pure functions -------------------------------------------------------------------------------
def test_thresholds_on_hand_made_curve():
    baseline = 10.0
    curve = [[0, 80.0], [5, 30.0], [10, 19.0], [15, 20.5], [20, 14.0], [25, 11.5], [30, 10.9]]
    # < 20 first at step 10 (19.0; 20.5 later does not undo it), < 15 at 20, < 11 at 30
    assert steps_to_thresholds(curve, baseline) == {"2.0": 10, "1.5": 20, "1.1": 30}
    assert steps_to_thresholds([[0, 50.0], [1, 20.0]], baseline) == {"2.0": None, "1.5": None, "1.1": None}
    assert steps_to_thresholds([[0, 10.5]], baseline) == {"2.0": 0, "1.5": 0, "1.1": 0}


def test_summary_of_an_anti_layer_and_difficulty():
    run = summarise_run([[0, 30.0], [1, 21.0], [2, 18.0], [3, 19.0]], baseline=22.6, status="done")
    assert run["best_ppl"] == 18.0 and run["best_step"] == 2
    assert run["final_ppl"] == 19.0 and run["improved_over_baseline"] is True
    assert run["steps_to"] == {"2.0": 0, "1.5": 0, "1.1": 1}
    assert difficulty(run["steps_to"], budget=200) == 1
    never = summarise_run([[0, 300.0], [200, 176.0]], baseline=22.6, status="done")
    assert never["improved_over_baseline"] is False and difficulty(never["steps_to"], budget=200) == 200


def hand_row(layer: int, hardness: float, final_ratio: float, after_noise: float) -> RecoveryRow:
    """A layer's row as the engine builds it, with the three numbers the budget and Spearman read."""
    curve = [[0, after_noise * 20.0], [200, final_ratio * 20.0]]
    run = RecoveryRepeat(**summarise_run(curve, 20.0, "done"), repeat=0, noise_seed=0, diverged_at=None,
                         steps_run=200, seconds=1.0, seconds_per_step=0.005, train_loss=[])
    return dataclasses.replace(layer_row(layer, [run], 200), difficulty=hardness, mean_final_ratio=final_ratio)


def test_budget_and_spearman_on_hand_rows():
    rows = [hand_row(11, 200.0, 7.8, 40.0), hand_row(14, 10.0, 0.8, 1.2), hand_row(17, 50.0, 0.9, 1.5)]
    budget = training_budget(rows, steps=200)
    assert budget.uniform_total == 600 and budget.proposed_total == 260
    assert budget.saving_steps == 340 and budget.saving_pct == pytest.approx(100 * 340 / 600)
    assert [item.reallocated_steps for item in budget.per_layer] == [462, 23, 115]
    ablation = AblationMap.from_json(ablation_map([
        AblationRow(layer, 1.0, d, "minor") for layer, d in ((11, 7946.0), (14, 1.0), (17, 20.0), (20, 5.0))
    ]))
    result = versus_ablation(rows, ablation)
    assert result is not None
    assert result.layers == 3 and result.difficulty == pytest.approx(1.0)
    assert versus_ablation(rows, None) is None


def test_parse_layers():
    (layers,) = [spec for spec in RecoverySettings.fields() if spec.name == "layers"]
    assert layers.parse_text("11, 14,17") == (11, 14, 17)
    assert layers.parse_text("all") is None
    with pytest.raises(UserError, match="--layers"):
        layers.parse_text("11,x")


# --- the experiment on a tiny model ---------------------------------------------------------------
def test_noise_hurts_training_heals_and_weights_come_back(trained, texts):
    model, tokenizer = trained
    before = snapshot(model)
    events, doc = drain(run_recovery(model, tokenizer, settings_for(texts, eval_every=4), model_name="tiny"))
    assert_same_weights(model, before)
    assert [row["layer"] for row in doc["layers"]] == [1, 2]
    for row in doc["layers"]:
        assert row["status"] == "done"
        assert row["ppl_after_noise"] > doc["baseline_ppl"]  # noise raises the loss
        assert row["final_ppl"] < row["ppl_after_noise"]  # training lowers it
        losses = [loss for _, loss in row["train_loss"]]
        assert len(losses) == 6 and losses[-1] < losses[0]
        assert [step for step, _ in row["curve"]] == [0, 4, 6]  # every 4th step, and the last
        assert row["steps_to"] == steps_to_thresholds(row["curve"], doc["baseline_ppl"])
    points = [e for e in events if isinstance(e, RecoveryPoint)]
    assert [(p.layer, p.step) for p in points] == [(1, 0), (1, 4), (1, 6), (2, 0), (2, 4), (2, 6)]
    assert points[1].eval_ppl / doc["baseline_ppl"] == pytest.approx(points[1].ratio_to_baseline)
    starts = [e for e in events if isinstance(e, RecoveryStart)]
    assert [s.ppl_after_noise for s in starts] == [row["ppl_after_noise"] for row in doc["layers"]]
    assert doc["budget"]["uniform_total"] == 12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_recovery_follows_float32(trained, texts, dtype):
    """lr 1e-4 as in the paper: updating bfloat16 weights directly loses most updates (a drop of
    16 % of float32's here) and float16 AdamW diverges at once; the float32 master copy tracks
    float32, and the half weights still come back bit for bit."""
    import copy

    settings = settings_for(texts, layers=(1,), sigma=3.0, lr=1e-4, steps=8, eval_every=2)
    curves = {}
    for kind in (torch.float32, dtype):
        model = copy.deepcopy(trained[0]).to(kind)
        before = snapshot(model)
        _, doc = drain(run_recovery(model, trained[1], settings))
        assert_same_weights(model, before)
        row = doc["layers"][0]
        assert row["status"] == "done"
        curves[kind] = [ppl for _, ppl in row["curve"]]
    full, half = curves[torch.float32], curves[dtype]
    assert len(half) == len(full) == 5
    assert half[0] - half[-1] >= 0.7 * (full[0] - full[-1]) > 0
    assert all(abs(h - f) <= 0.03 * f for h, f in zip(half, full, strict=True))


def test_prefix_cache_gives_the_same_run(tiny_llama, texts):
    model, tokenizer = tiny_llama
    settings = settings_for(texts, layers=(2,), steps=3)
    _, cached = drain(run_recovery(model, tokenizer, settings))
    plain_settings = settings_for(texts, layers=(2,), steps=3, prefix_cache=False)
    _, plain = drain(run_recovery(model, tokenizer, plain_settings))
    for a, b in zip(cached["layers"][0]["curve"], plain["layers"][0]["curve"], strict=True):
        assert a[0] == b[0] and a[1] == pytest.approx(b[1], rel=1e-4)


def test_repeats_use_different_noise(tiny_llama, texts):
    model, tokenizer = tiny_llama
    _, doc = drain(run_recovery(model, tokenizer, settings_for(texts, layers=(1,), steps=2, repeats=2)))
    row = doc["layers"][0]
    assert len(row["repeats"]) == 2 and row["repeats"][0]["noise_seed"] != row["repeats"][1]["noise_seed"]
    assert row["repeats"][0]["ppl_after_noise"] != row["repeats"][1]["ppl_after_noise"]
    assert row["ppl_after_noise"] == row["repeats"][0]["ppl_after_noise"]
    assert row["steps_to_reached"]["2.0"] in (0, 1, 2)


def test_cancel_within_one_step_restores_weights(tiny_llama, texts):
    model, tokenizer = tiny_llama
    before = snapshot(model)
    cancel = CancelToken()
    seen = []
    with pytest.raises(Cancelled):
        for event in run_recovery(model, tokenizer, settings_for(texts), cancel):
            seen.append(event)
            if isinstance(event, RecoveryPoint) and event.step == 1:
                cancel.cancel()
    assert max(e.step for e in seen if isinstance(e, RecoveryPoint)) == 1
    assert_same_weights(model, before)


def test_nan_loss_stops_that_layer_and_the_sweep_goes_on(tiny_llama, texts):
    model, tokenizer = tiny_llama
    layer = model.model.layers[1]

    def poison(module, args, output):  # NaN only while layer 1 itself is being trained
        return output * math.nan if module.self_attn.q_proj.weight.requires_grad else output

    handle = layer.register_forward_hook(poison)
    try:
        before = snapshot(model)
        _, doc = drain(run_recovery(model, tokenizer, settings_for(texts)))
    finally:
        handle.remove()
    assert_same_weights(model, before)
    first, second = doc["layers"]
    assert first["status"] == "diverged" and first["diverged_at"] == 1
    assert [step for step, _ in first["curve"]] == [0]  # the noised model's perplexity, before training
    reached = first["curve"][0][1] < 1.1 * doc["baseline_ppl"]
    assert first["difficulty"] == (0.0 if reached else 6.0)  # never reached counts as the whole budget
    assert second["status"] == "done" and second["steps_run"] == 6
    json.dumps(doc, allow_nan=False)  # a diverged run still writes valid JSON


@pytest.mark.parametrize("changes", [dict(sigma=0.0), dict(steps=0), dict(lr=-1e-4), dict(layers=(7,))])
def test_bad_settings_are_one_line_errors(tiny_llama, texts, changes):
    model, tokenizer = tiny_llama
    with pytest.raises(UserError) as caught:
        list(run_recovery(model, tokenizer, settings_for(texts, **changes)))
    assert "\n" not in str(caught.value)


# --- session, resume and the CLI ------------------------------------------------------------------
def cli_args(folder, texts, *extra) -> list[str]:
    train, evaluation = texts
    return ["run", "recovery", "--model", str(folder), "--device", "cpu", "--layers", "1,2", "--sigma", "3",
            "--steps", "4", "--lr", "1e-2", "--batch-size", "2", "--block-size", "16", "--train-blocks", "4",
            "--eval-every", "2", "--train-file", str(train), "--eval-file", str(evaluation), *extra]


def cancel_after_first_layer(events, cancel):
    for event in events:
        yield event
        if isinstance(event, RecoveryLayer):
            cancel.cancel()


def test_cancelled_sweep_resumes_at_the_next_layer(tmp_path, texts):
    from engine.models.loading import load_model

    folder = save_tiny(tmp_path / "tiny")
    loaded = load_model(str(folder), device="cpu")
    settings = settings_for(texts, steps=4, eval_every=2)
    session = SessionStore().create("sweep")
    cancel = CancelToken()
    context = RunContext(model=loaded, cancel=cancel, checkpoint_dir=session.checkpoint_dir("recovery"))
    assert run_job(session, "recovery", {}, cancel_after_first_layer(run(settings, context), cancel)) is None
    saved = json.loads((session.path / "checkpoints/recovery/layers.json").read_text())
    assert list(saved["layers"]) == ["1"] and saved["key"]["dtype"] == "float32"
    assert (session.path / "checkpoints/recovery/weights/layer-1.safetensors").exists()

    out = tmp_path / "resumed.json"
    assert cli.main(cli_args(folder, texts, "--session", "sweep", "--resume", "--json", str(out))) == 0
    resumed = json.loads(out.read_text())
    assert resumed["resumed_layers"] == [1]
    _, fresh = drain(run_recovery(loaded.model, loaded.tokenizer, settings, model_name=loaded.name))
    for a, b in zip(resumed["layers"], fresh["layers"], strict=True):
        assert a["layer"] == b["layer"] and a["steps_to"] == b["steps_to"]
        assert [p for _, p in a["curve"]] == pytest.approx([p for _, p in b["curve"]], rel=1e-6)
    stored = SessionStore().open("sweep").load_result("recovery")
    assert stored is not None and stored["layers"][1]["layer"] == 2


def test_sweep_killed_in_its_first_layer_resumes_from_the_start(tmp_path, texts):
    """A checkpoint with no finished layer (or none at all) is a sweep to start again, not an error."""
    folder = save_tiny(tmp_path / "tiny")
    SessionStore().create("fresh")  # killed before the checkpoint was written
    assert cli.main(cli_args(folder, texts, "--session", "fresh", "--resume", "--layers", "1",
                             "--steps", "2")) == 0
    session = SessionStore().open("fresh")
    stored = session.load_result("recovery")
    assert stored is not None and stored["resumed_layers"] == []
    path = session.path / "checkpoints/recovery/layers.json"
    state = json.loads(path.read_text())
    state["layers"] = {}
    path.write_text(json.dumps(state))
    assert cli.main(cli_args(folder, texts, "--session", "fresh", "--resume", "--layers", "1",
                             "--steps", "2")) == 0


def test_resume_refuses_another_dtype(tmp_path, texts):
    """A float16 sweep never continues a float32 one (the key holds model, dtype and device)."""
    from engine.experiments.sweep_checkpoint import load_finished, sweep_key

    class Loaded:
        name, dtype_name, device = "m", "float32", "cpu"

    path = tmp_path / "layers.json"
    settings = settings_for(texts)
    path.write_text(json.dumps({"key": sweep_key(settings, Loaded()), "layers": {}}))
    assert load_finished(path, sweep_key(settings, Loaded())) is not None
    Loaded.dtype_name = "float16"
    with pytest.raises(UserError, match="dtype float32, not float16"):
        load_finished(path, sweep_key(settings, Loaded()))


def test_resume_refuses_other_settings(tmp_path, texts, capsys):
    folder = save_tiny(tmp_path / "tiny")
    assert cli.main(cli_args(folder, texts, "--session", "s", "--steps", "2")) == 0
    assert cli.main(cli_args(folder, texts, "--session", "s", "--resume", "--sigma", "2")) == 2
    assert "sigma" in capsys.readouterr().err
    assert cli.main(cli_args(folder, texts, "--resume")) == 2  # no session named
    assert cli.main(cli_args(folder, texts, "--session", "s", "--resume", "--steps", "2", "--dtype", "bfloat16")) == 2
    assert "used dtype float32, not bfloat16" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, words",
    [(["--sigma", "0"], "--sigma"), (["--steps", "-1"], "--steps"), (["--lr", "0"], "--lr"),
     (["--layers", "9"], "out of range"), (["--layers", "a,b"], "--layers")],
)
def test_cli_bad_input_is_one_line(tmp_path, texts, capsys, flags, words):
    folder = save_tiny(tmp_path / "tiny")
    assert cli.main(cli_args(folder, texts, *flags)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and words in err[-1] and err[-1].startswith("anatomy-tui: error:")


@pytest.mark.embedded
def test_embedded_model_noise_and_restore(embedded, texts):
    """The real model: noising a deep layer hurts, one step of training helps, weights come back."""
    before = snapshot(embedded.model)
    settings = settings_for(texts, layers=(28,), sigma=0.5, steps=2, lr=1e-4, batch_size=1, block_size=32)
    _, doc = drain(run_recovery(embedded.model, embedded.tokenizer, settings, model_name=embedded.name))
    assert_same_weights(embedded.model, before)
    row = doc["layers"][0]
    assert row["status"] == "done" and row["ppl_after_noise"] > doc["baseline_ppl"]
    assert row["final_ppl"] < row["ppl_after_noise"]
