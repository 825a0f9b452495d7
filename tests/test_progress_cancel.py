"""Issue 29: every job speaks before its first forward (phases, counts, measured rates), a cancel
lands within one forward and is logged at once, recovery's intermediate evaluations on a fixed
subset with the first and last step exact, and a run stopped before its first checkpoint resumes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import signal
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from lm_eval_tasks import write_task
from test_signals import check_interrupted, check_resumed, resume_line, signal_after, start
from tiny_models import tiny_model

from cli.main import main
from cli.progress import ProgressLines, progress_text
from engine.core.events import Cancelled, Cancelling, CancelToken, Finished, Message, Pace, Progress, Result
from engine.core.settings import Settings
from engine.evaluation.perplexity import Evaluator, spread
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.experiments.recovery.run import run_recovery
from engine.experiments.recovery.summary import steps_to_thresholds
from engine.experiments.recovery.sweep import auto_eval_every, auto_eval_texts, evaluated
from engine.experiments.recovery.vocabulary import RecoveryBaseline, RecoveryLayer, RecoveryPoint, RecoverySettings
from engine.models.loading import LoadedModel
from engine.registry import EXPERIMENTS, Experiment, RunContext
from sessions.job_runner import run_job
from sessions.store import SessionStore

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = "\n".join(f"The cat number {i} sat on the mat and looked at the dog for a while." for i in range(40))
EVAL = [f"Text {i}: the dog sat on the mat number {i} and the cat looked on." for i in range(10)]


@pytest.fixture
def texts(tmp_path):
    train, evaluation = tmp_path / "train.txt", tmp_path / "eval.txt"
    train.write_text(TRAIN, encoding="utf-8")
    evaluation.write_text("\n".join(EVAL), encoding="utf-8")
    return str(train), str(evaluation)


def recovery_settings(texts, **changes) -> RecoverySettings:
    train, evaluation = texts
    base = dict(layers=(2,), sigma=3.0, steps=5, lr=1e-2, batch_size=2, block_size=16, train_blocks=4,
                train_file=train, eval_file=evaluation, eval_batch_size=2, eval_every=1)  # auto varies with the load
    return RecoverySettings(**{**base, **changes})


class Forwards:
    """Counts the model's forwards, and runs `then(count)` after each (a cancel, say)."""

    def __init__(self, model, then=None) -> None:
        self.count = 0
        self.then = then
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.count += 1
        if self.then is not None:
            self.then(self.count)


# every experiment speaks first, reports its units as they end, and stops when cancelled -------------
def small_settings(entry: Experiment, folder: Path) -> Settings:
    """The experiment's defaults, made small for a tiny model by field name (any experiment with
    these fields gets them), and what a few experiments need besides (their layers, methods, tasks;
    evaluate two models, as lm-eval's run of one model is a unit no cancel enters)."""
    train, evaluation = folder / "train.txt", folder / "eval.txt"
    train.write_text(TRAIN, encoding="utf-8")
    evaluation.write_text("\n".join(EVAL), encoding="utf-8")
    small = dict(eval_file=str(evaluation), train_file=str(train), text_file=str(evaluation), eval_batch_size=1,
                 bootstrap=0, max_length=32, max_tokens=200, steps=2, batch_size=2, block_size=16, train_blocks=4,
                 eval_every=1, null_draws=1, gen_tokens=2, limit=4.0, include_path=str(write_task(folder / "tasks")))
    besides: dict[str, dict[str, Any]] = {
        "recovery": dict(layers=(1,)), "prune": dict(remove=(1, 2), method="bi", gen_task=False),
        "evaluate": dict(tasks=("everyday_sense",), gen_task=False, variants=("original", "pruned"), remove=(1,)),
        "weights": dict(first_layer=0, paradox_counts=(1, 0)),
        "manipulate": dict(strategies=("zero", "scale"), alphas=(0.5,), sample_tokens=2),
    }
    fields = {field.name for field in dataclasses.fields(entry.settings_class)}
    return entry.settings_class(**{k: v for k, v in small.items() if k in fields}, **besides.get(entry.name, {}))


class EveryForward:
    """Counts the forwards of every model of `model`'s class (a copy an experiment makes too), and
    cancels `token` at forward number `cancel_at`: a hook on torch's modules, none of the
    experiment's own code."""

    def __init__(self, model: torch.nn.Module, token: CancelToken, cancel_at: int | None = None) -> None:
        self.count, self.kind, self.token, self.cancel_at = 0, type(model), token, cancel_at
        self.handle = torch.nn.modules.module.register_module_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, *_: object) -> None:
        if type(module) is self.kind:
            self.count += 1
            if self.count == self.cancel_at:
                self.token.cancel()


