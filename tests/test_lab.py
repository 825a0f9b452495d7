"""The console's policy without a terminal (tui/lab.py): where a job the console starts runs (beside
its model, on another GPU, or after the console releases its model, reloaded when the job ends),
cancel, resume offers, jobs that died without a word, which prompt-pane models a session has, and
when a new session maps its layers by itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_fixtures import cut, demo_session, growth_doc, prune_result, write_events

from engine.core.errors import UserError
from engine.core.events import CancelToken, Finished, Started
from engine.experiments.variants import Variant
from engine.models.loading import LoadedModel
from engine.models.options import ModelOptions
from sessions.store import SessionStore
from tui.console_settings import ConsoleSettings
from tui.jobs import BackgroundJob
from tui.lab import Lab
from tui.marks import Marks


class Console:
    """What the app does for the lab, recorded: the lines it tells, status redraws, model loads."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []
        self.redraws = 0
        self.loads: list[ModelOptions] = []

    def tell(self, text: str, level: str) -> None:
        self.told.append((level, text))

    def status_changed(self) -> None:
        self.redraws += 1

    def start_load(self, options: ModelOptions) -> None:
        self.loads.append(options)

    def said(self, part: str, level: str | None = None) -> bool:
        return any(part in text and level in (None, said) for said, text in self.told)


class FakeProcess:
    """A job's process that ends when the test says."""

    def __init__(self) -> None:
        self.ended = False

    def poll(self) -> int | None:
        return 0 if self.ended else None


def stub_model(device: str = "cuda:0", dtype: str = "float16", device_map: str | None = None) -> LoadedModel:
    """The console's model as the status line and the job flags read it (no weights: placement is faked)."""
    return LoadedModel(None, None, "tiny", "here", device, dtype, "llama", 4, device_map=device_map)


def make_lab(
    monkeypatch, session: str | None = "demo", device: str = "auto", placement: str | None = "beside",
    auto_map: bool = False,
) -> tuple[Lab, Console, list[list[str]]]:
    """A lab over a new session (`session`), its jobs launched into a list and placed as `placement` says."""
    console, started = Console(), []

    def launch(session, experiment, argv):
        started.append(argv)
        return BackgroundJob(experiment, 4242, Path(f"{experiment}.log"), argv, FakeProcess())  # type: ignore[arg-type]  # a stand-in Popen

    monkeypatch.setattr("tui.lab_jobs.launch_job", launch)
    if placement is not None:
        monkeypatch.setattr("tui.lab_jobs.job_placement", lambda *args, **kwargs: placement)
    lab = Lab(SessionStore(), ModelOptions("tiny", device=device), settings=ConsoleSettings(auto_map=auto_map),
              tell=console.tell, status_changed=console.status_changed, start_load=console.start_load)
    if session is not None:
        lab.open(session)
    return lab, console, started


def flag(argv: list[str], name: str) -> list[str]:
    return [arg for arg in argv if arg.startswith(f"--{name}")]


# placement ----------------------------------------------------------------------------------------
def test_a_job_the_gpu_cannot_hold_beside_the_console_gets_it_and_the_model_comes_back(monkeypatch):
    lab, console, started = make_lab(monkeypatch, placement="release")
    lab.model_loaded(stub_model())
    job = lab.map_job()
    assert job is not None and lab.released_for is job
    assert lab.loaded is None and "released from cuda:0 for the ablation job" in lab.model_status
    assert console.said("the console's model is released while the job runs")
    [argv] = started
    assert "--device=cuda:0" in argv and "--dtype=float16" in argv  # what the console had resolved `auto` to
    monkeypatch.setattr("tui.lab_jobs.job_placement", lambda *args, **kwargs: "beside")  # no model on the GPU now
    lab.inject(1, 0.5, 10, 1e-4)  # a later job keeps the released model's device and dtype
    assert "--device=cuda:0" in started[1] and "--dtype=float16" in started[1]
    lab.reconcile()
    assert console.loads == []  # the job still runs
    job.process.ended = True  # type: ignore[union-attr]  # the FakeProcess launch() gave it
    lab.reconcile()
    assert [options.model for options in console.loads] == ["tiny"] and lab.released_for is None
    assert lab.model_status == "model: loading tiny…" and console.said("reloading the console's model")


def test_the_model_is_not_released_while_the_console_uses_it(monkeypatch):
    lab, console, started = make_lab(monkeypatch, placement="release")
    stub = stub_model()
    lab.model_loaded(stub)
    lab.cancels["ablation"] = CancelToken()  # the map runs in the console
    assert lab.map_job() is None and started == [] and lab.loaded is stub
    assert console.said("wait for ablation to finish", "warning")


