"""The Analyses views drawn from result documents: every plot's legend in the colour its curve is
drawn in, and each view's plot and summary present (or the line that says how to fill it)."""

from __future__ import annotations

import re

import pytest
from rich.color import Color as RichColor
from textual.color import Color

from tui.screens import console
from tui.widgets import curve_plot, prune_plot, toy_depth_plot
from tui.widgets.curve_plot import Curve, CurvePlot, colour_code

ANSI = re.compile(r"\x1b\[38;5;(\d+)m")


def drawn_codes(plot: CurvePlot) -> set[int]:
    plot.plt.plotsize(30, 8)
    return {int(code) for code in ANSI.findall(plot.plt.build())}


def every_colour() -> set[curve_plot.PlotColour]:
    """The colours the console hands plotext, wherever they are named."""
    return {*curve_plot.REFERENCE_COLOURS, *console.CURVE_COLOURS, *console.ARM_COLOURS.values(),
            *prune_plot.METHOD_COLOURS.values(), *toy_depth_plot.REGIME_COLOURS,
            *toy_depth_plot.FIT_COLOURS}  # fmt: skip


@pytest.mark.parametrize("colour", sorted(every_colour(), key=str))
def test_the_legend_shows_a_curve_in_the_colour_plotext_draws_it(colour) -> None:
    empty = CurvePlot()
    empty.draw([Curve("x", [(0.0, 0.0)], "black")])  # the axes alone (black is the axes' colour)
    plot = CurvePlot()
    plot.draw([Curve("c", [(0.0, 0.0), (1.0, 1.0)], colour)])
    (drawn,) = drawn_codes(plot) - drawn_codes(empty)
    (legend,) = re.findall(r"\[([^\]/]+)\]━━", str(plot.border_subtitle))
    assert legend == Color.from_rich_color(RichColor.from_ansi(drawn)).css


def test_a_colour_plotext_does_not_know_is_refused() -> None:
    """plotext has no "yellow": it drew such a curve in its next theme colour (blue) under a yellow legend."""
    with pytest.raises(ValueError, match="yellow"):
        colour_code("yellow")
    with pytest.raises(ValueError):
        CurvePlot().draw([Curve("c", [(0.0, 1.0)], "yellow")])
