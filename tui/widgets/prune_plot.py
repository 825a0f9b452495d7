"""The prune view: perplexity against layers removed, one curve per criterion, on one plot."""

from __future__ import annotations

from typing import Any

from tui.widgets.curve_plot import Curve, CurvePlot

METHOD_COLOURS = {"angular": "cyan", "bi": "magenta", "ppl": "green", "map": "orange"}


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
