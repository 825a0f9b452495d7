"""The one reader of a session's documents (sessions/documents.py): the manifest, a job record, an
event line and every result come back as their dataclasses, and one that does not fit is one line
naming the file and the field; the consumers receive the dataclass, never the dict."""

from __future__ import annotations

import json
from typing import cast

import pytest

from engine import registry
from engine.core.codec import json_safe
from engine.core.events import Message, ResultDocument
from sessions.documents import Damaged, JobRecord, Manifest, read_event
from sessions.store import SessionError, SessionStore

SAMPLES = [pytest.param(entry, id=entry.name) for entry in registry.EXPERIMENTS]


def _one_line(text: str, *parts: str) -> None:
    assert "\n" not in text and all(part in text for part in parts), text


@pytest.mark.parametrize("change, field", [({"created": "yesterday"}, "'created'"), ({"model": ["m"]}, "'model'"),
                                           ({"settings": None}, "'settings'")])
def test_a_manifest_field_of_the_wrong_type_is_one_line_naming_file_and_field(change, field):
    store = SessionStore()
    session = store.create("s", model="m")
    written = json.loads((session.path / "manifest.json").read_text())
    (session.path / "manifest.json").write_text(json.dumps(written | change))
    with pytest.raises(SessionError) as info:
        store.open("s")
    _one_line(str(info.value), "manifest.json", field)


def test_a_manifest_missing_its_schema_version_names_the_field():
    store = SessionStore()
    session = store.create("s")
    written = json.loads((session.path / "manifest.json").read_text())
    del written["schema_version"]
    (session.path / "manifest.json").write_text(json.dumps(written))
    with pytest.raises(SessionError) as info:
        store.open("s")
    _one_line(str(info.value), "manifest.json", "'schema_version' is missing")


def test_the_manifest_reads_back_as_its_dataclass():
    session = SessionStore().create("s", model="tiny", settings={"atlas": {"models": ["a"]}})
    header = SessionStore().open("s").header
    assert isinstance(header, Manifest) and header.model == "tiny" and header.name == "s"
    assert header.settings == {"atlas": {"models": ["a"]}} and session.is_atlas


@pytest.mark.parametrize("doc, field", [({"experiment": "ablation"}, "'status' is missing"),
                                        ({"status": "done", "started": "noon"}, "'started'"),
                                        ({"status": "done", "cmdline": [1, 2]}, "'cmdline'"),
                                        ({"status": "done", "pid": None}, "'pid'")])
def test_a_job_record_that_does_not_fit_is_one_line_naming_file_and_field(doc, field):
    session = SessionStore().create("s")
    session.write_job("broken", doc)
    session.write_job("fine", {"status": "done", "experiment": "ablation", "started": 2.0})
    records = session.job_records()
    assert list(records) == ["fine"] and isinstance(records["fine"], JobRecord)
    assert records["fine"].experiment == "ablation" and records["fine"].started == 2.0
    assert len(session.damage) == 1
    _one_line(session.damage[0], "jobs/broken.json", field)


@pytest.mark.parametrize("line, field", [({"v": 2, "kind": "job.message", "t": 1.0, "job": "j"}, "'text' is missing"),
                                         ({"v": 2, "kind": "job.message", "text": ["x"], "job": "j"}, "'text'"),
                                         ({"v": 2, "text": "x"}, "'kind' is missing")])
def test_an_event_line_that_does_not_fit_is_one_line_naming_the_line_and_the_field(line, field):
    with pytest.raises(Damaged) as info:
        read_event(json.dumps(line), "events.jsonl at byte 0")
    _one_line(str(info.value), "events.jsonl at byte 0", field)


def test_the_event_log_reads_back_as_event_classes_and_skips_a_damaged_line(caplog):
    session = SessionStore().create("s")
    session.append_event(Message(text="hello", job="j"))
    with open(session.events_path, "a") as log:
        log.write(json.dumps({"v": 2, "kind": "job.message", "text": 3}) + "\n")
    events, _ = session.read_events()
    assert [type(e) for e in events] == [Message] and cast(Message, events[0]).text == "hello"
    warned = [r.getMessage() for r in caplog.records if "skipped an event" in r.getMessage()]
    assert len(warned) == 1
    _one_line(warned[0], "events.jsonl at byte", "'text'")


