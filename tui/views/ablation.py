"""The ablation map as `anatomy-tui run ablation` prints it (the console draws it on the Layers tab)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from engine.experiments.ablation.vocabulary import AblationMap


def print_result(doc: dict[str, Any]) -> None:
    """The map with each cheap measure named by its definition: BI, the angular distance over all
    tokens (`ang all`) and of the last token (`ang last`, the field's), and Gromov et al.'s
    last-token block search (the best block of each length)."""
    result = AblationMap.from_json(doc)
    last = all(isinstance(row.angular_last_token, float) for row in result.layers)
    table = Table(title=f"{result.model}  baseline PPL {result.baseline_ppl:.2f}  ({result.method})")
    for column in ("layer", "PPL", "D %", "95% CI", "class", "BI", "ang all", *(("ang last",) if last else ())):
        table.add_column(column, justify="right")
    for row in result.layers:
        ci = "" if row.ci_low is None else f"[{row.ci_low:.1f}, {row.ci_high:.1f}]"
        label = row.layer_class + (" anti" if row.anti else " anti?" if row.anti_within_noise else "")
        table.add_row(str(row.layer), f"{row.ppl:.2f}", f"{row.degradation_pct:.1f}", ci, label,
                      f"{row.block_influence:.3f}", f"{row.angular_distance:.3f}",
                      *((f"{row.angular_last_token:.3f}",) if last else ()))
    Console().print(table)
    rho = result.spearman
    shown = {"block_influence": "block influence", "angular_distance": "angular_all_tokens",
             "angular_last_token": "angular_last_token"}
    print("Spearman vs D: " + ", ".join(f"{shown.get(k, k)} {_rho(v)}" for k, v in rho.items()))
    if result.angular_block_best:
        blocks = [f"n={n}: layers {start}-{start + int(n) - 1} ({result.angular_blocks[n][start]:.3f})"
                  for n, start in result.angular_block_best.items() if int(n) < len(result.layers)][:8]
        print("angular_block_n (last token, Gromov et al.), the closest block of each length: " + "; ".join(blocks))


def _rho(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"
