"""The prune result: as `anatomy-tui run prune` prints it, and its Analyses view: per number of
layers removed each criterion's perplexity and the layers it removed, and perplexity against layers
removed, one curve per criterion, on one plot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from tui.views import Analysis
from tui.views._format import fmt, interval
from tui.widgets.curve_plot import Curve, CurvePlot

if TYPE_CHECKING:
    from tui.state import SessionState

ANALYSIS = Analysis("Pruning curves (every criterion)", place=6)
METHOD_COLOURS = {"angular": "cyan", "bi": "magenta", "ppl": "green", "map": "orange"}


def _layer_list(layers: list[int]) -> str:
    """0-3,7: runs of consecutive layers as ranges."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def notes(doc: dict[str, Any]) -> list[Text]:
    """The lines under either prune table: agreement with the ppl criterion, the depth law, the export."""
    agreement = ", ".join(f"{name} {fmt(rho, '.2f')}" for name, rho in (doc.get("agreement") or {}).items())
    lines = [Text(f"Spearman with the ppl criterion: {agreement or 'n/a'}")]
    fit = doc.get("depth_fit") or {}
    if fit.get("a") is not None:
        lines.append(Text(f"depth law (exploratory): a = {fit['a']:.2f} {interval(fit.get('ci95'), '.2f')}"))
    if doc.get("exported"):
        lines.append(Text(f"exported: {doc['exported']}"))
    return lines


def print_result(doc: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"{doc['model']}  baseline PPL {doc['baseline_ppl']:.2f}  (layers removed by each criterion)")
    for column in ("criterion", "removed", "layers", "PPL", "95% CI", "healed"):
        table.add_column(column, justify="left" if column in ("criterion", "layers") else "right")
    for row in doc["curve"]:
        ci = "" if row["ci_low"] is None else f"[{row['ci_low']:.1f}, {row['ci_high']:.1f}]"
        table.add_row(row["method"], str(row["removed"]), ",".join(map(str, row["layers"])),
                      fmt(row["ppl"], ".2f", "inf"), ci, fmt(row["healed_ppl"], ".2f", "-"))
    console.print(table)
    for line in notes(doc):
        console.print(line, highlight=False)


def summary(doc: dict[str, Any], command: str = "") -> Group:
    """The console's compact prune table: per number of layers removed, each criterion's perplexity
    and which layers it removed (healed perplexity beside it where healed)."""
    curve = doc.get("curve") or []
    methods = list(dict.fromkeys(str(p.get("method")) for p in curve))
    heading = Text(f"{doc.get('model', '')}  baseline PPL {fmt(doc.get('baseline_ppl'), '.2f')}: perplexity "
                   "(and the layers removed) per criterion", style="italic")
    table = Table()
    table.add_column("removed", justify="right")
    for method in methods:
        table.add_column(method, justify="right")
    cells = {(p.get("method"), p.get("removed")): p for p in curve}
    for removed in sorted({p.get("removed") for p in curve}):
        row = [str(removed)]
        for method in methods:
            point = cells.get((method, removed))
            healed = (point or {}).get("healed_ppl")
            row.append("" if point is None else f"{fmt(point.get('ppl'), '.2f', 'inf')} "
                       f"({_layer_list(point.get('layers', []))})" + ("" if healed is None else f" → {healed:.2f}"))
        table.add_row(*row)
    return Group(heading, table, *notes(doc))


def prune_curves(doc: dict[str, Any]) -> list[Curve]:
    """Each criterion's (layers removed, perplexity) points, starting at the full model."""
    base = float(doc["baseline_ppl"])
    by_method: dict[str, list[tuple[float, float]]] = {}
    for point in doc["curve"]:
        by_method.setdefault(str(point["method"]), [(0.0, base)]).append((float(point["removed"]), float(point["ppl"])))
    return [Curve(method, sorted(points), METHOD_COLOURS.get(method, "white")) for method, points in by_method.items()]


class PrunePlot(CurvePlot):
    def show(self, doc: dict[str, Any] | None) -> None:
        """Draws results/prune.json; hidden until there is one (the view's line says how)."""
        self.display = doc is not None
        if doc is None:
            return
        self.draw(
            prune_curves(doc),
            [("baseline", float(doc["baseline_ppl"]))],
            title="perplexity as layers are removed, per criterion",
            xlabel="layers removed",
            ylabel="ppl",
            log_y=True,
        )


def plots() -> list[Widget]:
    return [PrunePlot(id="prune-plot", classes="analysis-plot")]


def show(pane: Widget, state: SessionState) -> None:
    pane.query_one(PrunePlot).show(state.results.get("prune"))
