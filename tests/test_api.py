"""The notebook API (anatomy_tui): a run in this process gives what `anatomy-tui run` saves, into the
same session store; every result reads as a tidy DataFrame; a bad name or setting is one InputError
before anything runs; an interrupt cancels through the run's cancel token and keeps what it sent."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from typing import Any, cast

import pytest
import torch
from throwaway import installed

import anatomy_tui
from anatomy_tui import InputError, RunResult, load_model, open_session, run, to_pandas
from cli.main import main
from engine import registry
from engine.core.events import Event, Progress, ResultDocument
from engine.experiments.ablation.vocabulary import AblationMap, LayerAblated, sample_parts
from engine.experiments.recovery.vocabulary import RecoveryLayer
from engine.experiments.toy_depth.vocabulary import ToyDepthResult
from sessions.store import SessionStore


@pytest.fixture
def experiment(tmp_path):
    """The throwaway letter-count experiment (tests/throwaway.py): no model, a word a step."""
    yield from installed(tmp_path / "package")


@pytest.fixture
def tiny(tiny_folder):
    return load_model(str(tiny_folder), progress=False)


def _timeless(doc: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in doc.items() if key != "seconds"}


def test_load_model_loads_once_per_options(tiny_folder, tiny):
    assert load_model(str(tiny_folder), progress=False) is tiny
    assert tiny.n_layers == 4 and tiny.options.model == str(tiny_folder)
    fresh = load_model(str(tiny_folder), fresh=True, progress=False)
    assert fresh is not tiny and fresh.model is not tiny.model
    with pytest.raises(InputError, match=r"^dtype=half: must be one of auto, float32"):
        load_model(str(tiny_folder), dtype="half")


def test_run_gives_what_the_cli_saves_into_the_same_store(tiny_folder, tiny, tmp_path):
    """The same settings through `anatomy-tui run ... --json` and through `run`: the same document
    (but the seconds it took), and the session holds a job with the same settings and model options."""
    out = tmp_path / "cli.json"
    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--layers", "1,3",
                 "--bootstrap", "20", "--session", "cli", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    result = run("ablation", tiny, session="api", eval_set="paper", layers=[1, 3], bootstrap=20, progress=False)
    assert isinstance(result, RunResult) and not result.partial and result.session == "api"
    assert result.data is not None and _timeless(result.data) == _timeless(saved)
    ablation_map = cast(AblationMap, result.result)
    assert ablation_map == dataclasses.replace(AblationMap.from_json(saved), seconds=ablation_map.seconds)
    assert [row.layer for row in result.layers] == [1, 3]  # the result's fields read through
    store = SessionStore()
    assert store.open("api").load_result("ablation") == result.data
    (cli_job,), (api_job,) = store.open("cli").jobs().values(), store.open("api").jobs().values()
    assert api_job["status"] == "done" and api_job["settings"] == cli_job["settings"]
    assert api_job["model"] == cli_job["model"] and api_job["spec"]["model"] == cli_job["spec"]["model"]
    layer_events = cast(list[LayerAblated], [event for event in result.events if event.kind == "ablation.layer"])
    assert [event.ppl for event in layer_events] == [row.ppl for row in result.layers]


def test_a_preset_and_no_model_give_what_the_cli_saves(tmp_path, one_thread):
    """toy-depth trains its own students: `preset=` and the settings over it, as `--preset` and flags."""
    out = tmp_path / "cli.json"
    flags = ["--steps", "4", "--student-depths", "2,3", "--seeds", "2", "--bootstrap", "5", "--eval-size", "64",
             "--batch-size", "16", "--teacher-depth", "4"]
    assert main(["run", "toy-depth", "--preset", "tiny", *flags, "--session", "cli", "--json", str(out)]) == 0
    result = run("toy-depth", preset="tiny", steps=4, student_depths=[2, 3], seeds=2, bootstrap=5, eval_size=64,
                 batch_size=16, teacher_depth=4, progress=False)
    assert result.data is not None and _timeless(result.data) == _timeless(json.loads(out.read_text()))
    assert result.settings.preset == "tiny" and len(result.to_pandas()) == 2 * 2 * 2  # regimes x depths x seeds


def test_a_run_reads_the_session_results_it_needs(tiny, one_thread):
    """Recovery in a session with an ablation map compares its difficulty with the map's D%."""
    run("ablation", tiny, session="s", eval_set="paper", progress=False)
    recovered = run("recovery", tiny, session="s", eval_set="paper", layers=[0, 1, 2], steps=2, eval_every=1,
                    batch_size=2, block_size=16, progress=False)
    assert recovered.versus_ablation is not None and recovered.versus_ablation.layers == 3
    frame = recovered.to_pandas()
    assert list(frame.columns) == ["layer", "repeat", "step", "ppl", "ratio_to_baseline", "train_loss"]
    assert len(frame) == 3 * 3 and list(frame["step"]) == [0, 1, 2] * 3  # step 0 and one per step, each layer
    assert frame["ratio_to_baseline"].tolist() == pytest.approx((frame["ppl"] / recovered.baseline_ppl).tolist())
    assert (SessionStore().open("s").checkpoint_dir("recovery")).is_dir()


