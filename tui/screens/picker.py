"""The session picker shown on start: every session with its model, date, contents and jobs."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from engine.core.untrusted import printable
from sessions.store import SessionError, SessionInfo, SessionStore


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else "-"


def _jobs(info: SessionInfo) -> str:
    parts = []
    if info.running:
        parts.append(f"running: {len(info.running)}")
    if info.interrupted:
        parts.append(f"interrupted: {len(info.interrupted)}")
    return ", ".join(parts) or "-"


class SessionPicker(Screen[str]):
    """Dismisses with the chosen (or newly named) session; a damaged session cannot be opened."""

    BINDINGS = [
        Binding("enter", "open", "Open", priority=False),
        Binding("n", "new", "New session"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, store: SessionStore, current: str | None = None) -> None:
        super().__init__()
        self.store = store
        self.current = current  # the session the console had open last: the cursor starts there
        self.infos: list[SessionInfo] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Static("Sessions: Enter opens, n starts a new one, q quits", id="picker-title")
            yield Static(f"in {self.store.home}", id="picker-home", classes="dim")
            yield DataTable(id="sessions", cursor_type="row")
            yield Input(placeholder="new session name (Enter; empty for a timestamp)", id="new-name")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#sessions", DataTable)
        table.add_columns("session", "model", "updated", "results", "jobs")
        self.infos = self.store.list()
        for info in self.infos:  # cells as Text: a forged file's text is never markup (nor a control character)
            if not info.openable:
                table.add_row(Text(printable(info.name)), "DAMAGED", "", Text(printable(info.damaged)[:60]), "",
                              key=info.name)
            else:
                table.add_row(
                    Text(info.name),
                    Text(info.model[-28:]),
                    _when(info.updated),
                    ",".join(info.results) or "-",
                    f"{_jobs(info)} (damaged parts)" if info.damaged else _jobs(info),
                    key=info.name,
                )
        self.query_one("#new-name", Input).display = not self.infos
        if self.infos:
            table.focus()
            names = [info.name for info in self.infos]
            if self.current in names:
                table.move_cursor(row=names.index(self.current), animate=False)
        else:
            self.query_one("#new-name", Input).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self._choose(str(event.row_key.value))

    def action_open(self) -> None:
        table = self.query_one("#sessions", DataTable)
        if table.row_count:
            self._choose(str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value))

    def _choose(self, name: str) -> None:
        info = next((i for i in self.infos if i.name == name), None)
        if info is not None and not info.openable:
            self.notify(printable(info.damaged), severity="error", title="damaged session", markup=False)
            return
        self.dismiss(name)

    def action_new(self) -> None:
        field = self.query_one("#new-name", Input)
        field.display = True
        field.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        name = event.value.strip() or time.strftime("%Y%m%d-%H%M%S")
        try:
            exists = self.store.exists(name)
        except SessionError as exc:  # a bad name (a space, a slash, a control character pasted): say so, stay
            self.notify(printable(str(exc)), severity="error", title="bad session name", markup=False)
            return
        if exists:
            self.notify(f"session {name!r} exists: opening it")
        self.dismiss(name)
