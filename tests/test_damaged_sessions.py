"""One damaged session never stops the store (issue 40): a file nested 2,000 levels deep or too large
is "damaged: REASON" for its session or its line alone; a closed pipe ends a command quietly; a
name with control characters is refused where it comes in, and shown escaped where a forged file
has it; a session's text reaches the log pane and log files escaped."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from typing import cast

import pytest
from tui_fixtures import demo_session, write_events

from cli.main import main
from engine.core.events import Message
from engine.core.untrusted import DamagedJSON, loads
from sessions.store import SessionError, SessionStore

DEEP = "[" * 2000 + "]" * 2000  # 4 KB: json's decoder recurses, and 2,000 levels is a RecursionError
DEEP_REASON = "nested deeper than 100 levels"


def good_and_bad(part: str) -> SessionStore:
    """A store with the session 'good' and the session 'bad', whose `part` is damaged."""
    store = SessionStore()
    demo_session(store, "good")
    bad = demo_session(store, "bad")
    if part == "manifest":
        (bad.path / "manifest.json").write_text(DEEP)
    elif part == "huge manifest":
        (bad.path / "manifest.json").write_text(json.dumps({**bad.manifest, "pad": "x" * (2 << 20)}))
    elif part == "job":
        (bad.path / "jobs").mkdir()
        (bad.path / "jobs" / "a.json").write_text(DEEP)
    elif part == "result":
        (bad.results_dir / "ablation.json").write_text(DEEP)
    elif part == "huge result":
        with open(bad.results_dir / "ablation.json", "wb") as handle:
            handle.truncate(65 << 20)  # sparse: 65 MiB read as 64 MiB and a byte at most, never parsed
    return store


@pytest.mark.parametrize(("part", "reason"), [
    ("manifest", DEEP_REASON), ("huge manifest", "larger than 1 MiB"), ("job", DEEP_REASON),
    ("result", DEEP_REASON), ("huge result", "larger than 64 MiB"),
])
def test_sessions_list_lists_every_session_and_the_damaged_one_as_damaged(part, reason, capsys):
    good_and_bad(part)
    assert main(["sessions", "list"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert "Traceback" not in out.err and len(lines) == 2
    good = next(line for line in lines if line.startswith("good "))
    bad = next(line for line in lines if line.startswith("bad "))
    assert "damaged" not in good.lower() and "results: ablation" in good
    assert "damaged" in bad.lower() and reason in bad


def test_sessions_show_of_a_session_whose_manifest_is_too_deep_is_one_line(capsys):
    good_and_bad("manifest")
    assert main(["sessions", "show", "bad"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith("anatomy-tui: error: session 'bad' is damaged")
    assert DEEP_REASON in out.err


@pytest.mark.parametrize("part", ["job", "result"])
def test_sessions_show_of_a_session_with_a_deep_part_shows_the_rest_and_the_damage(part, capsys):
    good_and_bad(part)
    assert main(["sessions", "show", "bad"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["damage"]) == 1 and DEEP_REASON in shown["damage"][0]
    assert shown["results"] == ([] if part == "result" else ["ablation"])


def test_the_notebook_api_reads_the_events_around_a_deep_line():
    import anatomy_tui

    session = SessionStore().create("log")
    write_events(session, [Message("before")])
    with open(session.events_path, "a") as handle:
        handle.write('{"v": 2, "kind": "job.message", "text": ' + DEEP + "}\n")
    write_events(session, [Message("after")])
    events = cast(list[Message], anatomy_tui.open_session("log").events())  # the log's two messages
    assert [event.text for event in events] == ["before", "after"]


def test_the_console_reads_past_an_event_line_larger_than_any_event_without_keeping_it():
    session = SessionStore().create("long")
    write_events(session, [Message("before")])
    with open(session.events_path, "ab") as handle:
        handle.write(b'{"text": "' + b"x" * (65 << 20) + b'"}\n')
    write_events(session, [Message("after")])
    offset, reads = 0, []
    for _ in range(3):  # as the console polls: 4 MiB a read
        data, offset = session.read_event_bytes(offset, 4 << 20)
        reads.append(len(data))
    assert offset == session.events_path.stat().st_size  # the line before, the long one, the line after
    assert reads[1] == 0 and max(reads) < 1 << 10  # the 65 MiB line was never returned
    assert [cast(Message, event).text for event in session.events()] == ["before", "after"]


def test_the_event_index_skips_a_deep_line_and_refuses_a_deep_index():
    from tui import event_index

    session = SessionStore().create("indexed")
    good = json.dumps(Message("kept").to_json()).encode() + b"\n"
    deep = DEEP.encode() + b"\n"
    lines = list(event_index.parsed(good + deep + good, 100))
    assert [(span, cast(Message, event).text) for span, event in lines] == [
        ((100, 100 + len(good)), "kept"), ((100 + len(good) + len(deep), 100 + 2 * len(good) + len(deep)), "kept")]
    (session.path / "events.index.json").write_text(DEEP)
    assert event_index.load(session) is None  # the whole log is folded instead


def test_the_picker_lists_a_deep_session_as_damaged_and_opens_the_good_one(isolated_home):
    from textual.widgets import DataTable

    from tui.app import AnatomyApp
    from tui.screens.picker import SessionPicker

    good_and_bad("manifest")

    async def scenario() -> tuple[list[str], str | None, str]:
        app = AnatomyApp(load_model=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            table = app.screen.query_one("DataTable", DataTable)
            rows = {str(table.get_row_at(i)[0]): [str(cell) for cell in table.get_row_at(i)]
                    for i in range(table.row_count)}
            names = [info.name for info in cast(SessionPicker, app.screen).infos]
            table.move_cursor(row=names.index("good"))
            await pilot.press("enter")
            await pilot.pause()
            return names, app.session_name, " ".join(rows["bad"])

    names, opened, bad_row = asyncio.run(scenario())
    assert sorted(names) == ["bad", "good"] and opened == "good"
    assert "DAMAGED" in bad_row and "manifest.json does not parse" in bad_row


def test_the_picker_shows_a_forged_model_name_as_text_not_markup(isolated_home):
    from textual.widgets import DataTable

    from tui.app import AnatomyApp

    store = SessionStore()
    forged = demo_session(store, "forged")
    (forged.path / "manifest.json").write_text(json.dumps({**forged.manifest, "model": "[/][link=https://x]m"}))

    async def scenario() -> tuple[str, bool]:
        app = AnatomyApp(load_model=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            row = [str(cell) for cell in app.screen.query_one("DataTable", DataTable).get_row_at(0)]
            return row[1], app.is_running

    model, running = asyncio.run(scenario())
    assert model == "[/][link=https://x]m" and running  # "[/]" as markup would be a MarkupError


def test_a_new_session_name_with_control_characters_is_refused_in_the_picker(isolated_home):
    from textual.widgets import Input

    from tui.app import AnatomyApp
    from tui.screens.picker import SessionPicker

    demo_session(SessionStore())

    async def scenario() -> tuple[bool, str, list[str]]:
        app = AnatomyApp(load_model=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            await pilot.press("n")
            app.screen.query_one("#new-name", Input).value = "new\x1b[2J"  # pasted
            await pilot.press("enter")
            await pilot.pause()
            return isinstance(app.screen, SessionPicker), app.session_name, [str(n.message) for n in app._notifications]

    still_picking, opened, messages = asyncio.run(scenario())
    assert still_picking and not opened and [info.name for info in SessionStore().list()] == ["demo"]
    assert len(messages) == 1 and "bad name" in messages[0] and "\x1b" not in messages[0]


def test_a_closed_pipe_ends_sessions_show_quietly():
    store = SessionStore()
    session = store.create("big")
    session.update_manifest(settings={f"k{n}": "v" * 40 for n in range(10_000)})  # 600 KB: more than a pipe holds
    done = subprocess.run(["bash", "-c", f"{sys.executable} -m cli.main sessions show big | head -1; "
                           "echo ${PIPESTATUS[0]} >&2"], capture_output=True, text=True, env=os.environ)
    assert done.stdout == "{\n"
    assert done.stderr == "141\n"  # no traceback, no "Exception ignored": the exit status alone


def test_output_into_a_pipe_with_no_reader_exits_141_saying_nothing():
    demo_session(SessionStore(), "s")
    child = subprocess.Popen([sys.executable, "-m", "cli.main", "sessions", "list"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None  # both PIPE
    child.stdout.close()  # the reader is gone before the command writes a byte
    assert child.wait(timeout=60) == 141
    assert child.stderr.read() == b""


@pytest.mark.parametrize("name", ["smollm2\n```", "\n```", "\x1b[2J", "m\u202eodel"])
def test_a_model_name_with_control_characters_is_refused_in_one_line(name, capsys):
    assert main(["run", "ablation", "--model", name, "--session", "s"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\u202e" not in err
    assert err.startswith("anatomy-tui: error: --model ") and "without control characters" in err
    assert not SessionStore().exists("s")


@pytest.mark.parametrize("name", ["\n```", "\x1b[2J"])
def test_the_api_refuses_a_model_name_with_control_characters(name):
    import anatomy_tui

    with pytest.raises(anatomy_tui.InputError, match="without control characters") as raised:
        anatomy_tui.load_model(name)
    assert "\n" not in str(raised.value) and "\x1b" not in str(raised.value)


def test_a_forged_manifest_model_name_is_damage_shown_escaped(capsys):
    store = SessionStore()
    forged = store.create("forged")
    (forged.path / "manifest.json").write_text(json.dumps({**forged.manifest, "model": "m\x1b[2J\n```"}))
    assert main(["sessions", "list"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.count("\n") == 1
    assert "forged" in out and "DAMAGED" in out and "control characters" in out
    with pytest.raises(SessionError, match="control character"):
        store.create("other", model="a\x1b[2J")


def test_a_log_file_line_of_session_text_stays_one_escaped_line(tmp_path):
    from tui.logging_setup import log_to_file

    path = tmp_path / "app.log"
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        log_to_file(path)
        logging.getLogger("test").warning("job failed: %s", "boom\n2026-01-01 ERROR forged\x1b[2J")
    finally:
        for handler in root.handlers[len(handlers):]:
            root.removeHandler(handler)
            handler.close()
    text = path.read_text()
    assert text.count("\n") == 1 and "\x1b" not in text
    assert text.endswith("job failed: boom\\n2026-01-01 ERROR forged\\x1b[2J\n")


@pytest.mark.anyio
async def test_the_log_pane_shows_a_sessions_markup_and_escapes_as_text(isolated_home):
    from tui.app import AnatomyApp
    from tui.screens.console import ConsoleScreen

    session = demo_session(SessionStore())
    write_events(session, [Message("[link=https://x]click[/] \x1b[2J", job="r")])
    app = AnatomyApp(session="demo", load_model=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f7")  # the Log tab, whose view renders once shown
        view = cast(ConsoleScreen, app.screen).log_view()

        async def written() -> None:
            while not view.lines:
                await pilot.pause(0.05)

        await asyncio.wait_for(written(), timeout=10)
        assert view.lines[-1].text == "[info] r: [link=https://x]click[/] \\x1b[2J"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(("data", "reason"), [
    (DEEP, DEEP_REASON),
    ('{"a": "' + "[" * 5000 + '"}', None),  # brackets in a string are no nesting
    ("[" * 101 + "]" * 101, DEEP_REASON), ("[" * 100 + "]" * 100, None),
    (b"\xff", "not JSON"), ("x" * 65, "larger than 64 bytes"),
])
def test_loads_bounds_depth_and_size_before_parsing(data, reason):
    if reason is None:
        assert loads(data) is not None
        return
    with pytest.raises(DamagedJSON, match=reason):
        loads(data, limit=64 if reason.startswith("larger") else 1 << 20)
