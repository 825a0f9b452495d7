"""SIGTERM and SIGHUP (a `kill`, a scheduler, `docker stop`, a closed terminal) stop a run the way
Ctrl-C does: the checkpoint kept, a finish event naming the signal, the job 'interrupted' (the
console offers it), the command that resumes it printed, exit 143 or 129; a resume records the job
it continues, marked 'resumed' once it is done; an error found after the model load prints once."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar, cast

import pytest

from cli.main import main
from engine import registry
from engine.core.errors import UserError
from engine.core.events import Event, Message, Progress, Result, ResultDocument
from engine.core.process import STOP_EXIT_CODES, Stopped, exit_code, interruption, stop_on_signals, stop_signal
from engine.core.settings import Settings
from engine.experiments.context import RunContext
from engine.experiments.contract import Contract
from engine.models.options import ModelOptions
from engine.registry import Experiment
from sessions.job_runner import run_job
from sessions.store import Session, SessionStore
from tui.lab import Lab

ROOT = Path(__file__).resolve().parent.parent


# the signal, as an exception ----------------------------------------------------------------------
def test_sigterm_and_sighup_raise_stopped_once_and_the_old_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(Stopped) as caught, stop_on_signals():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises at the next bytecode, long before this ends
        assert caught.value.name == sig.name and exit_code(caught.value) == 128 + sig
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before
    with stop_on_signals():  # a second signal (a launcher passing on its group's) lets the first finish
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    assert exit_code(KeyboardInterrupt()) == 130 and STOP_EXIT_CODES == {130, 143, 129}
    assert (stop_signal(ValueError()), stop_signal(KeyboardInterrupt()), stop_signal(Stopped(signal.SIGHUP))) == (
        0, signal.SIGINT, signal.SIGHUP)
    assert type(interruption(signal.SIGINT)) is KeyboardInterrupt
    assert cast(Stopped, interruption(signal.SIGTERM)).name == "SIGTERM"


def test_sigint_stops_a_run_even_where_the_process_was_started_with_it_ignored_and_blocked():
    """A shell script's background job starts with SIGINT ignored, a child forked while its parent's
    thread held SIGINT blocked starts with it blocked: a run still takes SIGINT (the console's
    cancel) as Ctrl-C, and the process's own choice comes back after it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with pytest.raises(KeyboardInterrupt), stop_on_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, before)


def test_lines_of_processes_sharing_an_unbuffered_stderr_never_cut_into_each_other():
    """Workers of --shards and their launcher write to one stderr; under python -u (or
    PYTHONUNBUFFERED=1) `print` writes a line's text and its newline apart, so another process's
    line could land between them (the launcher's "interrupted by SIGTERM" glued to rank 0's resume
    command). `say` writes each line whole: many lines from three processes at once stay whole."""
    code = ("import sys\nfrom engine.core.process import say\n"
            "for i in range(3000):\n    say(f'{sys.argv[1]} line {i} ' + 'x' * 60)\n")
    reader, writer = os.pipe()
    writers = [subprocess.Popen([sys.executable, "-u", "-c", code, name], stderr=writer, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}) for name in ("a", "b", "c")]
    os.close(writer)
    with os.fdopen(reader) as stream:
        lines = stream.read().splitlines()
    assert all(process.wait(60) == 0 for process in writers)
    assert len(lines) == 9000 and all(re.fullmatch(r"[abc] line \d+ x{60}", line) for line in lines)


def test_a_run_stopped_before_its_job_starts_says_so_and_exits_with_the_signal(monkeypatch, capsys):
    """A signal during the model load (no job yet, nothing to resume): one line, 128 + the signal."""
    for stop, code, line in ((Stopped(signal.SIGTERM), 143, "anatomy-tui: interrupted by SIGTERM"),
                             (Stopped(signal.SIGHUP), 129, "anatomy-tui: interrupted by SIGHUP"),
                             (KeyboardInterrupt(), 130, "anatomy-tui: interrupted")):

        def loading(*args, stop=stop):
            raise stop

        monkeypatch.setattr("cli.runner.run_command", loading)
        assert main(["run", "toy-depth"]) == code
        assert capsys.readouterr().err.splitlines() == [line]


