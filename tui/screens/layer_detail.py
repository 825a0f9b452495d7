"""The layer detail view as its own screen (on narrow terminals the side pane is hidden)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.state import SessionState
from tui.widgets.layer_detail import layer_detail_text


class LayerDetailScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,d,enter", "dismiss", "Close")]

    def __init__(self, state: SessionState, index: int | None) -> None:
        super().__init__()
        self.state = state
        self.index = index

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail-screen"):
            yield Static(layer_detail_text(self.state, self.index))

    def on_mount(self) -> None:
        self.set_interval(0.5, self.redraw)  # live: a running map's progress and rows, as the panels show them

    def redraw(self) -> None:
        self.query_one(Static).update(layer_detail_text(self.state, self.index))
