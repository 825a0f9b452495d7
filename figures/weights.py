"""Weight predictability: how well a smooth function of depth predicts each matrix (R², leave one
layer out) against its two nulls (the layers shuffled, independent Gaussian draws), the
correlation of consecutive weight deltas against the same nulls, and, where the run replaced layers
by their predictions, the perplexity that costs."""

from __future__ import annotations

from matplotlib.figure import Figure

from engine.experiments.weights.vocabulary import WeightsResult
from figures import style

NULLS = {"model": None, "shuffled null": "null_shuffled", "independent null": "null_independent"}


def draw(result: WeightsResult) -> Figure:
    names = list(result.components)
    components = [result.components[n] for n in names]
    fig = style.figure(height=3.4 if result.paradox else 1.9)
    grid = fig.subplots(2 if result.paradox else 1, 2, squeeze=False)
    r2, delta = grid[0]

    def stats(null: str | None) -> list:
        return [c if null is None else getattr(c, null) for c in components]

    style.grouped_bars(r2, names, {label: [s.r2_loo for s in stats(null)] for label, null in NULLS.items()})
    r2.axhline(0.0, color="black", linewidth=0.5)
    r2.set_ylabel("R² (leave one layer out)")
    r2.set_xlabel("matrix")
    r2.set_title(f"{result.model}: layers {result.predicted_layers[0]}–{result.predicted_layers[-1]}")
    r2.legend(loc="best")
    style.grouped_bars(delta, names, {label: [s.delta_corr_mean for s in stats(null)] for label, null in NULLS.items()},
                       {label: [s.delta_corr_sd for s in stats(null)] for label, null in NULLS.items()})
    delta.axhline(0.0, color="black", linewidth=0.5)
    delta.set_ylabel("corr(ΔW_l, ΔW_l+1)")
    delta.set_xlabel("matrix")
    delta.set_title("delta correlation vs nulls")
    if result.paradox:
        paradox = grid[1][0]
        grid[1][1].remove()
        rows_drawn = [row for row in result.paradox if style.finite(row.degradation_pct)]
        paradox.plot([len(r.layers_replaced) for r in rows_drawn], [r.degradation_pct for r in rows_drawn],
                     label="predicted weights", **style.series(0))
        style.d_axis(paradox, [r.degradation_pct for r in rows_drawn])
        paradox.set_xlabel("layers replaced by their prediction")
        paradox.set_ylabel("D (%)")
        baseline = f" (baseline PPL {result.baseline_ppl:.3g})" if style.finite(result.baseline_ppl) else ""
        paradox.set_title(f"R²–PPL paradox{baseline}")
        paradox.legend(loc="best")
    return fig