def test_a_job_goes_to_another_gpu_and_the_console_keeps_its_model(monkeypatch):
    lab, console, started = make_lab(monkeypatch, placement="cuda:1")
    stub = stub_model()
    lab.model_loaded(stub)
    lab.map_job()
    [argv] = started
    assert "--device=cuda:1" in argv and "--device=cuda:0" not in argv
    assert lab.loaded is stub and lab.released_for is None
    assert console.said("the ablation job runs on cuda:1: cuda:0 holds the console's model")


def test_a_job_that_cannot_fit_is_said_not_started(monkeypatch):
    lab, console, started = make_lab(monkeypatch, placement=None)

    def never(*args, **kwargs):
        raise UserError("the ablation job needs about 9 GiB on cuda:0 but 1 GiB is free")

    monkeypatch.setattr("tui.lab_jobs.job_placement", never)
    lab.model_loaded(stub_model())
    assert lab.map_job() is None and started == []
    assert console.said("needs about 9 GiB", "error") and lab.loaded is not None


@pytest.mark.parametrize("gpus", [2, 0])
def test_the_map_job_takes_every_gpu(gpus, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    lab, _, started = make_lab(monkeypatch)
    lab.model_loaded(stub_model(device="cuda"))  # where `auto` loads on a GPU
    lab.map_job()
    [argv] = started
    assert flag(argv, "shards") == (["--shards=2"] if gpus == 2 else [])
    assert argv[argv.index("--session") + 1] == "demo"


def test_a_console_pinned_to_one_gpu_starts_its_map_job_there(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    lab, _, started = make_lab(monkeypatch, device="cuda:0")
    lab.model_loaded(stub_model(device="cuda:0"))
    lab.map_job()
    [argv] = started
    assert "--device=cuda:0" in argv and flag(argv, "shards") == []


def test_forms_with_bad_values_are_said_not_started(monkeypatch):
    lab, console, started = make_lab(monkeypatch)
    assert lab.inject(1, -1.0, 10, 1e-4) is None and console.said("sigma", "error")
    assert lab.growth(("--no-such-flag",)) is None and console.said("growth flags:", "error")
    assert started == []
    assert lab.growth(("--preset", "tiny")) is not None and flag(started[0], "preset") == ["--preset=tiny"]


# work in the console --------------------------------------------------------------------------------
def test_the_map_in_the_console_waits_for_the_model_and_runs_once(monkeypatch):
    lab, console, _ = make_lab(monkeypatch)
    assert lab.map_in_console() is None and console.said("the model is still loading", "warning")
    lab.model_loaded(stub_model(device="cpu", dtype="float32"))
    run = lab.map_in_console()
    assert run is not None and run.name == "ablation" and lab.running_in_console() == ["ablation"]
    assert lab.map_in_console() is None and console.said("ablation is already running in the console")
    lab.stop_console_runs()
    assert run.token.cancelled
    lab.console_run_ended("ablation")
    assert lab.running_in_console() == [] and lab.map_in_console() is not None


def test_a_new_session_maps_its_layers_once_the_model_is_there(monkeypatch):
    lab, console, _ = make_lab(monkeypatch, session="fresh", auto_map=True)
    redraws = console.redraws
    assert lab.model_loaded(stub_model(device="cpu", dtype="float32"))
    assert lab.model_status == "tiny · cpu · float32 · 4 layers" and console.redraws == redraws + 1
    assert not make_lab(monkeypatch, session="fresh", auto_map=False)[0].model_loaded(stub_model())
    demo_session(SessionStore())
    mapped, _, _ = make_lab(monkeypatch, session="demo", auto_map=True)  # it has a layer map
    assert not mapped.model_loaded(stub_model())
    SessionStore().open("fresh").write_job("growth-1", {"experiment": "growth", "status": "done"})
    assert not make_lab(monkeypatch, session="fresh", auto_map=True)[0].model_loaded(stub_model())  # not new


def test_the_session_to_open_at_start(monkeypatch):
    lab, _, _ = make_lab(monkeypatch, session=None)
    first = lab.first_session(None, resume=False)  # nothing stored: a new session, no picker
    assert first and SessionStore().list()[0].name == first
    assert lab.first_session("other", resume=False) == "other"
    assert lab.first_session(None, resume=True) == first
    assert lab.first_session(None, resume=False) is None  # sessions to pick from


# cancel, resume, reconcile ------------------------------------------------------------------------
def test_cancel_stops_the_job_of_the_panel(monkeypatch):
    lab, console, _ = make_lab(monkeypatch)
    token = lab.cancels["ablation"] = CancelToken()
    lab.cancel("ablation")
    assert token.cancelled and console.said("cancelling ablation")
    lab.cancel("recovery")
    assert console.said("no recovery job is running")


def test_a_cancelled_job_reads_cancelling_until_it_stops(monkeypatch):
    """A job in its own process asked to stop (SIGINT) is `cancelling` in the status line and its
    panel at once, and only its own word ends it."""
    lab, console, _ = make_lab(monkeypatch)
    monkeypatch.setattr("tui.lab_jobs.stop_job", lambda doc: True)
    assert lab.session is not None  # make_lab opens one
    write_events(lab.session, [Started("recovery", {}, job="recovery-9", t=1.0)])
    doc = {"id": "recovery-9", "experiment": "recovery", "pid": 2**22 + 7, "status": "running", "started": 1.0}
    monkeypatch.setattr(lab.session, "jobs", lambda: {"recovery-9": doc})  # its process alive, as far as it says
    lab.poll()
    lab.cancel("recovery")
    assert console.said("cancelling recovery-9")
    job, where = lab.running_jobs()[0]
    assert job.cancelling and where == "own process"
    assert lab.state.shown_status("recovery-9", "running") == "cancelling"
    assert lab.state.shown_status("recovery-9", "done") == "done"
    assert lab.state.shown_status("other", "running") == "running"
    write_events(lab.session, [Finished(status="cancelled", job="recovery-9", t=2.0)])
    lab.poll()
    assert lab.running_jobs() == [] and lab.state.jobs["recovery-9"].status == "cancelled"


def test_an_interrupted_job_is_offered_with_the_command_that_resumes_it(monkeypatch):
    from engine.experiments.growth.vocabulary import PRESETS

    lab, console, started = make_lab(monkeypatch)
    assert lab.resume_offer(asked=False) is None and console.told == []  # at start: nothing to say
    assert lab.resume_offer() is None and console.said("no interrupted job to resume")
    assert lab.session is not None  # make_lab opens one
    lab.session.write_job("growth-1", {"id": "growth-1", "experiment": "growth", "pid": 2**22 + 7,
                                       "argv": ["--trust-remote-code"], "settings": PRESETS["tiny"].to_dict(),
                                       "model": None, "status": "running", "started": 1.0})  # fmt: skip
    offer = lab.resume_offer(asked=False)
    assert offer is not None and (offer.job, offer.experiment) == ("growth-1", "growth")
    assert offer.question.startswith("Job growth-1 was interrupted.") and "--preset=tiny" in offer.question
    assert offer.argv[-3:] == ["--session", "demo", "--resume"] and "--trust-remote-code" not in offer.argv
    lab.launch(offer.experiment, offer.argv)
    assert started == [offer.argv]


def test_a_job_of_another_model_is_not_resumed(monkeypatch):
    lab, console, _ = make_lab(monkeypatch)
    assert lab.session is not None  # make_lab opens one
    lab.session.write_job("recovery-1", {"id": "recovery-1", "experiment": "recovery", "pid": 2**22 + 7,
                                         "settings": {}, "model": {"model": "/elsewhere"},
                                         "status": "running", "started": 1.0})  # fmt: skip
    assert lab.resume_offer(asked=False) is None
    assert console.said("job recovery-1 cannot be resumed", "error") and console.said("/elsewhere")


def test_a_job_that_died_without_a_word_reads_interrupted(monkeypatch):
    demo_session(SessionStore())
    lab, _, _ = make_lab(monkeypatch)  # the demo's recovery and growth jobs have no job file
    lab.poll()  # the first poll reconciles
    assert {job.id: job.status for job in lab.state.jobs.values()} == {"recovery-1": "interrupted",
                                                                      "growth-1": "interrupted"}
    assert lab.state.recovery[0].status == "interrupted" and lab.running_jobs() == []


def test_a_job_is_known_by_its_recorded_experiment_not_by_its_id(monkeypatch):
    """A toy-depth job whose start the log lost: its experiment is its job file's, not 'toy'."""
    lab, _, _ = make_lab(monkeypatch)
    job = "toy-depth-20240101-120000-7"
    assert lab.session is not None  # make_lab opens one
    write_events(lab.session, [Finished(status="done", job=job, t=1.0)])
    lab.session.write_job(job, {"id": job, "experiment": "toy-depth", "status": "done", "pid": 7})
    lab.poll()
    assert lab.state.jobs[job].experiment == "toy-depth" and lab.state.jobs[job].status == "done"
    write_events(lab.session, [Started("toy-depth", {}, job="toy-depth-2", t=2.0)])
    lab.poll()
    assert lab.state.jobs["toy-depth-2"].experiment == "toy-depth"


def test_running_jobs_say_where_they_run(monkeypatch):
    lab, _, _ = make_lab(monkeypatch)
    lab.cancels["ablation"] = CancelToken()  # the console runs a map itself
    lab.state.apply(Started("ablation", {}, job="ablation-1", t=1.0))  # its job file: no pid yet
    lab.state.apply(Started("recovery", {}, job="recovery-2", t=1.0))
    lab.state.jobs["recovery-2"].pid = 2**22 + 7
    assert {job.id: where for job, where in lab.running_jobs()} == {"ablation-1": "in console",
                                                                     "recovery-2": "own process"}


# the prompt pane ----------------------------------------------------------------------------------
def test_the_prompt_pane_models_this_session_has(monkeypatch, tmp_path):
    lab, console, _ = make_lab(monkeypatch, session="fresh")
    lab.toggle_mark(3)
    lab.toggle_mark(1)
    assert console.said("modified model: L1, L3 neighbour mean")
    noised, problem = lab.variant("noised", 1.5)
    assert noised is not None and (noised.layers, noised.sigma, problem) == ((1, 3), 1.5, "")
    assert lab.variant("recovered", 0.5) == (None, "no recovered layer in this session yet (inject noise: key i)")
    assert lab.variant("pruned", 0.5)[1].startswith("no prune result in this session yet")
    assert lab.variant("growth", 0.5) == (None, "no growth model in this session yet (run growth: key g)")
    lab.state.set_result("prune", prune_result([cut("bi", [1])], exported_point=cut("bi", [2, 4])))
    assert _variant(lab, "pruned").layers == (2, 4)
    assert lab.session is not None  # make_lab opens one
    saved = lab.session.path / "growth_models" / "uniform_100"
    saved.mkdir(parents=True)
    lab.state.set_result("growth", growth_doc({"uniform_100": str(saved)}))
    assert _variant(lab, "uniform").path == saved
    lab.state.set_result("growth", growth_doc({"uniform_100": str(tmp_path)}))  # a folder outside the session
    assert "is not inside session folder" in lab.variant("uniform", 0.5)[1]
    lab.toggle_mark(3)
    assert _variant(lab, "modified").layers == (1,)


def _variant(lab: Lab, choice: str) -> Variant:
    """The prompt pane's model `choice` (sigma 0.5), which this session has."""
    variant, problem = lab.variant(choice, 0.5)
    assert variant is not None, problem
    return variant


def test_block_marks_make_the_modified_model_and_come_back_with_the_session(monkeypatch):
    """t and m mark blocks beside the layers x marks; a layer is marked whole or by its blocks; the
    marks are the session's (console.json), and those beyond the loaded model's layers are dropped."""
    lab, console, _ = make_lab(monkeypatch, session="fresh")
    assert lab.variant("modified", 0.5)[0] == Variant("modified")
    lab.toggle_block_mark(3, "mlp")
    lab.toggle_mark(1)
    lab.toggle_block_mark(3, "attention")
    lab.toggle_block_mark(11, "mlp")
    assert console.said("modified model: L1 neighbour mean · L3.attn, L3.mlp, L11.mlp removed")
    modified, noised = _variant(lab, "modified"), _variant(lab, "noised")
    assert (modified.layers, modified.blocks) == ((1,), ((3, "attention"), (3, "mlp"), (11, "mlp")))
    assert (noised.layers, noised.blocks) == ((1,), ())  # the noised model noises whole layers only
    lab.toggle_block_mark(1, "mlp")  # a block of a layer marked whole: its mark takes the layer's place
    lab.toggle_mark(3)  # a layer marked whole: its blocks' marks give way
    assert lab.marks == Marks(frozenset({3}), frozenset({(1, "mlp"), (11, "mlp")}))
    lab.toggle_block_mark(11, "mlp")
    lab.toggle_block_mark(11, "mlp")  # twice: unmarked, marked again
    lab.closing()
    again, told, _ = make_lab(monkeypatch, session="fresh")
    assert again.marks == Marks(frozenset({3}), frozenset({(1, "mlp"), (11, "mlp")}))
    again.model_loaded(stub_model())  # 4 layers
    assert again.marks == Marks(frozenset({3}), frozenset({(1, "mlp")}))
    assert told.said("marks beyond this model's 4 layers dropped", "warning")
    lab.toggle_mark(3)
    lab.toggle_block_mark(1, "mlp")
    lab.toggle_block_mark(11, "mlp")
    assert console.said("modified model: nothing marked, it answers as the original")


def test_one_generation_at_a_time(monkeypatch):
    lab, console, _ = make_lab(monkeypatch)
    assert lab.new_generation() is None and console.said("the model is still loading")
    lab.model_loaded(stub_model(device="cpu", dtype="float32"))
    first = lab.new_generation()
    second = lab.new_generation()
    assert first is not None and second is not None  # the model is loaded
    assert (first.run, second.run) == (1, 2) and first.stop.is_set() and not second.stop.is_set()
    assert not lab.current_generation(1) and lab.current_generation(2)
    lab.generation_done(1)  # an older run's end changes nothing
    assert lab.generation is second
    lab.closing()
    assert second.stop.is_set()
    lab.generation_done(2)
    assert lab.generation is None
