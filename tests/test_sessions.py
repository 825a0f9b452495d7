"""The session store: atomic writes, damaged sessions, names that cannot escape, event logs, jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import cast

import pytest

from engine.core.events import Finished, Message, Progress, Result, Started
from engine.core.process import process_identity
from engine.disk.atomic import atomic_write_json
from sessions.job_runner import run_job
from sessions.store import SessionError, SessionStore


def test_create_open_and_manifest(isolated_home):
    store = SessionStore()
    session = store.create("alpha", model="tiny", settings={"a": 1})
    manifest = json.loads((isolated_home / "alpha" / "manifest.json").read_text())
    assert manifest["schema_version"] == 1 and manifest["model"] == "tiny"
    assert manifest["settings"] == {"a": 1}
    assert "torch" in manifest["versions"] and manifest["created"] <= manifest["updated"]
    assert store.open("alpha").manifest == session.manifest
    with pytest.raises(SessionError, match="already exists"):
        store.create("alpha")


def test_default_name_is_timestamp_and_unique():
    store = SessionStore()
    a, b = store.create(), store.create()
    assert a.name != b.name and a.name[:8].isdigit()


@pytest.mark.parametrize("name", ["../x", "a/b", "/etc", "..", ".hidden", ""])
def test_names_cannot_escape(isolated_home, name):
    store = SessionStore()
    with pytest.raises(SessionError):
        store.create(name)
    assert not (isolated_home.parent / "x").exists()


def test_damaged_session_is_listed_and_others_work(isolated_home):
    store = SessionStore()
    good = store.create("good")
    good.save_result("ablation", {"ok": 1})
    bad = store.create("bad")
    (bad.path / "manifest.json").write_text('{"schema_version": 1, "name": "ba')  # truncated
    half = store.create("halfresult")
    (half.path / "results" / "ablation.json").write_text("{not json")
    infos = {info.name: info for info in store.list()}
    assert infos["good"].damaged == "" and infos["good"].results == ["ablation"]
    assert "manifest.json does not parse" in infos["bad"].damaged
    assert "damaged" in infos["halfresult"].damaged
    assert store.open("good").load_result("ablation") == {"ok": 1}
    with pytest.raises(SessionError, match="damaged"):
        store.open("bad")


def test_atomic_write_leaves_old_file_when_writer_fails(tmp_path):
    target = tmp_path / "doc.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(ValueError):
        atomic_write_json(target, {"v": float("nan")})  # not JSON: fails before the rename
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]  # no temporary left behind


def test_event_log_round_trip_and_torn_line():
    session = SessionStore().create("log")
    session.append_event(Progress(1, 3, "x", job="j"))
    session.append_event(Message("hello", job="j"))
    with open(session.events_path, "a") as handle:
        handle.write('{"v": 1, "kind": "progress", "job"')  # a write cut short by a crash
    events, offset = session.read_events()
    assert [type(e) for e in events] == [Progress, Message]
    assert cast(Progress, events[0]).done == 1 and cast(Message, events[1]).text == "hello"
    more, offset2 = session.read_events(offset)
    assert more == [] and offset2 == offset  # the torn line waits; it is never half-parsed


def test_run_job_saves_result_and_status():
    session = SessionStore().create("jobs")

    def experiment():
        yield Progress(1, 1)
        yield Result("thing", {"answer": 42})

    result = run_job(session, "thing", {"k": 1}, experiment(), job_id="job1")
    assert result is not None and result.data == {"answer": 42}
    assert session.load_result("thing") == {"answer": 42}
    assert session.jobs()["job1"]["status"] == "done"
    assert [type(e) for e in session.events()] == [Started, Progress, Result, Finished]
    assert all(e.job == "job1" for e in session.events())


def test_failed_job_is_recorded():
    session = SessionStore().create("fail")

    def experiment():
        yield Progress(0, 1)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_job(session, "x", {}, experiment(), job_id="j")
    assert session.jobs()["j"]["status"] == "failed"
    assert cast(Finished, session.events()[-1]).error == "RuntimeError: boom"


def test_job_whose_process_died_reads_interrupted():
    session = SessionStore().create("dead")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    session.write_job("j", {"status": "running", "pid": child.pid})
    session.write_job("k", {"status": "running", **process_identity()})  # this process: provably alive
    jobs = session.jobs()
    assert jobs["j"]["status"] == "interrupted"
    assert jobs["k"]["status"] == "running"
    info = SessionStore().list()[0]
    assert info.interrupted == ["j"] and info.running == ["k"]
