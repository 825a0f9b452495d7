"""The console's panes that are out of view when it first paints: Recovery, Growth, Prompt,
Analyses and Log (the tabs show the layer map first). The console screen builds them just after its
first paint (tui/screens/console.py imports this module then), so neither their widgets nor the
modules behind them (the plots' plotext, every experiment's view in tui/views/) delay that paint;
benchmarks/startup.py measures it against an empty Textual app's.

Here too is what draws into them that needs those modules: the recovery and growth plots and the
Analyses pane."""

from __future__ import annotations

import shlex

from rich.text import Text
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Input, Label, RichLog, Static

from engine.registry import BY_NAME
from tui.state import Dirty, SessionState
from tui.views import analyses, analyses_widgets, show_analyses
from tui.views.recovery import waiting_line
from tui.widgets.curve_plot import Curve, CurvePlot
from tui.widgets.growth_timeline import GrowthTable, GrowthTimeline
from tui.widgets.prompt_column import PromptColumn

RATIO_LINES = (("2x", 2.0), ("1.5x", 1.5), ("1.1x", 1.1))
CURVE_COLOURS = ("cyan", "magenta", "orange", "green", "blue", "red")
ARM_COLOURS = {"growth_100": "green", "growth_50": "cyan", "uniform_100": "magenta"}
DEFERRED = ("recovery", "growth", "prompt", "analyses", "log")  # each pane's container is the screen's own


def pane_children() -> dict[str, list[Widget]]:
    """The widgets of each deferred pane, by the id of the (empty, already mounted) pane they fill."""
    declared = BY_NAME["recovery"].default_texts()
    return {
        "recovery": [
            Vertical(
                Label("", id="recovery-layer"),
                Label("sigma (x std of W)"),
                Input(declared["sigma"], id="sigma", type="number"),
                Label("steps"),
                Input(declared["steps"], id="steps", placeholder="auto, or a number"),
                Label("lr"),
                Input(declared["lr"], id="lr"),
                Static("", id="recovery-info"),
                id="recovery-form",
            ),
            CurvePlot(id="recovery-plot"),
        ],
        "growth": [
            VerticalScroll(
                Label("g starts: anatomy-tui run growth FLAGS"),
                Input(shlex.join(BY_NAME["growth"].console_flags), id="growth-flags"),
                GrowthTable(id="growth-table"),  # the final comparison first: never below the fold
                GrowthTimeline(id="timeline"),
                id="growth-left",
            ),
            CurvePlot(id="growth-plot"),
        ],
        "prompt": [
            Input(placeholder="type a prompt and press Enter (F9 stops)", id="prompt-input"),
            Horizontal(PromptColumn("original", id="left"), PromptColumn("modified", id="right"),
                       id="prompt-columns"),
        ],
        "analyses": list(analyses_widgets()),  # each experiment's own (tui/views/)
        "log": [RichLog(id="log-view", wrap=True, markup=False, max_lines=2000)],
    }


def analysis_figures() -> tuple[str, ...]:
    """The results whose figures F8 saves from the Analyses pane: every analysis it shows."""
    return tuple(BY_NAME[name].writes for name, _ in analyses())


def redraw(screen: Widget, state: SessionState, dirty: set[str], layer: int | None, form_steps: int | None,
           session_name: str) -> None:
    """The deferred panes' part of the screen's redraw of `dirty`; `layer` is the map's selection,
    `form_steps` the recovery form's step budget."""
    if dirty & {Dirty.RECOVERY, Dirty.LAYERS, Dirty.SELECTION, Dirty.JOBS}:  # JOBS: a run's pass before its points
        redraw_recovery(screen, state, layer, form_steps)
    if dirty & {Dirty.GROWTH, Dirty.RESULTS, Dirty.JOBS}:
        growth = state.growth  # a run under way or stopped: the table is an earlier run's
        status = state.shown_status(growth.job, growth.status)
        if growth.job and growth.plan is None and status == "running":  # before its plan: what its job says
            status = waiting_line(state.jobs.get(growth.job))
        screen.query_one(GrowthTimeline).show(growth, state.growth_preview, status)
        screen.query_one(GrowthTable).show(state.growth_arms, previous=bool(growth.job) and growth.status != "done")
        redraw_growth_plot(screen, state)
    if Dirty.RESULTS in dirty:
        show_analyses(screen, state, session_name)


def redraw_recovery(screen: Widget, state: SessionState, layer: int | None, form_steps: int | None) -> None:
    label = screen.query_one("#recovery-layer", Label)
    info = screen.query_one("#recovery-info", Static)
    plot = screen.query_one("#recovery-plot", CurvePlot)
    label.update(Text(f"layer {layer if layer is not None else '-'}\ni inject · c cancel", style="bold"))
    everything = state.recovery
    runs = [run for run in everything if run.layer == layer]  # the map's selection drives the plot
    curves = [
        Curve(
            run.label + ("" if (shown := state.shown_status(run.job, run.status)) in ("running", "done")
                         else f" {shown}"),
            run.points,
            CURVE_COLOURS[i % len(CURVE_COLOURS)],
        )
        for i, run in enumerate(runs[-6:])
    ]
    base = next((run.baseline_ppl for run in reversed(everything) if run.baseline_ppl), None)
    if base is None:
        base = state.ablation_baseline
    refs: list[tuple[str, float]] = []
    if isinstance(base, (int, float)):
        refs = [("baseline", base), *((name, base * k) for name, k in RATIO_LINES)]
    budget = runs[-1].steps if runs and runs[-1].steps else form_steps
    plot.draw(
        curves,
        refs,
        title="eval perplexity while the layer recovers",
        xlabel="step" if budget else "step (auto: known when the run starts)",
        ylabel="ppl",
        log_y=True,
        xspan=(0.0, float(budget or 1)),  # the baseline and its ratios drawn before any run, auto steps too
    )
    current = runs[-1] if runs else None
    if current is None:
        others = ", ".join(sorted({f"L{run.layer}" for run in everything}))
        hint = f"no run on layer {layer} yet (runs on: {others})" if others else "no run yet"
        info.update(Text(f"{hint}: set sigma, steps, lr and press i", style="dim"))
    else:
        last = current.points[-1] if current.points else None
        now = f"step {last[0]:g}: ppl {last[1]:,.2f}" if last else waiting_line(state.jobs.get(current.job))
        info.update(f"{current.label} {state.shown_status(current.job, current.status)}\n{now}")


def redraw_growth_plot(screen: Widget, state: SessionState) -> None:
    growth = state.growth
    curves = [  # each arm's training loss in its colour, every validation loss white: one legend entry
        Curve(arm, pts, ARM_COLOURS.get(arm.split("/")[0], "blue"))
        for arm, pts in growth.train.items()
    ]
    curves += [Curve("val", pts, "white") for pts in growth.val.values()]
    budget = max((int(arm["steps"]) for arm in growth.plan.arms.values()), default=0) if growth.plan else 0
    screen.query_one("#growth-plot", CurvePlot).draw(
        curves,
        title="loss: growth against uniform",
        xlabel="step",
        ylabel="loss",
        xspan=(0.0, float(budget)) if budget else None,
    )
