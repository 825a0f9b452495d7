"""recovery's summaries: what one run's curve says (thresholds, best and final perplexity), a
layer's row over its repeats, and the comparisons across layers (ranking, the training budget, the
Spearman against the session's ablation map)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

import numpy as np

from engine.core.codec import json_safe
from engine.evaluation.statistics import spearman
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.recovery.vocabulary import (
    DIFFICULTY_THRESHOLD,
    THRESHOLDS,
    LayerBudget,
    RecoveryBudget,
    RecoveryRepeat,
    RecoveryRow,
    RecoverySettings,
    RecoveryVsAblation,
)


def threshold_key(threshold: float) -> str:
    return str(float(threshold))


def steps_to_thresholds(
    curve: Sequence[Sequence[float]], baseline: float, thresholds: Sequence[float] = THRESHOLDS
) -> dict[str, int | None]:
    """First evaluated step whose perplexity is below threshold x baseline (None: never)."""
    found: dict[str, int | None] = {}
    for threshold in thresholds:
        hits = [int(step) for step, ppl in curve if ppl < threshold * baseline]
        found[threshold_key(threshold)] = hits[0] if hits else None
    return found


def summarise_run(curve: Sequence[Sequence[float]], baseline: float, status: str) -> dict[str, Any]:
    """What one run's curve says: thresholds, best and final perplexity, anti-layer signature."""
    ppls = [ppl if math.isfinite(ppl) else math.inf for _, ppl in curve]
    best = int(np.argmin(ppls))
    final = curve[-1][1]
    return {
        "status": status,
        "ppl_after_noise": curve[0][1],
        "ratio_after_noise": curve[0][1] / baseline,
        "steps_to": steps_to_thresholds(curve, baseline),
        "best_ppl": curve[best][1],
        "best_step": int(curve[best][0]),
        "final_ppl": final,
        "final_ratio": final / baseline,
        "improved_over_baseline": bool(final < baseline),
        "curve": [[int(step), ppl] for step, ppl in curve],
    }


def difficulty(steps_to: dict[str, int | None], budget: int) -> int:
    """Steps to get below 1.1x the baseline; never reached (or diverged first) counts as the budget."""
    steps = steps_to[threshold_key(DIFFICULTY_THRESHOLD)]
    return budget if steps is None else int(steps)


def layer_row(index: int, runs: list[RecoveryRepeat], budget: int) -> RecoveryRow:
    """The layer's result: run 0 at the top, every run under `repeats`, spread over repeats.
    Non-finite numbers become null here, so the row can be saved as it is."""
    shared = {f.name for f in fields(RecoveryRow)}
    top = {k: v for k, v in asdict(runs[0]).items() if k in shared}
    final_ratios = [math.nan if run.final_ratio is None else run.final_ratio for run in runs]  # None: saved inf/nan
    mean, sd, reached = {}, {}, {}
    for threshold in THRESHOLDS:
        key = threshold_key(threshold)
        hits = [steps for run in runs if (steps := run.steps_to[key]) is not None]
        reached[key] = len(hits)
        mean[key] = float(np.mean(hits)) if hits else None
        sd[key] = float(np.std(hits, ddof=1)) if len(hits) > 1 else None
    return RecoveryRow.from_json(json_safe({
        "layer": index,
        **top,
        "difficulty": float(np.mean([difficulty(run.steps_to, budget) for run in runs])),
        "mean_final_ratio": float(np.mean(final_ratios)),
        "steps_to_mean": mean,
        "steps_to_sd": sd,
        "steps_to_reached": reached,
        "repeats": runs,
    }))


def training_budget(rows: list[RecoveryRow], steps: int) -> RecoveryBudget:
    """The paper's Table 10 idea: a uniform budget against steps sized by measured difficulty.

    `proposed_steps` gives each layer the steps it needed to get below 1.1x the baseline (the full
    budget when it never did); `reallocated_steps` splits the uniform total in proportion to
    difficulty instead (same cost, more steps for the hard layers).
    """
    uniform_total = steps * len(rows)
    total_difficulty = sum(row.difficulty for row in rows)
    per_layer = []
    for row in rows:
        share = row.difficulty / total_difficulty if total_difficulty else 1 / len(rows)
        per_layer.append(
            LayerBudget(
                layer=row.layer,
                difficulty=row.difficulty,
                uniform_steps=steps,
                proposed_steps=min(steps, math.ceil(row.difficulty)),
                reallocated_steps=round(uniform_total * share),
            )
        )
    proposed_total = sum(item.proposed_steps for item in per_layer)
    return RecoveryBudget(
        rule="proposed: steps to get below 1.1x baseline (never reached = the full budget); "
        "reallocated: the uniform total split in proportion to that difficulty",
        uniform_total=uniform_total,
        proposed_total=proposed_total,
        saving_steps=uniform_total - proposed_total,
        saving_pct=100.0 * (uniform_total - proposed_total) / uniform_total if uniform_total else 0.0,
        per_layer=per_layer,
    )


def versus_ablation(rows: list[RecoveryRow], ablation: AblationMap | None) -> RecoveryVsAblation | None:
    """Spearman of recovery measures against the ablation map's D%, over the layers both have."""
    if ablation is None:
        return None
    degradation = {row.layer: row.degradation_pct for row in ablation.layers}
    shared = [row for row in rows if row.layer in degradation]
    d = [degradation[row.layer] for row in shared]
    return RecoveryVsAblation(
        layers=len(shared),
        ablation_method=ablation.method,
        difficulty=spearman([row.difficulty for row in shared], d),
        final_ratio=spearman([row.mean_final_ratio for row in shared], d),
        ratio_after_noise=spearman([row.ratio_after_noise for row in shared], d),
    )


def ranking(rows: list[RecoveryRow]) -> list[int]:
    """Layer indices from hardest to easiest: difficulty, then how far from baseline they ended."""
    def key(row: RecoveryRow) -> tuple[float, float]:
        ratio = row.mean_final_ratio
        return row.difficulty, ratio if ratio is not None and math.isfinite(ratio) else math.inf

    return [row.layer for row in sorted(rows, key=key, reverse=True)]


def over_layers(ordered: list[RecoveryRow], settings: RecoverySettings, ablation_map: AblationMap | None
                ) -> dict[str, Any]:
    """The fields of the result (`RecoveryResult`) that compare layers: ranking, Spearman, budget,
    mean step time."""
    vs_ablation = versus_ablation(ordered, ablation_map)
    runs = [run for row in ordered for run in row.repeats]
    run_seconds = [run.seconds_per_step for run in runs if run.seconds_per_step]
    return {
        "layers": ordered,
        "ranking": ranking(ordered),
        "spearman_vs_ablation": vs_ablation.difficulty if vs_ablation else None,
        "versus_ablation": vs_ablation,
        "budget": training_budget(ordered, settings.settled_steps),
        "seconds_per_step": float(np.mean(run_seconds)) if run_seconds else None,
    }

