"""Recovery curves: each noised layer's perplexity, as a multiple of the baseline, against the
fine-tuning steps, on a log axis, with the 2x, 1.5x and 1.1x thresholds drawn; and each layer's
difficulty (steps to get below 1.1x) beside it."""

from __future__ import annotations

from matplotlib.figure import Figure

from engine.experiments.recovery.vocabulary import RecoveryResult
from figures import style

THRESHOLDS = (2.0, 1.5, 1.1)


def draw(result: RecoveryResult) -> Figure:
    fig = style.figure(height=2.0, width=style.COLUMN)
    curves, difficulty = fig.subplots(1, 2, width_ratios=(2.2, 1))
    for index, row in enumerate(result.layers):
        points = [(step, ppl / result.baseline_ppl) for step, ppl in row.curve
                  if style.finite(step) and style.finite(ppl)]
        if points:
            curves.plot(*zip(*points, strict=True), label=f"layer {row.layer}", markevery=max(1, len(points) // 8),
                        **style.series(index))
    for threshold in THRESHOLDS:
        curves.axhline(threshold, color="0.35", linewidth=0.6, linestyle=(0, (2, 2)))
        curves.annotate(f"{threshold:g}×", (1.0, threshold), xycoords=("axes fraction", "data"), fontsize=5,
                        ha="right", va="bottom", color="0.35")
    style.log_axis(curves)
    curves.set_xlabel("fine-tuning step")
    curves.set_ylabel("PPL / baseline")
    curves.set_title(f"{result.model}: σ = {result.settings.sigma:g}")
    curves.legend(loc="upper right")
    layers = [row.layer for row in result.layers]
    for index, row in enumerate(result.layers):
        difficulty.bar(index, row.difficulty, **style.bar_look(index))
        if row.steps_to.get("1.1") is None:  # never below 1.1x: the bar is the budget, a lower bound
            difficulty.annotate(f"≥{row.difficulty:g}\nnot reached", (index, row.difficulty), ha="center",
                                va="bottom", fontsize=5)
    difficulty.set_xticks(range(len(layers)), [str(layer) for layer in layers])
    difficulty.set_xlabel("layer")
    difficulty.set_ylabel("steps to 1.1×")
    rho = result.spearman_vs_ablation
    difficulty.set_title(f"ρ vs D = {rho:.2f}" if style.finite(rho) else "ρ vs D: n/a")
    return fig
