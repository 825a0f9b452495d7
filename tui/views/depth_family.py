"""The depth family: as `anatomy-tui run depth-family` prints it (the members' table with each
member's final held-out loss and anatomy summary, the fitted depth term beside paper B's and the
toy's exponents, the anatomy against depth), and its Analyses view: the members' curves live (one
plot, a line per member coloured by its depth, from the `depth-family.step` events), the table of
the members finished as they finish, the fit when it comes, and any member's layer map (a selector
over the result's members)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Select, Static

from engine.experiments.depth_family.vocabulary import DepthFamilyResult, Member, MemberDone
from tui.depth_family_records import FamilyView, Points
from tui.views import Analysis, decoded
from tui.views._format import fmt, interval
from tui.views._tables import WholeConsole, whole
from tui.widgets.curve_plot import Curve, CurvePlot, PlotColour

if TYPE_CHECKING:
    from tui.state import SessionState

ANALYSIS = Analysis("Depth family (paper B's depth law on your corpus)", place=5)
DEPTH_COLOURS: tuple[PlotColour, ...] = ("cyan", "magenta", "orange", "green", "blue", "red", "cyan+", "magenta+")


def members_table(result: DepthFamilyResult) -> Table:
    """One row per member: its cell, N, final held-out loss and anatomy summary."""
    table = Table(title="depth family: members (final held-out loss, anatomy on the held-out windows)")
    for column in ("member", "depth", "width", "tokens", "seed", "N", "held-out loss", "redundant",
                   "mean angle", "neighbour sim."):
        table.add_column(column, justify="left" if column == "member" else "right")
    for m in result.members:
        a = m.anatomy
        table.add_row(m.name, str(m.depth), str(m.width), str(m.tokens), str(m.seed), str(m.params),
                      fmt(m.heldout_loss, ".4f"), fmt(a.redundant_share if a else None, ".2f"),
                      fmt(a.mean_angle if a else None, ".1f"), fmt(a.neighbour_similarity if a else None, ".3f"))
    return table


def fit_lines(result: DepthFamilyResult) -> list[str]:
    """The fitted depth term, its checks, and the references beside it."""
    fit = result.fit
    if fit is None:
        return ["no exponent fitted (fewer than three depths finished)"]
    lines = [f"L = c_l / l^a_l + L0 at width {fit.width}, {fit.tokens} tokens: a_l = {fit.alpha_l:.2f} "
             f"{interval(fit.ci95, '.2f')} (bootstrap, {fit.bootstrap_valid} draws), c_l = {fit.c_l:.4g}, "
             f"L0 = {fit.L0:.4g}",
             f"leave-one-depth-out RMSE {fmt(fit.loo_rmse, '.4f')}; objective within 0.3 % of its best for a_l in "
             f"[{fit.flat_range[0]:.2f}, {fit.flat_range[1]:.2f}]"
             f"{': weakly identified' if fit.weakly_identified else ''}"]
    lines += [f"  beside: {ref.name}: a_l = {ref.alpha_l:g} {interval(ref.interval, '.1f') if ref.interval else ''}"
              for ref in fit.references]
    return lines


def anatomy_table(result: DepthFamilyResult) -> Table:
    """Per depth: the anatomy summaries' means with their 95 % intervals over members."""
    table = Table(title="anatomy against depth (mean over members, 95% interval)")
    for column in ("depth", "members", "redundant share", "mean angle", "neighbour similarity"):
        table.add_column(column, justify="right")
    for row in result.anatomy_by_depth:
        table.add_row(str(row.depth), str(row.members),
                      f"{fmt(row.redundant_share, '.2f')} {interval(row.redundant_share_ci, '.2f')}",
                      f"{fmt(row.mean_angle, '.1f')} {interval(row.mean_angle_ci, '.1f')}",
                      f"{fmt(row.neighbour_similarity, '.3f')} {interval(row.neighbour_similarity_ci, '.3f')}")
    return table


def print_result(doc: dict[str, Any]) -> None:
    result = DepthFamilyResult.from_json(doc)
    console = WholeConsole()
    console.print(members_table(result))
    for line in fit_lines(result):
        console.print(line, highlight=False)
    if result.anatomy_by_depth:
        console.print(anatomy_table(result))
    if result.csv:
        console.print(f"CSV (scaling-fit's columns): {result.csv}", highlight=False)


def summary(result: DepthFamilyResult, command: str = "") -> Group:
    """The printed result: the members, the fit beside the references, the anatomy against depth."""
    parts: list[Any] = [members_table(result), *(Text(line) for line in fit_lines(result))]
    if result.anatomy_by_depth:
        parts.append(anatomy_table(result))
    return Group(*parts)


def depth_colour(depths: Sequence[int], depth: int) -> PlotColour:
    """The colour of a depth among the family's, shallowest first."""
    return DEPTH_COLOURS[sorted(set(depths)).index(depth) % len(DEPTH_COLOURS)]


def member_curves(family: FamilyView, members: Sequence[Member] = ()) -> list[Curve]:
    """A line per member (its training loss; else, from a result alone, its held-out loss) and its
    held-out points, coloured by depth and labelled `l=DEPTH` (one legend entry a depth)."""
    found: list[tuple[int, Points, Points]] = [(c.depth, c.train, c.heldout) for c in family.curves.values()]
    if not found:
        found = [(m.depth, [(float(p.step), p.heldout_loss) for p in m.curve if p.heldout_loss is not None], [])
                 for m in members]
    depths = [depth for depth, _, _ in found]
    curves = []
    for depth, line, points in found:
        colour = depth_colour(depths, depth)
        curves.append(Curve(f"l={depth}", line, colour))
        if points:
            curves.append(Curve(f"l={depth}", points, colour, scatter=True))
    return curves


