"""The recovery result as `anatomy-tui run recovery` prints it (the console draws its curves on the
Recovery tab), and what a run says there before its first point."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from engine.experiments.recovery.vocabulary import RecoveryResult
from tui.panel_records import JobView
from tui.views._format import fmt
from tui.views._tables import WholeConsole


def waiting_line(job: JobView | None) -> str:
    """What a recovery run says before its first point: its job's own word while its process starts
    (`starting: loading the model in its own process`), then the pass under way with its count
    (`baseline: texts 12/48`), `cancelling…` once asked to stop."""
    if job is not None and job.cancelling:
        return "cancelling…"
    if job is None or not job.label:
        return "waiting for the first point"
    if not job.total:
        return job.label
    return f"{job.label}: {' '.join(filter(None, (job.unit, f'{job.done}/{job.total}')))}"


def _steps(value: int | None) -> str:
    return "never" if value is None else str(value)


def print_result(doc: dict[str, Any]) -> None:
    result = RecoveryResult.from_json(doc)
    if result.partial is True:  # a stopped sweep's: the layers it finished
        print(f"{result.partial_text()} (the sweep stopped before its last layer; --resume goes on from them)")
    settings = result.settings
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
        title=f"{result.model}  baseline PPL {result.baseline_ppl:.2f}  sigma {settings.sigma}  "
        f"{settings.steps} steps  lr {settings.lr}"
    )  # fmt: skip
    columns = ("layer", "status", "noised", "<2x", "<1.5x", "<1.1x", "best", "final", "x base", "better")
    for column in columns:
        table.add_column(column, justify="right")
    for row in result.layers:
        steps = row.steps_to
        table.add_row(
            str(row.layer), row.status, fmt(row.ppl_after_noise, ".1f", "-"),
            _steps(steps["2.0"]), _steps(steps["1.5"]), _steps(steps["1.1"]),
            fmt(row.best_ppl, ".2f", "-"), fmt(row.final_ppl, ".2f", "-"),
            fmt(row.final_ratio, ".2f", "-"), "yes" if row.improved_over_baseline else "no",
        )  # fmt: skip
    console = WholeConsole()
    console.print(table)
    budget = result.budget
    console.print(f"hardest first: {', '.join(map(str, result.ranking))}", highlight=False)
    console.print(f"Spearman(difficulty, ablation D): {result.spearman_vs_ablation}", highlight=False)
    console.print(
        f"budget: uniform {budget.uniform_total} steps, by difficulty {budget.proposed_total} "
        f"(saves {budget.saving_pct:.0f}%)", highlight=False,
    )  # fmt: skip
