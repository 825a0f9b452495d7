"""The layer map: one row per layer, coloured by class, D% on a log-scale bar with its interval,
Block Influence, and recovery difficulty once known. Arrows or the mouse select a layer. A map
with parts (`run ablation --part`) shows each layer's attention and MLP D% beside the whole
layer's, each coloured by its own class. The marks of the prompt pane's modified model are drawn
where they apply: a layer marked whole beside its number, a marked block in its block's column
(shown for the mark even before a map with parts). While a streamed map runs, its wavefront is
marked (») on the layer it reads, and the layers it passed show their proxies before their D%."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.scrollbar import ScrollBarRender
from textual.widgets import DataTable

from engine.experiments.variants import pruned_layers
from engine.models.families import PARTS
from tui.marks import NO_MARKS, Marks
from tui.palette import class_style
from tui.state import SessionState, layer_class

if TYPE_CHECKING:
    from engine.experiments.recovery.vocabulary import RecoveryRow

log = logging.getLogger("anatomy_tui.console")
BAR_WIDTH = 16
LOG_LOW, LOG_HIGH = -1.0, 5.0  # the bar spans |D| from 0.1 % to 100,000 %


def log_bar(degradation: float | None, width: int = BAR_WIDTH, style: str = "") -> Text:
    """|D| on a log10 scale (0.1 % .. 1e5 %); a negative D (ablation helps) draws leftward arrows."""
    if degradation is None or not math.isfinite(degradation):
        return Text("·" * width, style="dim")
    magnitude = max(abs(degradation), 10**LOG_LOW)
    share = (math.log10(magnitude) - LOG_LOW) / (LOG_HIGH - LOG_LOW)
    filled = max(1, min(width, round(share * width)))
    char = "◂" if degradation < 0 else "█"
    bar = Text(char * filled, style=style)
    bar.append("·" * (width - filled), style="dim")
    return bar


def difficulty_text(summary: RecoveryRow | None) -> str:
    """A short reading of a recovery row: difficulty (steps-like, higher is harder)."""
    return "" if summary is None else f"{summary.difficulty:,.0f}"


def pct(value: Any) -> str:
    return "" if not isinstance(value, (int, float)) else f"{value:+,.1f}"


class WholeCells(ScrollBarRender):
    """A scrollbar whose thumb fills whole cells: no eighth-block glyph (▆) at its ends, which in the
    map's narrow gutter reads as a stray mark inside the table."""

    VERTICAL_BARS: ClassVar[list[str]] = [" "] * len(ScrollBarRender.VERTICAL_BARS)
    HORIZONTAL_BARS: ClassVar[list[str]] = [" "] * len(ScrollBarRender.HORIZONTAL_BARS)


