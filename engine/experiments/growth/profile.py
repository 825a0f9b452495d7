"""Importance profiles: one class per layer, from the paper's preset or a session's ablation map.

Classes: critical, important, minor, redundant, anti. Anti layers are left out of the model.

The paper's 12-layer preset (layers numbered from 0): core 4, 5 -> critical; input 1, 2 and
output 8, 9 -> important; minor 7, 10 -> minor; the rest (0, 3, 6, 11) -> redundant.

Compressing an ablation map of M layers to N: target layer j covers the source layers
floor(j*M/N) .. max(floor((j+1)*M/N), floor(j*M/N)+1) - 1. It is anti only if every layer it
covers is anti; otherwise it takes the most important class among its non-anti layers
(critical > important > minor > redundant), so a critical layer is never averaged away.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from engine.core.errors import UserError
from engine.experiments.ablation.vocabulary import AblationMap

CLASSES = ("critical", "important", "minor", "redundant")
ANTI = "anti"
PAPER_PROFILE: tuple[str, ...] = (
    "redundant", "important", "important", "redundant", "critical", "critical",
    "redundant", "minor", "important", "important", "minor", "redundant",
)  # fmt: skip
DEFAULT_MULTIPLIERS: tuple[tuple[str, float], ...] = (
    ("critical", 4.0), ("important", 2.0), ("minor", 2.0), ("redundant", 1.0),
)  # fmt: skip


def check_profile(profile: Sequence[str]) -> tuple[str, ...]:
    profile = tuple(c.strip().lower() for c in profile)
    for i, c in enumerate(profile):
        if c not in (*CLASSES, ANTI):
            raise UserError(f"layer {i} has class {c!r}; use one of {', '.join((*CLASSES, ANTI))}")
    if not any(c != ANTI for c in profile):
        raise UserError("the profile has no layer that is not anti; nothing to build")
    return profile


def parse_profile(text: str) -> tuple[str, ...]:
    """'critical,important,...' (one class per layer) to a checked profile."""
    return check_profile([c for c in text.split(",") if c.strip()])


def kept_layers(profile: Sequence[str]) -> list[int]:
    """Profile indices of the layers the model has (anti layers are omitted)."""
    return [i for i, c in enumerate(profile) if c != ANTI]


def profile_from_ablation(ablation: AblationMap, n_layers: int) -> tuple[str, ...]:
    """Compresses an ablation map (results/ablation.json) to `n_layers` classes (rule in the module doc)."""
    rows = sorted(ablation.layers, key=lambda row: row.layer)
    if not rows:
        raise UserError("the ablation result has no layers; run `anatomy-tui run ablation` first")
    if n_layers < 1:
        raise UserError(f"--layers must be at least 1, not {n_layers}")
    source = [ANTI if row.anti else row.layer_class.lower() for row in rows]
    for i, c in enumerate(source):
        if c not in (*CLASSES, ANTI):
            raise UserError(f"ablation layer {i} has unknown class {c!r}; rerun the ablation")
    m = len(source)
    profile = []
    for j in range(n_layers):
        lo = j * m // n_layers
        hi = max((j + 1) * m // n_layers, lo + 1)
        covered = [c for c in source[lo:hi] if c != ANTI]
        profile.append(min(covered, key=CLASSES.index) if covered else ANTI)
    return check_profile(profile)


def multipliers_dict(multipliers: Iterable[tuple[str, float]]) -> dict[str, float]:
    found = dict(multipliers)
    missing = [c for c in CLASSES if c not in found]
    if missing:
        raise UserError(f"no width multiplier for {', '.join(missing)}; give one per class")
    unknown = [c for c in found if c not in CLASSES]
    if unknown:
        raise UserError(f"width multiplier for unknown class {unknown[0]!r}; use {', '.join(CLASSES)}")
    bad = [c for c, v in found.items() if not (v > 0 and math.isfinite(v))]
    if bad:
        raise UserError(f"width multiplier for {bad[0]} must be a finite number > 0, not {found[bad[0]]}")
    return found


def parse_multipliers(text: str) -> tuple[tuple[str, float], ...]:
    """'critical=4,important=2,minor=2,redundant=1' to the settings' tuple form."""
    found = dict(DEFAULT_MULTIPLIERS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name.strip() not in CLASSES:
            raise UserError(f"--multipliers: unknown class {name.strip()!r}; use {', '.join(CLASSES)}")
        try:
            found[name.strip()] = float(value)
        except ValueError as exc:
            raise UserError(f"--multipliers: {part!r} is not class=number") from exc
    multipliers_dict(found.items())
    return tuple((c, found[c]) for c in CLASSES)
