"""The Compare view: an atlas, or the console's session beside the others of the store, on relative
depth. One criterion at a time as curves (n / p: the next or previous criterion), under it the
class bands, the depths critical or redundant in every model and the criteria's agreement, as
`anatomy-tui compare` prints them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from engine.atlas import table as A
from tui.views.atlas import report_lines, short_names
from tui.widgets.depth_profiles import DepthProfiles


class CompareScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        Binding("n,right", "turn(1)", "Next criterion"),
        Binding("p,left", "turn(-1)", "Previous criterion"),
    ]
    DEFAULT_CSS = """
    CompareScreen { background: $background; }
    #compare-title { height: 1; padding: 0 1; background: $panel; }
    #compare-plot { height: 2fr; min-height: 8; }
    #compare-text { height: 1fr; padding: 0 1; }
    """

    def __init__(self, doc: A.AtlasDocument) -> None:
        super().__init__()
        self.doc = doc
        self.criteria = A.criteria_of(doc.rows)
        self.index = 0
        self.names = short_names(doc.models)

    def compose(self) -> ComposeResult:
        yield Static(id="compare-title")
        yield DepthProfiles(id="compare-plot")
        with VerticalScroll(id="compare-text"):
            yield Static(self._text(), id="compare-report", markup=False)

    def on_mount(self) -> None:
        self._redraw()

    def action_turn(self, step: int) -> None:
        if self.criteria:
            self.index = (self.index + step) % len(self.criteria)
            self._redraw()

    def _redraw(self) -> None:
        title = self.query_one("#compare-title", Static)
        if not self.criteria:
            title.update(f"Compare {self.doc.name}: no per-layer values  (escape: close)")
            return
        criterion = self.criteria[self.index]
        title.update(f"Compare {self.doc.name} · {criterion} ({self.index + 1}/{len(self.criteria)})  "
                     "n/p: criterion  escape: close")
        self.query_one(DepthProfiles).show(self.doc, criterion, self.names)

    def _text(self) -> str:
        lines = report_lines(self.doc)
        start = next((i for i, line in enumerate(lines) if line.startswith("class bands")), 0)
        return "\n".join(lines[start:]).rstrip()
