"""The scaling-fit views: loss against depth beside the fitted depth term (results/scaling-fit.json
`depth_points`), and the profile of the fit's objective over the depth exponent a_l with the
estimate and its profile interval (`profile.alpha_l`)."""

from __future__ import annotations

from typing import Any

from engine.events import DepthPoints, from_doc
from tui.widgets.curve_plot import Curve, CurvePlot

DEPTH_LINE_POINTS = 60  # the fitted depth term is drawn through this many depths


def depth_curves(doc: dict[str, Any]) -> list[Curve]:
    """Every run's loss less the fit's width and token terms and L0, against its depth (points), and
    the fitted depth term c_l / l^a_l over the same depths (line): how well depth is explained."""
    runs = from_doc(DepthPoints, doc["depth_points"])
    curves = [Curve("runs: loss - fitted width, token terms - L0", runs.depth_part(), "cyan", scatter=True)]
    c, alpha = doc["params"].get("c_l"), doc["params"].get("alpha_l")
    if runs.depth and isinstance(c, (int, float)) and isinstance(alpha, (int, float)):
        low, high = min(runs.depth), max(runs.depth)
        depths = [low * (high / low) ** (i / (DEPTH_LINE_POINTS - 1)) for i in range(DEPTH_LINE_POINTS)]
        curves.append(Curve(f"fit c_l/l^a_l, a_l = {alpha:.3g}", [(d, c / d**alpha) for d in depths], "green"))
    return curves


def profile_curves(doc: dict[str, Any]) -> list[Curve]:
    """The objective against a_l, and vertical marks at the estimate and the 95 % interval."""
    points = [(float(p["alpha_l"]), float(p["objective"])) for p in doc["profile"]["alpha_l"]]
    curves = [Curve("objective", points, "cyan")]
    if not points:
        return curves
    low, high = min(y for _, y in points), max(y for _, y in points)
    estimate = doc["params"].get("alpha_l")
    if isinstance(estimate, (int, float)):
        curves.append(Curve(f"a_l = {estimate:.3g}", [(estimate, low), (estimate, high)], "green"))
    interval = doc.get("alpha_l_profile_ci95")
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and None not in interval:
        for bound in interval:
            curves.append(Curve(f"95% {interval[0]:.3g}..{interval[1]:.3g}", [(bound, low), (bound, high)], "orange"))
    return curves


class ScalingDepthPlot(CurvePlot):
    def show(self, doc: dict[str, Any] | None) -> None:
        """Draws the runs against depth; hidden for a result without them (the summary says how)."""
        self.display = bool(doc and doc.get("depth_points"))
        if not self.display or doc is None:
            return
        self.draw(depth_curves(doc), title="loss against depth, less the other fitted terms", xlabel="depth l",
                  ylabel="loss part")  # fmt: skip


class ScalingProfilePlot(CurvePlot):
    def show(self, doc: dict[str, Any] | None) -> None:
        """Draws the profile of results/scaling-fit.json; hidden until there is one."""
        self.display = bool(doc and doc.get("profile", {}).get("alpha_l"))
        if not self.display or doc is None:
            return
        self.draw(profile_curves(doc), title="objective over the depth exponent a_l", xlabel="a_l", ylabel="objective")