def run_counted(entry: Experiment, settings: Settings, tokenizer, cancel_at: int | None = None):
    """A fresh tiny model's run: its events, each with the forwards done before it, and the forwards
    done in all (up to the Cancelled, where it raised one: then `cancelled` is True)."""
    model, token = tiny_model("llama"), CancelToken()
    forwards = EveryForward(model, token, cancel_at)
    loaded = LoadedModel(model, tokenizer, "tiny", "test", "cpu", "float32", "llama", 4)
    seen, cancelled = [], False
    try:
        for event in entry.run(settings, RunContext(model=loaded, cancel=token)):
            seen.append((event, forwards.count))
    except Cancelled:
        cancelled = True
    finally:
        forwards.handle.remove()
    return seen, forwards.count, cancelled


@pytest.mark.slow
@pytest.mark.parametrize("entry", [entry for entry in EXPERIMENTS if entry.needs_model], ids=lambda entry: entry.name)
def test_every_experiment_reports_its_units_as_they_end_and_a_cancel_stops_it_within_one(entry, tokenizer, tmp_path):
    """Measured from outside (forwards counted by a hook on torch's modules): the first event comes
    before any forward; the experiment's own progress counts its units up to their total; a cancel
    at the middle forward ends the run in Cancelled within one unit's forwards."""
    settings = small_settings(entry, tmp_path)
    seen, total, cancelled = run_counted(entry, settings, tokenizer)
    assert not cancelled and seen[0][1] == 0 and isinstance(seen[0][0], Progress)  # said before any forward
    own = [(event, at) for event, at in seen[1:] if isinstance(event, Progress) and event.total > 0]
    assert own, f"{entry.name}: no progress of its own, only the registry's `starting`"
    assert any(event.done > 0 for event, _ in own), f"{entry.name}: its progress never counts a unit done"
    assert own[-1][0].done == own[-1][0].total, f"{entry.name}: its last progress is not all of its units"
    assert total >= 2, f"{entry.name}: {total} forwards, too few to cancel in the middle"
    marks = [0, *(at for _, at in own), total]
    unit = max(later - earlier for earlier, later in itertools.pairwise(marks))  # a unit's forwards, at most
    middle = total // 2
    _, done, cancelled = run_counted(entry, settings, tokenizer, cancel_at=middle)
    assert cancelled, f"{entry.name}: ran to its end after a cancel at forward {middle} of {total}"
    after = done - middle
    assert after <= unit, f"{entry.name}: {after} forwards after the cancel, more than a unit's {unit}"


def test_recovery_says_its_baseline_batch_by_batch_and_sends_it_before_training(tiny_llama, texts):
    model, tokenizer = tiny_llama
    forwards = Forwards(model)
    seen = []  # (event, forwards before it)
    for event in run_recovery(model, tokenizer, recovery_settings(texts, steps=2), model_name="tiny"):
        seen.append((event, forwards.count))
    first, at = seen[0]
    assert isinstance(first, Progress) and (first.phase, first.done, first.total, first.unit) == (
        "baseline", 0, 10, "texts") and at == 0  # fmt: skip
    baseline = [event for event, _ in seen if isinstance(event, Progress) and event.phase == "baseline"]
    assert [event.done for event in baseline] == [0, 2, 4, 6, 8, 10]  # a batch of 2 texts a forward
    assert all(event.rate is not None and event.rate > 0 for event in baseline[1:])
    kinds = [type(event) for event, _ in seen]
    assert kinds.index(RecoveryBaseline) < kinds.index(RecoveryPoint)
    steps = [event for event, _ in seen if isinstance(event, Progress) and event.phase == "training"]
    assert [event.done for event in steps] == [0, 1, 2] and {event.total for event in steps} == {2}


def test_progress_in_words_and_plain_lines_each_phase_its_end_and_every_tenth():
    event = Progress(12, 48, "baseline", phase="baseline", unit="texts", rate=4.0)
    assert event.seconds_left == 9.0
    assert progress_text(event) == "baseline: texts 12/48, 4/s, about 9 s left"
    assert progress_text(Progress(0, 0, "recovery: starting", phase="starting")) == "recovery: starting"
    lines = ProgressLines()
    shown = [lines.line(Progress(done, 100, "recovery", phase="training", unit="steps")) for done in range(101)]
    assert [done for done, line in enumerate(shown) if line] == [0, *range(10, 101, 10)]
    assert lines.line(Progress(0, 10, "evaluation", phase="evaluation", unit="texts")) is not None
    pace = Pace("training", 4, "steps")
    assert pace.at(0).rate is None and pace.at(2).total == 4