def test_a_stopped_worker_stops_the_sharded_job_as_interrupted_not_failed():
    from engine.models.distributed import _Failed, _Merger

    with pytest.raises(Stopped, match="SIGTERM"):
        list(_Merger().take(1, _Failed("SIGTERM", signal.SIGTERM)))
    with pytest.raises(KeyboardInterrupt):
        list(_Merger().take(1, _Failed("", signal.SIGINT)))


# the job's record -------------------------------------------------------------------------------
def stopped_after(events: list[Event], sig: int) -> Iterator[Event]:
    yield from events
    raise Stopped(sig)


def job_file(session: Session, job_id: str) -> dict:
    return json.loads((session.path / "jobs" / f"{job_id}.json").read_text())


def finishes(session: Session) -> list[dict]:
    docs = [json.loads(line) for line in (session.path / "events.jsonl").read_text().splitlines()]
    return [doc for doc in docs if doc["kind"] == "job.finished"]


def test_a_stopped_job_is_recorded_interrupted_naming_the_signal_and_the_stop_goes_on():
    session = SessionStore().create("s")
    with pytest.raises(Stopped):
        run_job(session, "toy-depth", {}, stopped_after([Progress(1, 3)], signal.SIGHUP), job_id="j1")
    doc = job_file(session, "j1")
    assert (doc["status"], doc["error"]) == ("interrupted", "stopped by SIGHUP")
    assert [(d["job"], d["status"], d["error"]) for d in finishes(session)] == [("j1", "interrupted", doc["error"])]
    assert session.jobs()["j1"]["status"] == "interrupted"


def test_a_resume_records_the_job_it_continues_and_marks_it_resumed_once_done():
    session = SessionStore().create("s")
    with pytest.raises(Stopped):
        run_job(session, "toy-depth", {}, stopped_after([], signal.SIGTERM), job_id="a")
    run_job(session, "growth", {}, iter([Result("growth", {})]), job_id="other")  # another experiment's
    with pytest.raises(Stopped):  # a resume that is stopped in turn leaves both to resume
        run_job(session, "toy-depth", {}, stopped_after([], signal.SIGTERM), job_id="b", resume=True)
    assert job_file(session, "b")["resumes"] == "a" and job_file(session, "a")["status"] == "interrupted"
    run_job(session, "toy-depth", {}, iter([Result("toy-depth", {})]), job_id="c", resume=True)
    assert job_file(session, "c")["resumes"] == "b" and job_file(session, "c")["status"] == "done"
    for old in ("a", "b"):  # the chain back: neither is offered again
        assert (job_file(session, old)["status"], job_file(session, old)["resumed_by"]) == ("resumed", "c")
    assert job_file(session, "other")["status"] == "done" and "resumed_by" not in job_file(session, "other")
    run_job(session, "toy-depth", {}, iter([Result("toy-depth", {})]), job_id="d", resume=True)
    assert "resumes" not in job_file(session, "d")  # the newest was done: nothing to continue


def test_a_job_killed_without_a_word_is_the_one_a_resume_marks():
    """kill -9 leaves the job file 'running' with its process gone: it reads interrupted, is
    offered, and a finished resume marks it resumed, after which the console offers nothing."""
    from engine.experiments.growth.vocabulary import PRESETS

    session = SessionStore().create("killed")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    settings = PRESETS["tiny"].to_dict()
    session.write_job("growth-1", {"id": "growth-1", "experiment": "growth", "status": "running", "pid": child.pid,
                                   "settings": settings, "model": None, "started": 1.0})  # fmt: skip
    assert session.jobs()["growth-1"]["status"] == "interrupted" and offered("killed") == "growth-1"
    run_job(session, "growth", {}, iter([Result("growth", {})]), job_id="growth-2", resume=True, settings=settings)
    assert job_file(session, "growth-2")["resumes"] == "growth-1"
    assert (job_file(session, "growth-1")["status"], job_file(session, "growth-1")["pid"]) == ("resumed", child.pid)
    assert offered("killed") is None


