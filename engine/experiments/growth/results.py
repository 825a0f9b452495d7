"""The growth run's result: each arm's losses, times and curves over the seeds, the first seed's
generations of the fixed prompts, the budget each layer received, and the paper's numbers beside
them."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from engine.core.codec import json_safe
from engine.experiments.growth.design import Design
from engine.experiments.growth.protocol import layer_steps, phase_to_dict
from engine.experiments.growth.vocabulary import (
    GrowthArm,
    GrowthBudgetRow,
    GrowthData,
    GrowthResult,
    GrowthSettings,
    GrowthWidths,
)

PROMPTS = (
    "The for statement is used to",
    "A class definition is",
    "The return statement",
    "Exceptions are raised by",
    "The value of a list",
    "If the condition is true,",
    "A function call",
    "The import statement",
    "Strings are immutable",
    "The while loop",
    "A dictionary maps",
    "When an object is deleted,",
)
PAPER_RESULTS = {
    "growth_val_loss": 0.127, "uniform_val_loss": 0.599, "growth_seconds": 52.0, "uniform_seconds": 59.6,
}  # fmt: skip


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def budget_table(settings: GrowthSettings, plan: Design) -> list[GrowthBudgetRow]:
    """Effective steps and epochs each layer receives in each arm."""
    counts = {name: layer_steps(arm.phases) for name, arm in plan.arms.items()}
    rows = []
    for layer in plan.kept:
        steps = {name: counts[name].get(layer, 0) for name in plan.arms}
        epochs = {name: round(n / plan.steps_per_epoch, 3) for name, n in steps.items()}
        rows.append(GrowthBudgetRow(layer=layer, layer_class=settings.profile[layer], steps=steps, epochs=epochs))
    return rows


def mean_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The validation loss at each step every seed evaluated, averaged over the seeds."""
    by_step = [dict(curve) for curve in curves]
    shared = set.intersection(*(set(losses) for losses in by_step)) if by_step else set()
    return [(step, statistics.fmean(losses[step] for losses in by_step)) for step in sorted(shared)]


def result_doc(
    settings: GrowthSettings,
    plan: Design,
    completed: dict[str, dict[str, Any]],
    corpus: Any,
    model_dir: Path | None,
) -> dict[str, Any]:
    arms: dict[str, GrowthArm] = {}
    for name, arm in plan.arms.items():
        records = [completed[f"{name}/{seed}"] for seed in settings.seeds]
        losses = [r["val_loss"] for r in records]
        arms[name] = GrowthArm(
            val_loss=losses,
            mean=statistics.fmean(losses),
            sd=_sd(losses),
            seconds=statistics.fmean(r["seconds"] for r in records),
            seconds_sd=_sd([r["seconds"] for r in records]),
            tokens_per_s=statistics.fmean(r["tokens_per_s"] for r in records),
            tokens_per_s_sd=_sd([r["tokens_per_s"] for r in records]),
            steps=arm.total_steps,
            tokens=arm.total_steps * settings.batch_size * settings.seq_len,
            phases=records[0]["phases"],
            model=str(Path(model_dir) / name) if model_dir is not None else None,
            curve=mean_curve([r.get("curve", []) for r in records]),
        )
    first = settings.seeds[0]
    generations = [
        {"prompt": prompt, **{name: completed[f"{name}/{first}"]["generations"][i] for name in plan.arms}}
        for i, prompt in enumerate(PROMPTS)
    ]
    growth = plan.arms.get("growth_100")
    phases = []
    if growth is not None:
        for phase, start, stats in zip(
            growth.phases, growth.starts(), arms["growth_100"].phases, strict=True
        ):
            phases.append({**phase_to_dict(phase), "start": start, "seconds": stats["seconds"],
                           "tokens_per_s": stats["tokens_per_s"]})  # fmt: skip
    ratio = None
    if "growth_100" in arms and "uniform_100" in arms and arms["growth_100"].seconds > 0:
        ratio = arms["uniform_100"].seconds / arms["growth_100"].seconds
    doc: dict[str, Any] = json_safe(GrowthResult(
        preset=settings.preset,
        params=plan.params,
        arms=arms,
        phases=phases,
        generations=generations,
        budget_table=budget_table(settings, plan),
        ratio_uniform_over_growth_seconds=ratio,
        profile=list(settings.profile),
        widths=GrowthWidths(growth=list(plan.arms[next(iter(plan.arms))].widths) if growth else None,
                            uniform=plan.arms["uniform_100"].widths[0] if "uniform_100" in plan.arms else None),
        data=GrowthData(source=corpus.source, tokenizer="character", vocab_size=corpus.tokenizer.vocab_size,
                        train_tokens=len(corpus.train), val_tokens=len(corpus.val),
                        batch_tokens=settings.batch_size * settings.seq_len),
        settings=settings,
        paper=PAPER_RESULTS,
    ))  # fmt: skip
    return doc
