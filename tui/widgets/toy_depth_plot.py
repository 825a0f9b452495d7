"""The toy-depth view: held-out loss against student depth on log-log axes (log10 on linear axes,
plotext's log scale being buggy), one colour per regime, with each regime's fitted power law."""

from __future__ import annotations

import math
from typing import Any

from tui.widgets.curve_plot import Curve, CurvePlot

REGIME_COLOURS = ("cyan", "magenta", "orange", "green")
FIT_COLOURS = ("cyan+", "magenta+", "orange+", "green+")  # each regime's fitted line: its bright twin


def _fitted(fit: dict[str, Any], depth: float) -> float | None:
    c, alpha, floor = fit.get("c"), fit.get("alpha_l"), fit.get("L0") or 0.0
    if not isinstance(c, (int, float)) or not isinstance(alpha, (int, float)):
        return None
    return c / depth**alpha + floor


def toy_curves(doc: dict[str, Any]) -> list[Curve]:
    """Per regime: the measured points (log10 depth, log10 loss) and the fitted line with a_l."""
    curves = []
    for index, (regime, fit) in enumerate(doc["regimes"].items()):
        colour = REGIME_COLOURS[index % len(REGIME_COLOURS)]
        points = [(math.log10(d), math.log10(v)) for d, v in zip(fit["depths"], fit["loss"], strict=True) if v > 0]
        curves.append(Curve(regime, points, colour, scatter=True))
        depths = [float(d) for d in fit["depths"]]
        line = [(math.log10(d), _fitted(fit, d)) for d in depths]
        interval = fit.get("ci95")
        ci = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if isinstance(interval, list) else ""
        alpha = fit.get("alpha_l")
        label = f"{regime} fit a_l={alpha:.2f}{ci}" if isinstance(alpha, (int, float)) else f"{regime} (no fit)"
        fitted = [(x, math.log10(y)) for x, y in line if y is not None and y > 0]
        curves.append(Curve(label, fitted, FIT_COLOURS[index % len(FIT_COLOURS)]))
    return curves


class ToyDepthPlot(CurvePlot):
    def show(self, doc: dict[str, Any] | None) -> None:
        """Draws results/toy-depth.json; hidden until there is one (the view's line says how)."""
        self.display = bool(doc and doc.get("regimes"))
        if not self.display or doc is None:
            return
        self.draw(
            toy_curves(doc), title="held-out loss against depth (log-log)", xlabel="log10 depth", ylabel="log10 loss"
        )
