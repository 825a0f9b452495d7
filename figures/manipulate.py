"""Manipulation strategies: the perplexity rise D % of every trial (zero, clone, blend, low-rank,
scale at each alpha; one layer or all together) as horizontal bars on a symmetric log axis, one
colour and hatch per strategy."""

from __future__ import annotations

from matplotlib.figure import Figure

from engine.experiments.manipulate.vocabulary import ManipulateResult, ManipulateRow
from figures import style


def trial_label(row: ManipulateRow) -> str:
    param = "" if row.param is None else (f" α={row.param:g}" if row.strategy == "scale" else f" r={row.param:g}")
    where = "L" + ",".join(str(layer) for layer in row.layers)
    return f"{row.strategy}{param} · {where}{' (together)' if row.together else ''}"


def draw(result: ManipulateResult) -> Figure:
    drawn = [(row, pct) for row in result.results if style.finite(pct := row.degradation_pct)]
    rows = [row for row, _ in drawn]
    strategies = list(dict.fromkeys(row.strategy for row in rows))
    fig = style.figure(height=0.6 + 0.16 * max(len(rows), 3))
    ax = fig.subplots()
    for index, (row, pct) in enumerate(drawn):
        look = style.bar_look(strategies.index(row.strategy))
        first = next(r for r in rows if r.strategy == row.strategy) is row
        ax.barh(index, pct, height=0.7, label=row.strategy if first else None, **look)
    ax.set_yticks(range(len(rows)), [trial_label(row) for row in rows])
    ax.invert_yaxis()
    style.d_axis(ax, [row.degradation_pct for row in rows], axis="x")
    ax.set_xlabel("D (%)")
    ax.set_title(f"{result.model}: baseline PPL {result.baseline_ppl:.3g}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