def test_a_run_without_a_session_writes_nothing(experiment):
    result = run("letter-count", words=["ab", "cde"], repeat=2, progress=False)
    counts: Any = result.result  # letter-count's classes are written at run time (tests/throwaway.py)
    assert counts.counts == {"ab": 4, "cde": 6} and result.session is None
    assert not SessionStore().home.exists()


# tidy frames --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [entry.name for entry in registry.EXPERIMENTS])
def test_each_sample_reads_as_the_tidy_frame_its_contract_declares(name):
    """The first columns and the rows its vocabulary's CONTRACT declares, written by hand from its
    sample (tests/test_contract.py checks the same against `tidy_rows()` without pandas)."""
    entry = registry.experiment(name)
    declared = entry.contract().frame
    assert declared is not None, f"{name}: no frame declared (Contract.frame)"
    frame = to_pandas(entry.sample())
    assert list(frame.columns[: len(declared.columns)]) == list(declared.columns) and len(frame) == declared.rows
    assert frame.columns.is_unique and not frame.isin(["ABSENT"]).any().any()


def test_the_frames_hold_the_documents_numbers():
    ablation = to_pandas(sample_parts())
    whole, blocks = ablation[ablation["part"] == "layer"], ablation[ablation["part"] != "layer"]
    assert len(whole) == 6 and len(blocks) == 12 and set(blocks["part"]) == {"attention", "mlp"}
    assert whole["degradation_pct"].tolist() == [row.degradation_pct for row in sample_parts().layers]
    prune = registry.BY_NAME["prune"].sample()
    frame = to_pandas(prune)
    angular = frame[frame["method"] == "angular"]
    assert angular["ppl"].tolist() == pytest.approx([20.0 * 1.3**k for k in range(1, 5)])
    assert angular["layers"].tolist() == [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3)]
    toy = cast(ToyDepthResult, registry.BY_NAME["toy-depth"].sample())
    means = to_pandas(toy).groupby(["regime", "depth"])["loss"].mean()
    assert means["compositional"].tolist() == pytest.approx(toy.regimes["compositional"].loss)
    evaluate = to_pandas(registry.BY_NAME["evaluate"].sample())
    assert evaluate.set_index(["label", "task"]).loc[("pruned -2,3", "everyday_sense"), "acc"] == 0.45


def test_a_result_with_no_rows_of_its_own_is_one_row_of_its_numbers():
    @dataclasses.dataclass(frozen=True)
    class Plain(ResultDocument):
        model: str
        ppl: float
        rows: list[int]

    assert to_pandas(Plain("tiny", 2.5, [1, 2])).to_dict("records") == [{"model": "tiny", "ppl": 2.5}]


def test_events_read_as_a_frame_a_row_each():
    frame = to_pandas([Progress(1, 4, "x", job="j", t=1.0), Progress(2, 4, job="j", t=2.0)])
    plain = {"phase": "", "unit": "", "rate": None}
    assert frame.to_dict("records") == [{"kind": "job.progress", "job": "j", "t": 1.0, "done": 1, "total": 4,
                                         "label": "x", **plain},
                                        {"kind": "job.progress", "job": "j", "t": 2.0, "done": 2, "total": 4,
                                         "label": "", **plain}]


# sessions -----------------------------------------------------------------------------------------


def test_open_session_reads_what_the_cli_made(tiny_folder, tmp_path):
    out = tmp_path / "map.json"
    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--session", "made",
                 "--json", str(out)]) == 0
    session = open_session("made")
    assert session.model == str(tiny_folder) and list(session.results) == ["ablation"]
    saved = session.results["ablation"]
    assert saved.experiment == "ablation" and saved.session == "made" and saved.events == ()
    assert saved.result == AblationMap.from_json(json.loads(out.read_text()))
    assert to_pandas(saved)["layer"].tolist() == [0, 1, 2, 3]
    layers = cast(list[LayerAblated], session.events("ablation.layer"))
    assert [event.layer for event in layers] == [0, 1, 2, 3]
    (job_id, job), = session.jobs.items()
    assert job.status == "done" and all(event.job == job_id for event in layers)
    assert {event.kind for event in session.events("job")} >= {"job.started", "job.result", "job.finished"}
    assert session.events(job="another") == [] and session.damage == []


