"""A view of one saved result (weight statistics, angle profiles, scaling fit): its numbers in a
readable tree, or one line that says the experiment is not there yet and how to run it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.pretty import Pretty
from rich.text import Text
from textual.widgets import Static

from tui.printers import weights_view
from tui.widgets.dynamics_clusters import clusters_table
from tui.widgets.manipulate_table import manipulate_table

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


SUMMARIES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "weights": weights_view,
    "manipulate": manipulate_table,
    "dynamics": clusters_table,
}


class ResultView(Static):
    """Shows `results/<name>.json`; `available` says whether the experiment exists in this install."""

    def show(self, name: str, doc: dict[str, Any] | None, command: str, available: bool) -> None:
        if doc is not None:
            summary = SUMMARIES.get(name)
            self.update(summary(doc) if summary else Pretty(_trimmed(doc), expand_all=False))
        elif not available:
            self.update(Text("this experiment is not in this version of anatomy-tui yet", style="dim"))
        else:
            self.update(Text(f"not run in this session yet; run:  {command}", style="dim"))
