"""One criterion of an atlas (engine/atlas/table.py) as curves on relative depth, one per model, so models
of different depths line up (D % on a log axis, with the class bounds as reference lines)."""

from __future__ import annotations

from engine.atlas import table as A
from tui.widgets.curve_plot import Curve, CurvePlot, PlotColour

COLOURS: list[PlotColour] = ["cyan", "orange", "green", "magenta", "blue", "red", "white"]
LOG_FLOOR = 0.1  # D % below this (an anti-layer's negative D) is drawn on the log axis's floor
CLASS_LINES = (("critical 100 %", 100.0), ("important 30 %", 30.0), ("minor 10 %", 10.0))


class DepthProfiles(CurvePlot):
    """`show(doc, criterion, names)`: the criterion of every model of `doc`, labelled by `names`."""

    def show(self, doc: A.AtlasDocument, criterion: str, names: dict[str, str]) -> None:
        log = criterion == "d_pct"
        curves = []
        for index, model in enumerate(doc.models):
            values = A.profile(doc.rows, model, criterion)
            depth = max((row.n_layers for row in doc.rows if row.model == model), default=1)
            points = [(A.relative_depth(layer, depth), max(value, LOG_FLOOR) if log else value)
                      for layer, value in sorted(values.items())]
            curves.append(Curve(names.get(model, model), points, COLOURS[index % len(COLOURS)]))
        self.draw(curves, CLASS_LINES if log else (), title=A.CRITERIA[criterion].split(",")[0],
                  xlabel="relative depth layer / (L - 1)", ylabel=criterion, log_y=log, xspan=(0.0, 1.0))