@pytest.mark.parametrize("entry", SAMPLES)
def test_every_result_reads_back_as_its_dataclass(entry):
    sample = entry.sample()
    session = SessionStore().create("s")
    session.save_result(entry.writes, json_safe(sample))
    read = session.result(entry.writes)
    assert type(read) is entry.result_class and read == sample
    assert session.typed_results() == {entry.writes: sample}


@pytest.mark.parametrize("entry", SAMPLES)
def test_a_result_missing_a_field_or_of_the_wrong_type_is_one_line_naming_file_and_field(entry):
    doc = json_safe(entry.sample())
    first = next(iter(doc))
    session = SessionStore().create("s")
    session.save_result(entry.writes, {k: v for k, v in doc.items() if k != first})
    with pytest.raises(Damaged) as info:
        session.result(entry.writes)
    _one_line(str(info.value), f"{entry.writes}.json", f"{first!r} is missing")
    wrong = [{"not": "this"}] if not isinstance(doc[first], list) else "not a list"
    session.save_result(entry.writes, doc | {first: wrong})
    with pytest.raises(Damaged) as info:
        session.result(entry.writes)
    _one_line(str(info.value), f"{entry.writes}.json", repr(first))
    assert session.typed_results() == {} and len(session.damage) == 1


@pytest.mark.parametrize("entry", SAMPLES)
def test_the_report_receives_each_result_as_its_dataclass(entry):
    from cli.commands.report import entries

    sample = entry.sample()
    session = SessionStore().create("s", model="tiny")
    session.save_result(entry.writes, json_safe(sample))
    found, notes = entries(SessionStore().open("s"))
    assert notes == [] and [e.name for e in found] == [entry.writes]
    assert type(found[0].result) is entry.result_class and found[0].result == sample


@pytest.mark.parametrize("entry", SAMPLES)
def test_the_console_state_receives_each_result_as_its_dataclass(entry):
    from tui.state import SessionState

    sample = entry.sample()
    state = SessionState()
    assert state.set_result(entry.writes, json_safe(sample)) == ""
    result_class: type[ResultDocument] = entry.result_class
    assert type(state.typed[entry.writes]) is result_class and state.typed[entry.writes] == sample
    assert state.result(result_class) == sample


def test_the_console_state_follows_job_records():
    from tui.state import SessionState

    state = SessionState()
    state.apply(Message(text="x", job="ablation-1"))
    state.mark_job("ablation-1", "running")
    state.follow_job_files({"ablation-1": JobRecord(status="done", experiment="ablation", pid=4242)})
    assert state.jobs["ablation-1"].status == "done" and state.jobs["ablation-1"].pid == 4242
    assert state.jobs["ablation-1"].experiment == "ablation"


@pytest.mark.parametrize("entry", SAMPLES)
def test_the_api_receives_each_result_as_its_dataclass(entry):
    from anatomy_tui import open_session

    sample = entry.sample()
    stored = SessionStore().create("s", model="tiny")
    stored.save_result(entry.writes, json_safe(sample))
    stored.write_job("j", {"status": "done", "experiment": entry.name, "started": 1.0})
    session = open_session("s")
    read = session.results[entry.writes]
    assert type(read.result) is entry.result_class and read.result == sample and read.experiment == entry.name
    assert session.jobs == {"j": JobRecord(status="done", experiment=entry.name, started=1.0)}
    assert session.model == "tiny" and session.damage == []


def test_the_api_leaves_out_a_result_that_does_not_fit_naming_file_and_field():
    from anatomy_tui import open_session

    doc = json_safe(registry.BY_NAME["ablation"].sample())
    doc["layers"][0]["ppl"] = "high"
    SessionStore().create("s").save_result("ablation", doc)
    session = open_session("s")
    assert session.results == {} and len(session.damage) == 1
    _one_line(session.damage[0], "results/ablation.json", "'layers.ppl'")
