"""The look every figure shares: sizes for a two-column paper, the importance classes' colour
AND hatch AND marker (so a greyscale print still tells them apart), one style per series (colour,
marker and line style all differ), the D % axis, and the new figure on the Agg canvas.

A figure module draws on the axes `figure()` hands it and uses these helpers; nothing here knows
any experiment.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

COLUMN = 3.4  # inches: one column of a two-column paper
PAGE = 7.0  # inches: both columns
DPI = 300  # PNG resolution (the report's and save_figure's)

RC: dict[RcKeyType, Any] = {
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "xtick.labelsize": 6,
    "ytick.labelsize": 6,
    "legend.fontsize": 6,
    "legend.frameon": False,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.0,
    "lines.markersize": 3.5,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "hatch.linewidth": 0.5,
    "errorbar.capsize": 1.5,
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
    "svg.fonttype": "none",  # text stays text in the SVG
    "pdf.fonttype": 42,  # TrueType in the PDF (journals refuse Type 3)
    "text.parse_math": False,  # a `$` in a model's name is a dollar sign, never mathtext to parse (or fail on)
}

# Okabe & Ito's colour-blind-safe palette
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 2)), (0, (3, 1, 1, 1, 1, 1)), (0, (6, 2)))
HATCHES = ("", "////", "....", "xxxx", "\\\\\\\\", "++++", "oo", "----")


@dataclass(frozen=True)
class Look:
    """How one class or one series is drawn: each of the three differs between any two."""

    color: str
    hatch: str
    marker: str


CLASS_LOOK: dict[str, Look] = {
    "critical": Look("#B2182B", "xxxx", "s"),
    "important": Look("#E69F00", "////", "^"),
    "minor": Look("#56B4E9", "....", "o"),
    "redundant": Look("#BBBBBB", "", "v"),
}
ANTI_LOOK = Look("#009E73", "\\\\\\\\", "*")  # an anti-layer: the model is better without it
NO_CLASS_LOOK = Look("#FFFFFF", "", ".")  # a layer no importance profile classes (growth's uniform arm)


def class_look(name: str | None) -> Look:
    return CLASS_LOOK.get(name or "", CLASS_LOOK["redundant"])


def series(index: int) -> dict[str, Any]:
    """Keyword arguments of `Axes.plot` for the index-th line: colour, marker and dash all change."""
    return {"color": PALETTE[index % len(PALETTE)], "marker": MARKERS[index % len(MARKERS)],
            "linestyle": DASHES[index % len(DASHES)]}


def bar_look(index: int) -> dict[str, Any]:
    """Keyword arguments of `Axes.bar` for the index-th group of bars: colour and hatch change."""
    return {"color": PALETTE[index % len(PALETTE)], "hatch": HATCHES[index % len(HATCHES)],
            "edgecolor": "black", "linewidth": 0.4}


class PaperFigure(Figure):
    """A figure a notebook shows as its PNG with no pyplot and no `%matplotlib` (IPython calls
    `_repr_png_`)."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        with matplotlib.rc_context(RC):
            self.savefig(buffer, format="png", dpi=150)
        return buffer.getvalue()


def figure(height: float, width: float = COLUMN) -> Figure:
    """A new figure of that size in inches, on the Agg canvas (no pyplot, no global state)."""
    fig = PaperFigure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def d_axis(ax: Axes, values: Sequence[float | None], axis: str = "y") -> None:
    """D % on a symmetric log axis: linear within +-10 %, logarithmic beyond, so a 9000 % layer and
    a -8 % anti-layer read on one axis; a line at 0."""
    finite = [abs(v) for v in values if v is not None and math.isfinite(v)]
    threshold = 10.0 if not finite or max(finite) > 10.0 else max(max(finite), 1.0)
    (ax.set_yscale if axis == "y" else ax.set_xscale)("symlog", linthresh=threshold, linscale=0.6)
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    (ax.axhline if axis == "y" else ax.axvline)(0.0, color="black", linewidth=0.5)


def interval_errors(values: Sequence[float], lows: Sequence[float | None],
                    highs: Sequence[float | None]) -> np.ndarray | None:
    """The (2, n) error-bar array of intervals around `values`, or None when no value has one
    (a missing bound draws no bar on that side)."""
    if all(lo is None and hi is None for lo, hi in zip(lows, highs, strict=True)):
        return None
    return np.array([[max(v - lo, 0.0) if lo is not None else 0.0 for v, lo in zip(values, lows, strict=True)],
                     [max(hi - v, 0.0) if hi is not None else 0.0 for v, hi in zip(values, highs, strict=True)]])


def class_legend(ax: Axes, names: Sequence[str], anti: bool, unclassed: bool = False, **kwargs: Any) -> None:
    """A legend of the importance classes present (their colour and hatch), the anti-layer, and
    with `unclassed` the look of a layer without a class: every look drawn has its entry."""
    looks = [(class_look(n), n) for n in names]
    looks += [(ANTI_LOOK, "anti-layer")] if anti else []
    looks += [(NO_CLASS_LOOK, "no class")] if unclassed else []
    ax.legend(handles=[Patch(facecolor=look.color, hatch=look.hatch, edgecolor="black", linewidth=0.4, label=label)
                       for look, label in looks], **kwargs)


def nothing(ax: Axes, what: str) -> None:
    """An empty panel that says what the result does not hold (an older or a partial run)."""
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, fontsize=6, color="0.4", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def grouped_bars(ax: Axes, groups: Sequence[str], values: Mapping[str, Sequence[float | None]],
                 errors: Mapping[str, Sequence[float | None]] | None = None) -> None:
    """Bars of each series (colour and hatch its own) side by side within each group, with
    symmetric error bars where `errors` has them; a missing value leaves its slot empty."""
    width = 0.8 / max(len(values), 1)
    for index, (name, heights) in enumerate(values.items()):
        spread = (errors or {}).get(name)
        for group, height in enumerate(heights):
            if not finite(height):
                continue
            error = spread[group] if spread is not None and finite(spread[group]) else None
            ax.bar(group - 0.4 + width * (index + 0.5), height, width=width, yerr=error,
                   label=name if group == next(g for g, h in enumerate(heights) if finite(h)) else None,
                   **bar_look(index))
    ax.set_xticks(range(len(groups)), groups)


def log_axis(ax: Axes, axis: str = "y") -> None:
    """A log axis labelled in plain numbers at 1, 2 and 5 of each decade (20, 50, not 2×10¹)."""
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    which = ax.yaxis if axis == "y" else ax.xaxis
    which.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    which.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    which.set_minor_formatter(NullFormatter())
