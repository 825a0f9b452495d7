"""The training runs a scaling fit reads: a CSV's width, depth, tokens and loss columns, its bad
rows dropped and counted (or refused with --strict). Read before the fit (and by the settings'
check before any run starts), so a wrong file is one line."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.errors import UserError


@dataclass(frozen=True)
class Runs:
    """Training runs: width m, depth l, tokens D and final loss, one entry per run."""

    width: np.ndarray
    depth: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    source: str = ""
    n_rows: int = 0  # rows read before cleaning and exclusion
    dropped: tuple[tuple[str, int], ...] = ()  # (why, how many rows) left out while reading

    def dropped_text(self) -> str:
        return ", ".join(f"{count} with {why}" for why, count in self.dropped)


def load_runs(path: Path, settings: Any) -> Runs:
    """Reads the four columns from a CSV. Rows with text, NaN, inf or non-positive values are dropped
    and counted (the run says how many and why), or refused with `strict`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no CSV file at {path}; pass --csv FILE")
    names = (settings.width_column, settings.depth_column, settings.tokens_column, settings.loss_column)
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [n for n in names if n not in (reader.fieldnames or [])]
        if missing:
            raise UserError(
                f"{path} has no column(s) {', '.join(missing)} "
                f"(it has {', '.join(reader.fieldnames or [])}); "
                "name them with --loss-col, --width-col, --depth-col, --tokens-col"
            )
        rows = list(reader)
    values = np.full((len(rows), 4), np.nan)
    reasons: dict[str, int] = {}
    first: tuple[int, str] | None = None
    for i, row in enumerate(rows):
        why = None
        for j, name in enumerate(names):
            try:
                values[i, j] = float(row[name])
            except (TypeError, ValueError):
                why = why or "text or an empty cell"
                continue
            if not math.isfinite(values[i, j]):
                why = why or "NaN or inf"
            elif values[i, j] <= 0:
                why = why or "a zero or negative value"
        if why is not None:
            reasons[why] = reasons.get(why, 0) + 1
            first = first or (i + 2, why)  # the header is line 1
    keep = np.all(np.isfinite(values) & (values > 0), axis=1)
    v = values[keep]
    runs = Runs(v[:, 0], v[:, 1], v[:, 2], v[:, 3], source=str(path), n_rows=len(rows),
                dropped=tuple(reasons.items()))
    if first is not None and settings.strict:
        raise UserError(f"{path}: {len(rows) - len(v)} rows are not usable runs ({runs.dropped_text()}; the first "
                        f"on line {first[0]} has {first[1]}); fix them, or drop --strict to leave them out")
    return runs