def test_a_forged_resumes_chain_is_followed_safely():
    session = SessionStore().create("s")
    for job_id, resumes, started in (("x", ["a", "list"], 3.0), ("y", "z", 1.0), ("z", "y", 2.0)):  # a cycle
        session.write_job(job_id, {"id": job_id, "experiment": "toy-depth", "status": "cancelled",
                                   "started": started, "resumes": resumes})  # fmt: skip
    run_job(session, "toy-depth", {}, iter([]), job_id="n", resume=True)
    assert job_file(session, "n")["resumes"] == "z"  # x's file has a bad field: not a job
    assert {j: job_file(session, j)["status"] for j in "xyz"} == {"x": "cancelled", "y": "resumed", "z": "resumed"}


def offered(session: str) -> str | None:
    """The job the console offers to resume in `session`."""
    lab = Lab(SessionStore(), ModelOptions())
    lab.open(session)
    offer = lab.resume_offer(asked=False)
    return offer.job if offer is not None else None


def test_the_console_offers_a_sigterm_interrupted_job_and_not_once_it_is_resumed():
    from engine.experiments.growth.vocabulary import PRESETS

    store = SessionStore()
    session = store.create("s")
    with pytest.raises(Stopped):
        run_job(session, "growth", {}, stopped_after([], signal.SIGTERM), job_id="growth-1",
                settings=PRESETS["tiny"].to_dict())  # fmt: skip
    lab = Lab(store, ModelOptions())
    lab.open("s")
    offer = lab.resume_offer(asked=False)
    assert offer is not None and offer.job == "growth-1" and offer.argv[-1] == "--resume"
    lab.poll()
    assert lab.state.jobs["growth-1"].status == "interrupted"
    run_job(session, "growth", {}, iter([Result("growth", {})]), job_id="growth-2", resume=True,
            settings=PRESETS["tiny"].to_dict())  # fmt: skip
    assert offered("s") is None
    assert session.jobs()["growth-1"]["status"] == "resumed"
    lab.poll()
    lab.reconcile()  # the jobs panel: the old job reads resumed, not interrupted
    assert lab.state.jobs["growth-1"].status == "resumed" and lab.state.jobs["growth-2"].status == "done"


# an error found after the model load prints once ------------------------------------------------
@dataclass(frozen=True)
class LateSettings(Settings):
    """No settings: the experiment below fails once it runs."""


@dataclass(frozen=True)
class LateResult(ResultDocument):
    """The result it never writes."""

    name: ClassVar[str] = "late-error"


def run(settings: LateSettings, context: RunContext) -> Iterator[Event]:
    """An experiment whose bad input shows only once it runs (after a model would have loaded)."""
    yield Message("loaded; checking what needs the model")
    raise UserError("layer 9 is out of range; this model has layers 0 to 3")


def test_an_error_after_the_load_is_one_line_with_no_empty_bar(monkeypatch, capsys):
    here = sys.modules[__name__]  # its vocabulary and its computation
    folder = SimpleNamespace(__name__=__name__, contract=lambda: Contract(LateSettings, LateResult, LateResult),
                             computation=lambda: here)
    row = Experiment("late-error", "fails once it runs", folder, needs_model=False)
    registry.register(row)
    try:
        assert main(["run", "late-error", "--session", "late"]) == 2
    finally:
        registry.unregister(row.name)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["[progress] late-error: starting", "[info] loaded; checking what needs the model",
                     "anatomy-tui: error: layer 9 is out of range; this model has layers 0 to 3"], err
    (doc,) = SessionStore().open("late").jobs().values()  # the job is recorded, failed, with its reason
    assert doc["status"] == "failed" and "layer 9 is out of range" in doc["error"]


