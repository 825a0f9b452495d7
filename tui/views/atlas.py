"""The text of an atlas or a comparison (engine/atlas/table.py's document): per-criterion profiles on
relative depth (one line per model, a sparkline and the bins' means; D % on a log axis), the class
bands, the depths critical or redundant in every model, the criteria's agreement and calibration
stability, and, for models of one depth, D % layer by layer. `anatomy-tui compare`, `anatomy-tui
atlas` and the console's Compare view print it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from engine.atlas import table as A

SHORT = {"d_pct": "D%", "block_influence": "BI", "angular_distance": "ang", "angular_last_token": "ang-last",
         "removal_ppl": "ppl-rm", "angle_state": "θstate", "angle_update": "θupd", "recovery_difficulty": "recov"}
SPARK = "▁▂▃▄▅▆▇█"
BAND_WIDTH = 40
CORE = ("d_pct", "block_influence", "angular_distance", "angular_last_token", "removal_ppl")  # compared pairwise
LOG_FLOOR = 0.1  # D % below this (or negative: anti-layers) sits at the bottom of the log axis


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def spark(values: Sequence[float | None], log: bool, low: float, high: float) -> str:
    """One character per value, from the lowest to the highest of the whole table (log10 for D %)."""
    def scaled(v: float) -> float:
        return math.log10(max(v, LOG_FLOOR)) if log else v

    lo, hi = scaled(low), scaled(high)
    out = []
    for v in values:
        if v is None:
            out.append(" ")
            continue
        x = 0.0 if hi == lo else (scaled(v) - lo) / (hi - lo)
        out.append(SPARK[min(int(x * len(SPARK)), len(SPARK) - 1)])
    return "".join(out)


def short_names(models: Sequence[str]) -> dict[str, str]:
    """A model's label in the tables: the last part of its path, or the whole name where two share it."""
    last = {m: Path(m.rstrip("/")).name or m for m in models}
    return {m: last[m] if list(last.values()).count(last[m]) == 1 else m for m in models}


def report_lines(doc: A.AtlasDocument) -> list[str]:
    names = short_names(doc.models)
    doc = replace(doc, models=[names[m] for m in doc.models], rows=[replace(r, model=names[r.model]) for r in doc.rows],
                  agreement=replace(doc.agreement, pairs={names[m]: p for m, p in doc.agreement.pairs.items()}),
                  stability=replace(doc.stability, rho={names[m]: r for m, r in doc.stability.rho.items()}))
    rows, n_bins = doc.rows, doc.n_bins
    width = max((len(m) for m in doc.models), default=5) + 2
    lines: list[str] = []
    for criterion in A.criteria_of(rows):
        profiles = {m: A.binned_profile(rows, m, criterion, n_bins) for m in doc.models}
        values = [v for p in profiles.values() for v in p.values()]
        if not values:
            continue
        log = criterion == "d_pct"
        axis = ", log axis" if log else ""
        lines.append(f"{SHORT[criterion]} by relative depth ({n_bins} bins of {1 / n_bins:.2g}{axis}): "
                     f"{A.CRITERIA[criterion]}")
        for model, prof in profiles.items():
            cells = [prof.get(b) for b in range(n_bins)]
            lines.append(f"  {model:<{width}}{spark(cells, log, min(values), max(values))}  "
                         + " ".join(f"{_fmt(c):>6}" for c in cells))
        lines.append("")
    classes = A.classes_by_model(rows)
    if classes:
        depth = {row.model: row.n_layers for row in rows}
        lines.append("class bands on relative depth 0 → 1 (C critical, I important, m minor, r redundant):")
        for model, layers in classes.items():
            lines.append(f"  {model:<{width}}{A.class_band(layers, depth[model], BAND_WIDTH)}")
        for verdict in ("critical", "redundant"):
            spans = [f"{b.lo:.2g}-{b.hi:.2g}" for b in doc.bands if b.verdict == verdict]
            lines.append(f"  {verdict} in every model: {', '.join(spans) or 'no depth'}")
        lines.append("")
    protocols = {row.model: row.protocol for row in rows if row.measure == "d_pct" and row.variant == A.MAIN}
    if len(set(protocols.values())) > 1:
        lines += ["note: the models' maps were measured under different protocols (the protocol column); "
                  "their D % compare only roughly", ""]
    lines += agreement_lines(doc, width)
    lines += stability_lines(doc)
    lines += layer_by_layer(doc)
    return lines


def agreement_lines(doc: A.AtlasDocument, width: int) -> list[str]:
    agreement = doc.agreement
    keys = [k for k in dict.fromkeys(k for pairs in agreement.pairs.values() for k in pairs)
            if k.startswith("d_pct~") or set(k.split("~")) <= set(CORE)]  # every pair is in results/atlas.json
    if not keys:
        return []
    heads = ["~".join(SHORT[c] for c in key.split("~")) for key in keys]
    lines = ["criteria agreement (Spearman between per-layer values, per model):",
             f"  {'':<{width}}" + " ".join(f"{h:>11}" for h in heads)]
    for model, pairs in agreement.pairs.items():
        lines.append(f"  {model:<{width}}" + " ".join(f"{_fmt(pairs.get(k)):>11}" for k in keys))
    lines.append("across models (vs D %: mean, lowest; profile consistency: mean Spearman of binned profiles "
                 "between models):")
    for criterion, across in agreement.across_models.items():
        with_d = agreement.with_d.get(criterion)
        versus = f"vs D% {_fmt(with_d['mean'])}, {_fmt(with_d['min'])}; " if with_d else ""
        lines.append(f"  {SHORT[criterion]:<9}{versus}consistency {_fmt(across)}")
    if agreement.most_consistent:
        lines.append(f"  most consistent across models: {SHORT[agreement.most_consistent]}")
    lines.append("")
    return lines


def stability_lines(doc: A.AtlasDocument) -> list[str]:
    stability = doc.stability
    if not stability.stable:
        return []
    lines = [f"calibration sensitivity (Spearman with the main text; stable: every one >= {stability.threshold}):"]
    for criterion, stable in stability.stable.items():
        per = [f"{model} {variant} {_fmt(rho)}" for model, by in stability.rho.items()
               for variant, rho in by.get(criterion, {}).items()]
        verdict = "stable" if stable else "unstable"
        lines.append(f"  {SHORT[criterion]:<9}{verdict:<9}" + "; ".join(per))
    lines.append("")
    return lines


def layer_by_layer(doc: A.AtlasDocument) -> list[str]:
    """Models of the same depth (two sessions of one model, say): D % layer by layer, side by side."""
    depths = {row.n_layers for row in doc.rows}
    if len(doc.models) < 2 or len(depths) != 1:
        return []
    n = depths.pop()
    criterion = next((c for c in A.criteria_of(doc.rows)), None)
    if criterion is None:
        return []
    profiles = {m: A.profile(doc.rows, m, criterion) for m in doc.models}
    widths = {m: max(len(m), 8) for m in doc.models}
    lines = [f"{SHORT[criterion]} layer by layer:", "  layer " + " ".join(f"{m:>{widths[m]}}" for m in doc.models)]
    for layer in range(n):
        lines.append(f"  {layer:>5} " + " ".join(f"{_fmt(profiles[m].get(layer)):>{widths[m]}}" for m in doc.models))
    for i, a in enumerate(doc.models):
        for b in doc.models[i + 1:]:
            lines.append(f"  Spearman {a} ~ {b}: {_fmt(A.rank_agreement(profiles[a], profiles[b]))}")
    return [*lines, ""]


def print_report(doc: A.AtlasDocument) -> None:
    print("\n".join(report_lines(doc)).rstrip())
