"""The growth timeline: each arm's phases in order with the current one highlighted, per-phase
progress, the network drawn growing (which layers exist in each phase), and the final table."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine.experiments.growth.vocabulary import GrowthArm
from tui.state import GrowthView
from tui.widgets.status_line import text_bar


def _phase_progress(phase: dict[str, Any], step: int) -> float:
    start, steps = int(phase.get("start", 0)), max(1, int(phase.get("steps", 1)))
    return min(1.0, max(0.0, (step - start) / steps))


def timeline_text(growth: GrowthView, preview: tuple[str, dict[str, Any]] | None = None, status: str = "") -> Text:
    """Each arm's phases; before any run, the phases the form's flags would run (`preview`);
    `status` `cancelling` once its running job was asked to stop."""
    arms: dict[str, Any] = growth.plan.arms if growth.plan else {}
    text = Text()
    if status == "cancelling":
        text.append("cancelling: the run stops at its next step\n", style="bold yellow")
    if not arms and preview is not None:
        flags, arms = preview
        text.append(f"planned ({flags}); key g starts it\n", style="dim")
    if not arms:
        return Text("no growth run in this session yet (key g starts a tiny one)", style="dim")
    positions = sorted({layer for arm in arms.values() for p in arm["phases"] for layer in p["layers"]})
    for name, arm in arms.items():
        step = growth.step.get(name, 0)
        done = name in growth.arm_done
        text.append(f"{name}", style="bold")
        text.append(f"  step {step}/{arm['steps']}{'  done' if done else ''}\n", style="dim")
        current = growth.current[name].phase if name in growth.current else None
        for phase in arm["phases"]:
            share = 1.0 if done else _phase_progress(phase, step)
            active = phase["name"] == current and not done
            style = "reverse bold" if active else ("" if share >= 1.0 else "dim")
            layers = set(phase["layers"])
            network = "".join("■" if p in layers else "·" for p in positions)
            text.append(f"  {phase['name']:<13}", style=style)
            filled = round(share * phase["steps"])
            text.append(f" {phase['steps']:>5} {text_bar(filled, phase['steps'], 8)} {network} {len(layers)}L\n")
    return text


def comparison_table(arms: dict[str, GrowthArm]) -> Table | Text:
    """The final growth-against-uniform table from results/growth.json, compact (it sits above the
    timeline, in a third of the dashboard): the spread over seeds only where there are several (one
    seed has none: said as n=1 in the title)."""
    if not arms:
        return Text("final comparison: when the run finishes", style="dim")
    seeds = max(len(arm.val_loss) for arm in arms.values())
    title = "final comparison" + (f" (n={seeds} seeds)" if seeds > 1 else " (n=1 seed: no sd)")
    table = Table(title=title, box=box.SIMPLE_HEAD, expand=False, pad_edge=False, title_justify="left")
    columns = ("arm", "val loss", *(["± sd"] if seeds > 1 else []), "s", "tok/s")  # steps: in the timeline
    for column in columns:
        table.add_column(column, justify="left" if column == "arm" else "right", no_wrap=True)
    for name, arm in arms.items():
        spread = [f"{arm.sd:.4f}" if len(arm.val_loss) > 1 else "n=1"] if seeds > 1 else []
        table.add_row(name, f"{arm.mean:.4f}", *spread, f"{arm.seconds:.1f}", f"{arm.tokens_per_s:,.0f}")
    return table


class GrowthTimeline(Static):
    def show(self, growth: GrowthView, preview: tuple[str, dict[str, Any]] | None = None, status: str = "") -> None:
        self.update(timeline_text(growth, preview, status))


class GrowthTable(Static):
    def show(self, arms: dict[str, GrowthArm]) -> None:
        self.update(comparison_table(arms))
