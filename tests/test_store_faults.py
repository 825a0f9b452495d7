"""The machine's faults on the store: a sessions folder that is a file or cannot be written, a full
disk during a run, and two runs writing one session at once.

Tests may run as root, where a read-only mode does not stop a write: a read-only folder is
simulated through `os.access` and an `OSError(EROFS)` from the writer, a full disk through a fake
byte budget on the session's writes (`FullDisk`); a sessions folder that is a regular file is real.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import engine.disk.atomic
from cli.main import main
from engine.core.errors import UserError
from engine.core.events import Finished, Progress, Result, Started
from engine.disk.atomic import append_line, mount_point
from sessions.job_runner import run_job
from sessions.store import SessionError, SessionExists, SessionStore


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error: "), err
    return err[0]


@pytest.fixture
def no_load(monkeypatch):
    """Any model load fails the test: the checks under test come before it."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("engine.models.options.ModelOptions.load", load)


# the sessions folder ------------------------------------------------------------------------------------------
COMMANDS = [
    ["run", "ablation", "--session", "s"],
    ["run", "ablation"],
    ["sessions", "list"],
    ["sessions", "show", "s"],
    ["export", "s", "OUT", "--model", "recovered"],
    [],  # the console: refused before any screen
]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_sessions_folder_that_is_a_file_is_one_line_before_the_model(argv, tmp_path, monkeypatch, capsys,
                                                                       tiny_folder, no_load):
    home = tmp_path / "sessions-file"
    home.write_text("not a folder")
    monkeypatch.setenv("ANATOMY_TUI_HOME", str(home))
    argv = [str(tmp_path / "out") if word == "OUT" else word for word in argv]
    if argv[:1] == ["run"]:
        argv += ["--model", str(tiny_folder)]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert f"sessions folder {home} is a file" in line and "ANATOMY_TUI_HOME" in line
    assert home.read_text() == "not a folder"


@pytest.fixture
def read_only(isolated_home, monkeypatch):
    """The sessions folder (it exists, with one session) cannot be written: `os.access` says so
    and a write in it fails with EROFS, as on a read-only filesystem."""
    SessionStore().create("kept", model="m")
    real_access, real_mkdir = os.access, Path.mkdir

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and Path(path).resolve() == isolated_home.resolve():
            return False
        return real_access(path, mode, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        if path.parent.resolve() == isolated_home.resolve() and not path.exists():
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    return isolated_home


@pytest.mark.parametrize("argv", [["run", "ablation", "--session", "new"], ["run", "ablation"], []], ids=" ".join)
def test_a_read_only_sessions_folder_is_one_line_before_the_model(argv, read_only, capsys, tiny_folder, no_load):
    if argv:
        argv = [*argv, "--model", str(tiny_folder)]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert f"sessions folder {read_only} is not writable" in line and "ANATOMY_TUI_HOME" in line
    assert sorted(p.name for p in read_only.iterdir()) == ["kept"]


def test_a_read_only_filesystem_is_named_when_the_session_is_made(read_only, monkeypatch):
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: True)  # the check passes; the write fails
    with pytest.raises(SessionError, match="is on a read-only filesystem") as caught:
        SessionStore().create("new")
    assert "ANATOMY_TUI_HOME" in str(caught.value)


def test_a_read_only_sessions_folder_still_lists_and_shows(read_only, capsys):
    assert main(["sessions", "list"]) == 0
    assert "kept" in capsys.readouterr().out
    assert main(["sessions", "show", "kept"]) == 0
    assert json.loads(capsys.readouterr().out)["manifest"]["model"] == "m"


# a full disk -------------------------------------------------------------------------------------------------
class FullDisk:
    """A filesystem under `root` with `free` bytes left: appends write what fits and then fail with
    ENOSPC (a torn line, as a real full disk leaves), atomic writes of more than fits fail; cutting a
    file back frees its bytes. Everything outside `root` (the temp folder) has room."""

    def __init__(self, root: Path, free: int) -> None:
        self.root, self.free = root.resolve(), free
        self.real_write_bytes = engine.disk.atomic.atomic_write_bytes

    def _inside(self, path: str | Path) -> bool:
        return Path(path).resolve().is_relative_to(self.root)

    def write(self, fd: int, data: bytes) -> int:
        if not self._inside(os.readlink(f"/proc/self/fd/{fd}")):
            return os.write(fd, data)
        if len(data) <= self.free:
            self.free -= len(data)
            return os.write(fd, data)
        if self.free:
            written, self.free = os.write(fd, data[: self.free]), 0
            return written
        raise OSError(errno.ENOSPC, "No space left on device")

    def ftruncate(self, fd: int, size: int) -> None:
        if self._inside(os.readlink(f"/proc/self/fd/{fd}")):
            self.free += os.fstat(fd).st_size - size
        os.ftruncate(fd, size)

    def __getattr__(self, name: str):
        return getattr(os, name)

    def write_bytes(self, path: Path, data: bytes, what: str = "output") -> None:
        if self._inside(path) and len(data) > self.free:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        self.real_write_bytes(path, data, what)


