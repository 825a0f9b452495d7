"""The weights result, as `anatomy-tui run weights` prints it and the Analyses pane shows it:
predictability against the two nulls, then the R²-perplexity paradox."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from engine.experiments.weights.vocabulary import WeightsResult, WeightStats
from tui.views import Analysis
from tui.views._format import fmt
from tui.views._tables import WholeConsole

ANALYSIS = Analysis("Weight statistics and their null models", place=1)


def summary(result: WeightsResult, command: str = "") -> Group:
    """Predictability against the two nulls, then the R²-perplexity paradox."""
    shown: list[int | str] = [*result.predicted_layers] or ["?", "?"]
    first, last = shown[:2]
    table = Table(title=f"{result.model}: predictability of layers {first}-{last} "
                        "(real / shuffled order / independent layers)")
    for column in ("component", "R² in-sample", "R² leave-one-out", "cos LOO", "delta corr mean", "delta sd",
                   "R² in / LOO, all layers"):
        table.add_column(column, justify="right")
    lines: list[Any] = [table]
    for name, comp in result.components.items():

        def cell(value: Callable[[WeightStats], float | None], comp=comp) -> str:
            return f"{fmt(value(comp))} / {fmt(value(comp.null_shuffled))} / {fmt(value(comp.null_independent))}"

        every = comp.all_layers
        table.add_row(name, cell(lambda s: s.r2_in_sample), cell(lambda s: s.r2_loo), cell(lambda s: s.cosine_loo),
                      cell(lambda s: s.delta_corr_mean), cell(lambda s: s.delta_corr_sd),
                      f"{fmt(every.r2_in_sample)} / {fmt(every.r2_loo)}")
    for name, comp in result.components.items():
        reading = comp.reading
        if reading:
            lines.append(Text(f"{name}: delta correlation {reading.get('delta_corr_mean')}; "
                              f"leave-one-out R² {reading.get('r2_loo')}"))
    rows = result.paradox
    if rows:
        paradox = Table(title=f"R²-perplexity paradox (baseline PPL {fmt(result.baseline_ppl, '.2f')}, "
                              f"{rows[0].prediction} predictions)")
        for column in ("layers replaced", "PPL", "D %", "mean R² in-sample", "mean R² LOO", "mean cos"):
            paradox.add_column(column, justify="right")
        for row in rows:
            layers = row.layers_replaced
            label = ",".join(map(str, layers)) if len(layers) <= 9 else f"{len(layers)} layers"
            paradox.add_row(label, fmt(row.ppl, ".2f", "inf"), fmt(row.degradation_pct, ".1f", "inf"),
                            fmt(row.r2_in_sample_mean), fmt(row.r2_loo_mean), fmt(row.cosine_mean))
        lines.append(paradox)
    return Group(*lines)


def print_result(doc: dict[str, Any]) -> None:
    WholeConsole().print(summary(WeightsResult.from_json(doc)))
