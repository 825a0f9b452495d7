"""Recovery reuses a baseline measured already (one evaluation pass less, the same curve) when its
fingerprint matches, refuses a forged or foreign one, and sizes `--steps auto` for the device: a
short run on the CPU, the paper's 200 steps on a GPU (issue 43)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_models import byte_tokenizer, tiny_model

from engine.core.events import Event, Message, Progress, Result
from engine.evaluation.perplexity import Evaluator
from engine.experiments.recovery import sweep as sweep_module
from engine.experiments.recovery.run import run_recovery
from engine.experiments.recovery.sweep import auto_steps
from engine.experiments.recovery.vocabulary import RecoveryPoint, RecoverySettings
from engine.models.placement import training_budget_seconds

TRAIN = "\n".join(f"The cat number {i} sat on the mat and looked at the dog for a while." for i in range(40))
EVAL = ["The dog sat on the mat.", "A cat looked at the dog.", "Number seven sat for a while."]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def settings(tmp_path: Path) -> RecoverySettings:
    train, evaluation = tmp_path / "train.txt", tmp_path / "eval.txt"
    train.write_text(TRAIN, encoding="utf-8")
    evaluation.write_text("\n".join(EVAL), encoding="utf-8")
    return RecoverySettings(layers=(1, 2), sigma=3.0, steps=4, lr=1e-2, batch_size=2, block_size=16, train_blocks=4,
                            train_file=str(train), eval_file=str(evaluation), eval_every=1)


class Counted:
    """The rows every evaluation forward scored (a forward stopped early by the prefix cache scores none)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        scored = Evaluator._forward_nll

        def counting(evaluator: Evaluator, batch: Any) -> Any:
            nll = scored(evaluator, batch)
            self.rows += len(batch.input_ids)
            return nll

        monkeypatch.setattr(Evaluator, "_forward_nll", counting)


def sweep(settings: RecoverySettings, file: Path, identity: str = "float32", **kwargs: Any) -> list[Event]:
    return list(run_recovery(tiny_model("llama"), byte_tokenizer(), settings, model_name="tiny", dtype_name=identity,
                             baseline_file=file, **kwargs))


def curve(events: list[Event]) -> list[tuple[int, int, float]]:
    return [(e.layer, e.step, e.eval_ppl) for e in events if isinstance(e, RecoveryPoint)]


def said(events: list[Event], part: str) -> bool:
    return any(isinstance(e, Message) and part in e.text for e in events)


def test_a_known_baseline_saves_one_pass_over_every_text_and_gives_the_same_curve(settings, tmp_path, monkeypatch):
    counted = Counted(monkeypatch)
    file = tmp_path / "baseline.json"
    first = sweep(settings, file)
    measured_rows, counted.rows = counted.rows, 0
    kept = json.loads(file.read_text())
    assert kept["measured_by"] == "recovery" and kept["baseline_ppl"] > 1
    again = sweep(settings, file)
    assert counted.rows == measured_rows - len(EVAL)  # the baseline pass, and nothing else, is gone
    assert curve(again) == curve(first) and len(curve(first)) == 2 * (1 + settings.steps)
    assert said(again, "as recovery measured it") and not said(first, "measured it")
    assert isinstance(again[-1], Result) and again[-1].data["baseline_ppl"] == first[-1].data["baseline_ppl"]  # type: ignore[attr-defined]
    passes = [e.phase for e in again if isinstance(e, Progress) and e.done == 0 and e.unit == "texts"]
    assert passes[0] == "prefix"  # the cache, up to the deepest layer, instead of the baseline pass


def test_the_subset_baseline_comes_from_the_cache_when_the_baseline_is_known(settings, tmp_path):
    """Fewer texts between the first and the last step: their own baseline is scored from the
    deepest layer's cached input, the same numbers as the full pass gives."""
    file = tmp_path / "baseline.json"
    few = RecoverySettings(**{**settings.to_dict(), "eval_texts": 1, "eval_batch_size": 1})
    assert curve(sweep(few, file)) == curve(sweep(few, file))


@pytest.mark.parametrize("doc, why", [
    ({"fingerprint": "0" * 64, "baseline_ppl": 12.0, "measured_by": "the console's layer map"}, "another model"),
    ({"fingerprint": "x", "baseline_ppl": "twelve", "measured_by": "x"}, "ignored"),
    ("[1, 2", "ignored"),
])
def test_a_foreign_or_forged_baseline_is_measured_again(settings, tmp_path, monkeypatch, doc, why):
    counted = Counted(monkeypatch)
    file = tmp_path / "baseline.json"
    reference = sweep(settings, tmp_path / "none.json")
    measured_rows, counted.rows = counted.rows, 0
    file.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    events = sweep(settings, file)
    assert said(events, why) and counted.rows == measured_rows and curve(events) == curve(reference)


def test_a_baseline_of_another_precision_is_not_reused(settings, tmp_path):
    file = tmp_path / "baseline.json"
    sweep(settings, file, identity="bfloat16")
    assert said(sweep(settings, file, identity="float32"), "another model, precision")


def test_a_forged_perplexity_with_the_right_fingerprint_is_refused(settings, tmp_path):
    file = tmp_path / "baseline.json"
    sweep(settings, file)
    file.write_text(json.dumps({**json.loads(file.read_text()), "baseline_ppl": 0.5}))
    assert said(sweep(settings, file), "is no perplexity")


