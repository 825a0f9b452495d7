"""Teacher-student toy models: the two teachers differ as built, students start uniform, the depth
fit recovers known exponents, and a micro run speaks the documented events and JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace
from typing import cast

import numpy as np
import pytest
import torch
from tui_fixtures import round_trips

from engine.core.errors import UserError
from engine.core.events import Cancelled, CancelToken, Result
from engine.experiments.toy_depth.fit import fit_depth_law
from engine.experiments.toy_depth.networks import Students, Teacher, kl
from engine.experiments.toy_depth.run import preset_settings, run_toy_depth, torch_threads
from engine.experiments.toy_depth.vocabulary import StudentDone, StudentStep, ToyDepthSettings

MICRO = ToyDepthSettings(width=8, outputs=8, teacher_depth=6, student_depths=(1, 2, 4), temperatures=(1.0,),
                         steps=12, batch_size=16, lr=1e-2, seeds=2, eval_size=64, bootstrap=40, log_every=4)


def teacher(regime: str, depth: int = 64) -> Teacher:
    settings = ToyDepthSettings(width=32, outputs=16, teacher_depth=depth)
    return Teacher(regime, settings, torch.Generator().manual_seed(0))


def test_tied_teacher_shares_one_block_and_independent_does_not() -> None:
    tied, independent = teacher("tied"), teacher("independent")
    assert all(w is tied.w1[0] for w in tied.w1) and all(w is tied.w2[0] for w in tied.w2)
    assert all(b is tied.b1[0] for b in tied.b1)
    assert len({id(w) for w in independent.w1}) == 64
    assert not torch.equal(independent.w1[0], independent.w1[1])
    # the update scale is 1/sqrt(L) in both: the output projections have the same spread
    assert tied.w2[0].std() == pytest.approx(float(torch.stack(independent.w2).std()), rel=0.1)


def test_tied_updates_are_aligned_and_independent_ones_nearly_orthogonal() -> None:
    """The signature of the two regimes (paper B1): consecutive updates of a smooth flow point the same
    way; those of independent random layers are close to orthogonal."""
    x = torch.randn(256, 32, generator=torch.Generator().manual_seed(1))

    def mean_cos(t: Teacher) -> float:
        states = t.hidden_states(x)
        deltas = [b - a for a, b in zip(states[:-1], states[1:], strict=True)]
        pairs = zip(deltas[:-1], deltas[1:], strict=True)
        cos = [torch.nn.functional.cosine_similarity(a, b, dim=-1).mean() for a, b in pairs]
        return float(torch.stack(cos).mean())

    assert mean_cos(teacher("tied")) > 0.9
    assert abs(mean_cos(teacher("independent"))) < 0.3


def test_students_start_uniform_so_the_first_loss_is_log_k_minus_entropy() -> None:
    settings = ToyDepthSettings(width=32, outputs=16)
    students = Students(3, 2, settings, torch.Generator().manual_seed(0))
    x = torch.randn(32, 32)
    logq = students(x)
    assert torch.allclose(logq, torch.full_like(logq, -math.log(16)))
    logp = teacher("independent").log_probs(x, 0.5)
    entropy = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(kl(logp, logq[0]), math.log(16) - entropy, atol=1e-5)


def test_depth_fit_recovers_a_known_exponent_exactly_and_with_a_floor() -> None:
    depths = [2, 3, 4, 6, 8, 12, 16]
    exact = [[0.5 / d**1.7] * 2 for d in depths]
    doc = fit_depth_law(depths, exact, floor=False, bootstrap=50, seed=0)
    assert doc["alpha_l"] == pytest.approx(1.7, abs=1e-6)
    assert doc["c"] == pytest.approx(0.5, rel=1e-5)
    assert doc["ci95"][0] == pytest.approx(1.7, abs=1e-4) and doc["ci95"][1] == pytest.approx(1.7, abs=1e-4)
    floored = [[0.5 / d**1.7 + 0.01] * 2 for d in depths]
    doc = fit_depth_law(depths, floored, floor=True, bootstrap=0, seed=0)
    assert doc["alpha_l"] == pytest.approx(1.7, abs=1e-3)
    assert doc["L0"] == pytest.approx(0.01, rel=1e-3)


def test_depth_fit_interval_widens_with_seed_noise() -> None:
    rng = np.random.default_rng(0)
    depths = [2, 4, 8, 16]
    noisy = [[0.5 / d * math.exp(rng.normal(0, 0.1)) for _ in range(3)] for d in depths]
    doc = fit_depth_law(depths, noisy, floor=False, bootstrap=200, seed=0)
    assert doc["ci95"][0] < doc["alpha_l"] < doc["ci95"][1]
    assert 0.7 < doc["alpha_l"] < 1.3
    assert doc["ci95"][1] - doc["ci95"][0] > 0.01


def test_micro_run_emits_student_events_and_the_documented_result() -> None:
    events = list(run_toy_depth(MICRO, preset="micro"))
    steps = [e for e in events if isinstance(e, StudentStep)]
    expected = {(r, d) for r in ("tied", "independent") for d in (1, 2, 4)}
    assert {(e.regime, e.depth) for e in steps} == expected
    assert {e.step for e in steps} == {4, 8, 12}
    assert len([e for e in events if isinstance(e, StudentDone)]) == 6
    result = events[-1]
    assert isinstance(result, Result) and result.name == "toy-depth" and round_trips("toy-depth", result.data)
    doc = json.loads(json.dumps(result.data))
    assert doc["preset"] == "micro"
    for regime in ("tied", "independent"):
        entry = doc["regimes"][regime]
        assert entry["depths"] == [1, 2, 4] and len(entry["loss"]) == 3
        assert all(v > 0 for v in entry["loss"])
        assert isinstance(entry["alpha_l"], float)
        assert entry["ci95"] is None or len(entry["ci95"]) == 2
    assert doc["by_temperature"]["1"] == doc["regimes"]


def test_cancel_stops_the_run_and_threads_are_restored() -> None:
    token = CancelToken()
    before = torch.get_num_threads()
    run = run_toy_depth(MICRO, cancel=token)
    next(run)
    token.cancel()
    with pytest.raises(Cancelled):
        list(run)
    assert torch.get_num_threads() == before
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="--regimes"):
        next(run_toy_depth(preset_settings("tiny", regimes=("smooth",))))
    with pytest.raises(UserError, match="preset"):
        preset_settings("huge")
    assert preset_settings("paper").teacher_depth == 128 and preset_settings("paper").width == 32


def test_cli_runs_a_micro_config(tmp_path, monkeypatch) -> None:
    from cli.main import main

    monkeypatch.setenv("ANATOMY_TUI_HOME", str(tmp_path / "home"))
    out = tmp_path / "toy.json"
    code = main(["run", "toy-depth", "--preset", "tiny", "--width", "8", "--outputs", "8",
                 "--teacher-depth", "4", "--student-depths", "1,2", "--steps", "5", "--batch-size", "8",
                 "--eval-size", "16",
                 "--regimes", "independent", "--bootstrap", "5", "--session", "toy", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["preset"] == "tiny" and list(doc["regimes"]) == ["independent"]
    assert doc["settings"]["steps"] == 5 and doc["regimes"]["independent"]["depths"] == [1, 2]


def _result(events) -> dict:
    last = list(events)[-1]
    assert isinstance(last, Result) and round_trips("toy-depth", last.data)  # built from ToyDepthResult
    return {k: v for k, v in last.data.items() if k != "seconds"}


def test_a_run_killed_after_its_first_student_resumes_to_the_uninterrupted_numbers(tmp_path) -> None:
    straight = _result(run_toy_depth(MICRO, preset="micro"))
    folder = tmp_path / "checkpoints"
    token = CancelToken()
    trained = []
    with pytest.raises(Cancelled):
        for event in run_toy_depth(MICRO, preset="micro", cancel=token, checkpoint_dir=folder):
            if isinstance(event, StudentDone):
                trained.append(event)
                token.cancel()
    assert len(trained) == 1
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("student-")) == [
        "student-tied-T1.0-d1.json", "student-tied-T1.0-d1.safetensors"]
    from safetensors.torch import load_file

    weights = load_file(folder / "student-tied-T1.0-d1.safetensors")
    assert weights["w1"].shape == (1, MICRO.seeds, MICRO.width, 4 * MICRO.width)

    events = list(run_toy_depth(MICRO, preset="micro", checkpoint_dir=folder, resume=True))
    retrained = {(e.regime, e.depth) for e in events if isinstance(e, StudentStep)}
    assert ("tied", 1) not in retrained and len(retrained) == 5  # the finished student was restored
    assert _result(events) == straight


def test_resume_refuses_other_settings_and_a_missing_checkpoint_in_one_line(tmp_path) -> None:
    folder = tmp_path / "checkpoints"
    with pytest.raises(UserError, match="nothing to resume"):
        next(run_toy_depth(MICRO, checkpoint_dir=folder, resume=True))
    with pytest.raises(UserError, match="--session"):
        next(run_toy_depth(MICRO, resume=True))
    list(run_toy_depth(MICRO, checkpoint_dir=folder))
    with pytest.raises(UserError, match=r"steps: 12 there, 13 now") as caught:
        next(run_toy_depth(replace(MICRO, steps=13), checkpoint_dir=folder, resume=True))
    assert "\n" not in str(caught.value)
    # threads and log_every change no number: a resume may change them
    events = list(run_toy_depth(replace(MICRO, log_every=6), checkpoint_dir=folder, resume=True))
    assert not [e for e in events if isinstance(e, StudentStep)]


def test_a_damaged_student_checkpoint_is_trained_again(tmp_path) -> None:
    folder = tmp_path / "checkpoints"
    first = _result(run_toy_depth(MICRO, checkpoint_dir=folder))
    (folder / "student-independent-T1.0-d2.json").write_text('{"losses": "many"}')
    record = json.loads((folder / "student-tied-T1.0-d4.json").read_text())
    record["losses"] = [float("nan")] * MICRO.seeds
    (folder / "student-tied-T1.0-d4.json").write_text(json.dumps(record))
    events = list(run_toy_depth(MICRO, checkpoint_dir=folder, resume=True))
    retrained = {(e.regime, e.depth) for e in events if isinstance(e, StudentStep)}
    assert retrained == {("independent", 2), ("tied", 4)}
    assert _result(events) == first


def test_cli_resume_continues_a_session_and_refuses_changed_flags(tmp_path, monkeypatch, capsys) -> None:
    from cli.main import main

    monkeypatch.setenv("ANATOMY_TUI_HOME", str(tmp_path / "home"))
    flags = ["run", "toy-depth", "--preset", "tiny", "--width", "8", "--outputs", "8", "--teacher-depth", "4",
             "--student-depths", "1,2", "--steps", "5", "--batch-size", "8", "--eval-size", "16",
             "--regimes", "independent", "--bootstrap", "5", "--session", "toy"]
    assert main([*flags, "--json", str(tmp_path / "a.json")]) == 0
    checkpoints = tmp_path / "home" / "toy" / "checkpoints" / "toy-depth"
    assert (checkpoints / "student-independent-T1.0-d2.json").is_file()
    assert main([*flags, "--resume", "--json", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert a["regimes"] == b["regimes"]
    capsys.readouterr()
    assert main([*flags[:-2], "--steps", "6", "--session", "toy", "--resume"]) == 2
    assert "other settings" in capsys.readouterr().err
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_students_follow_float32(dtype) -> None:
    """Mixed precision: float32 weights and Adam, the students' forward autocast to the half dtype."""
    micro = dataclasses.replace(MICRO, regimes=("tied",), bootstrap=0, steps=40)
    docs = {}
    for kind in ("float32", dtype):
        result = cast(Result, list(run_toy_depth(dataclasses.replace(micro, device="cpu", dtype=kind)))[-1])
        docs[kind] = json.loads(json.dumps(result.data))
    assert docs[dtype]["settings"]["dtype"] == dtype and docs[dtype]["settings"]["device"] == "cpu"
    full, half = docs["float32"]["regimes"]["tied"]["loss"], docs[dtype]["regimes"]["tied"]["loss"]
    assert all(abs(h - f) <= 0.05 * f for h, f in zip(half, full, strict=True))


def test_auto_precision_is_recorded_resolved_and_bad_devices_are_one_line() -> None:
    result = cast(Result, list(run_toy_depth(dataclasses.replace(MICRO, regimes=("tied",), bootstrap=0, steps=4)))[-1])
    if not torch.cuda.is_available():  # 'auto' is stored as what it resolved to
        assert result.data["settings"]["dtype"] == "float32" and result.data["settings"]["device"] == "cpu"
    with pytest.raises(UserError, match="--device cuda:x: must be auto, cpu, cuda or cuda:N"):
        list(run_toy_depth(dataclasses.replace(MICRO, device="cuda:x")))  # refused with the settings


def test_out_of_memory_in_training_is_one_line(monkeypatch) -> None:
    from engine.models import oom

    freed = []
    monkeypatch.setattr(oom, "release_memory", lambda: freed.append(True))

    def out_of_memory(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(Students, "forward", out_of_memory)
    with pytest.raises(UserError, match=r"^out of memory in toy-depth training of depth 1; try .*--batch-size"
                       ) as info:
        list(run_toy_depth(MICRO))
    assert "\n" not in str(info.value) and freed == [True]