def test_the_command_line_prints_each_phase_as_a_plain_line_when_not_a_terminal(tiny_folder, texts, capsys):
    train, evaluation = texts
    assert main(["run", "recovery", "--model", str(tiny_folder), "--layers", "2", "--steps", "2", "--sigma", "3",
                 "--batch-size", "2", "--block-size", "16", "--train-blocks", "4", "--train-file", train,
                 "--eval-file", evaluation, "--eval-batch-size", "2", "--eval-texts", "4"]) == 0
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if line.startswith("[progress] ")]
    assert progress[:2] == ["[progress] recovery: starting", "[progress] baseline: texts 0/10"]
    assert "[progress] evaluation: texts 0/10" in progress  # after the noise, every text
    assert any(line.startswith("[info] baseline perplexity ") for line in err)


# a cancel within one forward ------------------------------------------------------------------------
def cancel_at(token: CancelToken, forward: int):
    def then(count: int) -> None:
        if count == forward:
            token.cancel()
    return then


def test_a_cancel_during_an_evaluation_stops_it_before_the_next_forward(tiny_llama):
    model, tokenizer = tiny_llama
    token = CancelToken()
    evaluator = Evaluator(model, tokenizer, EVAL, batch_size=1, cancel=token)
    forwards = Forwards(model, cancel_at(token, 3))
    with pytest.raises(Cancelled):
        evaluator.scores()
    assert forwards.count == 3  # the forward under way when the cancel came, none after it
    for scoring in (lambda: evaluator.build_cache(), lambda: evaluator.scores(2)):
        forwards.count = 0
        with pytest.raises(Cancelled):
            scoring()
        assert forwards.count == 0  # cancelled already: not one forward


# a text a forward: the baseline's 10 forwards, then the 10 of the evaluation after the noise
@pytest.mark.parametrize("forward", [2, 10, 17])
def test_a_cancel_stops_recovery_within_one_forward(tiny_llama, texts, forward):
    model, tokenizer = tiny_llama
    token = CancelToken()
    forwards = Forwards(model, cancel_at(token, forward))
    settings = recovery_settings(texts, eval_batch_size=1, eval_texts=4)
    kinds = []
    with pytest.raises(Cancelled):
        for event in run_recovery(model, tokenizer, settings, token, "tiny"):
            kinds.append(event.kind)
    assert forwards.count == forward
    assert ("recovery.baseline" in kinds) == (forward >= 10) and "recovery.start" not in kinds  # the last: kept


def test_a_cancel_stops_the_ablation_map_within_one_forward_of_a_layer(tiny_llama, texts):
    model, tokenizer = tiny_llama
    token = CancelToken()
    settings = AblationSettings(eval_file=texts[1], eval_batch_size=1, bootstrap=0)
    forwards = Forwards(model, cancel_at(token, 10 + 4))  # the baseline's 10, then the 4th of layer 0's
    with pytest.raises(Cancelled):
        for _ in run_ablation(model, tokenizer, settings, token, "tiny"):
            pass
    assert forwards.count == 14


def test_a_cancel_is_logged_at_once_and_the_job_ends_cancelled(tmp_path):
    session = SessionStore(tmp_path).create("c")
    token = CancelToken()
    logged_at_cancel = []

    def events():
        yield Message("working")
        token.cancel()
        logged_at_cancel.append([event.kind for event in session.events()])
        token.check()
        yield Message("never")

    assert run_job(session, "ablation", {}, events(), cancel=token) is None
    assert logged_at_cancel[0][-1] == Cancelling.kind  # written by the cancel, before the run saw it
    kinds = [event.kind for event in session.events()]
    assert kinds[-2:] == [Cancelling.kind, Finished.kind] and cast(Finished, session.events()[-1]).status == "cancelled"
    assert next(iter(session.jobs().values()))["status"] == "cancelled"
    token.cancel()  # a cancel after the end writes nothing more
    assert [event.kind for event in session.events()] == kinds