@pytest.fixture
def full_disk(isolated_home, tmp_path, monkeypatch):
    def fill(free: int) -> FullDisk:
        disk = FullDisk(isolated_home, free)
        monkeypatch.setattr(engine.disk.atomic, "os", disk)
        monkeypatch.setattr(engine.disk.atomic, "atomic_write_bytes", disk.write_bytes)
        return disk

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return fill


def _earlier(session) -> dict[str, bytes]:
    """What a finished earlier job left in the session, byte for byte."""
    run_job(session, "ablation", {}, [Progress(1, 1), Result("ablation", {"layers": [{"layer": 0}]})])
    return {name: (session.path / name).read_bytes() for name in ("events.jsonl", "results/ablation.json")}


def _lines(session) -> list[dict]:
    return [json.loads(line) for line in session.events_path.read_bytes().splitlines()]  # each line whole


def test_a_full_disk_keeps_the_result_elsewhere_and_leaves_whole_lines(full_disk, tmp_path):
    session = SessionStore().create("s")
    before = _earlier(session)
    big = {"layers": [{"layer": i, "values": list(range(50))} for i in range(40)]}  # ~8 kB: it does not fit
    full_disk(3000)
    with pytest.raises(UserError) as caught:
        run_job(session, "recovery", {}, [Progress(1, 2), Result("recovery", big)], job_id="j")
    line = str(caught.value)
    assert line.startswith("no space left on ") and "freed nothing" in line and "\n" not in line
    spare = Path(line.split("kept the result at ")[1])
    assert spare.is_relative_to(tmp_path / "tmp" / "anatomy-tui-unsaved") and json.loads(spare.read_text()) == big
    log = session.events_path.read_bytes()
    assert log.startswith(before["events.jsonl"]) and log.endswith(b"\n")  # nothing earlier touched, no torn line
    mine = [doc for doc in _lines(session) if doc.get("job") == "j"]
    assert [doc["kind"] for doc in mine] == [Started.kind, Progress.kind, Finished.kind]  # the Result cut back
    assert mine[-1]["status"] == "failed" and "no space left" in mine[-1]["error"]
    assert (session.path / "results/ablation.json").read_bytes() == before["results/ablation.json"]
    assert not (session.path / "results/recovery.json").exists()
    job = json.loads((session.path / "jobs/j.json").read_text())
    assert job["status"] == "failed" and "no space left" in job["error"]


def test_a_torn_append_is_cut_back(full_disk, isolated_home):
    log = isolated_home / "log.jsonl"
    isolated_home.mkdir()
    log.write_bytes(b'{"a": 1}\n')
    disk = full_disk(5)
    with pytest.raises(OSError) as caught:
        append_line(log, b'{"b": 2222222}\n')
    assert caught.value.errno == errno.ENOSPC
    assert log.read_bytes() == b'{"a": 1}\n' and disk.free == 5


def test_a_checkpoint_that_finds_the_disk_full_stops_the_run_in_one_line(isolated_home):
    session = SessionStore().create("s")

    def events():
        yield Progress(1, 3)
        raise OSError(errno.ENOSPC, "No space left on device", str(session.path / "checkpoints" / "x"))

    with pytest.raises(UserError, match="^no space left on .*checkpoints/x.*the run stopped") as caught:
        run_job(session, "recovery", {}, events(), job_id="k")
    assert json.loads((session.path / "jobs/k.json").read_text())["error"] == f"UserError: {caught.value}"
    assert _lines(session)[-1]["status"] == "failed"


@pytest.mark.slow  # a whole ablation run on the tiny model
def test_a_full_disk_at_the_end_of_a_run_is_one_line(full_disk, tiny_folder, capsys, tmp_path):
    SessionStore().create("s")
    # the log's progress lines (about 3.8 kB) and the map's checkpoint (2.2 kB at most, rewritten whole
    # after each layer) fit; the result's line in the log (3.1 kB) does not
    full_disk(6400)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--session", "s", "--eval-set", "paper",
                 "--bootstrap", "10"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err), err
    assert err[-1].startswith("anatomy-tui: error: no space left on ") and "kept the result at" in err[-1]
    assert [line for line in err if "space" in line or "could not" in line] == err[-1:], err  # said once
    spare = Path(err[-1].split("kept the result at ")[1])
    assert json.loads(spare.read_text())["layers"] and spare.is_relative_to(tmp_path / "tmp")


