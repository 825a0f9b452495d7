"""The scaling-fit result: as `anatomy-tui run scaling-fit` prints it, and its Analyses view: the
fit's terms, loss against depth beside the fitted depth term (`depth_points`), and the profile of the
fit's objective over the depth exponent a_l with the estimate and its profile interval
(`profile.alpha_l`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.containers import Horizontal
from textual.widget import Widget

from engine.core.codec import ABSENT
from engine.experiments.scaling_fit.vocabulary import ProfilePoint, ScalingFitResult
from tui.views import Analysis, decoded
from tui.views._format import fmt, interval
from tui.views._tables import WholeConsole
from tui.widgets.curve_plot import Curve, CurvePlot

if TYPE_CHECKING:
    from tui.state import SessionState

ANALYSIS = Analysis("Scaling fit (loss decomposition)", place=4)
DEPTH_LINE_POINTS = 60  # the fitted depth term is drawn through this many depths


def _given(value: Any) -> Any:
    """A part the result does not have (another optimizer's, or an older version's) as None."""
    return None if value is ABSENT else value


def figures(result: ScalingFitResult) -> Group:
    """The fit's terms (exponent, bootstrap interval, coefficient), then its a_l profile interval,
    objective and errors: of either optimizer and of older versions, whatever parts they have."""
    params, ci95 = result.params, result.ci95 or {}
    heading = Text(f"L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 fitted to {result.n_points} runs "
                   f"({result.optimizer or 'lm'}, {result.loss_function or 'least_squares'})", style="italic")
    table = Table()
    for column in ("term", "exponent", "95% (bootstrap)", "coefficient"):
        table.add_column(column, justify="left" if column == "term" else "right")
    for term, key in (("width m", "m"), ("depth l", "l"), ("tokens D", "D")):
        table.add_row(f"{term} (alpha_{key}, c_{key})", fmt(params.get(f"alpha_{key}")),
                      interval(ci95.get(f"alpha_{key}")), fmt(params.get(f"c_{key}"), ".4g"))
    table.add_row("floor L0", "", interval(ci95.get("L0")), fmt(params.get("L0"), ".4g"))
    lines: list[Any] = [heading, table]
    if result.alpha_l_profile_ci95 is not ABSENT:
        lines.append(Text(f"a_l profile-likelihood 95% {interval(result.alpha_l_profile_ci95)}"))
    lines.append(Text(f"objective {fmt(result.objective, '.6g')} (mean squared log residual) · train RMSE "
                      f"{fmt(_given(result.train_rmse), '.4g')} · held-out RMSE "
                      f"{fmt(_given(result.heldout_rmse), '.4g')}"))
    return Group(*lines)


def print_result(doc: dict[str, Any]) -> None:
    WholeConsole().print(figures(ScalingFitResult.from_json(doc)))


def summary(result: ScalingFitResult, command: str) -> Any:
    """The fit's figures; a line with `command` for a result without the runs to plot against depth."""
    view = figures(result)
    if result.depth_points:
        return view
    hint = f"no runs in this result to plot loss against depth; run:  {command}"
    return Group(view, Text(hint, style="dim"))


def depth_curves(result: ScalingFitResult) -> list[Curve]:
    """Every run's loss less the fit's width and token terms and L0, against its depth (points), and
    the fitted depth term c_l / l^a_l over the same depths (line): how well depth is explained."""
    runs = result.depth_points
    assert runs
    curves = [Curve("runs: loss - fitted width, token terms - L0", runs.depth_part(), "cyan", scatter=True)]
    c, alpha = result.params.get("c_l"), result.params.get("alpha_l")
    if runs.depth and isinstance(c, (int, float)) and isinstance(alpha, (int, float)):
        low, high = min(runs.depth), max(runs.depth)
        depths = [low * (high / low) ** (i / (DEPTH_LINE_POINTS - 1)) for i in range(DEPTH_LINE_POINTS)]
        curves.append(Curve(f"fit c_l/l^a_l, a_l = {alpha:.3g}", [(d, c / d**alpha) for d in depths], "green"))
    return curves


def _profile(result: ScalingFitResult | None) -> list[ProfilePoint]:
    """The profile over a_l; none for a fit without one (--huber, --optimizer paper, before 0.2)."""
    return (result.profile.alpha_l or []) if result is not None and result.profile else []


def profile_curves(result: ScalingFitResult) -> list[Curve]:
    """The objective against a_l, and vertical marks at the estimate and the 95 % interval."""
    points = [(float(p.alpha_l), float(p.objective)) for p in _profile(result)
              if p.objective is not None]  # None: an objective saved as inf or nan, not drawn
    curves = [Curve("objective", points, "cyan")]
    if not points:
        return curves
    low, high = min(y for _, y in points), max(y for _, y in points)
    estimate = result.params.get("alpha_l")
    if isinstance(estimate, (int, float)):
        curves.append(Curve(f"a_l = {estimate:.3g}", [(estimate, low), (estimate, high)], "green"))
    interval = _given(result.alpha_l_profile_ci95)
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and None not in interval:
        for bound in interval:
            curves.append(Curve(f"95% {interval[0]:.3g}..{interval[1]:.3g}", [(bound, low), (bound, high)], "orange"))
    return curves


class ScalingDepthPlot(CurvePlot):
    def show(self, result: ScalingFitResult | None) -> None:
        """Draws the runs against depth; hidden for a result without them (the summary says how)."""
        self.display = bool(result and result.depth_points)
        if not self.display or result is None:
            return
        self.draw(depth_curves(result), title="loss against depth, less the other fitted terms", xlabel="depth l",
                  ylabel="loss part")  # fmt: skip


class ScalingProfilePlot(CurvePlot):
    def show(self, result: ScalingFitResult | None) -> None:
        """Draws the profile of results/scaling-fit.json; hidden until there is one."""
        self.display = bool(_profile(result))
        if not self.display or result is None:
            return
        self.draw(profile_curves(result), title="objective over the depth exponent a_l", xlabel="a_l",
                  ylabel="objective")


def plots() -> list[Widget]:
    return [Horizontal(ScalingDepthPlot(id="scaling-depth-plot"), ScalingProfilePlot(id="scaling-plot"),
                       id="scaling-plots", classes="analysis-plot")]


def show(pane: Widget, state: SessionState) -> None:
    """Loss against depth beside the profile over a_l; the row is hidden while neither can be drawn."""
    result = decoded(ScalingFitResult, state.results.get("scaling-fit"))
    depth, profile = pane.query_one(ScalingDepthPlot), pane.query_one(ScalingProfilePlot)
    depth.show(result)
    profile.show(result)
    pane.query_one("#scaling-plots").display = depth.display or profile.display
