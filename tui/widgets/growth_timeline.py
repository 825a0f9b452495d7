"""The growth timeline: each arm's phases in order with the current one highlighted, per-phase
progress, the network drawn growing (which layers exist in each phase), and the final table.

Both fit the cells they are given (an 80x24 terminal gives them half its width and a few rows): a
row never wraps a drawing and a number is never cut; what gives way is the less important part (a
phase's length, the bar's width, a name's tail, a column of the table, the phases an arm is not in)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text
from textual.app import RenderResult as WidgetRender
from textual.widget import Widget
from textual.widgets import Static

from engine.experiments.growth.vocabulary import GrowthArm
from tui.state import GrowthView
from tui.widgets.status_line import text_bar


def _phase_progress(phase: dict[str, Any], step: int) -> float:
    start, steps = int(phase.get("start", 0)), max(1, int(phase.get("steps", 1)))
    return min(1.0, max(0.0, (step - start) / steps))


@dataclass(frozen=True)
class RowLayout:
    """How a phase's row is drawn: indent, the name's column, the phase's length shown or not, the
    bar's width, and the network on its own line (under the name) when nothing else makes it fit."""

    indent: int = 2
    name: int = 13
    steps: bool = True
    bar: int = 8
    network_below: bool = False

    def width(self, network: int, count: int) -> int:
        """The cells the row takes (its widest line)."""
        head = self.indent + self.name + (6 if self.steps else 0) + 1 + self.bar
        return max(head + 1 + count, self.indent + 2 + network) if self.network_below else head + 2 + network + count


def row_layout(names: list[str], network: int, count: int, width: int) -> RowLayout:
    """The fullest layout whose rows fit `width` (0: no limit): first the phase's length goes, then the
    bar narrows, then names lose their tails (down to 4 cells), then the network goes under the name."""
    full = RowLayout(name=max(map(len, names), default=0))
    if width <= 0:
        return full
    short = replace(full, steps=False)
    for layout in (full, short, replace(short, bar=4), replace(short, indent=1, bar=4)):
        if layout.width(network, count) <= width:
            return layout
    cut = RowLayout(indent=1, name=width - network - count - 8, steps=False, bar=4)
    if cut.name >= 4:
        return cut
    return replace(cut, name=max(4, min(full.name, width - count - 7)), network_below=True)


def _name(name: str, cells: int) -> str:
    return name if len(name) <= cells else name[: cells - 1] + "…"


def _shown_phases(arm: dict[str, Any], current: str | None, done: bool) -> list[dict[str, Any]]:
    """The one phase an arm is in (its last once done, its first before it starts): a short panel's row."""
    phases: list[dict[str, Any]] = arm["phases"]
    if done:
        return phases[-1:]
    return [p for p in phases if p["name"] == current][:1] or phases[:1]


def timeline_text(growth: GrowthView, preview: tuple[str, dict[str, Any]] | None = None, status: str = "",
                  width: int = 0, height: int = 0) -> Text:
    """Each arm's phases; before any run, the phases the form's flags would run (`preview`);
    `status` `cancelling` once its running job was asked to stop. Fitted to `width` x `height` cells
    (0: no limit): too few rows for every phase, each arm shows the phase it is in."""
    arms: dict[str, Any] = growth.plan.arms if growth.plan else {}
    head = Text()
    if status == "cancelling":
        head.append("cancelling: the run stops at its next step\n", style="bold yellow")
    if not arms and growth.job and status:  # a run started and not planned yet: what its job says (starting)
        return Text(status, style="dim")
    if not arms and preview is not None:
        flags, arms = preview
        head.append(f"planned ({flags}); key g starts it\n", style="dim")
    if not arms:
        return Text("no growth run in this session yet (key g starts a tiny one)", style="dim")
    positions = sorted({layer for arm in arms.values() for p in arm["phases"] for layer in p["layers"]})
    names = [p["name"] for arm in arms.values() for p in arm["phases"]]
    layout = row_layout(names, len(positions), len(f"{len(positions)}L"), width)
    head_rows = len(head.wrap(Console(width=width), width)) if width and head else head.plain.count("\n")
    short = 0 < height < head_rows + len(arms) + (2 if layout.network_below else 1) * len(names)
    text = head
    for name, arm in arms.items():
        step = growth.step.get(name, 0)
        done = name in growth.arm_done
        current = growth.current[name].phase if name in growth.current else None
        phases = _shown_phases(arm, current, done) if short else arm["phases"]
        text.append(f"{name}", style="bold")
        where = f" · phase {arm['phases'].index(phases[0]) + 1}/{len(arm['phases'])}" if short else ""
        text.append(f"  step {step}/{arm['steps']}{'  done' if done else ''}{where}\n", style="dim")
        for phase in phases:
            share = 1.0 if done else _phase_progress(phase, step)
            active = phase["name"] == current and not done
            style = "reverse bold" if active else ("" if share >= 1.0 else "dim")
            layers = set(phase["layers"])
            network = "".join("■" if p in layers else "·" for p in positions)
            text.append(" " * layout.indent)
            text.append(f"{_name(phase['name'], layout.name):<{layout.name}}", style=style)
            length = f" {phase['steps']:>5}" if layout.steps else ""
            bar = text_bar(round(share * phase["steps"]), phase["steps"], layout.bar)
            count = f"{len(layers)}L"
            if layout.network_below:
                text.append(f"{length} {bar} {count}\n{' ' * (layout.indent + 2)}{network}\n")
            else:
                text.append(f"{length} {bar} {network} {count}\n")
    text.rstrip()
    return text