def test_the_console_state_shows_a_cancelling_job_until_it_ends():
    from engine.core.events import Started
    from tui.state import SessionState

    state = SessionState()
    state.apply(Started("ablation", {}, job="j"))
    state.apply(Progress(3, 10, "ablation", phase="ablation", unit="layers", job="j"))
    state.apply(Cancelling(job="j"))
    assert (state.jobs["j"].status, state.jobs["j"].cancelling) == ("running", True)
    assert state.shown_status("j", "running") == "cancelling"  # as the panels and the status line say it
    assert state.log[-1] == ("warning", "j cancelling: it stops at its next forward")
    state.apply(Finished("cancelled", job="j"))
    assert state.jobs["j"].status == "cancelled"


# recovery: the subset between, the first and last step whole ----------------------------------------
def test_the_subset_is_fixed_and_spread_over_the_texts():
    assert spread(4, 10) == [0, 3, 6, 9] and spread(1, 10) == [0] and spread(12, 10) == list(range(10))
    for count in range(1, 12):
        chosen = spread(count, 11)
        assert len(chosen) == min(count, 11) and chosen == sorted(set(chosen)) and chosen[0] == 0
        assert count == 1 or chosen[-1] == 10


def test_a_subset_is_whole_batches_scored_as_the_whole_set_scores_them(tiny_llama):
    model, tokenizer = tiny_llama
    evaluator = Evaluator(model, tokenizer, EVAL, batch_size=3)  # batches of 3, 3, 3, 1
    everything = evaluator.build_cache()
    part = evaluator.subset(5)  # 2 batches: the first and the last
    assert part.n_texts == 4 and len(part.batches) == 2 and evaluator.subset(10) is evaluator
    assert list(part.chosen) == [*evaluator.batches[0].text_index, *evaluator.batches[3].text_index]
    for layer in (0, 2):
        got, whole = part.scores(layer), evaluator.scores(layer)
        assert (got.nll[part.chosen] == whole.nll[part.chosen]).all()  # bit for bit
        assert got.perplexity == whole.of(part.chosen).perplexity
    assert part.perplexity(0) == everything.of(part.chosen).perplexity


def test_auto_schedule_rules(texts):
    settings = recovery_settings(texts, eval_every=None, eval_texts=None, batch_size=4, block_size=128)
    # a quarter of a step's 3 x 4 x 128 token passes = 384 tokens; 96 tokens a text -> 4, at least 8
    assert auto_eval_texts(settings, 48, 48 * 96) == 8
    assert auto_eval_texts(settings, 48, 48 * 12) == 32 and auto_eval_texts(settings, 5, 500) == 5
    assert auto_eval_texts(recovery_settings(texts, eval_texts=20), 10, 100) == 10
    assert auto_eval_every(settings, 1.5, 1.0) == 1 and auto_eval_every(settings, 10.0, 2.0) == 5
    assert auto_eval_every(recovery_settings(texts, eval_every=3), 100.0, 1.0) == 3
    explicit, auto = recovery_settings(texts, eval_every=2, steps=5), recovery_settings(texts, steps=5, eval_every=None)
    assert [s for s in range(1, 6) if evaluated(s, 2, explicit)] == [2, 4, 5]
    assert [s for s in range(1, 6) if evaluated(s, 2, auto)] == [1, 2, 4, 5]


def test_intermediate_steps_on_the_subset_and_the_first_and_last_on_every_text_exactly(tiny_llama, texts):
    model, tokenizer = tiny_llama

    def sweep(**changes):
        events = list(run_recovery(model, tokenizer, recovery_settings(texts, **changes), model_name="tiny"))
        points = [event for event in events if isinstance(event, RecoveryPoint)]
        (layer,) = [event for event in events if isinstance(event, RecoveryLayer)]
        return points, layer.result.repeats[0], cast(Result, events[-1]).data["baseline_ppl"]

    whole, whole_run, baseline = sweep(eval_every=2, eval_texts=10)
    part, part_run, _ = sweep(eval_every=2, eval_texts=4)
    assert [p.step for p in whole] == [p.step for p in part] == [0, 2, 4, 5]  # the last step always
    assert [p.texts for p in part] == [10, 4, 4, 10] and {p.texts for p in whole} == {10}
    for a, b in zip(whole, part, strict=True):  # evaluating never changes the training
        assert a.train_loss == b.train_loss
    assert (part[0].eval_ppl, part[-1].eval_ppl) == (whole[0].eval_ppl, whole[-1].eval_ppl)  # bit for bit
    for p in part[1:-1]:  # the subset's ratio to its own baseline, in the full baseline's units
        assert p.eval_ppl == pytest.approx(p.ratio_to_baseline * baseline, rel=1e-12)
        assert p.eval_ppl != pytest.approx([q for q in whole if q.step == p.step][0].eval_ppl, rel=1e-9)
    assert [step for step, _ in part_run.curve] == [0, 2, 4, 5]
    assert (part_run.eval_every, part_run.eval_texts, whole_run.eval_texts) == (2, 4, 10)
    assert part_run.steps_to == steps_to_thresholds(part_run.curve, baseline)  # at the evaluated steps
    assert set(part_run.steps_to.values()) <= {0, 2, 4, 5, None}


