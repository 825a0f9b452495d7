"""The developmental protocol: a table of phases, each naming the layers that exist and train in
it, where each new layer is cloned from, the FFN scale applied when cloning, and its length.

Rules (checked by `validate_phases`, one-line errors): a phase has at least one layer and a length
(steps > 0 or epochs > 0, not both); every layer is one the model has (anti layers are omitted);
layers are only ever added, never dropped; a clone source was trained in an earlier phase; every
layer is trained by the last phase. A new layer without a named source is cloned from the nearest
layer trained so far (the lower index on a tie); layers of the first phase start from fresh init.

The paper's six phases, derived from a profile by `derive_phases` with epochs as weights:
gastrulation (critical, 30), neurulation (important below the core's middle, 20), organogenesis
(important above it, 20), growth (minor, 12), connective (redundant, FFN x0.5, 6), maturation
(all, 15). Phases that would be empty are dropped. When a total step budget is given, lengths
are proportions and `scale_phases` turns them into whole steps summing to the budget (largest
remainders; at least one step per phase): 656 steps give 191/127/127/77/38/96.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.untrusted import loads
from engine.experiments.growth.profile import CLASSES, kept_layers

PAPER_WEIGHTS = (
    ("gastrulation", 30), ("neurulation", 20), ("organogenesis", 20),
    ("growth", 12), ("connective", 6), ("maturation", 15),
)  # fmt: skip
CONNECTIVE_FFN_SCALE = 0.5
_KEYS = {"name", "layers", "clone_from", "ffn_scale", "steps", "epochs"}


@dataclass(frozen=True)
class Phase:
    """One row of the table; `clone_from` pairs (new layer, source layer), profile indices."""

    name: str
    layers: tuple[int, ...]
    clone_from: tuple[tuple[int, int], ...] = ()
    ffn_scale: float = 1.0
    steps: int = 0
    epochs: float = 0.0

    def sources(self) -> dict[int, int]:
        return dict(self.clone_from)


def derive_phases(profile: Sequence[str]) -> tuple[Phase, ...]:
    """The paper's six phases for any profile (rule in the module doc), lengths in epochs."""
    kept = kept_layers(profile)
    by_class = {c: [i for i in kept if profile[i] == c] for c in CLASSES}
    core = next((by_class[c] for c in CLASSES if by_class[c]), [])
    middle = (min(core) + max(core)) / 2
    rest_important = [i for i in by_class["important"] if i not in core]
    groups = {
        "gastrulation": core,
        "neurulation": [i for i in rest_important if i < middle],
        "organogenesis": [i for i in rest_important if i >= middle],
        "growth": [i for i in by_class["minor"] if i not in core],
        "connective": [i for i in by_class["redundant"] if i not in core],
        "maturation": [],
    }
    phases: list[Phase] = []
    existing: list[int] = []
    for name, weight in PAPER_WEIGHTS:
        if not groups[name] and name != "maturation":
            continue
        existing = sorted(existing + groups[name])
        scale = CONNECTIVE_FFN_SCALE if name == "connective" else 1.0
        phases.append(Phase(name, tuple(existing), ffn_scale=scale, epochs=float(weight)))
    return validate_phases(phases, profile)


def validate_phases(phases: Sequence[Phase], profile: Sequence[str]) -> tuple[Phase, ...]:
    """Checks the rules and fills in missing clone sources; returns the completed table."""
    if not phases:
        raise UserError("the phase table is empty; give at least one phase")
    kept = set(kept_layers(profile))
    trained: list[int] = []
    done = []
    for n, phase in enumerate(phases):
        label = f"phase {n + 1} {phase.name!r}"
        if not phase.layers:
            raise UserError(f"{label} is empty; give it at least one layer")
        if (phase.steps > 0) == (phase.epochs > 0) or phase.steps < 0 or phase.epochs < 0:
            if phase.steps > 0 and phase.epochs > 0:
                raise UserError(f"{label} gives both steps and epochs; give one")
            raise UserError(f"{label} has zero length; give steps > 0 or epochs > 0")
        if not phase.ffn_scale > 0:
            raise UserError(f"{label}: ffn_scale must be > 0, not {phase.ffn_scale}")
        for layer in phase.layers:
            if layer not in kept:
                why = "an anti layer, omitted" if 0 <= layer < len(profile) else "not in the profile"
                raise UserError(f"{label}: unknown layer {layer} ({why}; the model has {sorted(kept)})")
        dropped = sorted(set(trained) - set(phase.layers))
        if dropped:
            raise UserError(f"{label} drops layer {dropped[0]}, which exists already; layers are only added")
        new = sorted(set(phase.layers) - set(trained))
        sources = phase.sources()
        for layer, source in sources.items():
            if layer not in new:
                raise UserError(f"{label}: clone_from names layer {layer}, which is not new in this phase")
            if source not in trained:
                raise UserError(f"{label}: layer {layer} is cloned from layer {source}, not trained yet")
        if trained:
            for layer in new:
                def nearest(t: int, layer: int = layer) -> tuple[int, int]:
                    return abs(t - layer), t

                sources.setdefault(layer, min(trained, key=nearest))
        layers = tuple(sorted(set(phase.layers)))
        done.append(replace(phase, layers=layers, clone_from=tuple(sorted(sources.items()))))
        trained = sorted(set(phase.layers))
    missing = sorted(kept - set(trained))
    if missing:
        raise UserError(f"layers {missing} are never trained; add them to a phase")
    return tuple(done)


