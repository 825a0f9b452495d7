"""The console's parts of a session are named in tui/session_files.py, not in the engine's layout;
the store, which names none of them, still refuses a session with any of them linked (a link
anywhere in the session folder)."""

from __future__ import annotations

import pytest

from engine.disk import session_layout
from sessions.store import SessionError, SessionStore
from tui import session_files

CONSOLE_PARTS = (session_files.EVENT_INDEX, session_files.APP_LOG, session_files.CONSOLE_VIEW, session_files.FIGURES)


def test_the_engine_layout_names_no_part_of_the_console():
    shared = {value for name, value in vars(session_layout).items() if name.isupper() and isinstance(value, str)}
    assert shared.isdisjoint(CONSOLE_PARTS)
    assert CONSOLE_PARTS == ("events.index.json", "app.log", "console.json", "figures")  # as sessions have them


@pytest.mark.parametrize("part", [*CONSOLE_PARTS, "notes"])
def test_a_session_with_a_linked_entry_does_not_open(isolated_home, tmp_path, part):
    session = SessionStore().create("s", model="tiny")
    (session.path / part).symlink_to(tmp_path)
    with pytest.raises(SessionError, match=f"session 's' is refused: {part} is a symbolic link"):
        SessionStore().open("s")
