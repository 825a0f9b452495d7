"""A textual-plotext plot of a few named curves plus horizontal reference lines, redrawn from
scratch each time (clear, replot, refresh) so a live curve never accumulates stale points."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from plotext._dict import color_codes  # plotext's colour names, the table textual-plotext reads too
from rich.color import Color as RichColor
from rich.markup import escape
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


def legend_markup(entries: Sequence[tuple[str, PlotColour]], width: int = 0) -> str:
    """A one-line legend, each label after a line in its curve's colour (markup for a border subtitle);
    with `width` (the cells it has), every label is cut by as much as it takes for all to show."""
    labels = [label for label, _ in entries]
    if width > 0:
        longest = max(map(len, labels), default=0)
        while longest > 1 and sum(len(label) + 5 for label in labels) - 2 > width:
            longest -= 1
            labels = [label if len(label) <= longest else label[: longest - 1] + "…" for label in labels]
    return "  ".join(f"[{legend_colour(colour)}]━━[/] {escape(label)}"
                     for label, (_, colour) in zip(labels, entries, strict=True))


class CurvePlot(PlotextPlot):
    """Curves and reference lines; `log_y` plots log10(y) on a linear axis (plotext's log scale is
    buggy) with ticks labelled in the original units. The legend sits under the plot, in the
    bottom border, so it never hides a point; `xspan` fixes the x axis (a step budget) before the
    data fills it."""

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
        if log_y and ys_all:
            low, high = min(ys_all), max(ys_all)
            ticks = [low + (high - low) * i / 4 for i in range(5)] if high > low else [low]
            plt.yticks(ticks, [f"{10**t:,.3g}" for t in ticks])
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
        # one entry per label, in the bottom border between its corners
        self.border_subtitle = legend_markup(list(dict.fromkeys(entries)), self.size.width - 4)
        self.refresh()
