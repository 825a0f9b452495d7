"""The help screen: every key of the console and what it does, built from the bindings themselves."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

ABOUT = (
    "Every action is also in the command palette (ctrl+p). Long jobs run as their own process and keep "
    "running when the console closes; reopen the session to follow them again. Logs: app.log in the session."
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,f1,h", "dismiss", "Close")]

    def __init__(self, bindings: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = bindings

    def compose(self) -> ComposeResult:
        table = Table(title="anatomy-tui keys", expand=True)
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("action")
        for key, description in self.keys:
            table.add_row(key, description)
        with VerticalScroll(id="help"):
            yield Static(table)
            yield Static(ABOUT, id="help-about")
