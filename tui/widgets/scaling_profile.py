"""The scaling-fit view: the profile of the fit's objective over the depth exponent a_l, with the
estimate and its profile interval (results/scaling-fit.json `profile.alpha_l`)."""

from __future__ import annotations

from typing import Any

from tui.widgets.curve_plot import Curve, CurvePlot


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


class ScalingProfilePlot(CurvePlot):
    def show(self, doc: dict[str, Any] | None) -> None:
        """Draws the profile of results/scaling-fit.json; hidden until there is one."""
        self.display = bool(doc and doc.get("profile", {}).get("alpha_l"))
        if not self.display or doc is None:
            return
        self.draw(profile_curves(doc), title="objective over the depth exponent a_l", xlabel="a_l", ylabel="objective")
