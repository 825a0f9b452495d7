"""A textual-plotext plot of a few named curves plus horizontal reference lines, redrawn from
scratch each time (clear, replot, refresh) so a live curve never accumulates stale points."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from plotext._dict import color_codes  # plotext's colour names, the table textual-plotext reads too
from rich.color import Color as RichColor
from rich.markup import escape
from rich.style import Style
from rich.text import Text
from textual.app import RenderResult
from textual.color import Color
from textual_plotext import PlotextPlot

PlotColour = str | int  # one of plotext's colour names, or an xterm-256 index
# baseline, then the 2x / 1.5x / 1.1x lines (plotext's "orange" is ANSI 3, what terminals call yellow)
REFERENCE_COLOURS: list[PlotColour] = ["white", "red", "orange", "orange+"]


@dataclass
class Curve:
    label: str
    points: Sequence[tuple[float, float]]
    colour: PlotColour = "white"
    scatter: bool = False  # measured points: dots, not joined by lines


def colour_code(colour: PlotColour) -> int:
    """The xterm-256 index plotext draws `colour` with. A name plotext does not know (it has no
    "yellow") raises ValueError: plotext would quietly draw it in its next theme colour, unlike the
    legend."""
    if isinstance(colour, int) and 0 <= colour <= 255:
        return colour
    if isinstance(colour, str) and colour in color_codes:
        return color_codes[colour]
    raise ValueError(f"{colour!r} is not a plotext colour (one of {', '.join(color_codes)} or 0..255)")


def legend_colour(colour: PlotColour) -> str:
    """`colour` as Textual markup names the colour the plot is drawn in: plotext writes an xterm
    index, which Textual reads as an ANSI colour (ansi_yellow for 3), not a CSS name like yellow."""
    return Color.from_rich_color(RichColor.from_ansi(colour_code(colour))).css


def legend_markup(entries: Sequence[tuple[str, PlotColour]]) -> str:
    """A one-line legend, each label after a line in its curve's colour (markup for a border subtitle)."""
    return "  ".join(f"[{legend_colour(colour)}]━━[/] {escape(label)}" for label, colour in entries)


def legend_width(entries: Sequence[tuple[str, PlotColour]]) -> int:
    """The cells `legend_markup`'s line takes."""
    return sum(len(label) + 5 for label, _ in entries) - 2 if entries else 0


def legend_rows(entries: Sequence[tuple[str, PlotColour]], width: int) -> list[Text]:
    """The legend over as many rows of `width` cells as it takes, each entry whole on one row."""
    rows: list[list[tuple[str, PlotColour]]] = [[]]
    for entry in entries:
        if rows[-1] and legend_width([*rows[-1], entry]) > width:
            rows.append([])
        rows[-1].append(entry)
    return [Text("  ").join(Text.assemble(("━━", Style(color=RichColor.from_ansi(colour_code(colour)))), f" {label}")
                            for label, colour in row) for row in rows]


class CurvePlot(PlotextPlot):
    """Curves and reference lines; `log_y` plots log10(y) on a linear axis (plotext's log scale is
    buggy) with ticks labelled in the original units. The legend sits under the plot, so it never
    hides a point: in the bottom border where it fits on one line, else on rows of its own under the
    plot (a narrow terminal), never a label cut; `xspan` fixes the x axis (a step budget) before the
    data fills it."""

    legend: Sequence[tuple[str, PlotColour]] = ()
    legend_below: tuple[Text, ...] = ()

    def place_legend(self) -> None:
        """The legend in the bottom border (a cell of rule kept at each end) or, too long for it, below the plot."""
        fits = self.size.width <= 0 or legend_width(self.legend) <= self.size.width - 2
        self.border_subtitle = legend_markup(self.legend) if fits else ""
        self.legend_below = () if fits else tuple(legend_rows(self.legend, self.size.width))
        self.refresh()

    def on_resize(self) -> None:
        self.place_legend()

    log_range: tuple[float, float] | None = None  # log10 of the lowest and highest y drawn (log_y)

    def label_log_ticks(self, height: int) -> None:
        """Log-y ticks labelled in the original units, as many as the plot's rows can show apart: more
        ticks than rows are dropped by plotext in an order that changes from process to process."""
        if self.log_range is None:
            return
        low, high = self.log_range
        count = 5 if height >= 16 else 3 if height >= 10 else 2
        ticks = [low + (high - low) * i / (count - 1) for i in range(count)] if high > low else [low]
        self.plt.yticks(ticks, [f"{10**t:,.3g}" for t in ticks])

    def render(self) -> RenderResult:
        """The plot, in the rows the legend leaves it (textual-plotext's render, a smaller height)."""
        self.label_log_ticks(self.size.height - len(self.legend_below))
        if not self.legend_below:
            return super().render()
        width, height = self.size.width, max(1, self.size.height - len(self.legend_below))
        self.plt.plotsize(width, height)
        self.plt._set_size(width, height)  # as textual-plotext does (its issue 5)
        self.plt.theme(self._get_plotext_theme_name(self.app.theme))
        return Text("\n").join([Text.from_ansi(self.plt.build().rstrip("\n")), *self.legend_below])

    def draw(
        self,
        curves: Sequence[Curve],
        references: Sequence[tuple[str, float]] = (),
        title: str = "",
        xlabel: str = "",
        ylabel: str = "",
        log_y: bool = False,
        xspan: tuple[float, float] | None = None,
    ) -> None:
        import math

        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title)
        plt.xlabel(xlabel)
        plt.ylabel(f"{ylabel} (log)" if log_y and ylabel else ylabel)

        def y(value: float) -> float:
            return math.log10(value) if log_y and value > 0 else value

        xs_all = [x for curve in curves for x, _ in curve.points]
        for curve in sorted(curves, key=lambda c: c.scatter):  # points on top of the lines
            if not curve.points:
                continue
            xs = [x for x, _ in curve.points]
            ys = [y(v) for _, v in curve.points]
            if curve.scatter:  # a braille dot is an eighth of a cell: too faint for a measured point
                plt.scatter(xs, ys, color=colour_code(curve.colour), marker="dot")
            else:
                plt.plot(xs, ys, color=colour_code(curve.colour), marker="braille")
        ys_all = [y(v) for curve in curves for _, v in curve.points] + [y(v) for _, v in references]
        self.log_range = (min(ys_all), max(ys_all)) if log_y and ys_all else None
        span = xspan
        if span is None and xs_all:
            low, high = min(xs_all), max(xs_all)
            span = (low, high if high > low else low + 1)
        if span is not None:
            plt.xlim(*span)
            for (_, value), colour in zip(references, REFERENCE_COLOURS, strict=False):
                plt.plot(list(span), [y(value)] * 2, color=colour_code(colour), marker="dot")
        entries = [(curve.label, curve.colour) for curve in curves if curve.points]
        if span is not None:
            entries += [(label, colour) for (label, _), colour in zip(references, REFERENCE_COLOURS, strict=False)]
        self.legend = list(dict.fromkeys(entries))  # one entry per label
        self.place_legend()
