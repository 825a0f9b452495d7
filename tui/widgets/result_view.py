"""A view of one saved result: its summary (a table and a few lines), a readable tree for a result
without one, or one line that says the experiment is not there yet and how to run it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Group
from rich.pretty import Pretty
from rich.text import Text
from textual.widgets import Static

from tui.printers import manipulate_view, prune_view, scaling_fit_view, toy_depth_view, weights_view
from tui.widgets.dynamics_clusters import clusters_table

MAX_ITEMS = 40  # long lists are cut in the view; the file has everything


def _trimmed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _trimmed(v) for k, v in value.items()}
    if isinstance(value, list):
        head = [_trimmed(v) for v in value[:MAX_ITEMS]]
        return head + ([f"... {len(value) - MAX_ITEMS} more"] if len(value) > MAX_ITEMS else [])
    if isinstance(value, float):
        return float(f"{value:.5g}")
    return value


def _without_command(view: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any], str], Any]:
    return lambda doc, _command: view(doc)


def scaling_fit_summary(doc: dict[str, Any], command: str) -> Any:
    """The fit's figures; a line with `command` for a result without the runs to plot against depth."""
    view = scaling_fit_view(doc)
    if doc.get("depth_points"):
        return view
    hint = f"no runs in this result to plot loss against depth; run:  {command}"
    return Group(view, Text(hint, style="dim"))


# each summary gets the document and the command that (re)fills the view
SUMMARIES: dict[str, Callable[[dict[str, Any], str], Any]] = {
    "weights": _without_command(weights_view),
    "manipulate": _without_command(manipulate_view),
    "dynamics": clusters_table,
    "scaling-fit": scaling_fit_summary,
    "toy-depth": _without_command(toy_depth_view),
    "prune": _without_command(prune_view),
}


class ResultView(Static):
    """Shows `results/<name>.json`, or the command that fills it."""

    def show(self, name: str, doc: dict[str, Any] | None, command: str) -> None:
        if doc is not None:
            summary = SUMMARIES.get(name)
            self.update(summary(doc, command) if summary else Pretty(_trimmed(doc), expand_all=False))
        else:
            self.update(Text(f"not run in this session yet; run:  {command}", style="dim"))
