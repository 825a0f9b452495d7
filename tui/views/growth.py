"""The growth comparison as `anatomy-tui run growth` prints it (the console follows a run on the
Growth tab)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from engine.experiments.growth.vocabulary import GrowthResult
from tui.views._tables import WholeConsole


def print_result(doc: dict[str, Any]) -> None:
    """The comparison, the budget table and the generations side by side."""
    result = GrowthResult.from_json(doc)
    console = WholeConsole()
    params = result.params
    console.print(
        f"parameters: growth {params['growth']:,}  uniform {params['uniform']:,} "
        f"({100 * (params['uniform'] / params['growth'] - 1):+.3f} %)", highlight=False,
    )  # fmt: skip
    arms = Table(title=f"growth vs uniform, preset {result.preset}")
    for column in ("arm", "steps", "val loss mean", "sd", "seeds", "train s", "tokens/s"):
        arms.add_column(column, justify="right" if column != "arm" else "left")
    for name, arm in result.arms.items():
        arms.add_row(
            name, str(arm.steps), f"{arm.mean:.4f}", f"{arm.sd:.4f}", str(len(arm.val_loss)),
            f"{arm.seconds:.1f}", f"{arm.tokens_per_s:,.0f}",
        )  # fmt: skip
    console.print(arms)
    budget = Table(title="effective steps (epochs) per layer")
    budget.add_column("layer")
    budget.add_column("class")
    for name in result.arms:
        budget.add_column(name, justify="right")
    for row in result.budget_table:
        cells = [f"{row.steps[a]} ({row.epochs[a]:.2f})" for a in result.arms]
        budget.add_row(str(row.layer), row.layer_class, *cells)
    console.print(budget)
    gens = Table(title="greedy generations", show_lines=True)
    gens.add_column("prompt")
    for name in result.arms:
        gens.add_column(name)
    for generated in result.generations:
        gens.add_row(generated["prompt"], *(repr(generated[a])[1:-1] for a in result.arms))
    console.print(gens)
    ratio = result.ratio_uniform_over_growth_seconds
    if ratio is not None:
        g, u = result.arms["growth_100"].mean, result.arms["uniform_100"].mean
        console.print(
            f"growth_100 vs uniform_100: val loss {g:.4f} vs {u:.4f} ({u / g:.2f}x), uniform/growth seconds "
            f"{ratio:.2f}; the paper: 0.127 vs 0.599 (4.7x), 59.6 s / 52.0 s = 1.15", highlight=False,
        )  # fmt: skip
