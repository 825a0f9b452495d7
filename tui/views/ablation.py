"""The ablation map as `anatomy-tui run ablation` prints it (the console draws it on the Layers tab)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from engine.events import AblationMap


def print_result(doc: dict[str, Any]) -> None:
    result = AblationMap.from_json(doc)
    table = Table(title=f"{result.model}  baseline PPL {result.baseline_ppl:.2f}  ({result.method})")
    for column in ("layer", "PPL", "D %", "95% CI", "class", "BI", "ang"):
        table.add_column(column, justify="right")
    for row in result.layers:
        ci = "" if row.ci_low is None else f"[{row.ci_low:.1f}, {row.ci_high:.1f}]"
        label = row.layer_class + (" anti" if row.anti else " anti?" if row.anti_within_noise else "")
        table.add_row(str(row.layer), f"{row.ppl:.2f}", f"{row.degradation_pct:.1f}", ci, label,
                      f"{row.block_influence:.3f}", f"{row.angular_distance:.3f}")
    Console().print(table)
    rho = result.spearman
    print(f"Spearman vs D: block influence {rho['block_influence']}, angular distance {rho['angular_distance']}")
