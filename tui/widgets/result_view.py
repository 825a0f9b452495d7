"""A view of one saved result (weight statistics, angle profiles, scaling fit): its numbers in a
readable tree, or one line that says the experiment is not there yet and how to run it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Group
from rich.pretty import Pretty
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

MAX_ITEMS = 40  # long lists are cut in the view; the file has everything


def _trimmed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _trimmed(v) for k, v in value.items()}
    if isinstance(value, list):
        head = [_trimmed(v) for v in value[:MAX_ITEMS]]
        return head + ([f"... {len(value) - MAX_ITEMS} more"] if len(value) > MAX_ITEMS else [])
    if isinstance(value, float):
        return float(f"{value:.5g}")
    return value


def _num(value: Any, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def weights_summary(doc: dict[str, Any]) -> Table:
    """Per matrix: how predictable a layer's weights are from its depth, against the two nulls."""
    table = Table(title=f"weight predictability ({doc.get('model', '')})", expand=False)
    for column in ("matrix", "R² in", "R² LOO", "shuffled R² in", "indep. R² in", "Δ corr"):
        table.add_column(column, justify="right")
    for name, comp in doc.get("components", {}).items():
        table.add_row(
            name, _num(comp.get("r2_in_sample")), _num(comp.get("r2_loo")),
            _num((comp.get("null_shuffled") or {}).get("r2_in_sample")),
            _num((comp.get("null_independent") or {}).get("r2_in_sample")), _num(comp.get("delta_corr_mean")),
        )  # fmt: skip
    return table


def paradox_summary(doc: dict[str, Any]) -> Table | None:
    rows = doc.get("paradox") or []
    if not rows:
        return None
    table = Table(title="R²-perplexity paradox: layers replaced by their predicted weights", expand=False)
    for column in ("layers", "PPL", "D %", "R² in", "cosine"):
        table.add_column(column, justify="right")
    for row in rows:
        layers = row.get("layers_replaced", [])
        shown = ",".join(map(str, layers)) if len(layers) <= 6 else f"{len(layers)} layers"
        table.add_row(
            shown,
            _num(row.get("ppl"), ",.1f"),
            _num(row.get("degradation_pct"), "+,.0f"),
            _num(row.get("r2_in_sample_mean")),
            _num(row.get("cosine_mean")),
        )
    return table


SUMMARIES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "weights": lambda doc: Group(*(t for t in (weights_summary(doc), paradox_summary(doc)) if t is not None)),
}


class ResultView(Static):
    """Shows `results/<name>.json`; `available` says whether the experiment exists in this install."""

    def show(self, name: str, doc: dict[str, Any] | None, command: str, available: bool) -> None:
        if doc is not None:
            summary = SUMMARIES.get(name)
            self.update(summary(doc) if summary else Pretty(_trimmed(doc), expand_all=False))
        elif not available:
            self.update(Text("this experiment is not in this version of anatomy-tui yet", style="dim"))
        else:
            self.update(Text(f"not run in this session yet; run:  {command}", style="dim"))