# --steps auto: sized for the device -----------------------------------------------------------------
def test_the_device_rule_gives_the_cpu_a_short_run_and_a_gpu_the_papers():
    assert training_budget_seconds("cpu") == 150.0
    assert training_budget_seconds("cuda") is None and training_budget_seconds("cuda:1") is None
    assert auto_steps(None, 0.5) == 200  # a GPU: the paper's, whatever a step takes
    assert auto_steps(150.0, 10.0) == 12  # 150 s / (10 s a step and a quarter of one evaluating)
    assert auto_steps(150.0, 100.0) == 5 and auto_steps(150.0, 0.01) == 200 and auto_steps(150.0, None) == 5


def test_auto_steps_on_the_cpu_are_short_and_say_how_to_ask_for_the_papers(settings, tmp_path):
    auto = RecoverySettings(**{**settings.to_dict(), "steps": None, "layers": (1,)})
    events = sweep(auto, tmp_path / "baseline.json")
    line = next(e.text for e in events if isinstance(e, Message) and "--steps auto" in e.text)
    assert "on the CPU" in line and "--steps 200" in line
    steps = events[-1].data["settings"]["steps"]  # type: ignore[attr-defined]
    assert 5 <= steps <= 200 and curve(events)[-1][1] == steps  # the result records the steps it ran


def test_auto_steps_on_a_gpu_are_the_papers(settings, tmp_path, monkeypatch):
    """The sweep asks the rule about its device; a GPU's answer (no budget) runs 200 steps."""
    asked: list[str] = []

    def on_a_gpu(device: str) -> float | None:
        asked.append(device)
        return training_budget_seconds("cuda:0")

    monkeypatch.setattr(sweep_module, "training_budget_seconds", on_a_gpu)
    auto = RecoverySettings(**{**settings.to_dict(), "steps": None, "layers": (1,), "eval_every": 100})
    events = sweep(auto, tmp_path / "baseline.json")
    assert asked == ["cpu"] and not said(events, "--steps auto")
    assert events[-1].data["settings"]["steps"] == 200 and curve(events)[-1][1] == 200  # type: ignore[attr-defined]


def test_a_resumed_auto_sweep_keeps_the_steps_its_finished_layers_ran(settings, tmp_path):
    auto = RecoverySettings(**{**settings.to_dict(), "steps": None})
    first = sweep(RecoverySettings(**{**auto.to_dict(), "layers": (1,)}), tmp_path / "baseline.json")
    done = first[-1].data["layers"]  # type: ignore[attr-defined]
    ran = first[-1].data["settings"]["steps"]  # type: ignore[attr-defined]
    resumed = sweep(auto, tmp_path / "baseline.json", done_layers=done)
    assert resumed[-1].data["settings"]["steps"] == ran and not said(resumed, "--steps auto")  # type: ignore[attr-defined]


@pytest.mark.parametrize("mapped_in, said_then", [("float32", "as the console's layer map measured it"),
                                                   ("bfloat16", "another model, precision")])
def test_the_consoles_map_hands_its_baseline_to_the_recovery_job_it_starts(settings, tmp_path, monkeypatch,
                                                                           isolated_home, mapped_in, said_then):
    """The map measured the baseline of the same texts on the same model, precision and device: the
    console writes it, with that fingerprint, where the recovery job it starts reads it, and the
    job skips its baseline pass; the number is the map's. A map its job recorded in another
    precision is not taken."""
    from test_lab import make_lab

    from engine.experiments.ablation.run import run_ablation
    from engine.experiments.ablation.vocabulary import AblationSettings
    from sessions.job_runner import run_job

    lab, _, _ = make_lab(monkeypatch)
    assert lab.session is not None  # make_lab opens one
    model = tiny_model("llama")
    mapped = AblationSettings(eval_file=settings.eval_file, layers=(1,))
    spec = {"model": {"name": "tiny", "dtype": mapped_in, "device": "cpu"}}
    run_job(lab.session, "ablation", spec, run_ablation(model, byte_tokenizer(), mapped, model_name="tiny"))
    lab.poll()
    assert lab.state.ablation_map is not None
    assert lab.inject(1, 3.0, 4, 1e-2) is not None
    file = lab.session.checkpoint_dir("recovery") / "baseline.json"
    events = list(run_recovery(model, byte_tokenizer(), settings, model_name="tiny", dtype_name="float32",
                               baseline_file=file))
    assert said(events, said_then)
    if mapped_in == "float32":
        assert events[-1].data["baseline_ppl"] == lab.state.ablation_map.baseline_ppl  # type: ignore[attr-defined]


def test_the_step_estimate_counts_the_output_head_in_layers():
    """A small model's head costs several layers' work; counted from the config by hand."""
    from engine.experiments.recovery.sweep import head_in_layers
    from engine.models.anatomy import LayerStack

    model = tiny_model("llama")
    c = model.config
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    layer = 2 * c.hidden_size**2 + 2 * c.hidden_size * kv + 3 * c.hidden_size * c.intermediate_size
    assert head_in_layers(model, LayerStack(model), 1) == pytest.approx(c.vocab_size * c.hidden_size / layer)
