"""Publication figures of anatomy-tui's results, drawn from the typed result alone (matplotlib, Agg).

    figure_for(result) -> Figure           any registered result document, or an atlas
    save_figure(result, stem, formats)     stem.png (300 dpi), stem.svg, stem.pdf
    write_figure(fig, path, format)        one file, written in place (the report stages its files)

One module per result kind, `figures/<name>.py` (the result class's `name` with `-` as `_`; an
atlas: `figures/atlas.py`), each with `draw(result) -> Figure`; found by that name, never listed by
hand, like the console's views. `figures/style.py` holds what they share: sizes for a two-column
paper, the classes' colour, hatch and marker, one look per series. Every figure is made on its own
Agg canvas, never through pyplot: no window, no global state, and a notebook's backend is left as
it is (a notebook shows the returned figure as its PNG: `style.PaperFigure`). The engine imports none of this
(a `lint-imports` contract): figures sit beside the store, above the engine; `anatomy-tui report`
(cli/commands/report.py) and the notebook API call them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from engine.atlas.table import AtlasDocument
from engine.core.errors import UserError
from engine.core.events import ResultDocument
from engine.disk.atomic import atomic_write
from figures.style import DPI, RC

FORMATS = ("png", "svg", "pdf")


def kind_of(result: Any) -> str:
    """The result's kind: its class's `name` (`ablation`, `scaling-fit`, ...), or `atlas`."""
    if isinstance(result, AtlasDocument):
        return "atlas"
    if isinstance(result, ResultDocument) and type(result).name:
        return type(result).name
    raise UserError(f"no figure for a {type(result).__name__}: give a result document (e.g. AblationMap) or an "
                    "atlas document")


def _module(kind: str) -> ModuleType:
    name = f"{__name__}.{kind.replace('-', '_')}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise UserError(f"no figure is drawn for {kind!r} results") from None


def figure_for(result: ResultDocument | AtlasDocument) -> Figure:
    """The publication figure of a result, in the shared style."""
    module = _module(kind_of(result))
    with matplotlib.rc_context(RC):
        return module.draw(result)


def check_formats(formats: Sequence[str]) -> tuple[str, ...]:
    """The formats, each once, or a one-line UserError naming the unknown one."""
    chosen = tuple(dict.fromkeys(f.strip().lower() for f in formats if f.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise UserError(f"unknown figure format {', '.join(unknown) or '(none)'}: choose from {', '.join(FORMATS)}")
    return chosen


def write_figure(fig: Figure, path: Path, fmt: str) -> None:
    """The figure as the one file `path` in format `fmt` (PNG at 300 dpi), written in place."""
    with matplotlib.rc_context(RC):
        fig.savefig(path, format=fmt, dpi=DPI)


def save_figure(result: ResultDocument | AtlasDocument, stem: Path,
                formats: Sequence[str] = FORMATS) -> list[Path]:
    """Writes the result's figure as `stem.<format>` for each format (PNG at 300 dpi), each file
    atomically; returns the paths written."""
    chosen = check_formats(formats)
    fig = figure_for(result)
    stem = Path(stem)
    paths = []
    for fmt in chosen:
        path = stem.parent / f"{stem.name}.{fmt}"
        atomic_write(path, functools.partial(write_figure, fig, fmt=fmt), "figure")
        paths.append(path)
    return paths
