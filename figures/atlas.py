"""The atlas: every criterion's per-layer profile of every model on relative depth (layer / (L - 1)),
one panel per criterion and one line per model, intervals where the criterion has them; D % on
its symmetric log axis."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from engine.atlas.table import MAIN, AtlasDocument, criteria_of, models_of
from figures import style

LABELS = {"d_pct": "D (%)", "block_influence": "Block Influence", "angular_distance": "angular distance",
          "angular_last_token": "angular distance, last token", "removal_ppl": "PPL without the layer",
          "angle_state": "θ(h_l, h_l+1) (°)", "angle_update": "θ(Δh_l, Δh_l+1) (°)",
          "recovery_difficulty": "steps to 1.1×"}


def draw(result: AtlasDocument) -> Figure:
    rows = [row for row in result.rows if row.variant == MAIN]
    criteria, models = criteria_of(rows), models_of(rows)
    columns = 1 if len(criteria) <= 1 else 2
    width = style.COLUMN if columns == 1 else style.PAGE
    fig = style.figure(height=1.7 * math.ceil(max(len(criteria), 1) / columns) + 0.2, width=width)
    if not criteria:
        style.nothing(fig.subplots(), "the atlas has no rows")
        return fig
    series: dict[tuple[str, str], list[tuple[float, float | None, float | None, float | None]]] = {}
    for r in rows:  # one pass: time linear in the rows, however many models
        if style.finite(r.value):
            series.setdefault((r.model, r.measure), []).append((r.relative_depth, r.value, r.lo, r.hi))
    axes = fig.subplots(math.ceil(len(criteria) / columns), columns, squeeze=False).ravel()
    for ax, criterion in zip(axes, criteria, strict=False):
        for index, model in enumerate(models):
            points = sorted(series.get((model, criterion), ()))
            if not points:
                continue
            x, y, lo, hi = zip(*points, strict=True)
            ax.plot(x, y, label=model, **style.series(index))
            errors = style.interval_errors(y, lo, hi)
            if errors is not None:
                ax.errorbar(x, y, yerr=errors, fmt="none", ecolor=style.PALETTE[index % len(style.PALETTE)],
                            elinewidth=0.5)
        if criterion == "d_pct":
            style.d_axis(ax, [r.value for r in rows if r.measure == criterion])
        ax.set_xlim(-0.03, 1.03)
        ax.set_xlabel("relative depth")
        ax.set_ylabel(LABELS.get(criterion, criterion))
        ax.legend(loc="best")
    for ax in axes[len(criteria):]:
        ax.remove()
    fig.suptitle(f"atlas {result.name}: {len(models)} models", fontsize=7)
    return fig
