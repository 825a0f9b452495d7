"""The dynamics result: as `anatomy-tui run dynamics` prints it, and its Analyses view: the angle
profiles per layer, the token groups PCA and KMeans found in the per-token angle profiles as a
scatter in the first two components, and a table of their sizes, most frequent tokens and typical
examples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from engine.experiments.dynamics.vocabulary import DynamicsResult, Quartiles, TokenCluster
from tui.views import Analysis, decoded
from tui.views._format import fmt
from tui.views._tables import WholeConsole
from tui.widgets.curve_plot import Curve, CurvePlot, PlotColour

if TYPE_CHECKING:
    from engine.experiments.dynamics.vocabulary import DynamicsRow
    from tui.state import SessionState

ANALYSIS = Analysis("Angle profiles (layer dynamics)", place=3)
CLUSTER_COLOURS: tuple[PlotColour, ...] = ("gray+", "cyan", "magenta", "orange", "green", "red", "blue+")


def _spread(q: Quartiles) -> str:
    """'median [q1-q3]', short enough for an 80-column table."""
    return "" if q.median is None else f"{q.median:.1f} [{q.q1:.0f}-{q.q3:.0f}]"


def print_result(doc: dict[str, Any]) -> None:
    result = DynamicsResult.from_json(doc)
    console = WholeConsole()
    table = Table(title=Text(f"{result.model}  {result.tokens} tokens, first position {result.first_token}  "
                             "(degrees: median [q1-q3])"))
    columns = ["layer", "theta(h, h')", "theta(dh, dh')", "|h'|", "|dh|/|h|"]
    lens = result.logit_lens
    if lens:
        columns.append("lens loss")
    for column in columns:
        table.add_column(column, justify="right")
    for row in result.layers:
        cells = [
            str(row.layer),
            _spread(row.angle_state),
            _spread(row.angle_update),
            fmt(row.norm.median, ".1f", ""),
            f"{row.relative_update.median:.3f}",
        ]
        if lens:
            cells.append(f"{row.lens_loss:.3f}")
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)
    core = result.core
    console.print(f"core layers {core.layers[0]}-{core.layers[1]}: median theta(dh, dh') "
                  f"{fmt(core.angle_update_median, '.1f', '')} deg, "
                  f"theta(h, h') {fmt(core.angle_state_median, '.1f', '')} deg, "
                  f"|dh|/|h| {core.relative_update_median:.3f}", highlight=False)
    pca = result.pca
    explained = ", ".join(f"{x:.3f}" for x in pca.explained[:5])
    console.print(f"PCA explained variance: {explained}; k={pca.k} ({pca.k_choice}); "
                  f"bulk fraction {pca.bulk_fraction:.4f} (paper: 0.996)", highlight=False)
    for cluster in pca.clusters:
        top = ", ".join(f"{word!r}x{count}" for word, count in cluster.top_tokens)
        console.print(f"cluster {cluster.label}{' (bulk)' if cluster.bulk else ''}: "
                      f"{cluster.size} tokens ({cluster.fraction:.4f}), top: {top}",
                      markup=False, highlight=False)
        for example in cluster.examples:
            console.print(f"    {example}", markup=False, highlight=False)


def summary(result: DynamicsResult, command: str) -> Group:
    """results/dynamics.json `pca.clusters`, largest (the bulk) first; a line with `command` where the
    result has no PCA sample to draw (written before anatomy-tui 0.3)."""
    pca = result.pca
    explained = ", ".join(f"{100 * share:.0f}%" for share in pca.explained[:3])
    table = Table(title=f"token clusters (k={pca.k}; PCA explains {explained or '?'})", expand=False)
    for column in ("cluster", "size", "share", "top tokens", "typical examples"):
        table.add_column(column, justify="right" if column in ("size", "share") else "left")
    for row in pca.clusters:
        tokens = " ".join(f"{word!r}×{count}" for word, count in row.top_tokens)
        examples = " | ".join(str(e).replace("\n", " ") for e in row.examples)[:80]
        table.add_row(
            "bulk" if row.bulk else str(row.label),
            f"{row.size:,}",
            f"{100 * row.fraction:.1f}%",
            Text(tokens),
            Text(examples),
        )
    if pca.sample:
        return Group(table)
    return Group(table, Text(f"no PCA coordinates in this result to draw the clusters; run:  {command}", style="dim"))


def cluster_name(row: TokenCluster) -> str:
    return "bulk" if row.bulk else f"cluster {row.label}"


def scatter_curves(result: DynamicsResult) -> list[Curve]:
    """The sampled tokens at (PC1, PC2), one colour per cluster, labelled with the cluster's size."""
    sample = result.pca.sample
    assert sample is not None
    rows = {row.label: row for row in result.pca.clusters}
    curves = []
    for label in sorted(set(sample.label)):
        points = [(x, y) for x, y, own in zip(sample.pc1, sample.pc2, sample.label, strict=True) if own == label]
        row = rows.get(label)
        name = f"cluster {label}" if row is None else f"{cluster_name(row)} ({row.size:,} tokens)"
        curves.append(Curve(name, points, CLUSTER_COLOURS[label % len(CLUSTER_COLOURS)], scatter=True))
    return curves


class ClusterScatter(CurvePlot):
    def show(self, result: DynamicsResult | None) -> None:
        """Draws results/dynamics.json's PCA sample; hidden for a result without one (the table says how)."""
        self.display = bool(result and result.pca.sample)
        if result is None or result.pca.sample is None or not self.display:
            return
        n = len(result.pca.sample.token)
        self.draw(scatter_curves(result), title=f"token clusters in PCA space ({n} sampled tokens)", xlabel="PC1",
                  ylabel="PC2")  # fmt: skip


def draw_angles(plot: CurvePlot, rows: list[DynamicsRow]) -> None:
    """The angle profiles: per layer, the median angle between the state and its update, and
    between consecutive states (degrees)."""
    plot.display = bool(rows)
    if not rows:
        return

    def series(key: str, part: str = "median") -> list[tuple[float, float]]:
        points = [(row.layer, getattr(getattr(row, key), part)) for row in rows]
        return [(float(x), y) for x, y in points if y is not None]

    plot.draw(
        [
            Curve("angle(state, update) median", series("angle_update"), "cyan"),
            Curve("quartiles", series("angle_update", "q1"), "blue"),
            Curve("quartiles", series("angle_update", "q3"), "blue"),
            Curve("angle(state in, state out) median", series("angle_state"), "magenta"),
            Curve("quartiles ", series("angle_state", "q1"), "red"),
            Curve("quartiles ", series("angle_state", "q3"), "red"),
        ],
        [("90°", 90.0)],
        title="angle profiles (median over tokens)",
        xlabel="layer",
        ylabel="degrees",
    )


def plots() -> list[Widget]:
    return [CurvePlot(id="angle-plot"), ClusterScatter(id="cluster-plot", classes="analysis-plot")]


def show(pane: Widget, state: SessionState) -> None:
    draw_angles(pane.query_one("#angle-plot", CurvePlot), state.dynamics)
    pane.query_one(ClusterScatter).show(decoded(DynamicsResult, state.results.get("dynamics")))
