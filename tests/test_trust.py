"""Nothing a session file says is trusted, one damaged file never hides the rest, and no finished
work is lost to a bad output path (issue 14's probe cases, one test each)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable

from cli.main import main
from engine.core.errors import UserError
from engine.core.events import Message, Progress, Result
from engine.core.process import job_identity_matches, process_identity
from engine.disk.atomic import atomic_write_json, check_writable_path
from sessions.job_runner import run_job
from sessions.store import SessionError, SessionStore
from tui import jobs as jobs_module


def one_error_line(capsys, after_a_run: bool = False) -> str:
    """The error, one line; after a run, the last line of stderr (progress comes before it)."""
    err = capsys.readouterr().err.strip().splitlines()
    if after_a_run:
        assert not any("Traceback" in line for line in err), err
        err = err[-1:]
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error: "), err
    return err[0]


# atomic writes: only over regular files or new paths -------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "directory", "link-to-fifo", "link-to-directory"])
def test_atomic_write_refuses_what_is_not_a_regular_file(tmp_path, kind):
    target = tmp_path / "special"
    if kind.endswith("fifo"):
        os.mkfifo(target)
    else:
        target.mkdir()
    path = target if not kind.startswith("link") else tmp_path / "link"
    if path != target:
        path.symlink_to(target)
    with pytest.raises(UserError, match="regular file") as caught:
        atomic_write_json(path, {"v": 1})
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
    mode = os.lstat(target).st_mode
    assert stat.S_ISFIFO(mode) if kind.endswith("fifo") else stat.S_ISDIR(mode)  # left as it was
    assert not path.is_file()


def test_atomic_write_through_a_link_updates_the_file_it_names(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    atomic_write_json(link, {"v": 2})
    assert link.is_symlink() and json.loads(real.read_text()) == {"v": 2}
    assert check_writable_path(tmp_path / "new" / "deep.json") == tmp_path / "new" / "deep.json"


def test_json_to_a_fifo_fails_before_the_run_with_one_line(tiny_folder, tmp_path, capsys, monkeypatch):
    fifo = tmp_path / "null"
    os.mkfifo(fifo)  # like --json /dev/null: not a file to replace
    monkeypatch.setattr("engine.models.options.ModelOptions.load", lambda *a, **k: pytest.fail("model loaded"))
    code = main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--session", "j",
                 "--json", str(fifo)])  # fmt: skip
    line = one_error_line(capsys)
    assert code == 2 and "--json" in line and "FIFO" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not SessionStore().exists("j")  # refused before the session was even made


def test_json_to_a_directory_fails_before_the_run(tiny_folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("engine.models.options.ModelOptions.load", lambda *a, **k: pytest.fail("model loaded"))
    code = main(["run", "ablation", "--model", str(tiny_folder), "--json", str(tmp_path)])
    assert code == 2 and "is a directory" in one_error_line(capsys)


def test_result_file_that_is_a_directory_fails_before_the_run(tiny_folder, capsys, monkeypatch):
    session = SessionStore().create("r")
    (session.results_dir / "ablation.json").mkdir()
    monkeypatch.setattr("engine.models.options.ModelOptions.load", lambda *a, **k: pytest.fail("model loaded"))
    code = main(["run", "ablation", "--model", str(tiny_folder), "--session", "r"])
    assert code == 2 and "ablation.json" in one_error_line(capsys, after_a_run=True)


def test_a_result_that_cannot_be_written_at_the_end_is_kept(capsys):
    session = SessionStore().create("late")

    def experiment():
        yield Progress(1, 1)
        (session.results_dir / "thing.json").mkdir()  # becomes a directory while the run goes on
        yield Result("thing", {"answer": 42})

    with pytest.raises(UserError, match="the result is kept in") as caught:
        run_job(session, "thing", {}, experiment(), job_id="j1")
    spare = str(caught.value).rsplit("kept in ", 1)[1]
    assert json.loads(open(spare).read()) == {"answer": 42}
    assert [e.data for e in session.events() if isinstance(e, Result)] == [{"answer": 42}]  # and in the log


def test_json_that_fails_at_the_end_says_where_the_result_is(tiny_folder, tmp_path, capsys, monkeypatch):
    out = tmp_path / "later"
    out.mkdir()  # as if it became a directory during the run: the check before it is skipped
    monkeypatch.setattr("cli.runner.check_writable_path", lambda path, what: path)
    code = main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--session", "late2",
                 "--json", str(out), "--bootstrap", "20"])  # fmt: skip
    line = one_error_line(capsys, after_a_run=True)
    assert code == 2 and "kept in session late2" in line
    doc = SessionStore().open("late2").load_result("ablation")
    assert doc is not None and doc["layers"]


# signals: only to a process proven to be the job -----------------------------------------------------------
@pytest.fixture
def signals(monkeypatch):
    sent = []
    monkeypatch.setattr(jobs_module.os, "kill", lambda pid, sig: sent.append(("kill", pid, sig)))
    monkeypatch.setattr(jobs_module.os, "killpg", lambda pid, sig: sent.append(("killpg", pid, sig)))
    return sent


def _me() -> dict:
    return {"status": "running", "experiment": "growth", **process_identity()}


@pytest.mark.parametrize(
    "doc",
    [
        {"status": "running", "pid": 1, "pgid": 1, "start_time": 1, "cmdline": ["init"]},
        {**_me(), "start_time": _me()["start_time"] - 1},  # our pid, but not the process that wrote it
        {**_me(), "cmdline": ["something", "else"]},
        {k: v for k, v in _me().items() if k != "start_time"},  # a file that does not prove anything
        {"status": "running", "pid": os.getpid()},  # the 0.1 job file
        {**_me(), "pid": "abc"},
        {**_me(), "pid": [1]},
        {**_me(), "pid": 99999999999},
        {**_me(), "pid": 0},
        {**_me(), "pid": -1},
        {**_me(), "pid": True},
    ],
)
def test_an_unproven_pid_is_never_signalled(doc, signals):
    assert jobs_module.stop_job(doc) is False
    assert signals == []
    assert not job_identity_matches(doc)


def test_a_reused_pid_reads_stale_and_pid_one_is_never_running():
    session = SessionStore().create("stale")
    session.write_job("reused", {**_me(), "start_time": _me()["start_time"] - 1})
    session.write_job("init", {"status": "running", "pid": 1})
    session.write_job("mine", _me())
    jobs = session.jobs()
    assert jobs["reused"]["status"] == "stale" and "another program" in jobs["reused"]["stale"]
    assert jobs["init"]["status"] in ("stale", "interrupted")
    assert jobs["mine"]["status"] == "running"
    info = SessionStore().list()[0]
    assert info.running == ["mine"] and "reused" in info.stale


def test_a_proven_job_gets_the_signal_for_its_group(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        for _ in range(200):  # until the child has exec'd python
            doc = {"status": "running", **process_identity(child.pid)}
            if doc["cmdline"] and doc["cmdline"][-1] == "import time; time.sleep(60)":
                break
            time.sleep(0.05)
        assert doc["pgid"] == child.pid and job_identity_matches(doc)
        assert jobs_module.stop_job(doc, signal.SIGTERM) is True
        assert child.wait(10) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_run_job_records_the_identity_of_its_process():
    session = SessionStore().create("ident")
    run_job(session, "x", {}, iter([Message("hi")]), job_id="j")
    doc = json.loads((session.path / "jobs" / "j.json").read_text())
    assert doc["pid"] == os.getpid() and doc["pgid"] == os.getpgid(0)
    assert doc["start_time"] == process_identity()["start_time"] and doc["cmdline"]


# symbolic links in a session are refused -----------------------------------------------------------------
@pytest.mark.parametrize("part", ["results", "jobs", "checkpoints", "logs", "events.jsonl"])
def test_a_linked_part_of_a_session_is_refused(tmp_path, part, capsys):
    store = SessionStore()
    store.create("good")
    session = store.create("linked")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / part
    if part == "events.jsonl":
        target.write_text("")
    else:
        target.mkdir()
    if (session.path / part).is_dir():
        (session.path / part).rmdir()
    (session.path / part).symlink_to(target)
    with pytest.raises(SessionError, match="symbolic link"):
        store.open("linked")
    infos = {info.name: info for info in store.list()}
    assert not infos["linked"].openable and part in infos["linked"].damaged
    assert infos["good"].openable and infos["good"].damaged == ""
    recent = store.most_recent()
    assert recent is not None and recent.name == "good"
    # a Session object opened before the link appeared never writes through it either
    with pytest.raises((SessionError, UserError)):
        if part == "results":
            session.save_result("ablation", {"layers": []})
        elif part == "jobs":
            session.write_job("j", {"status": "done"})
        elif part == "checkpoints":
            session.checkpoint_dir("growth")
        elif part == "logs":
            session.logs_dir.mkdir()
        else:
            session.append_event(Message("x"))
    assert [p for p in outside.rglob("*") if p.is_file() and p.stat().st_size] == []
    assert main(["sessions", "list"]) == 0


def test_a_linked_weights_folder_is_neither_read_nor_written(tmp_path):
    import torch

    from engine.experiments.recovery.checkpoints import save_layer_weights
    from sessions.layer_weights import load_layers, saved_layers

    session = SessionStore().create("w")
    outside = tmp_path / "outside"
    outside.mkdir()
    weights = session.checkpoint_dir("recovery") / "weights"
    save_layer_weights(weights, 1, {"w": torch.zeros(2)}, "m")
    (outside / "layer-3.safetensors").write_bytes((session.checkpoint_dir("recovery") / "weights" /
                                                   "layer-1.safetensors").read_bytes())  # fmt: skip
    folder = session.path / "checkpoints" / "recovery" / "weights"
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    folder.symlink_to(outside)
    assert saved_layers(session, "recovery") == [] and load_layers(session, "recovery", "m") == {}
    with pytest.raises(UserError, match="symbolic link"):
        save_layer_weights(weights, 2, {"w": torch.zeros(2)}, "m")
    assert sorted(p.name for p in outside.iterdir()) == ["layer-3.safetensors"]


# one damaged file never hides the rest ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"updated": "yesterday"}, "'updated'"),
        ({"created": float("inf")}, "'created'"),
        ({"model": 7}, "'model'"),
        ({"settings": []}, "'settings'"),
    ],
)
def test_a_bad_manifest_field_damages_only_that_session(change, fragment, capsys):
    store = SessionStore()
    store.create("good")
    bad = store.create("bad")
    text = json.dumps({**bad.manifest, **change}).replace("Infinity", "1e999")
    (bad.path / "manifest.json").write_text(text)
    infos = {info.name: info for info in store.list()}
    assert not infos["bad"].openable and fragment in infos["bad"].damaged
    recent = store.most_recent()
    assert recent is not None and recent.name == "good"
    assert main(["sessions", "list"]) == 0
    listing = capsys.readouterr().out
    assert "bad" in listing and "DAMAGED" in listing and "good" in listing
    assert main(["sessions", "show", "bad"]) == 2


@pytest.mark.parametrize("pid", ["abc", [1], 99999999999, None, 2.5])
def test_a_bad_job_file_is_reported_and_the_session_still_opens(pid, capsys):
    store = SessionStore()
    session = store.create("jobs")
    session.save_result("ablation", {"layers": [{"layer": 0}]})
    session.write_job("bad", {"status": "running", "pid": pid, "experiment": "growth", "started": 1.0})
    session.write_job("done", {"status": "done", "pid": 12, "experiment": "ablation", "started": 1.0})
    (session.path / "jobs" / "torn.json").write_text('{"status": "run')
    session.write_job("odd", {"status": "exploded"})
    session.write_job("time", {"status": "done", "started": "yesterday"})
    opened = store.open("jobs")
    assert list(opened.jobs()) == ["done"]
    assert len(opened.damage) == 4 and all("\n" not in line for line in opened.damage)
    info = store.list()[0]
    assert info.openable and info.results == ["ablation"] and "jobs/bad.json" in info.damaged
    recent = store.most_recent()
    assert recent is not None and recent.name == "jobs"
    assert main(["sessions", "list"]) == 0 and "damaged: " in capsys.readouterr().out
    assert main(["sessions", "show", "jobs"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert list(shown["jobs"]) == ["done"] and len(shown["damage"]) == 4


def test_damaged_results_are_reported_and_the_rest_is_read():
    session = SessionStore().create("results")
    session.save_result("recovery", {"layers": [{"layer": 1}]})
    (session.results_dir / "ablation.json").write_text('{"layers": 5}')  # valid JSON, wrong shape
    (session.results_dir / "weights.json").write_text("{not json")
    (session.results_dir / "dynamics.json").mkdir()
    (session.results_dir / "growth.json").write_text("[1, 2]")
    results = session.results()
    assert list(results) == ["recovery"]
    assert len(session.damage) == 4
    assert any("ablation.json" in line and "'layers'" in line for line in session.damage)
    with pytest.raises(SessionError, match="damaged"):
        session.load_result("ablation")


def test_manipulate_on_a_map_of_the_wrong_shape_is_one_line(tiny_folder, capsys):
    session = SessionStore().create("m")
    (session.results_dir / "ablation.json").write_text('{"layers": {"0": 1}}')
    code = main(["run", "manipulate", "--model", str(tiny_folder), "--session", "m", "--eval-set", "paper"])
    assert code == 2 and "ablation.json" in one_error_line(capsys, after_a_run=True)


def test_session_that_escapes_is_one_line_before_the_console(capsys, monkeypatch):
    from tui.app import AnatomyApp

    monkeypatch.setattr(AnatomyApp, "run", lambda self: pytest.fail("the console started"))
    assert main(["--session", "../x"]) == 2
    assert "bad name" in one_error_line(capsys)
    bad = SessionStore().create("trunc")
    (bad.path / "manifest.json").write_text('{"schema_version": 1, "na')
    assert main(["--session", "trunc"]) == 2
    assert "manifest.json does not parse" in one_error_line(capsys)


def test_fifos_in_a_session_never_block_a_reader():
    store = SessionStore()
    session = store.create("fifos")
    os.mkfifo(session.results_dir / "ablation.json")
    os.mkfifo(session.path / "events.jsonl")
    (session.path / "jobs").mkdir()
    os.mkfifo(session.path / "jobs" / "j.json")
    assert session.check() and session.read_event_docs() == ([], 0) and session.results() == {}
    other = store.create("fifo-manifest")
    (other.path / "manifest.json").unlink()
    os.mkfifo(other.path / "manifest.json")
    infos = {info.name: info for info in store.list()}
    assert "not a regular file" in infos["fifo-manifest"].damaged and not infos["fifo-manifest"].openable
    assert infos["fifos"].openable and infos["fifos"].damaged.count("not a regular file") == 3


# the console: a damaged part is a notification, not a traceback ---------------------------------------------
def test_console_opens_a_damaged_session_with_a_notification(isolated_home):
    from tui.app import AnatomyApp

    session = SessionStore().create("dmg")
    session.save_result("recovery", {"layers": [{"layer": 1, "tau": 3.0}]})
    (session.results_dir / "ablation.json").write_text('{"layers": 5}')
    (session.results_dir / "weights.json").mkdir()
    session.write_job("bad", {"status": "running", "pid": "abc"})

    async def scenario() -> list[str]:
        app = AnatomyApp(session="dmg", load_model=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            assert app.session is not None and app.session.name == "dmg"
            return [str(n.message) for n in app._notifications]

    messages = asyncio.run(scenario())
    assert any("ablation.json" in m for m in messages)
    assert any("weights.json" in m for m in messages)
    assert any("jobs/bad.json" in m for m in messages)


def test_picker_offers_a_session_with_damaged_parts_and_refuses_a_broken_one(isolated_home):
    from tui.app import AnatomyApp
    from tui.screens.picker import SessionPicker

    store = SessionStore()
    broken = store.create("broken")
    (broken.path / "manifest.json").write_text(json.dumps({**broken.manifest, "updated": "yesterday"}))
    partly = store.create("partly")
    (partly.results_dir / "ablation.json").write_text("{not json")

    async def scenario() -> tuple[str, list[str]]:
        app = AnatomyApp(load_model=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            picker = app.screen
            assert isinstance(picker, SessionPicker)  # no session named: the picker
            names = [info.name for info in picker.infos]
            assert set(names) == {"broken", "partly"}
            table = picker.query_one("DataTable", DataTable)
            table.move_cursor(row=names.index("broken"))
            await pilot.press("enter")
            await pilot.pause()
            assert app.session is None  # refused, with the reason
            table.move_cursor(row=names.index("partly"))
            await pilot.press("enter")
            await pilot.pause()
            return app.session_name, [str(n.message) for n in app._notifications]

    name, messages = asyncio.run(scenario())
    assert name == "partly"
    assert any("'updated'" in m for m in messages) and any("ablation.json" in m for m in messages)


# the event log ---------------------------------------------------------------------------------------------
def test_a_torn_last_line_does_not_swallow_the_next_jobs_events():
    session = SessionStore().create("torn")
    run_job(session, "first", {}, iter([Progress(1, 2)]), job_id="a")
    with open(session.events_path, "a") as handle:  # a writer killed in the middle of a line
        handle.write('{"v": 1, "kind": "job.progress", "job": "a", "do')
    run_job(session, "second", {}, iter([Message("hello")]), job_id="b")
    events = session.events()
    assert [(e.job, e.kind) for e in events if e.job == "b"][0][1].endswith("started")
    assert [e.text for e in events if isinstance(e, Message)] == ["hello"]
    assert len([e for e in events if e.job == "b"]) == 3  # started, message, finished: none lost
    lines = session.events_path.read_text().splitlines()
    assert sum(1 for line in lines if line.startswith('{"v": 1, "kind": "job.progress", "job": "a", "do')) == 1


def test_events_log_that_is_a_directory_is_one_line_and_loses_nothing(tiny_folder, capsys, monkeypatch):
    session = SessionStore().create("evdir")
    session.save_result("recovery", {"layers": []})
    session.events_path.mkdir()
    assert session.read_event_docs() == ([], 0)
    assert any("events.jsonl" in line for line in session.damage)
    with pytest.raises(UserError, match="events.jsonl"):
        session.append_event(Message("x"))
    assert SessionStore().open("evdir").load_result("recovery") == {"layers": []}
    monkeypatch.setattr("engine.models.options.ModelOptions.load", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["run", "ablation", "--model", str(tiny_folder), "--session", "evdir"]) == 2
    assert "events.jsonl" in one_error_line(capsys)


# issue 27: nothing below a session is read or written through a link --------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def planted(tmp_path: Path, content: bytes = b'{"mine": 1}\n', mode: int = 0o644) -> tuple[Path, bytes, int]:
    """A file outside every session that a link will name: (path, its bytes, its mode)."""
    target = tmp_path / "elsewhere" / "precious.json"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(content)
    target.chmod(mode)
    return target, content, mode


def untouched(target: Path, content: bytes, mode: int) -> None:
    assert target.read_bytes() == content and stat.S_IMODE(os.stat(target).st_mode) == mode


def test_run_into_a_session_whose_result_file_is_a_link_refuses_and_leaves_the_target(tiny_folder, tmp_path):
    """The probe: results/ablation.json a link to a file elsewhere; `run ablation --session S`, a real
    process, refused in one line before the model loads, the file it names as it was (bytes and mode)."""
    session = SessionStore().create("forged")
    target, content, mode = planted(tmp_path)
    (session.path / "results" / "ablation.json").symlink_to(target)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "cli.main", "run", "ablation", "--model", str(tiny_folder),
                           "--eval-set", "paper", "--device", "cpu", "--session", "forged"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0] == ("anatomy-tui: error: session 'forged': results/ablation.json is a symbolic link; sessions "
                      "never follow links (replace it with a real file or folder)")
    untouched(target, content, mode)
    assert (session.path / "results" / "ablation.json").is_symlink() and not (session.path / "jobs").exists()


def test_a_result_file_linked_during_the_run_is_kept_elsewhere_and_its_target_untouched(tmp_path):
    session = SessionStore().create("late-link")
    target, content, mode = planted(tmp_path, mode=0o640)

    def experiment():
        yield Progress(1, 1)
        (session.results_dir / "thing.json").symlink_to(target)  # after the check before the run
        yield Result("thing", {"answer": 42})

    with pytest.raises(UserError, match="symbolic link") as caught:
        run_job(session, "thing", {}, experiment(), job_id="j1")
    spare = str(caught.value).rsplit("kept in ", 1)[1]
    assert json.loads(open(spare).read()) == {"answer": 42} and "\n" not in str(caught.value)
    untouched(target, content, mode)


def _linked_checkpoint(session, target) -> None:
    from engine.experiments.growth.checkpoint import load_checkpoint, save_checkpoint

    folder = session.checkpoint_dir("growth")
    (folder / "state.json").symlink_to(target)
    with pytest.raises(UserError, match="checkpoints/growth/state.json is a symbolic link"):
        load_checkpoint(folder)  # a resume never reads it
    with pytest.raises(UserError, match="checkpoints/growth/state.json is a symbolic link"):
        save_checkpoint(folder, "t", {}, {"step": 1})  # the engine's own write, through engine.disk.atomic


def _linked_job(session, target) -> None:
    (session.path / "jobs").mkdir()
    (session.path / "jobs" / "j.json").symlink_to(target)
    assert "j" not in session.jobs() and any("jobs/j.json" in line for line in session.damage)
    with pytest.raises(SessionError, match="jobs/j.json is a symbolic link"):
        session.write_job("j", {"status": "done"})


def _linked_index(session, target) -> None:
    from tui import event_index

    session.append_event(Message("hello"))
    (session.path / "events.index.json").symlink_to(target)
    assert event_index.load(session) is None  # not read: the whole log is read instead
    assert not event_index.write(session, [], 0)  # not written through either


def _linked_app_log(session, target) -> None:
    from tui.lab import Lab

    (session.path / "app.log").symlink_to(target)
    assert session.writable_part("app.log") is None
    assert any("app.log is a symbolic link" in line for line in session.damage)
    from engine.models.options import ModelOptions

    with pytest.raises(SessionError, match="app.log is a symbolic link"):  # the console does not open it
        Lab(SessionStore(), ModelOptions("tiny", device="cpu")).open(session.name)


def _linked_result_read(session, target) -> None:
    (session.path / "results" / "ablation.json").symlink_to(target)
    with pytest.raises(SessionError, match="results/ablation.json is a symbolic link"):
        session.load_result("ablation")
    assert "ablation" not in session.results()
    with pytest.raises((UserError, SessionError), match="results/ablation.json is a symbolic link"):
        session.check_writable("ablation")


def _linked_layer(session, target) -> None:
    from sessions.layer_weights import load_layers

    folder = session.checkpoint_dir("recovery") / "weights"
    folder.mkdir()
    (folder / "layer-1.safetensors").symlink_to(target)
    with pytest.raises(UserError, match="weights/layer-1.safetensors is a symbolic link"):
        load_layers(session, "recovery", "m")


def _linked_growth_model(session, target) -> None:
    models = session.path / "growth_models"
    models.mkdir()
    (models / "growth_100").symlink_to(target.parent, target_is_directory=True)
    assert main(["export", session.name, "--model", "growth", str(target.parent.parent / "out")]) == 2


@pytest.mark.parametrize("case", [_linked_result_read, _linked_checkpoint, _linked_job, _linked_index,
                                  _linked_app_log, _linked_layer, _linked_growth_model])  # fmt: skip
def test_a_linked_file_in_a_session_is_neither_read_nor_written(tmp_path, case, capsys):
    session = SessionStore().create("s")
    target, content, mode = planted(tmp_path)
    case(session, target)
    untouched(target, content, mode)
    assert sorted(p.name for p in target.parent.iterdir()) == ["precious.json"]
    if case is _linked_growth_model:
        assert "growth_models/growth_100 is a symbolic link" in one_error_line(capsys)


def test_a_session_folder_that_is_a_link_is_refused(tiny_folder, tmp_path, capsys, monkeypatch):
    store = SessionStore()
    real = store.create("real")
    real.save_result("ablation", {"layers": []})
    outside = tmp_path / "outside-session"
    outside.mkdir()
    (outside / "manifest.json").write_bytes((real.path / "manifest.json").read_bytes())
    (store.home / "alias").symlink_to(real.path, target_is_directory=True)  # another session's folder
    (store.home / "away").symlink_to(outside, target_is_directory=True)  # a folder outside the store
    before = {p: p.read_bytes() for p in (*real.path.rglob("*.json"), outside / "manifest.json")}
    for name in ("alias", "away"):
        with pytest.raises(SessionError, match=f"session '{name}' is refused: its folder is a symbolic link"):
            store.open(name)
    infos = {info.name: info for info in store.list()}
    assert not infos["alias"].openable and "symbolic link" in infos["alias"].damaged
    recent = store.most_recent()
    assert infos["real"].openable and recent is not None and recent.name == "real"
    monkeypatch.setattr("engine.models.options.ModelOptions.load", lambda *a, **k: pytest.fail("model loaded"))
    for name in ("alias", "away"):
        assert main(["run", "ablation", "--model", str(tiny_folder), "--session", name]) == 2
        assert "its folder is a symbolic link" in one_error_line(capsys)
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in outside.iterdir()) == ["manifest.json"]
    assert not (real.path / "events.jsonl").exists() and not (real.path / "jobs").exists()


def test_evaluate_never_loads_a_growth_model_from_outside_the_session(tiny_folder, tmp_path, capsys, monkeypatch):
    """The probe: results/growth.json whose arm names a folder outside the session: `run evaluate
    --variants growth` refuses it in one line and loads nothing from there."""
    from lm_eval_tasks import write_task
    from tui_fixtures import growth_doc

    outside = tmp_path / "someone-elses" / "growth_100"
    outside.mkdir(parents=True)
    (outside / "tokenizer.json").write_text("{}")
    session = SessionStore().create("ev", model=str(tiny_folder))
    session.save_result("growth", growth_doc({"growth_100": str(outside)}))
    inside_but_linked = session.path / "growth_models" / "uniform_100"
    inside_but_linked.parent.mkdir()
    inside_but_linked.symlink_to(outside, target_is_directory=True)
    doc = session.load_result("growth")
    assert doc is not None
    doc["arms"]["uniform_100"]["model"] = str(inside_but_linked)
    session.save_result("growth", doc)
    monkeypatch.setattr("engine.experiments.growth.architecture.load_growth_model",
                        lambda *a, **k: pytest.fail("a model outside the session was loaded"))
    tasks = write_task(tmp_path / "tasks")
    for variant, line in (("growth", f"the growth result's growth_100 arm names {outside}, which is not inside "
                                     f"session folder {session.path}"),
                          ("uniform", "growth_models/uniform_100 is a symbolic link")):
        code = main(["run", "evaluate", "--model", str(tiny_folder), "--device", "cpu", "--session", "ev",
                     "--tasks", "everyday_sense", "--include-path", str(tasks), "--variants", variant,
                     "--gen-tokens", "0"])  # fmt: skip
        assert code == 2 and line in one_error_line(capsys, after_a_run=True)
    assert sorted(p.name for p in outside.iterdir()) == ["tokenizer.json"]


# --serve-token ---------------------------------------------------------------------------------------------
def test_serve_token_is_required():
    from aiohttp.test_utils import TestClient, TestServer

    from tui.serve import TokenServer

    server = TokenServer("true", port=8123, token=True)
    assert server.host == "localhost" and server.token in server.entry_url

    async def scenario() -> list[int]:
        client = TestClient(TestServer(await server._make_app()))
        await client.start_server()
        try:
            codes = [(await client.get("/")).status, (await client.get("/?token=wrong")).status,
                     (await client.get("/ws")).status]  # fmt: skip
            codes.append((await client.get(f"/?token={server.token}")).status)
            codes.append((await client.get("/")).status)  # the cookie the first visit set
            return codes
        finally:
            await client.close()

    assert asyncio.run(scenario()) == [403, 403, 403, 200, 200]


def test_serve_without_token_stays_open_on_localhost():
    from tui.serve import TokenServer

    server = TokenServer("true", port=8124, token=False)
    assert server.token == "" and server.entry_url == "http://localhost:8124"
