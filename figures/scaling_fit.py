"""The scaling fit's depth term: each run's loss less the fitted width, token and L0 terms against
its depth with the fitted c_l / l^a_l and the band its a_l interval spans; and the objective
profiled over a_l with the profile interval."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from engine.core.codec import ABSENT
from engine.experiments.scaling_fit.vocabulary import ScalingFitResult
from figures import style


def interval(result: ScalingFitResult) -> list[float] | None:
    """a_l's 95 % interval: the bootstrap's, else the profile's; None when neither was computed."""
    for found in ((result.ci95 or {}).get("alpha_l") if result.ci95 is not ABSENT else None,
                  result.alpha_l_profile_ci95 if result.alpha_l_profile_ci95 is not ABSENT else None):
        kept = [float(v) for v in found or () if style.finite(v)]
        if found and len(kept) == len(found):
            return kept
    return None


def draw(result: ScalingFitResult) -> Figure:
    fig = style.figure(height=1.9)
    depth, profile = fig.subplots(1, 2)
    points = result.depth_points if result.depth_points is not ABSENT else None
    alpha, c_l = result.params.get("alpha_l"), result.params.get("c_l")
    if points is None or not points.depth:
        style.nothing(depth, "no per-run points in this result (before anatomy-tui 0.3)")
    else:
        d, part = zip(*points.depth_part(), strict=True)
        depth.scatter(d, part, color="black", marker="o", s=8, label=f"runs (n = {len(d)})", zorder=3)
        if style.finite(alpha) and style.finite(c_l):
            grid = np.geomspace(min(d), max(d), 100)
            depth.plot(grid, c_l / grid**alpha, label=f"fit a_l = {alpha:.2f}", **style.series(0) | {"marker": ""})
            bounds = interval(result)
            if bounds:
                low, high = (c_l / grid**a for a in bounds)
                depth.fill_between(grid, np.minimum(low, high), np.maximum(low, high), color=style.PALETTE[0],
                                   alpha=0.2, linewidth=0, label=f"a_l 95 % [{bounds[0]:.2f}, {bounds[1]:.2f}]")
        style.log_axis(depth, "x")
        depth.set_xlabel("depth l (layers)")
        depth.set_ylabel("loss − other terms")
        depth.legend(loc="upper right")
    depth.set_title(f"fit to {result.n_points} runs")
    profiled = result.profile.alpha_l if result.profile is not ABSENT else None
    points_profile = [(p.alpha_l, p.objective) for p in profiled or [] if style.finite(p.objective)]
    if not points_profile:
        style.nothing(profile, "no a_l profile in this result")
    else:
        profile.plot(*zip(*points_profile, strict=True), label="objective", **style.series(0))
        if result.alpha_l_profile_ci95 is not ABSENT and result.alpha_l_profile_ci95 and all(
                style.finite(v) for v in result.alpha_l_profile_ci95):
            profile.axvspan(*result.alpha_l_profile_ci95, color="0.85", zorder=0, label="profile 95 %")
        if style.finite(alpha):
            profile.axvline(alpha, color="black", linewidth=0.6, linestyle=":", label="best a_l")
        profile.set_xlabel("a_l (held)")
        profile.set_ylabel("objective")
        profile.set_title("profile over a_l")
        profile.legend(loc="best")
    return fig