def test_plot_draws_the_figures_package_figure_of_a_run_and_of_a_saved_result(tiny, tmp_path):
    from matplotlib.figure import Figure

    done = run("ablation", tiny, session="plotted", eval_set="paper", progress=False)
    figure = done.plot()
    assert isinstance(figure, Figure) and figure.axes
    assert any("layer" in axes.get_xlabel().lower() for axes in figure.axes)
    saved = open_session("plotted").results["ablation"]
    assert [a.get_xlabel() for a in anatomy_tui.plot(saved).axes] == [a.get_xlabel() for a in figure.axes]


def test_open_session_of_no_session_is_one_error():
    with pytest.raises(InputError, match="no session 'nowhere'"):
        open_session("nowhere")


# one clear error ----------------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda model: run("ablaton", model), r"^unknown experiment 'ablaton'; use one of ablation, recovery"),
    (lambda model: run("ablation", model, laysers=[1]), r"^AblationSettings has no setting 'laysers'; its settings: "),
    (lambda model: run("ablation", model, bootstrap=-1), r"^bootstrap=-1: must be an integer at least 0"),
    (lambda model: run("ablation", model, method="half"), r"^method=half: must be one of mean, skip, zero"),
    (lambda model: run("ablation", model, layers="x"), r"^layers=x: must be a comma-separated list"),
    (lambda model: run("ablation", model, layers=9), r"--layers: layer 9 is out of range; this model has layers 0"),
    (lambda model: run("ablation", model, eval_file="/nope.txt"), r"does not exist"),
    (lambda model: run("ablation", model, preset="tiny"), r"^ablation has no presets"),
    (lambda model: run("toy-depth", preset="huge"), r"^unknown preset 'huge'; use paper, tiny"),
    (lambda model: run("ablation", model, resume=True), r"^resume=True continues a run checkpointed in a session"),
])
def test_a_bad_name_or_setting_is_one_error_before_anything_runs(tiny, call, message):
    with pytest.raises(ValueError, match=message) as caught:
        call(tiny)
    assert isinstance(caught.value, InputError) and "\n" not in str(caught.value)
    shown_chain = caught.value.__cause__ or (None if caught.value.__suppress_context__ else caught.value.__context__)
    assert shown_chain is None  # the one line, no second traceback under it
    assert not SessionStore().home.exists()


def test_a_bad_setting_makes_no_session(tiny):
    with pytest.raises(InputError):
        run("ablation", tiny, session="never", bootstrap=-1)
    assert not SessionStore().exists("never")


def test_settings_read_as_the_cli_reads_its_flags(experiment):
    """A string is the flag's text; a list a tuple; one value a tuple of one."""
    # letter-count's classes are written at run time (tests/throwaway.py): its result reads as Any
    for words in ("ab,cde", ["ab", "cde"], ("ab", "cde")):
        assert cast(Any, run("letter-count", words=words, progress=False).result).counts == {"ab": 2, "cde": 3}
    assert cast(Any, run("letter-count", words="ab", progress=False).result).total == 2


def test_progress_is_a_bar_fed_by_the_runs_events_and_its_messages_above_it(experiment, capsys, monkeypatch):
    import importlib

    from engine.core.events import Message

    run_module = importlib.import_module("letter_count.run")
    counted = run_module.run

    def talking(settings, context):
        yield Message("counting", level="info")
        yield from counted(settings, context)

    monkeypatch.setattr(run_module, "run", talking)
    run("letter-count", words=["ab", "cde", "fghi"])
    err = capsys.readouterr().err
    assert "[info] counting" in err and "3/3" in err and "fghi" in err  # the last event's label
    run("letter-count", words=["ab"], progress=False)
    assert capsys.readouterr().err == ""


# interrupts ---------------------------------------------------------------------------------------


def _interrupt_at(kind: str, times: int = 1):
    """An on_event that sends this process SIGINT (Ctrl-C, Jupyter's interrupt) at the first `kind` event."""
    sent: list[Event] = []

    def on_event(event: Event) -> None:
        if event.kind == kind and not sent:
            sent.append(event)
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)

    return on_event


