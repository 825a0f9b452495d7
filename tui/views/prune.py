"""The prune result: as `anatomy-tui run prune` prints it, and its Analyses view: per number of
layers removed each criterion's perplexity and the layers it removed, and perplexity against layers
removed, one curve per criterion, on one plot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from engine.experiments.prune.vocabulary import PruneCut, PruneResult
from tui.state import layer_list
from tui.views import Analysis, decoded
from tui.views._format import fmt, interval
from tui.views._tables import WholeConsole
from tui.views.evaluate import agreement_cell, score_cell
from tui.widgets.curve_plot import Curve, CurvePlot

if TYPE_CHECKING:
    from tui.state import SessionState

ANALYSIS = Analysis("Pruning curves (every criterion)", place=6)
METHOD_COLOURS = {"angular": "cyan", "angular_last": "blue", "bi": "magenta", "ppl": "green", "map": "orange",
                  "last": "red", "angular+linear": "cyan+", "angular_last+linear": "blue+"}


def cut_text(point: PruneCut) -> str:
    """A point's cut: its layers as runs, or with --unit block its blocks (`14a,15m`; a layer that
    lost both, its number)."""
    if not point.blocks:
        return layer_list(point.layers)
    alone = [b for b in point.blocks if b.layer not in point.layers]
    cells = [(layer, str(layer)) for layer in point.layers] + [(b.layer, f"{b.layer}{b.part[0]}") for b in alone]
    return ",".join(text for _, text in sorted(cells))


def notes(result: PruneResult) -> list[Text]:
    """The lines under either prune table: agreement with the ppl criterion, the depth law, the export."""
    agreement = ", ".join(f"{name} {fmt(rho, '.2f')}" for name, rho in result.agreement.items())
    lines = [Text(f"Spearman with the ppl criterion: {agreement or 'n/a'}")]
    fit = result.depth_fit
    if fit is not None and fit.a is not None:
        lines.append(Text(f"depth law (exploratory): a = {fit.a:.2f} {interval(fit.ci95, '.2f')}"))
    if result.exported:
        lines.append(Text(f"exported: {result.exported}"))
    return lines


def accuracy_notes(result: PruneResult) -> list[Text]:
    """With --evaluate-tasks: the full model's accuracy, and each cut where accuracy and perplexity
    disagree (marked ! in the table)."""
    if not result.baseline_accuracy:
        return []
    lines = [Text("accuracy % (lm-eval) of the full model: "
                  + ", ".join(f"{s.task} {score_cell(s)}" for s in result.baseline_accuracy))]
    lines += [Text(f"! {row.method} -{row.removed} ({cut_text(row)}): {row.disagreement}", style="bold")
              for row in result.curve if row.disagreement]
    return lines


def print_result(doc: dict[str, Any]) -> None:
    result = PruneResult.from_json(doc)
    console = WholeConsole()
    table = Table(title=f"{result.model}  baseline PPL {result.baseline_ppl:.2f}  (layers removed by each criterion)")
    tasks = [score.task for score in result.baseline_accuracy or []]
    for column in ("criterion", "removed", "layers", "PPL", "95% CI", "healed", *tasks):
        table.add_column(column, justify="left" if column in ("criterion", "layers") else "right")
    if tasks:
        table.add_column("generation", justify="right")
        table.add_column("!")
    base = {score.task: score for score in result.baseline_accuracy or []}
    for row in result.curve:
        ci = "" if row.ci_low is None else f"[{row.ci_low:.1f}, {row.ci_high:.1f}]"
        cells = [row.method, str(row.removed), cut_text(row) if row.blocks else ",".join(map(str, row.layers)),
                 fmt(row.ppl, ".2f", "inf"), ci, fmt(row.healed_ppl, ".2f", "-")]
        if tasks:
            scores = {score.task: score for score in row.accuracy or []}
            cells += [score_cell(scores.get(task), base.get(task), compact=True) for task in tasks]
            cells += [agreement_cell(row.generation or None), "!" if row.disagreement else ""]
        table.add_row(*cells)
    console.print(table)
    for line in notes(result) + accuracy_notes(result):
        console.print(line, highlight=False)


def summary(result: PruneResult, command: str = "") -> Group:
    """The console's compact prune table: per number of layers removed, each criterion's perplexity
    and which layers it removed (healed perplexity beside it where healed)."""
    methods = list(dict.fromkeys(point.method for point in result.curve))
    heading = Text(f"{result.model}  baseline PPL {fmt(result.baseline_ppl, '.2f')}: perplexity "
                   "(and the layers removed) per criterion", style="italic")
    table = Table()
    table.add_column("removed", justify="right")
    for method in methods:
        table.add_column(method, justify="right")
    cells = {(point.method, point.removed): point for point in result.curve}
    for removed in sorted({point.removed for point in result.curve}):
        row = [str(removed)]
        for method in methods:
            point = cells.get((method, removed))
            healed = None if point is None else point.healed_ppl
            row.append("" if point is None else f"{fmt(point.ppl, '.2f', 'inf')} "
                       f"({cut_text(point)})" + ("" if healed is None else f" → {healed:.2f}"))
        table.add_row(*row)
    return Group(heading, table, *notes(result), *accuracy_notes(result))


def prune_curves(result: PruneResult) -> list[Curve]:
    """Each criterion's (layers removed, perplexity) points, starting at the full model."""
    base = float(result.baseline_ppl)
    by_method: dict[str, list[tuple[float, float]]] = {}
    for point in result.curve:
        if point.ppl is None:  # the saved inf or nan: no point to draw
            continue
        by_method.setdefault(point.method, [(0.0, base)]).append((float(point.removed), float(point.ppl)))
    return [Curve(method, sorted(points), METHOD_COLOURS.get(method, "white")) for method, points in by_method.items()]


class PrunePlot(CurvePlot):
    def show(self, result: PruneResult | None) -> None:
        """Draws results/prune.json; hidden until there is one (the view's line says how)."""
        self.display = result is not None
        if result is None:
            return
        self.draw(
            prune_curves(result),
            [("baseline", float(result.baseline_ppl))],
            title="perplexity as layers are removed, per criterion",
            xlabel="layers removed",
            ylabel="ppl",
            log_y=True,
        )


def plots() -> list[Widget]:
    return [PrunePlot(id="prune-plot", classes="analysis-plot")]


def show(pane: Widget, state: SessionState) -> None:
    pane.query_one(PrunePlot).show(decoded(PruneResult, state.results.get("prune")))
