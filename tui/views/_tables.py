"""How `anatomy-tui run` prints a view's tables: every value whole at any width. Rich's defaults cut
a cell that does not fit (`107394…`) and squeeze a table redirected to a file into 80 columns, while
a column with nothing in it (an interval not measured) still takes its share. Each view prints
through `WholeConsole`, so the rule is kept here once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def _blank(cell: RenderableType) -> bool:
    plain = cell.plain if isinstance(cell, Text) else cell
    return isinstance(plain, str) and not plain.strip()


def whole(table: Table) -> Table:
    """`table` changed in place: the columns empty in every row dropped, and each column set to
    wrap, then fold, a value too wide for it rather than cut it."""
    if table.row_count:
        table.columns[:] = [column for column in table.columns if not all(_blank(cell) for cell in column.cells)]
    for column in table.columns:
        column.overflow, column.no_wrap = "fold", False
    return table


def tables_in(renderable: Any) -> Iterator[Table]:
    """The tables in a renderable, those inside a Group too."""
    if isinstance(renderable, Table):
        yield renderable
    elif isinstance(renderable, Group):
        for inner in renderable.renderables:
            yield from tables_in(inner)


class WholeConsole(Console):
    """A console whose tables keep every value whole (`whole`). On a terminal a table too wide for
    it wraps its cells; elsewhere (a pipe, a file) the console grows to the table's natural width,
    so each value stays on one line whatever COLUMNS says."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        tables = [whole(table) for item in objects for table in tables_in(item)]
        if tables and not self.is_terminal:
            unbounded = self.options.update_width(10**6)
            needed = max(Measurement.get(self, unbounded, table).maximum for table in tables)
            self.width = max(self.width, needed)
        super().print(*objects, **kwargs)
