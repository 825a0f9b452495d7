"""Prune curves: perplexity, and mean lm-eval accuracy where the run scored tasks, against the
layers removed (top axis: the share of the decoder layers' parameters), one line per criterion,
healed cuts dashed beside them; the full model at zero."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from engine.core.codec import ABSENT
from engine.evaluation.accuracy import TaskScore
from engine.experiments.prune.vocabulary import PruneCut, PruneResult
from figures import style


def mean_accuracy(scores: Sequence[TaskScore] | None) -> float | None:
    values = [s.acc for s in scores or () if style.finite(s.acc)]
    return sum(values) / len(values) if values else None


def curve_panel(ax: Axes, result: PruneResult, value: str, full: float | None) -> None:
    """One line per criterion of `value(cut)` (ppl, accuracy), healed ones dashed, the full model at 0."""
    for index, method in enumerate(result.methods):
        cuts = sorted((c for c in result.curve if c.method == method), key=lambda c: c.removed)
        look = style.series(index)
        for healed in (False, True):
            points = [(cut.removed, y) for cut in cuts if style.finite(y := measure(cut, value, healed))]
            if full is not None and points:
                points.insert(0, (0, full))
            if len(points) > (full is not None):
                ax.plot(*zip(*points, strict=True), label=f"{method}, healed" if healed else method,
                        **(look | {"linestyle": "--", "markerfacecolor": "white"} if healed else look))
    if full is not None:
        ax.axhline(full, color="0.4", linewidth=0.5, linestyle=":")
    ax.set_xlabel("layers removed")
    top = ax.secondary_xaxis("top", functions=(lambda k: np.asarray(k) / result.n_layers,
                                                      lambda s: np.asarray(s) * result.n_layers))
    top.set_xlabel("share of decoder-layer parameters removed")
    top.xaxis.set_major_formatter(lambda s, _: f"{s:.0%}")


def measure(cut: PruneCut, value: str, healed: bool) -> float | None:
    if value == "ppl":
        return cut.healed_ppl if healed else cut.ppl
    scores = cut.healed_accuracy if healed else cut.accuracy
    return None if scores is ABSENT else mean_accuracy(scores)


def draw(result: PruneResult) -> Figure:
    has_accuracy = any(cut.accuracy is not ABSENT and mean_accuracy(cut.accuracy) is not None for cut in result.curve)
    fig = style.figure(height=2.2, width=style.COLUMN)
    axes = fig.subplots(1, 2 if has_accuracy else 1, squeeze=False)[0]
    curve_panel(axes[0], result, "ppl", result.baseline_ppl)
    style.log_axis(axes[0])
    axes[0].set_ylabel("perplexity")
    axes[0].legend(loc="upper left")
    if has_accuracy:
        baseline = None if result.baseline_accuracy is ABSENT else mean_accuracy(result.baseline_accuracy)
        curve_panel(axes[1], result, "accuracy", baseline)
        axes[1].set_ylabel("mean accuracy")
    fig.suptitle(f"{result.model} ({result.n_layers} layers)", fontsize=7)
    return fig