def done_table(done: Sequence[MemberDone], total: int) -> Table:
    """The members finished so far, in the order they finished."""
    table = Table(title=f"members finished: {len(done)} of {total}")
    for column in ("member", "depth", "seed", "N", "held-out loss", "redundant", "mean angle", "neighbour sim.", "s"):
        table.add_column(column, justify="left" if column == "member" else "right")
    for m in done:
        table.add_row(m.member, str(m.depth), str(m.seed), f"{m.params:,}", fmt(m.heldout_loss, ".4f"),
                      fmt(m.redundant_share, ".2f"), fmt(m.mean_angle, ".1f"), fmt(m.neighbour_similarity, ".3f"),
                      fmt(m.seconds, ".1f"))
    return table


def live_lines(family: FamilyView) -> list[str]:
    """The plan and, once sent, the fit."""
    lines = []
    if family.plan is not None:
        plan = family.plan
        lines.append(f"plan: {len(plan.members)} members, {plan.total_flops:.3g} training FLOPs (6 N D), about "
                     f"{plan.estimate_hours * 60:.1f} min on {plan.device} (a step of {plan.measured_member}: "
                     f"{plan.measured_step_seconds:.3g} s)")
    if family.fit is not None:
        fit = family.fit
        lines.append(f"fit: a_l = {fit.alpha_l:.2f} {interval(fit.ci95, '.2f')}, c_l = {fit.c_l:.4g}, L0 = "
                     f"{fit.L0:.4g}, leave-one-depth-out RMSE {fmt(fit.loo_rmse, '.4f')}"
                     f"{' (weakly identified)' if fit.weakly_identified else ''}; paper B: 1.2 ± 0.3")
    return lines


def map_table(member: Member) -> Table:
    """A member's layer map: each layer's perplexity when replaced, its degradation and its class."""
    anatomy = member.anatomy
    table = Table(title=f"{member.name}: layer map (baseline PPL {fmt(anatomy and anatomy.baseline_ppl, '.3f')})")
    for column in ("layer", "PPL", "D %", "class", "angle in/out"):
        table.add_column(column, justify="left" if column == "class" else "right")
    angles = anatomy.angle_state if anatomy else []
    for row in anatomy.map if anatomy else []:
        angle = angles[row.layer] if row.layer < len(angles) else None
        table.add_row(str(row.layer), fmt(row.ppl, ".3f"), fmt(row.degradation_pct, ".1f"), row.layer_class,
                      fmt(angle, ".1f"))
    return table


class FamilyPlot(CurvePlot):
    """The members' curves, a line per member."""

    curves: list[Curve] = []

    def show(self, curves: list[Curve], live: bool) -> None:
        self.curves = curves
        title = "members' training loss (lines), held-out (points)" if live else "members' held-out loss (the result)"
        self.draw(curves, title=title, xlabel="step", ylabel="loss")


class FamilyPanel(Vertical):
    """The Analyses view's live part: the plan and fit lines, the members' curves, the table of the
    members finished while the run goes, and a selector of the member whose layer map is shown."""

    DEFAULT_CSS = """
    FamilyPanel { height: auto; }
    FamilyPanel > FamilyPlot { height: 18; }
    FamilyPanel > Static, FamilyPanel > Select { height: auto; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.members: dict[str, Member] = {}  # the result's members with a map, by name

    def compose(self) -> ComposeResult:
        yield Static(id="family-lines")
        yield FamilyPlot(id="family-plot")
        yield Static(id="family-done")
        yield Select[str]([], prompt="a member's layer map", id="family-member")
        yield Static(id="family-map")

    def show(self, family: FamilyView, result: DepthFamilyResult | None, running: bool) -> None:
        members = result.members if result is not None else []
        self.display = bool(family.curves or family.plan or members)
        if not self.display:
            return
        self.query_one("#family-lines", Static).update(Text("\n".join(live_lines(family))))
        self.query_one(FamilyPlot).show(member_curves(family, members), live=bool(family.curves))
        total = len(family.plan.members) if family.plan is not None else len(family.done)
        done = self.query_one("#family-done", Static)
        done.display = running  # once finished, the summary below has the members
        done.update(whole(done_table(list(family.done.values()), total)) if running else "")  # cells fold, never cut
        mapped = {m.name: m for m in members if m.anatomy is not None}
        select = self.query_one("#family-member", Select)
        select.display = bool(mapped)
        if list(mapped) != list(self.members):
            self.members = mapped
            select.set_options([(name, name) for name in mapped])
            self.query_one("#family-map", Static).update("")

    def on_select_changed(self, event: Select.Changed) -> None:
        member = self.members.get(str(event.value))
        self.query_one("#family-map", Static).update(whole(map_table(member)) if member is not None else "")


def plots() -> list[Widget]:
    return [FamilyPanel(id="family-panel", classes="analysis-panel")]


def show(pane: Widget, state: SessionState) -> None:
    """The live run (tui/state.py's `family`) and the result, whichever the session has."""
    family = state.family
    job = state.jobs.get(family.job)
    running = job is not None and job.status == "running"
    result = decoded(DepthFamilyResult, state.results.get("depth-family"))
    pane.query_one(FamilyPanel).show(family, result, running)