HEADERS = {"arm": "arm", "loss": "val loss", "sd": "± sd", "s": "s", "tok/s": "tok/s"}
# what gives way when the table is wider than its cells: the seconds, then the throughput
DROPPED: tuple[tuple[str, ...], ...] = ((), ("s",), ("s", "tok/s"))


def comparison_table(arms: dict[str, GrowthArm], width: int = 0, previous: bool = False) -> Group | Text:
    """The final growth-against-uniform table from results/growth.json, compact (it sits above the
    timeline, in a third of the dashboard): the spread over seeds only where there are several (one
    seed has none: said as n=1 in the title). Fitted to `width` cells (0: no limit): the seconds,
    then the throughput, give way; narrower still, a line per arm that wraps between its numbers.
    `previous`: the arms are an earlier run's (a new run is under way), and the title says so."""
    if not arms:
        return Text("final comparison: when the run finishes", style="dim")
    seeds = max(len(arm.val_loss) for arm in arms.values())
    title = ("previous run's " if previous else "") + "final comparison" + (
        f" (n={seeds} seeds)" if seeds > 1 else " (n=1 seed: no sd)")
    rows = {name: {"loss": f"{arm.mean:.4f}",
                   **({"sd": f"{arm.sd:.4f}" if len(arm.val_loss) > 1 else "n=1"} if seeds > 1 else {}),
                   "s": f"{arm.seconds:.1f}", "tok/s": f"{arm.tokens_per_s:,.0f}"}
            for name, arm in arms.items()}  # fmt: skip
    measure = Console(width=10_000)  # the table's own width, not one a narrower console would squeeze it to
    for dropped in DROPPED if width > 0 else DROPPED[:1]:
        keys = [key for key in next(iter(rows.values())) if key not in dropped]
        table = Table(box=box.SIMPLE_HEAD, expand=False, show_edge=False, pad_edge=False, collapse_padding=True)
        for key in ("arm", *keys):
            table.add_column(HEADERS[key], justify="left" if key == "arm" else "right", no_wrap=True)
        for name, cells in rows.items():
            table.add_row(name, *(cells[key] for key in keys))
        if width <= 0 or measure.measure(table).maximum <= width:
            return Group(Text(title, style="italic"), table)  # the title over the whole width, not the table's
    lines = Text(title, style="italic")
    for name, cells in rows.items():
        lines.append(f"\n{name}: " + "  ".join(f"{HEADERS[key]} {value}" for key, value in cells.items()))
    return lines


@dataclass(frozen=True)
class Comparison:
    """The final table, laid out at render time for the width it is given."""

    arms: dict[str, GrowthArm]
    previous: bool = False

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield comparison_table(self.arms, options.max_width, self.previous)


class GrowthTimeline(Widget):
    """Drawn for its own size at each render (the CSS gives it the rows the pane has left)."""

    growth: GrowthView = GrowthView()
    preview: tuple[str, dict[str, Any]] | None = None
    status: str = ""

    def show(self, growth: GrowthView, preview: tuple[str, dict[str, Any]] | None = None, status: str = "") -> None:
        self.growth, self.preview, self.status = growth, preview, status
        self.refresh()

    def render(self) -> WidgetRender:
        return timeline_text(self.growth, self.preview, self.status, self.size.width, self.size.height)


class GrowthTable(Static):
    def show(self, arms: dict[str, GrowthArm], previous: bool = False) -> None:
        """`previous`: the arms are an earlier run's result, shown under a new run's live steps."""
        self.update(Comparison(arms, previous))