def scale_phases(
    phases: Sequence[Phase], total_steps: int, steps_per_epoch: float = 1.0
) -> tuple[Phase, ...]:
    """Whole steps per phase, proportional to each phase's length, summing to `total_steps`."""
    weights = [p.steps if p.steps > 0 else p.epochs * steps_per_epoch for p in phases]
    if total_steps < len(phases):
        raise UserError(f"a budget of {total_steps} steps is less than one step per phase ({len(phases)})")
    raw = [total_steps * w / sum(weights) for w in weights]
    steps = [max(1, math.floor(r)) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (raw[i] - math.floor(raw[i]), -i), reverse=True)
    k = 0
    while sum(steps) != total_steps:
        i = order[k % len(order)]
        if sum(steps) < total_steps:
            steps[i] += 1
        elif steps[i] > 1:
            steps[i] -= 1
        k += 1
    return tuple(replace(p, steps=s, epochs=0.0) for p, s in zip(phases, steps, strict=True))


def resolve_steps(phases: Sequence[Phase], steps_per_epoch: float) -> tuple[Phase, ...]:
    """Epoch lengths to whole steps (at least one), for a table used as given."""
    return tuple(
        p if p.steps > 0 else replace(p, steps=max(1, round(p.epochs * steps_per_epoch)), epochs=0.0)
        for p in phases
    )


def layer_steps(phases: Iterable[Phase]) -> dict[int, int]:
    """How many optimizer steps each layer receives over the table."""
    counts: dict[int, int] = {}
    for phase in phases:
        for layer in phase.layers:
            counts[layer] = counts.get(layer, 0) + phase.steps
    return counts


def phase_from_dict(doc: dict[str, Any], n: int) -> Phase:
    if not isinstance(doc, dict):
        raise UserError(f"phase {n + 1} is not a table of name, layers, clone_from, ffn_scale, steps/epochs")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise UserError(f"phase {n + 1}: unknown key {unknown[0]!r}; use {', '.join(sorted(_KEYS))}")
    try:
        return Phase(
            name=str(doc.get("name", f"phase{n + 1}")),
            layers=tuple(_whole(x, "layers") for x in doc.get("layers", ())),
            clone_from=tuple(sorted((_whole(k, "clone_from"), _whole(v, "clone_from"))
                                    for k, v in dict(doc.get("clone_from", {})).items())),
            ffn_scale=_finite(doc.get("ffn_scale", 1.0), "ffn_scale"),
            steps=_whole(doc.get("steps", 0), "steps"),
            epochs=_finite(doc.get("epochs", 0.0), "epochs"),
        )
    except (TypeError, ValueError) as exc:
        raise UserError(f"phase {n + 1}: {exc}") from exc


def _whole(value: Any, key: str) -> int:
    """An integer from a table (a string of digits too); 1.5, 1e400 or true is refused, not rounded."""
    if isinstance(value, bool) or (isinstance(value, float) and not (value.is_integer() and abs(value) < 2**53)):
        raise ValueError(f"{key} must be whole numbers, not {value!r}")
    return int(value)


def _finite(value: Any, key: str) -> float:
    """A finite number from a table (NaN or inf would reach the trainer and the JSON writer)."""
    number = float(value)
    if isinstance(value, bool) or not math.isfinite(number):
        raise ValueError(f"{key} must be a finite number, not {value!r}")
    return number


def phase_to_dict(phase: Phase) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": phase.name, "layers": list(phase.layers)}
    doc["clone_from"] = {str(k): v for k, v in phase.clone_from}
    doc["ffn_scale"] = phase.ffn_scale
    doc["steps" if phase.steps > 0 else "epochs"] = phase.steps if phase.steps > 0 else phase.epochs
    return doc


def load_phases(path: Path) -> tuple[Phase, ...]:
    """A phase table from JSON ({"phases": [...]} or a list) or TOML ([[phases]] tables)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read phase table {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"phase table {path} is not UTF-8 text; give a TOML or JSON file") from exc
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            doc: Any = tomllib.loads(text)
        else:
            doc = loads(text)  # a ValueError when too deeply nested too (engine.core.untrusted)
    except ValueError as exc:
        raise UserError(f"phase table {path} does not parse: {str(exc).splitlines()[0]}") from exc
    rows = doc.get("phases") if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        raise UserError(f"phase table {path} needs a list of phases (JSON list, or [[phases]] in TOML)")
    return tuple(phase_from_dict(row, n) for n, row in enumerate(rows))
