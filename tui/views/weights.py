"""The weights result, as `anatomy-tui run weights` prints it and the Analyses pane shows it:
predictability against the two nulls, then the R²-perplexity paradox."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from tui.views import Analysis
from tui.views._format import fmt

ANALYSIS = Analysis("Weight statistics and their null models", place=1)


def summary(doc: dict[str, Any], command: str = "") -> Group:
    """Predictability against the two nulls, then the R²-perplexity paradox. Read defensively: the
    console shows it for any session's file."""
    components = doc.get("components") or {}
    first, last = (doc.get("predicted_layers") or ["?", "?"])[:2]
    table = Table(title=f"{doc.get('model', '')}: predictability of layers {first}-{last} "
                        "(real / shuffled order / independent layers)")
    for column in ("component", "R² in-sample", "R² leave-one-out", "cos LOO", "delta corr mean", "delta sd",
                   "R² in / LOO, all layers"):
        table.add_column(column, justify="right")
    lines: list[Any] = [table]
    for name, comp in components.items():
        shuffled, independent = comp.get("null_shuffled") or {}, comp.get("null_independent") or {}

        def cell(key: str, comp=comp, shuffled=shuffled, independent=independent) -> str:
            return f"{fmt(comp.get(key))} / {fmt(shuffled.get(key))} / {fmt(independent.get(key))}"

        every = comp.get("all_layers") or {}
        table.add_row(name, cell("r2_in_sample"), cell("r2_loo"), cell("cosine_loo"), cell("delta_corr_mean"),
                      cell("delta_corr_sd"), f"{fmt(every.get('r2_in_sample'))} / {fmt(every.get('r2_loo'))}")
    for name, comp in components.items():
        reading = comp.get("reading") or {}
        if reading:
            lines.append(Text(f"{name}: delta correlation {reading.get('delta_corr_mean')}; "
                              f"leave-one-out R² {reading.get('r2_loo')}"))
    rows = doc.get("paradox") or []
    if rows:
        paradox = Table(title=f"R²-perplexity paradox (baseline PPL {fmt(doc.get('baseline_ppl'), '.2f')}, "
                              f"{rows[0].get('prediction')} predictions)")
        for column in ("layers replaced", "PPL", "D %", "mean R² in-sample", "mean R² LOO", "mean cos"):
            paradox.add_column(column, justify="right")
        for row in rows:
            layers = row.get("layers_replaced") or []
            label = ",".join(map(str, layers)) if len(layers) <= 9 else f"{len(layers)} layers"
            paradox.add_row(label, fmt(row.get("ppl"), ".2f", "inf"), fmt(row.get("degradation_pct"), ".1f", "inf"),
                            fmt(row.get("r2_in_sample_mean")), fmt(row.get("r2_loo_mean")),
                            fmt(row.get("cosine_mean")))
        lines.append(paradox)
    return Group(*lines)


def print_result(doc: dict[str, Any]) -> None:
    Console().print(summary(doc))
