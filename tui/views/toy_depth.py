"""The toy-depth result: as `anatomy-tui run toy-depth` prints it, and its Analyses view: per regime
the fitted a_l and the held-out loss by depth, and that loss against student depth on log-log axes
(log10 on linear axes, plotext's log scale being buggy), one colour per regime, with each regime's
fitted power law."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.table import Table
from textual.widget import Widget

from engine.experiments.toy_depth.vocabulary import ToyDepthCurve, ToyDepthResult
from tui.views import Analysis, decoded
from tui.views._format import fmt, interval
from tui.views._tables import WholeConsole
from tui.widgets.curve_plot import Curve, CurvePlot

if TYPE_CHECKING:
    from tui.state import SessionState

ANALYSIS = Analysis("Toy depth models", place=5)
REGIME_COLOURS = ("cyan", "magenta", "orange", "green")
FIT_COLOURS = ("cyan+", "magenta+", "orange+", "green+")  # each regime's fitted line: its bright twin


def summary(result: ToyDepthResult, command: str = "") -> Table:
    """One row per regime: the fitted a_l with its interval, then the held-out loss at each depth."""
    depths = sorted({d for fit in result.regimes.values() for d in fit.depths})
    table = Table(title=f"{result.fit}  (preset {result.preset}, "
                        f"temperature {result.temperature}): held-out loss by student depth")
    for column in ("regime", "a_l", "95% CI", *(f"l={d}" for d in depths)):
        table.add_column(column, justify="left" if column == "regime" else "right")
    for regime, fit in result.regimes.items():
        loss = dict(zip(fit.depths, fit.loss, strict=True))
        table.add_row(regime, fmt(fit.alpha_l, ".2f"), interval(fit.ci95, ".2f"),
                      *(fmt(loss.get(d), ".4f", "") for d in depths))
    return table


def print_result(doc: dict[str, Any]) -> None:
    WholeConsole().print(summary(ToyDepthResult.from_json(doc)))


def _fitted(fit: ToyDepthCurve, depth: float) -> float | None:
    c, alpha, floor = fit.c, fit.alpha_l, fit.L0 or 0.0
    if not isinstance(c, (int, float)) or not isinstance(alpha, (int, float)):
        return None
    return c / depth**alpha + floor


def toy_curves(result: ToyDepthResult) -> list[Curve]:
    """Per regime: the measured points (log10 depth, log10 loss) and the fitted line with a_l."""
    curves = []
    for index, (regime, fit) in enumerate(result.regimes.items()):
        colour = REGIME_COLOURS[index % len(REGIME_COLOURS)]
        points = [(math.log10(d), math.log10(v)) for d, v in zip(fit.depths, fit.loss, strict=True)
              if v is not None and v > 0]  # None: a loss saved as inf or nan, not drawn
        curves.append(Curve(regime, points, colour, scatter=True))
        depths = [float(d) for d in fit.depths]
        line = [(math.log10(d), _fitted(fit, d)) for d in depths]
        ci95 = fit.ci95
        ci = f" [{ci95[0]:.2f}, {ci95[1]:.2f}]" if isinstance(ci95, list) else ""
        alpha = fit.alpha_l
        label = f"{regime} fit a_l={alpha:.2f}{ci}" if isinstance(alpha, (int, float)) else f"{regime} (no fit)"
        fitted = [(x, math.log10(y)) for x, y in line if y is not None and y > 0]
        curves.append(Curve(label, fitted, FIT_COLOURS[index % len(FIT_COLOURS)]))
    return curves


class ToyDepthPlot(CurvePlot):
    def show(self, result: ToyDepthResult | None) -> None:
        """Draws results/toy-depth.json; hidden until there is one (the view's line says how)."""
        self.display = bool(result and result.regimes)
        if not self.display or result is None:
            return
        self.draw(
            toy_curves(result), title="held-out loss against depth (log-log)", xlabel="log10 depth",
            ylabel="log10 loss",
        )


def plots() -> list[Widget]:
    return [ToyDepthPlot(id="toy-plot", classes="analysis-plot")]


def show(pane: Widget, state: SessionState) -> None:
    pane.query_one(ToyDepthPlot).show(decoded(ToyDepthResult, state.results.get("toy-depth")))