def test_an_error_every_worker_of_a_split_run_finds_is_said_once(monkeypatch, tmp_path, capsys):
    """Under --shards each worker runs the same checks: rank 0 says the error, the others hand it
    to the launcher (its reply file), which says it only when rank 0 did not."""
    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from engine.models.distributed import launch

    reply = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(reply))
    monkeypatch.setenv("RANK", "1")
    assert main(["run", "toy-depth", "--steps", "0"]) == 2
    said = capsys.readouterr().err
    assert said == "" and "--steps" in json.loads(reply.read_text())["message"]
    monkeypatch.setenv("RANK", "0")
    assert main(["run", "toy-depth", "--steps", "0"]) == 2 and capsys.readouterr().err.startswith("anatomy-tui: error:")

    def failing(*exits: tuple[int, int]):
        def run(args):
            raise ChildFailedError("cli.main", {rank: ProcessFailure(rank, 100 + rank, code, str(reply) if rank else "")
                                               for rank, code in exits})
        return run

    for exits, code, lines in (
        (((0, 2), (1, 2)), 2, []),  # rank 0 said it
        (((1, 2), (0, -15)), 2, [f"anatomy-tui: error: worker rank 1: {json.loads(reply.read_text())['message']}"]),
        (((0, 143), (1, 143)), 143, []),  # stopped: rank 0 said how to resume
    ):
        monkeypatch.setattr(torch.distributed.run, "run", failing(*exits))
        assert launch([sys.executable, "-c", "pass"], 2) == code
        assert capsys.readouterr().err.splitlines() == lines


