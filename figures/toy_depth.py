"""The toy teacher-student scaling: each student's held-out loss against its depth on log-log
axes, one series per teacher regime (seeds as small points, their mean joined), with the fitted
L = c / l^a_l (+ L0) and a_l's interval in the legend; one panel per temperature."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from engine.experiments.toy_depth.vocabulary import ToyDepthCurve, ToyDepthResult
from figures import style


def fitted(curve: ToyDepthCurve, grid: np.ndarray) -> np.ndarray | None:
    if not (style.finite(curve.alpha_l) and style.finite(curve.c)):
        return None
    return curve.c / grid**curve.alpha_l + (curve.L0 if style.finite(curve.L0) else 0.0)


def draw(result: ToyDepthResult) -> Figure:
    temperatures = result.by_temperature or {f"{result.temperature:g}": result.regimes}
    fig = style.figure(height=2.0, width=style.COLUMN if len(temperatures) == 1 else style.PAGE)
    axes = fig.subplots(1, len(temperatures), squeeze=False, sharey=True)[0]
    regimes = sorted({regime for curves in temperatures.values() for regime in curves})
    for ax, (temperature, curves) in zip(axes, temperatures.items(), strict=True):
        for regime, curve in curves.items():
            look = style.series(regimes.index(regime))
            for depth, seeds in zip(curve.depths, curve.loss_per_seed, strict=True):
                kept = [loss for loss in seeds if style.finite(loss)]
                ax.scatter([depth] * len(kept), kept, color=look["color"], marker=look["marker"], s=5, alpha=0.5,
                           linewidth=0)
            mean = [(d, loss) for d, loss in zip(curve.depths, curve.loss, strict=True) if style.finite(loss)]
            if not mean:
                continue
            interval = f" [{curve.ci95[0]:.2f}, {curve.ci95[1]:.2f}]" if curve.ci95 else ""
            label = f"{regime}: a_l = {curve.alpha_l:.2f}{interval}" if style.finite(curve.alpha_l) else regime
            ax.plot(*zip(*mean, strict=True), linestyle="none", marker=look["marker"], color=look["color"],
                    label=label)
            grid = np.geomspace(min(d for d, _ in mean), max(d for d, _ in mean), 60)
            line = fitted(curve, grid)
            if line is not None:
                ax.plot(grid, line, color=look["color"], linestyle=look["linestyle"], marker="")
        style.log_axis(ax, "x")
        style.log_axis(ax)
        ax.set_xlabel("student depth l")
        ax.set_title(f"temperature {temperature}; {result.fit}")
        ax.legend(loc="lower left")
    axes[0].set_ylabel("held-out loss")
    return fig