class LayerMap(DataTable):
    """A DataTable with one row per layer; the row key is the layer index."""

    COLUMNS = ("L", "class", "D% (log)", "D %", "95% CI", "BI", "ang", "recov")
    PART_COLUMNS = ("attn D%", "mlp D%")  # after "D %" when the session's map has parts
    RECOVERING = "⟳"  # beside the layer number while that layer recovers
    PRUNED = "✂"  # beside the layer number of a layer the session's prune run removes
    MARKED = "✕"  # beside the layer number, or in its block's column, marked for the modified model
    WAVEFRONT = "»"  # beside the layer number of the layer a streamed map's wavefront reads now
    restore_row: int | None = None  # the layer to select once the map has that many rows (the console's view)

    def on_mount(self) -> None:
        for bar in (self.vertical_scrollbar, self.horizontal_scrollbar):
            bar.renderer = WholeCells  # type: ignore[misc]  # a ClassVar to Textual's stubs; its docs set it per instance
        self.cursor_type = "row"
        self.zebra_stripes = False
        self.shown: tuple[str, ...] = self.COLUMNS
        for name in self.COLUMNS:
            self.add_column(name, key=name)

    @classmethod
    def columns_for(cls, state: SessionState, marks: Marks = NO_MARKS) -> tuple[str, ...]:
        """The layer map's columns; with parts (or a block marked), the blocks' D% right after the
        whole layer's."""
        if not state.ablation_parts and not marks.blocks:
            return cls.COLUMNS
        at = cls.COLUMNS.index("D %") + 1
        return (*cls.COLUMNS[:at], *cls.PART_COLUMNS, *cls.COLUMNS[at:])

    def show(self, state: SessionState, n_layers: int, marks: Marks = NO_MARKS) -> None:
        """Redraws every row from the state and the marks. Cells are updated in place while the layers
        stay the same, so the cursor (the selected layer) never jumps when new numbers arrive."""
        count = max(n_layers, state.n_layers, max((layer for layer, _ in state.ablation_parts), default=-1) + 1)
        from engine.experiments.prune.vocabulary import PruneResult  # here: its vocabulary is not needed to paint

        recovering = state.recovering()
        pruned = set(pruned_layers(state.result(PruneResult)))
        columns = self.columns_for(state, marks)
        front = state.wavefront()
        rows = [self._cells(state, index, index in recovering, index in pruned, index in marks.layers, front)
                for index in range(count)]
        if columns != self.COLUMNS:
            at = self.COLUMNS.index("D %") + 1
            rows = [[*cells[:at], *self._part_cells(state, index, marks), *cells[at:]]
                    for index, cells in enumerate(rows)]
        if self.row_count == count and columns == self.shown:
            for index, cells in enumerate(rows):
                for column, value in zip(columns, cells, strict=True):
                    self.update_cell(str(index), column, value, update_width=True)
            return
        row = self.cursor_row
        if self.restore_row is not None and self.restore_row < count:  # the layer selected when the console quit
            row, self.restore_row = self.restore_row, None
        if columns != self.shown:
            self.clear(columns=True)
            self.shown = columns
            for name in columns:
                self.add_column(name, key=name)
        self.clear()
        for index, cells in enumerate(rows):
            self.add_row(*cells, key=str(index))
        if count:
            self.move_cursor(row=min(row, count - 1), animate=False)
            log.info("layer map: %d rows", count)

    @staticmethod
    def _part_cells(state: SessionState, index: int, marks: Marks) -> list[Text]:
        """The attention's and the MLP's D% in layer `index`, each in its own class's colour, a
        marked block's behind the mark."""
        cells = []
        for part in PARTS:
            info = state.ablation_parts.get((index, part))
            d = info.degradation_pct if info else None
            mark = LayerMap.MARKED if (index, part) in marks.blocks else ""
            cells.append(Text(mark + pct(d), style=class_style(layer_class(info)) if info else "", justify="right"))
        return cells

    @staticmethod
    def _cells(state: SessionState, index: int, recovering: bool = False, pruned: bool = False,
               marked: bool = False, front: int | None = None) -> list[Text | str]:
        """A layer's row; `front` is the layer a streamed map's wavefront reads now: that layer says
        `reading`, the layers it passed `passed` (their proxies known, their perplexities at the end)."""
        info = state.ablation.get(index)
        name = layer_class(info) if info else ""
        waiting = "reading" if index == front else "passed" if index in state.passed else "?"
        style = class_style(name)
        d = info.degradation_pct if info else None
        low, high = (info.ci_low, info.ci_high) if info else (None, None)
        known = low is not None and high is not None
        bi, angle = state.proxy(index)
        return [
            Text(f"{index}{LayerMap.RECOVERING if recovering else ''}{LayerMap.PRUNED if pruned else ''}"
                 f"{LayerMap.MARKED if marked else ''}{LayerMap.WAVEFRONT if index == front else ''}", style=style),
            Text(name or waiting, style="bold" if index == front else style),
            log_bar(d, style=style),
            Text(pct(d), style=style, justify="right"),
            f"{low:,.0f}..{high:,.0f}" if known else "",
            "" if bi is None else f"{bi:.3f}",
            "" if angle is None else f"{angle:.3f}",
            difficulty_text(state.difficulty.get(index)),
        ]
