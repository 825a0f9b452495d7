"""The dynamics view's clusters: the token groups PCA and KMeans found in the per-token angle
profiles, as a scatter in the first two components and a table of their sizes, most frequent
tokens and typical examples."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from engine.events import PcaSample, from_doc
from tui.widgets.curve_plot import Curve, CurvePlot, PlotColour

CLUSTER_COLOURS: tuple[PlotColour, ...] = ("gray+", "cyan", "magenta", "orange", "green", "red", "blue+")


def cluster_name(row: dict[str, Any]) -> str:
    return "bulk" if row.get("bulk") else f"cluster {row.get('label')}"


def scatter_curves(doc: dict[str, Any]) -> list[Curve]:
    """The sampled tokens at (PC1, PC2), one colour per cluster, labelled with the cluster's size."""
    pca = doc["pca"]
    sample = from_doc(PcaSample, pca["sample"])
    rows = {row.get("label"): row for row in pca.get("clusters", [])}
    curves = []
    for label in sorted(set(sample.label)):
        points = [(x, y) for x, y, own in zip(sample.pc1, sample.pc2, sample.label, strict=True) if own == label]
        row = rows.get(label, {"label": label})
        size = f" ({row['size']:,} tokens)" if "size" in row else ""
        curves.append(Curve(cluster_name(row) + size, points, CLUSTER_COLOURS[label % len(CLUSTER_COLOURS)],
                            scatter=True))
    return curves


class ClusterScatter(CurvePlot):
    def show(self, doc: dict[str, Any] | None) -> None:
        """Draws results/dynamics.json's PCA sample; hidden for a result without one (the table says how)."""
        self.display = bool(doc and (doc.get("pca") or {}).get("sample"))
        if not self.display or doc is None:
            return
        n = len(doc["pca"]["sample"]["token"])
        self.draw(scatter_curves(doc), title=f"token clusters in PCA space ({n} sampled tokens)", xlabel="PC1",
                  ylabel="PC2")  # fmt: skip


def clusters_table(doc: dict[str, Any], command: str) -> Group:
    """results/dynamics.json `pca.clusters`, largest (the bulk) first; a line with `command` where the
    result has no PCA sample to draw (written before anatomy-tui 0.3)."""
    pca = doc.get("pca") or {}
    explained = ", ".join(f"{100 * share:.0f}%" for share in (pca.get("explained") or [])[:3])
    table = Table(title=f"token clusters (k={pca.get('k', '?')}; PCA explains {explained or '?'})", expand=False)
    for column in ("cluster", "size", "share", "top tokens", "typical examples"):
        table.add_column(column, justify="right" if column in ("size", "share") else "left")
    for row in pca.get("clusters", []):
        tokens = " ".join(f"{word!r}×{count}" for word, count in row.get("top_tokens", []))
        examples = " | ".join(str(e).replace("\n", " ") for e in row.get("examples", []))[:80]
        table.add_row(
            "bulk" if row.get("bulk") else str(row.get("label")),
            f"{row['size']:,}",
            f"{100 * row['fraction']:.1f}%",
            Text(tokens),
            Text(examples),
        )
    if pca.get("sample"):
        return Group(table)
    return Group(table, Text(f"no PCA coordinates in this result to draw the clusters; run:  {command}", style="dim"))
