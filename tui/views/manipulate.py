"""The manipulate result, as `anatomy-tui run manipulate` prints it and the Analyses pane shows it:
per layer edit, its strategy and parameter, perplexity, degradation and the greedy sample."""

from __future__ import annotations

from typing import Any

from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from engine.experiments.manipulate.vocabulary import ManipulateResult
from tui.palette import class_style
from tui.views import Analysis
from tui.views._tables import WholeConsole

ANALYSIS = Analysis("Weight manipulation strategies", place=2)
SAMPLE_WIDTH = 70


def summary(result: ManipulateResult, command: str = "") -> Table:
    """results/manipulate.json as rows: layers, strategy, its parameter, ppl, D %, the sample."""
    table = Table(title=f"baseline ppl {result.baseline_ppl:,.2f} · sample: {result.baseline_sample[:60]!r}",
                  expand=False)  # fmt: skip
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("layers", "left"), ("strategy", "left"), ("param", "right"), ("ppl", "right"), ("D %", "right"),
        ("greedy sample", "left"))
    for column, justify in columns:
        table.add_column(column, justify=justify)
    for row in result.results:
        d = row.degradation_pct
        style = class_style("anti") if d is not None and d < 0 else ""  # the edit helps: as on the map
        table.add_row(
            ",".join(map(str, row.layers)) + (" (together)" if row.together else ""),
            row.strategy,
            "" if row.param is None else f"{row.param:g}",
            "" if row.ppl is None else f"{row.ppl:,.2f}",
            Text("" if d is None else f"{d:+,.1f}", style=style),
            row.sample.replace("\n", " ")[:SAMPLE_WIDTH],
        )
    return table


def print_result(doc: dict[str, Any]) -> None:
    result = ManipulateResult.from_json(doc)
    console = WholeConsole()
    console.print(f"{result.model}  prompt {result.prompt!r}", highlight=False)
    console.print(summary(result))
    console.print(f"baseline sample: {result.baseline_sample!r}", highlight=False)