def test_an_export_without_room_is_refused_before_the_model_loads(tiny_folder, files, tmp_path, monkeypatch,
                                                                   capsys, no_load, isolated_home):
    monkeypatch.setattr("engine.disk.atomic.shutil.disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    assert main(["run", "prune", "--model", str(tiny_folder), "--eval-file", files[0],
                 "--remove", "1", "--export", str(tmp_path / "pruned"), "--session", "p"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("anatomy-tui: error: --export needs about ") and "MB free" in err[-1], err
    assert not (isolated_home / "p").exists()  # the failed start left nothing


def test_checkpoints_that_will_not_fit_are_refused_before_the_model_loads(tiny_folder, monkeypatch, capsys,
                                                                          no_load, isolated_home):
    from tiny_models import tiny_model

    from engine.experiments.recovery.vocabulary import RecoverySettings
    from engine.models.anatomy import LayerStack
    from engine.models.memory import plan_run

    layer = sum(w.numel() for w in LayerStack(tiny_model("llama")).matrices(1).values())
    plan = plan_run(str(tiny_folder), RecoverySettings(layers=(1, 2)), "cpu", "float32")
    assert plan.checkpoints == 2 * layer * 4  # two layers' matrices kept, float32
    monkeypatch.setattr("engine.disk.atomic.shutil.disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    assert main(["run", "recovery", "--model", str(tiny_folder), "--layers", "1,2", "--session", "r",
                 "--device", "cpu", "--dtype", "float32"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"anatomy-tui: error: recovery's checkpoints needs about {2 * layer * 4 / 1e6:.2f} MB in "
                       f"{isolated_home / 'r'} but {mount_point(isolated_home)} has 0.00 MB free; free some space "
                       "or choose a folder on "
                       "another disk"), err
    assert not (isolated_home / "r").exists()


# two runs at once ---------------------------------------------------------------------------------------------
def _create(home: str, barrier, answers) -> None:
    os.environ["ANATOMY_TUI_HOME"] = home
    barrier.wait()
    try:
        SessionStore().create("race", model=str(os.getpid()))
        answers.put("made")
    except SessionExists:
        answers.put("exists")


def test_two_runs_creating_one_session_the_first_wins(isolated_home):
    context = multiprocessing.get_context("fork")
    barrier, answers = context.Barrier(4), context.Queue()
    workers = [context.Process(target=_create, args=(str(isolated_home), barrier, answers)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert sorted(answers.get(timeout=5) for _ in workers) == ["exists", "exists", "exists", "made"]
    assert sorted(p.name for p in isolated_home.iterdir()) == ["race"]  # no staging folder left
    assert SessionStore().open("race").manifest["model"]  # whole: one run's manifest


def test_the_session_is_made_before_the_model_loads_and_removed_when_the_start_fails(tiny_folder, monkeypatch,
                                                                                   capsys, isolated_home):
    seen = []

    def load(*args, **kwargs):
        seen.append(SessionStore().open("new").manifest["model"])
        raise UserError("the load failed")

    monkeypatch.setattr("engine.models.options.ModelOptions.load", load)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--session", "new"]) == 2
    assert seen == [str(tiny_folder)] and not (isolated_home / "new").exists()
    assert "the load failed" in capsys.readouterr().err


def test_a_failed_start_leaves_a_session_another_run_wrote_to(tiny_folder, monkeypatch, isolated_home):
    def load(*args, **kwargs):  # meanwhile another run that joined the session logs its start
        session = SessionStore().open("shared")
        run_job(session, "ablation", {}, [Progress(1, 1)])
        raise UserError("the load failed")

    monkeypatch.setattr("engine.models.options.ModelOptions.load", load)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--session", "shared"]) == 2
    assert [doc["kind"] for doc in _lines(SessionStore().open("shared"))][0] == Started.kind


WRITERS, ROUNDS = 4, 100


def _write(home: str, writer: int, barrier) -> None:
    os.environ["ANATOMY_TUI_HOME"] = home
    session = SessionStore().open("busy")
    barrier.wait()
    for i in range(ROUNDS):
        session.append_event(Progress(i, ROUNDS, label=f"w{writer}-{i}" + "x" * (i * 37 % 3000)))
        session.update_manifest(**{f"writer{writer}": i})
        if i % 10 == 0:
            session.save_result("shared", {"writer": writer, "i": i, "pad": "y" * 5000})
            session.write_job(f"job{writer}", {"id": f"job{writer}", "status": "running", "i": i})


def test_several_processes_writing_one_session_keep_it_valid(isolated_home):
    SessionStore().create("busy")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(WRITERS)
    workers = [context.Process(target=_write, args=(str(isolated_home), w, barrier)) for w in range(WRITERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    session = SessionStore().open("busy")
    labels = [doc["label"].split("x")[0] for doc in _lines(session)]  # every line parses
    assert sorted(labels) == sorted(f"w{w}-{i}" for w in range(WRITERS) for i in range(ROUNDS))  # each once
    manifest = json.loads((isolated_home / "busy" / "manifest.json").read_text())
    assert {f"writer{w}": manifest[f"writer{w}"] for w in range(WRITERS)} == {
        f"writer{w}": ROUNDS - 1 for w in range(WRITERS)}  # no update lost
    shared = session.load_result("shared")
    assert shared is not None and shared["pad"] == "y" * 5000
    assert sorted(session.jobs()) == [f"job{w}" for w in range(WRITERS)] and not session.check()
    assert sorted(p.name for p in (isolated_home / "busy").iterdir()) == ["events.jsonl", "jobs", "manifest.json",
                                                                         "results"]


# staging folders of an export killed half way ------------------------------------------------------------------
def test_an_export_removes_the_staging_folders_a_killed_export_left(tokenizer, tmp_path):
    from tiny_models import tiny_model

    from engine.export.folder import EXPORT_STAGING, export_recovered
    from engine.models.anatomy import LayerStack
    from engine.models.gguf_cache import STAGING_OWNER

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = tmp_path / f"{EXPORT_STAGING}old.abc"  # an export killed (kill -9) while writing its weights
    (killed / "model").mkdir(parents=True)
    (killed / STAGING_OWNER).write_text(dead.stdout.strip())
    (killed / "model" / "model.safetensors").write_bytes(b"0" * 1000)
    running = tmp_path / f"{EXPORT_STAGING}other.def"  # another export writing right now
    running.mkdir()
    (running / STAGING_OWNER).write_text(str(os.getpid()))
    users = tmp_path / ".config"  # a hidden folder of the user's, old and with no owner: never touched
    users.mkdir()
    os.utime(users, (0, 0))
    model = tiny_model("llama")
    layers = {1: {name: w.detach() for name, w in LayerStack(model).matrices(1).items()}}
    folder = export_recovered(model, tokenizer, layers, tmp_path / "new", model_name="tiny")
    assert (folder / "config.json").exists() and not killed.exists() and running.exists() and users.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, ".config", "new"])  # none of its own


@pytest.mark.slow  # a whole ablation run on the tiny model
def test_a_run_that_loses_the_race_for_a_new_session_joins_it(tiny_folder, monkeypatch, capsys):
    other = SessionStore().create("both", model="the other run")  # made just after this run looked
    looked = []

    def exists(store, name):
        looked.append(name)
        return len(looked) > 1  # the first look, before the other run made it: not there yet

    monkeypatch.setattr(SessionStore, "exists", exists)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--session", "both", "--eval-set", "paper",
                 "--bootstrap", "10"]) == 0  # fmt: skip
    assert "session both was just made by another run; this run adds to it" in capsys.readouterr().err
    joined = SessionStore().open("both")
    assert joined.path == other.path and joined.manifest["model"] == "the other run"
    joined_map = joined.load_result("ablation")
    assert joined_map is not None and joined_map["layers"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_console_given_a_sessions_folder_that_is_a_file_exits_with_its_line(tmp_path, monkeypatch, capsys):
    from tui.app import AnatomyApp

    home = tmp_path / "sessions-file"
    home.write_text("")
    monkeypatch.setenv("ANATOMY_TUI_HOME", str(home))
    app = AnatomyApp(load_model=False)  # past the launch's check (the folder became a file since)
    async with app.run_test() as pilot:
        await pilot.pause()
    assert app.return_code == 2 and not capsys.readouterr().err  # no traceback; cli/launch.py prints the line
    assert app.exit_line.startswith(f"anatomy-tui: error: sessions folder {home} is a file")


def test_an_export_without_room_is_one_line_and_leaves_nothing(tokenizer, tmp_path, monkeypatch):
    from tiny_models import tiny_model

    from engine.export.folder import export_recovered
    from engine.models.anatomy import LayerStack

    model = tiny_model("llama")
    layers = {1: {name: w.detach() for name, w in LayerStack(model).matrices(1).items()}}
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    usage = type("Usage", (), {"free": size - 1})()
    with monkeypatch.context() as patch:
        patch.setattr("engine.disk.atomic.shutil.disk_usage", lambda path: usage)
        with pytest.raises(UserError, match=f"^the export needs about {size / 1e6:.2f} MB in {tmp_path} but "):
            export_recovered(model, tokenizer, layers, tmp_path / "a", model_name="tiny")

    def full(*args, **kwargs):  # the disk fills while the weights are written
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "b" / "model.safetensors"))

    monkeypatch.setattr(type(model), "save_pretrained", full)
    with pytest.raises(UserError, match="^no space left on .*freed nothing, removed the half-written export$"):
        export_recovered(model, tokenizer, layers, tmp_path / "b", model_name="tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no export, no staging folder