# real runs stopped by a real signal --------------------------------------------------------------
def start(args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(process: subprocess.Popen, session: str, kind: str, count: int = 1) -> None:
    """Until session `session`'s log holds `count` events of `kind` (or the process ended)."""
    log = Path(os.environ["ANATOMY_TUI_HOME"]) / session / "events.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and log.read_text().count(f'"kind": "{kind}"') >= count:
            return
        time.sleep(0.02)


def signal_after(process: subprocess.Popen, session: str, kind: str, sig: int) -> tuple[int, str]:
    """Sends `sig` as soon as session `session`'s log holds an event of `kind`; the exit code and stderr."""
    wait_for(process, session, kind)
    process.send_signal(sig)
    _, err = process.communicate(timeout=600)
    return process.returncode, err


def resume_line(err: str, experiment: str, sig: str) -> list[str]:
    """The printed command that resumes the run, as argv for `main`."""
    lines = [line for line in err.splitlines() if line.startswith(f"{experiment} interrupted by {sig}")]
    assert len(lines) == 1, err[-3000:]  # the whole stderr when it is not said once
    (line,) = lines
    command = shlex.split(line.split("; continue with: ", 1)[1])
    assert command[0] == "anatomy-tui" and command[-3:-1] == ["--session", command[-2]] and command[-1] == "--resume"
    return command[1:]


def check_interrupted(session: str, sig: str) -> str:
    """The job is interrupted, naming the signal, in its file and in the log's last event; its id."""
    opened = SessionStore().open(session)
    (job_id, doc), = opened.jobs().items()
    assert (doc["status"], doc["error"]) == ("interrupted", f"stopped by {sig}")
    assert finishes(opened)[-1] == {**finishes(opened)[-1], "job": job_id, "status": "interrupted",
                                    "error": f"stopped by {sig}"}  # fmt: skip
    assert offered(session) == job_id  # the console offers it
    return job_id


def check_resumed(session: str, old: str) -> None:
    jobs = SessionStore().open(session).jobs()
    (new,) = [job_id for job_id in jobs if job_id != old]
    assert (jobs[new]["status"], jobs[new]["resumes"]) == ("done", old)
    assert (jobs[old]["status"], jobs[old]["resumed_by"]) == ("resumed", new)
    assert offered(session) is None


def recovery_flags(model: Path, files: tuple[str, str]) -> list[str]:
    evaluation, train = files
    return ["run", "recovery", "--model", str(model), "--device", "cpu", "--layers", "1,2,3", "--sigma", "3",
            "--steps", "12", "--lr", "1e-2", "--batch-size", "2", "--block-size", "16", "--train-blocks", "4",
            "--eval-every", "4", "--train-file", train, "--eval-file", evaluation]


def same_recovery(a: dict, b: dict) -> None:
    assert [row["layer"] for row in a["layers"]] == [row["layer"] for row in b["layers"]] == [1, 2, 3]
    for x, y in zip(a["layers"], b["layers"], strict=True):
        assert x["steps_to"] == y["steps_to"]
        assert [p for _, p in x["curve"]] == pytest.approx([p for _, p in y["curve"]], rel=1e-5)


@pytest.mark.slow
def test_sigterm_stops_a_recovery_sweep_that_resumes_to_the_uninterrupted_result(tmp_path, tiny_folder, files):
    flags = recovery_flags(tiny_folder, files)
    code, err = signal_after(start([*flags, "--session", "term"]), "term", "recovery.layer", signal.SIGTERM)
    assert code == 143, err
    assert "anatomy-tui: error" not in err and "Traceback" not in err
    old = check_interrupted("term", "SIGTERM")
    checkpoint = json.loads((SessionStore().open("term").path / "checkpoints/recovery/layers.json").read_text())
    assert "1" in checkpoint["layers"] and len(checkpoint["layers"]) < 3  # stopped in the sweep, layer 1 kept

    resumed, fresh = tmp_path / "resumed.json", tmp_path / "fresh.json"
    assert main([*resume_line(err, "recovery", "SIGTERM"), "--json", str(resumed)]) == 0
    check_resumed("term", old)
    assert main([*flags, "--session", "straight", "--json", str(fresh)]) == 0
    doc = json.loads(resumed.read_text())
    assert 1 in doc["resumed_layers"]
    same_recovery(doc, json.loads(fresh.read_text()))


TOY = ["run", "toy-depth", "--preset", "tiny", "--width", "8", "--outputs", "8", "--teacher-depth", "4",
       "--student-depths", "1,2,4", "--steps", "300", "--batch-size", "8", "--eval-size", "16",
       "--regimes", "independent", "--bootstrap", "5", "--device", "cpu"]


def same_toy(a: Path, b: Path) -> None:
    docs = [{k: v for k, v in json.loads(path.read_text()).items() if k != "seconds"} for path in (a, b)]
    assert docs[0] == docs[1]


@pytest.mark.slow
def test_sighup_stops_a_toy_depth_run_that_resumes_to_the_uninterrupted_result(tmp_path):
    code, err = signal_after(start([*TOY, "--session", "hup"]), "hup", "toy-depth.student", signal.SIGHUP)
    assert code == 129, err
    old = check_interrupted("hup", "SIGHUP")
    assert main([*resume_line(err, "toy-depth", "SIGHUP"), "--json", str(tmp_path / "resumed.json")]) == 0
    check_resumed("hup", old)
    assert main([*TOY, "--session", "straight", "--json", str(tmp_path / "fresh.json")]) == 0
    same_toy(tmp_path / "resumed.json", tmp_path / "fresh.json")


@pytest.mark.slow
def test_sigterm_to_the_shards_launcher_reaches_every_worker_and_the_job_resumes(tmp_path, worker_env):
    launcher = start([*TOY, "--regimes", "independent,tied", "--shards", "2", "--session", "split"])
    code, err = signal_after(launcher, "split", "toy-depth.student", signal.SIGTERM)
    assert code == 143, err
    assert "failed" not in err and "Traceback" not in err
    old = check_interrupted("split", "SIGTERM")
    resume = resume_line(err, "toy-depth", "SIGTERM")
    assert main([*resume, "--json", str(tmp_path / "resumed.json")]) == 0  # serially: the same numbers
    check_resumed("split", old)
    assert main([*TOY, "--regimes", "independent,tied", "--session", "straight",
                 "--json", str(tmp_path / "fresh.json")]) == 0
    same_toy(tmp_path / "resumed.json", tmp_path / "fresh.json")


@pytest.mark.slow
def test_a_job_the_console_started_stops_on_sigterm_is_offered_and_its_resume_marks_it(monkeypatch):
    """The console's jobs run the same command: `kill PID` (SIGTERM) leaves it interrupted and offered,
    the offer's command finishes it and marks it resumed; the console's own cancel (SIGINT to the
    job's group) leaves it cancelled, as Ctrl-C does."""
    from cli.flags import settings_from_flags

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    lab = Lab(SessionStore(), ModelOptions())
    lab.open("console")
    settings = settings_from_flags(registry.BY_NAME["toy-depth"], TOY[2:])
    job = lab.start_job("toy-depth", settings)
    assert job is not None and job.process is not None
    wait_for(job.process, "console", "toy-depth.student")
    os.kill(job.pid, signal.SIGTERM)
    assert job.process.wait(timeout=600) == 143
    assert "toy-depth interrupted by SIGTERM; continue with: anatomy-tui run toy-depth" in job.log_path.read_text()
    old = check_interrupted("console", "SIGTERM")
    offer = lab.resume_offer()
    assert offer is not None and offer.job == old
    resumed = lab.launch(offer.experiment, offer.argv)
    assert resumed is not None and resumed.process is not None and resumed.process.wait(timeout=600) == 0
    check_resumed("console", old)

    seen = (SessionStore().open("console").path / "events.jsonl").read_text().count('"kind": "toy-depth.student"')
    again = lab.start_job("toy-depth", settings)
    assert again is not None and again.process is not None
    wait_for(again.process, "console", "toy-depth.student", count=seen + 1)
    assert again.process.poll() is None, again.log_path.read_text()[-2000:]  # still running: the cancel stops it
    lab.cancel("toy-depth")
    said = [text for _, text in lab.state.log]
    assert again.process.wait(timeout=600) == 130, (said[-3:], again.log_path.read_text()[-2000:])
    cancelled = [doc for doc in SessionStore().open("console").jobs().values() if doc.get("pid") == again.pid]
    assert [doc["status"] for doc in cancelled] == ["cancelled"]


@pytest.mark.slow
def test_sigterm_stops_an_atlas_as_interrupted_and_its_rerun_reuses_the_finished_measures(tmp_path, capsys):
    """A real `anatomy-tui atlas` stopped by SIGTERM while its second model's map runs: exit 143, the
    measure said interrupted (not failed), its step and its job marked interrupted; run again, the
    first model's map is reused and the second's runs to the end."""
    from tiny_models import save_tiny

    models = [save_tiny(tmp_path / family, family) for family in ("llama", "qwen2")]
    texts = tmp_path / "texts.txt"  # enough text that a map takes a while
    texts.write_text("\n".join(f"The {i}th cat sat on the mat and looked at dog {i * 7 % 13}." for i in range(300)))
    argv = ["atlas", "--models", ",".join(map(str, models)), "--name", "sig", "--eval-file", str(texts),
            "--device", "cpu", "--measures", "map", "--bins", "4"]
    code, err = signal_after(start(argv), "sig-qwen2", "ablation.layer", signal.SIGTERM)
    assert code == 143, err
    assert "Traceback" not in err and "failed" not in err and "fix that" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("atlas sig interrupted")]
    assert line == (f"atlas sig interrupted by SIGTERM at {models[1]} · ablation on main (marked interrupted; its "
                    "session sig-qwen2); run the same atlas command again to continue from here")
    state = json.loads((SessionStore().open("sig").path / "checkpoints/atlas/state.json").read_text())
    assert state["steps"] == {f"{models[0]}|main|ablation": {"session": "sig-llama", "status": "run"},
                              f"{models[1]}|main|ablation": {"session": "sig-qwen2", "status": "interrupted"}}
    (job,) = SessionStore().open("sig-qwen2").jobs().values()
    assert (job["status"], job["error"]) == ("interrupted", "stopped by SIGTERM")

    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"{models[0]} · ablation (map) on main: reused from session sig-llama" in err
    # the stopped map's partial result is not reused: the map resumes from its checkpoint
    assert f"{models[1]} · ablation (map) on main: resuming into session sig-qwen2" in err
    doc = SessionStore().open("sig").load_result("atlas")
    assert doc is not None
    assert {row["model"] for row in doc["rows"]} == {str(m) for m in models}
