"""How numbers read in every view: a missing value as a word, an interval as [low, high]."""

from __future__ import annotations

from typing import Any


def fmt(value: Any, spec: str = ".3f", missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def interval(pair: Any, spec: str = ".3f") -> str:
    """[low, high], a missing side "open"; "n/a" when there is no interval."""
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        return "n/a"
    return "[" + ", ".join(fmt(v, spec, "open") for v in pair) + "]"
