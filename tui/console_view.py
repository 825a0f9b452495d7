"""Where the console was, so it comes back there: the session it had open (in the sessions folder,
`.console.json`: the console's own, which a headless `anatomy-tui run --session S` never writes) and,
in each session, its selected layer, tab, forms and the layers and blocks marked for the prompt pane's
modified model (tui/marks.py) (`<session>/console.json`, tui/session_files.py CONSOLE_VIEW).
Both are written atomically and, like every file there, read as untrusted: JSON only, each field
checked, anything else left at its default (and logged)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.disk.atomic import atomic_write_json, read_json
from sessions.store import Session, SessionError, SessionStore
from tui.marks import NO_MARKS, Marks
from tui.session_files import CONSOLE_VIEW

log = logging.getLogger("anatomy_tui.console")

FORMAT = "anatomy-tui console view 1"
LAST_SESSION = ".console.json"  # in the sessions folder: the session the console had open last
MAX_BYTES = 64 << 10  # a larger file is not one the console wrote
MAX_FIELD = 4000  # characters of a form's value at most


@dataclass(frozen=True)
class ConsoleView:
    """The selected layer (None: none yet), the tab in view, each form field's text by its id and
    the marks of the modified model."""

    layer: int | None = None
    tab: str = "layers"
    forms: dict[str, str] = field(default_factory=dict)
    marks: Marks = NO_MARKS

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "layer": self.layer, "tab": self.tab, "forms": dict(self.forms),
                "marks": self.marks.to_json()}


def _read(path: Path) -> Any:
    """The JSON document at `path`, never through a link; None when there is none; ValueError when
    it is not one this version could have written."""
    if not path.exists():
        return None
    doc = read_json(path, limit=MAX_BYTES)  # too large or deeply nested: a ValueError (engine.core.untrusted)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT!r} document")
    return doc


def load(session: Session) -> ConsoleView:
    """The session's saved view; the default view when there is none or it does not check."""
    try:
        doc = _read(session.part(CONSOLE_VIEW))
    except (OSError, ValueError, SessionError, UserError) as exc:
        log.info("console view of %s not used (%s)", session.name, exc)
        return ConsoleView()
    if doc is None:
        return ConsoleView()
    layer, tab, forms = doc.get("layer"), doc.get("tab"), doc.get("forms")
    return ConsoleView(
        layer=layer if type(layer) is int and layer >= 0 else None,
        tab=tab if isinstance(tab, str) and tab.isidentifier() else "layers",
        forms={key: value for key, value in forms.items()
               if isinstance(key, str) and isinstance(value, str) and len(value) <= MAX_FIELD}
        if isinstance(forms, dict) else {},
        marks=_marks(doc.get("marks"), session.name),
    )  # fmt: skip


def _marks(doc: Any, session: str) -> Marks:
    """The saved marks; none when there are none or they do not check (logged)."""
    if doc is None:
        return Marks()
    try:
        return Marks.from_json(doc)
    except ValueError as exc:
        log.info("marks of %s not used (%s)", session, exc)
        return Marks()


def save(session: Session, view: ConsoleView) -> None:
    """Writes the session's view (a session that cannot be written keeps none: logged)."""
    try:
        atomic_write_json(session.part(CONSOLE_VIEW), view.to_json(), "console view")
    except (OSError, SessionError, UserError) as exc:
        log.info("console view of %s not written (%s)", session.name, exc)


def last_session(store: SessionStore) -> str | None:
    """The session the console had open last, while it still exists; None otherwise."""
    try:
        doc = _read(store.home / LAST_SESSION)
        name = doc.get("session") if doc is not None else None
        return name if isinstance(name, str) and store.exists(name) else None
    except (OSError, ValueError, SessionError, UserError) as exc:
        log.info("the console's last session not used (%s)", exc)
        return None


def remember_session(store: SessionStore, name: str) -> None:
    """Notes `name` as the session the console has open (the next start and the picker offer it)."""
    try:
        atomic_write_json(store.home / LAST_SESSION, {"format": FORMAT, "session": name}, "console's last session")
    except (OSError, UserError) as exc:
        log.info("the console's last session not written (%s)", exc)
