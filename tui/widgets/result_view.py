"""A view of one saved result: its summary (a table and a few lines), a readable tree for a result
without one, or one line that says the experiment is not there yet and how to run it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.pretty import Pretty
from rich.text import Text
from textual.widgets import Static

from engine.core.events import ResultDocument, decode_or_none

MAX_ITEMS = 40  # long lists are cut in the view; the file has everything

Summary = Callable[[Any, str], Any]  # (result, as its class; the command that refills it) -> renderable


def _trimmed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _trimmed(v) for k, v in value.items()}
    if isinstance(value, list):
        head = [_trimmed(v) for v in value[:MAX_ITEMS]]
        return head + ([f"... {len(value) - MAX_ITEMS} more"] if len(value) > MAX_ITEMS else [])
    if isinstance(value, float):
        return float(f"{value:.5g}")
    return value


def _summarised(doc: dict[str, Any], command: str, summary: Summary | None,
                result_class: type[ResultDocument] | None = None) -> Any:
    """The summary of `doc` read as `result_class`; None without one, or when the document does not
    fit its class (damaged, or written by another version): the tree then shows what it holds."""
    if summary is None or result_class is None:
        return None
    result = decode_or_none(result_class, doc)
    if result is None:
        return None
    try:
        return summary(result, command)
    except (KeyError, TypeError, ValueError, AttributeError):  # read, but a value inside of the wrong type
        return None


class ResultView(Static):
    """Shows `results/<name>.json` through its view's summary, or the command that fills it."""

    def show(self, doc: dict[str, Any] | None, command: str, summary: Summary | None = None,
             result_class: type[ResultDocument] | None = None) -> None:
        if doc is not None:
            self.update(_summarised(doc, command, summary, result_class) or Pretty(_trimmed(doc), expand_all=False))
        else:
            self.update(Text(f"not run in this session yet; run:  {command}", style="dim"))
