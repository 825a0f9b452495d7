"""The Compare view: an atlas, or the console's session beside the others of the store, on relative
depth. One criterion at a time as curves (n / p: the next or previous criterion), under it the
class bands, the depths critical or redundant in every model and the criteria's agreement, as
`anatomy-tui compare` prints them.

On an atlas session it is live: the atlas's measures in a table (model · measure · variant · state ·
detail), read again every REFRESH_SECONDS in a thread worker (sessions/atlas.py AtlasWatch: only what
the logs gained since), so it opens while the atlas runs, before its table exists, and the curves
come in when the atlas saves its table."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from engine.atlas import table as A
from engine.atlas.tasks import TaskRow, counts, task_key
from engine.core.errors import UserError
from sessions.atlas import AtlasWatch
from sessions.store import SessionError
from tui.views.atlas import report_lines, short_names
from tui.widgets.depth_profiles import DepthProfiles

REFRESH_SECONDS = 0.5  # an atlas's measures are read again at most twice a second
COLUMNS = ("model", "measure", "variant", "state", "detail")


@dataclass
class TasksRead(Message):
    """What a read of the atlas found: its measures, its table when it came just now, or why it
    could not be read."""

    rows: list[TaskRow]
    doc: A.AtlasDocument | None
    error: str = ""


class CompareScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        Binding("n,right", "turn(1)", "Next criterion", priority=True),  # before the measures' table's arrows
        Binding("p,left", "turn(-1)", "Previous criterion", priority=True),
    ]
    DEFAULT_CSS = """
    CompareScreen { background: $background; }
    #compare-title { height: 1; padding: 0 1; background: $panel; }
    #compare-tasks { height: 1fr; display: none; }
    CompareScreen.-curves #compare-tasks { height: auto; max-height: 25%; }
    #compare-note { height: 1; padding: 0 1; display: none; }
    #compare-plot { height: 2fr; min-height: 8; display: none; }
    #compare-text { height: 1fr; padding: 0 1; display: none; }
    CompareScreen.-curves #compare-plot, CompareScreen.-curves #compare-text { display: block; }
    """

    def __init__(self, shown: A.AtlasDocument | AtlasWatch) -> None:
        super().__init__()
        self.atlas_watch = shown if isinstance(shown, AtlasWatch) else None
        self.shown_name = shown.name
        self.doc: A.AtlasDocument | None = None
        self.criteria: list[str] = []
        self.index = 0
        self.names: dict[str, str] = {}
        self.rows: list[TaskRow] = []
        self.reading = False
        if isinstance(shown, A.AtlasDocument):
            self.doc = shown

    def compose(self) -> ComposeResult:
        yield Static(id="compare-title")
        yield DataTable(id="compare-tasks", cursor_type="none", zebra_stripes=True)
        yield Static(id="compare-note", markup=False)
        yield DepthProfiles(id="compare-plot")
        with VerticalScroll(id="compare-text"):
            yield Static(id="compare-report", markup=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column)
        if self.doc is not None:
            self._take(self.doc)
        if self.atlas_watch is not None:  # the first read now, so the view opens whole; the next ones off the UI thread
            self.show_read(self._read())
            self.set_interval(REFRESH_SECONDS, self._refresh)
        self._title()

    def action_turn(self, step: int) -> None:
        if self.criteria:
            self.index = (self.index + step) % len(self.criteria)
            self._plot()
            self._title()

    # the atlas, read again on a timer ---------------------------------------------------------------
    def _refresh(self) -> None:
        if not self.reading:
            self.reading = True
            self.run_worker(self._read_and_post, thread=True, exit_on_error=False, group="compare",
                            description="reading the atlas")

    def _read_and_post(self) -> None:
        self.post_message(self._read())

    def _read(self) -> TasksRead:
        """The atlas's measures now and, until it came, its table (a thread worker's, or the first read)."""
        assert self.atlas_watch is not None
        try:
            return TasksRead(self.atlas_watch.tasks(), self.atlas_watch.result() if self.doc is None else None)
        except (SessionError, UserError, OSError) as exc:  # the atlas's session gone, its table damaged
            return TasksRead(self.rows, None, str(exc))

    @on(TasksRead)
    def show_read(self, read: TasksRead) -> None:
        self.reading = False
        if read.doc is not None and self.doc is None:
            self._take(read.doc)
        if read.rows != self.rows:
            self._show_rows(read.rows)
        note = self.query_one("#compare-note", Static)
        note.display = bool(read.error) or self.doc is None
        note.update(read.error or (f"the table comes when the atlas ends ({len(read.rows)} measures)" if read.rows
                                   else "no measure of this atlas has started yet; the table comes when it ends"))
        self._title()

    def _show_rows(self, rows: list[TaskRow]) -> None:
        table = self.query_one(DataTable)
        names = short_names(list(dict.fromkeys(row.model for row in rows)))
        for row in rows:
            key = task_key(row.model, row.variant, row.experiment)
            cells = (names[row.model], row.experiment, row.variant, row.state, row.detail)
            if key not in table.rows:
                table.add_row(*cells, key=key)
                continue
            for column, value in zip(COLUMNS[3:], cells[3:], strict=True):
                table.update_cell(key, column, value)
        table.display = bool(rows)
        self.rows = rows

    def _take(self, doc: A.AtlasDocument) -> None:
        """The atlas's table, from now on shown as curves (under the measures of an atlas's session)."""
        self.doc, self.criteria, self.names = doc, A.criteria_of(doc.rows), short_names(doc.models)
        self.add_class("-curves")
        self.query_one("#compare-report", Static).update(self._text())
        self._plot()

    # drawing ------------------------------------------------------------------------------------------
    def _plot(self) -> None:
        if self.doc is not None and self.criteria:
            self.query_one(DepthProfiles).show(self.doc, self.criteria[self.index], self.names)

    def _title(self) -> None:
        title = self.query_one("#compare-title", Static)
        if self.doc is None:  # the measures' states; once the table is there, the table shows them
            states = ", ".join(f"{n} {state}" for state, n in counts(self.rows).items())
            title.update(f"Atlas {self.shown_name} · {states or 'no measures yet'}  escape: close")
        elif not self.criteria:
            title.update(f"Compare {self.doc.name}: no per-layer values  (escape: close)")
        else:
            title.update(f"Compare {self.doc.name} · {self.criteria[self.index]} ({self.index + 1}/"
                         f"{len(self.criteria)})  n/p: criterion  escape: close")

    def _text(self) -> str:
        assert self.doc is not None
        lines = report_lines(self.doc)
        start = next((i for i, line in enumerate(lines) if line.startswith("class bands")), 0)
        return "\n".join(lines[start:]).rstrip()
