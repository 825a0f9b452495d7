"""Each experiment's presentation, one module per registry experiment: `tui/views/<command>.py`
(the command's name with `-` as `_`), found by that name, never listed by hand.

A view module defines what it has of these; an experiment without a view module, or a view without
one of them, gets the plain form:
  print_result(doc)     how `anatomy-tui run <command>` prints the result (plain: its JSON)
  ANALYSIS              an `Analysis`: its title and place in the console's Analyses pane (plain:
                        not in the pane)
  summary(result, command) the result's table and lines in the pane (`result` read through its
                        class), `command` being the line that (re)fills it (plain: the document as a
                        readable tree)
  plots()               the pane's widgets above the summary (plain: none)
  show(pane, state)     redraws those widgets from the session state (tui/state.py)

View modules read result documents through their classes in engine/core/events.py (`RESULT` of the
experiment's module: `PruneResult.from_json(doc)`), so a renamed field fails where the engine builds
it and here alike; they import no torch (the console paints before torch loads). `_format.py` holds
the number formats they share.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from engine import registry
from engine.core.events import ResultDocument, decode_or_none
from tui.views._tables import tables_in, whole
from tui.widgets.result_view import ResultView, Summary

if TYPE_CHECKING:
    from tui.state import SessionState

log = logging.getLogger(__name__)
R = TypeVar("R", bound=ResultDocument)


@dataclass(frozen=True)
class Analysis:
    """An experiment's entry in the Analyses pane."""

    title: str
    place: int = 100  # the pane's order, top first; the registry's order among equals


def decoded(cls: type[R], doc: Mapping[str, Any] | None) -> R | None:
    """A session's result document as its class; None when there is none, or when it does not fit
    this version (damaged, or written by another version): the plots it feeds stay hidden."""
    return decode_or_none(cls, doc, on_error=_unfit)


def _unfit(exc: Exception) -> None:
    log.warning("a result does not fit this version (%s); its plots stay empty", exc)


def view(name: str) -> ModuleType | None:
    """The view module of experiment `name`, or None for an experiment without one."""
    module = f"{__name__}.{name.replace('-', '_')}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:  # the view exists and something it imports is missing: say so
            raise
        return None


def analyses() -> list[tuple[str, ModuleType]]:
    """(experiment name, view) for every experiment of the registry whose view has an ANALYSIS, in
    the pane's order."""
    listed = [(entry.name, module) for entry in registry.EXPERIMENTS
              if (module := view(entry.name)) is not None and hasattr(module, "ANALYSIS")]  # fmt: skip
    return sorted(listed, key=lambda pair: pair[1].ANALYSIS.place)


def rerun_command(name: str, session: str) -> str:
    return f"anatomy-tui run {name} --session {session}"


def analyses_widgets() -> Iterator[Widget]:
    """The Analyses pane's children: per analysis its title, its plots and its summary."""
    for name, found in analyses():
        yield Static(Text(found.ANALYSIS.title, style="bold"), classes="analysis-title")
        yield from getattr(found, "plots", tuple)()
        yield ResultView(id=f"result-{name}")


def show_analyses(pane: Widget, state: SessionState, session: str) -> None:
    """Redraws every analysis in `pane` (the widget holding `analyses_widgets()`) from the state."""
    for name, found in analyses():
        show = getattr(found, "show", None)
        if show is not None:
            show(pane, state)
        summary = getattr(found, "summary", None)
        pane.query_one(f"#result-{name}", ResultView).show(
            state.results.get(name), rerun_command(name, session), summary and kept_whole(summary),
            registry.experiment(name).result_class,
        )


def kept_whole(summary: Summary) -> Summary:
    """`summary` with its tables keeping every value whole, as `anatomy-tui run` prints them
    (tui/views/_tables.py): in a narrow pane a cell wraps or folds, never cut."""

    def whole_summary(result: Any, command: str) -> Any:
        drawn = summary(result, command)
        for table in tables_in(drawn):
            whole(table)
        return drawn

    return whole_summary