def test_auto_evaluates_the_first_step_and_records_what_it_chose(tiny_llama, texts):
    model, tokenizer = tiny_llama
    auto = recovery_settings(texts, steps=3, eval_every=None)
    events = list(run_recovery(model, tokenizer, auto, model_name="tiny"))
    (base,) = [event for event in events if isinstance(event, RecoveryBaseline)]
    assert (base.texts, base.eval_texts, base.eval_every) == (10, 8, 0)  # auto: at least 8; every: measured
    steps = [event.step for event in events if isinstance(event, RecoveryPoint)]
    (row,) = [event.result.repeats[0] for event in events if isinstance(event, RecoveryLayer)]
    assert steps[:2] == [0, 1] and steps[-1] == 3 and row.eval_texts == 8
    assert steps == [0, *[s for s in (1, 2) if evaluated(s, row.eval_every, auto)], 3]
    assert any(isinstance(e, Message) and e.text.startswith("evaluating every") for e in events)
    assert isinstance(events[-1], Result)


# a stop before the first checkpoint ----------------------------------------------------------------
GROWTH = ["run", "growth", "--preset", "tiny", "--hidden-size", "16", "--heads", "2", "--base-ffn", "8",
          "--seq-len", "16", "--batch-size", "2", "--steps", "12", "--eval-every", "6", "--eval-batches", "1",
          "--checkpoint-every", "1000", "--gen-tokens", "2", "--threads", "1", "--arms", "growth_100,uniform_100",
          "--device", "cpu"]


@pytest.mark.slow
def test_growth_stopped_before_its_first_checkpoint_resumes_from_the_start_with_the_offered_command(tmp_path):
    code, err = signal_after(start([*GROWTH, "--session", "early"]), "early", "job.started", signal.SIGTERM)
    assert code == 143, err
    old = check_interrupted("early", "SIGTERM")
    folder = SessionStore().open("early").path / "checkpoints" / "growth"
    assert not any(folder.glob("*.json")) if folder.exists() else True  # stopped before any checkpoint
    out = tmp_path / "resumed.json"
    assert main([*resume_line(err, "growth", "SIGTERM"), "--json", str(out)]) == 0
    check_resumed("early", old)
    doc = json.loads(Path(out).read_text())
    assert set(doc["arms"]) == {"growth_100", "uniform_100"}
    messages = [e.text for e in SessionStore().open("early").events() if isinstance(e, Message)]
    assert any(text.startswith("no growth checkpoint in this session yet") for text in messages)


def test_the_commands_a_refused_recovery_resume_offers_run(tiny_folder, texts, capsys):
    """Each refusal names a command (the same settings, the saved dtype, no --resume): each one runs."""
    train, evaluation = texts

    def flags(*extra: str) -> list[str]:
        return ["run", "recovery", "--model", str(tiny_folder), "--device", "cpu", "--layers", "1", "--sigma", "3",
                "--steps", "2", "--batch-size", "2", "--block-size", "16", "--train-blocks", "4", "--train-file",
                train, "--eval-file", evaluation, "--eval-batch-size", "2", "--session", "s", *extra]

    assert main(flags()) == 0
    capsys.readouterr()
    assert main(flags("--resume", "--sigma", "2")) == 2
    assert "resume with the same settings or run without --resume" in capsys.readouterr().err
    assert main(flags("--resume")) == 0  # the same settings
    assert main(flags("--resume", "--dtype", "bfloat16")) == 2
    assert "resume with --dtype float32 or run without --resume" in capsys.readouterr().err
    assert main(flags("--resume", "--dtype", "float32")) == 0
    assert main(flags("--sigma", "2")) == 0  # without --resume: the other settings run from the start
    checkpoint = SessionStore().open("s").path / "checkpoints" / "recovery" / "layers.json"
    checkpoint.write_text("{damaged", encoding="utf-8")
    capsys.readouterr()
    assert main(flags("--resume")) == 2
    assert "run without --resume to start over" in capsys.readouterr().err
    assert main(flags()) == 0 and main(flags("--resume")) == 0  # started over, then resumable again