def test_an_interrupt_cancels_through_the_token_and_keeps_what_was_sent(experiment):
    before = signal.getsignal(signal.SIGINT)
    result = run("letter-count", session="s", words=["ab", "cde", "fghi"], on_event=_interrupt_at("letter-count.word"),
                 progress=False)
    assert result.partial and result.result is None and result.data is None and result.session == "s"
    # letter-count's classes are written at run time (tests/throwaway.py): its events read as Any
    assert [cast(Any, event).word for event in result.events if event.kind == "letter-count.word"] == ["ab"]
    assert to_pandas(result).to_dict("records")[0]["word"] == "ab"
    assert signal.getsignal(signal.SIGINT) is before
    session = open_session("s")
    assert session.results == {} and [job.status for job in session.jobs.values()] == ["cancelled"]
    with pytest.raises(InputError, match="cancelled before its result: nothing to plot"):
        result.plot()


def test_a_second_interrupt_stops_at_once(experiment):
    """The second interrupt does not wait for the token's next check: the run stops where it is."""
    result = run("letter-count", words=["ab", "cde"], on_event=_interrupt_at("letter-count.word", times=2),
                 progress=False)
    assert result.partial and [event.kind for event in result.events] == ["letter-count.word"]


def test_an_interrupt_mid_step_puts_the_weights_back(tiny, monkeypatch):
    """Ctrl-C in the middle of the second layer's evaluation, its weights zeroed: they are put back as
    the step unwinds, and the partial run keeps the first layer's row."""
    from engine.evaluation.perplexity import Evaluator

    weights = {name: value.clone() for name, value in tiny.model.state_dict().items()}
    scoring, calls = Evaluator.scoring, []

    def interrupted(self, start_layer: int = 0, *args, **kwargs):
        calls.append(start_layer)
        changed = not all(torch.equal(weights[n], v) for n, v in tiny.model.state_dict().items())
        if len(calls) == 2:
            assert changed  # layer 1 is zeroed now
            raise KeyboardInterrupt
        return scoring(self, start_layer, *args, **kwargs)

    monkeypatch.setattr(Evaluator, "scoring", interrupted)
    result = run("ablation", tiny, eval_set="paper", method="zero", progress=False)
    layer_events = cast(list[LayerAblated], [event for event in result.events if event.kind == "ablation.layer"])
    assert result.partial and [event.layer for event in layer_events] == [0]
    assert all(torch.equal(weights[name], value) for name, value in tiny.model.state_dict().items())


def test_an_interrupt_raised_in_a_callback_cancels_too(experiment):
    def stop(event: Event) -> None:
        if event.kind == "letter-count.word":
            raise KeyboardInterrupt

    result = run("letter-count", words=["ab", "cde"], on_event=stop, progress=False)
    assert result.partial and len([event for event in result.events if event.kind == "letter-count.word"]) == 1


def test_jobs_of_one_process_in_one_second_have_their_own_ids(monkeypatch):
    from sessions import job_runner

    monkeypatch.setattr("sessions.job_runner.time.strftime", lambda _: "20260101-000000")
    ids = {job_runner.new_job_id("ablation") for _ in range(3)}
    assert len(ids) == 3


def test_the_api_names_no_experiment():
    """Like the runner, the API reads the registry: it branches on no experiment's name."""
    import ast
    from pathlib import Path

    from test_experiment_adapter import _compared_names

    names = {entry.name for entry in registry.EXPERIMENTS}
    for module in sorted(Path(anatomy_tui.__file__).parent.glob("*.py")):
        assert _compared_names(ast.parse(module.read_text(encoding="utf-8")), names) == [], module.name


def test_a_cancelled_recovery_in_a_session_resumes_where_it_stopped(tiny, one_thread):
    """Interrupted once its first layer is checkpointed, recovery continues with resume=True: the
    first layer is read back, not trained again, and the finished job marks the cancelled one resumed."""
    settings: dict[str, Any] = dict(eval_set="paper", layers=[0, 2], steps=2, batch_size=2, block_size=16,
                                    progress=False)
    stopped = run("recovery", tiny, session="r", on_event=_interrupt_at("recovery.layer"), **settings)
    layer_events = cast(list[RecoveryLayer], [event for event in stopped.events if event.kind == "recovery.layer"])
    assert stopped.partial and [event.layer for event in layer_events] == [0]
    resumed = run("recovery", tiny, session="r", resume=True, **settings)
    assert resumed.resumed_layers == [0] and [row.layer for row in resumed.layers] == [0, 2]
    assert sorted(job.status for job in open_session("r").jobs.values()) == ["done", "resumed"]
