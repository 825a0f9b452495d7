"""The growth run's design: the settings resolved into its arms (phases, widths, parameter counts)
and the training configuration, checked before any data is read; the arms' phases as the
`growth.plan` event carries them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.errors import UserError
from engine.experiments.growth.architecture import growth_widths, param_count, solve_uniform_width
from engine.experiments.growth.profile import check_profile, kept_layers, multipliers_dict
from engine.experiments.growth.protocol import (
    Phase,
    derive_phases,
    resolve_steps,
    scale_phases,
    validate_phases,
)
from engine.experiments.growth.trainer import ArmPlan, TrainConfig
from engine.experiments.growth.vocabulary import ARMS, GrowthSettings


@dataclass(frozen=True)
class Design:
    """What the settings resolve to: the arms, sizes and data."""

    arms: dict[str, ArmPlan]
    kept: list[int]
    params: dict[str, int]
    train_config: TrainConfig
    steps_per_epoch: float


def design(settings: GrowthSettings, vocab_size: int, train_tokens: int) -> Design:
    """Resolves profile, phases and widths into the three arms; checks everything first."""
    profile = check_profile(settings.profile)
    multipliers = multipliers_dict(settings.multipliers)
    unknown = [a for a in settings.arms if a not in ARMS]
    if unknown or not settings.arms:
        raise UserError(f"unknown arm {unknown[0] if unknown else '(none)'}; use {', '.join(ARMS)}")
    if not 0 < settings.half_fraction <= 1:
        raise UserError(f"half fraction must be in (0, 1], not {settings.half_fraction}")
    kept = kept_layers(profile)
    table = derive_phases(profile) if settings.phases is None else validate_phases(settings.phases, profile)
    batch_tokens = settings.batch_size * settings.seq_len
    per_epoch = train_tokens / batch_tokens
    if settings.steps:
        full = scale_phases(table, settings.steps, per_epoch)
    else:
        full = resolve_steps(table, per_epoch)
    total = sum(p.steps for p in full)
    half = scale_phases(full, max(len(full), round(total * settings.half_fraction)))
    widths = tuple(growth_widths(profile, settings.base_ffn, multipliers))
    growth_params = param_count(vocab_size, settings.hidden_size, widths)
    uniform_width = solve_uniform_width(vocab_size, settings.hidden_size, len(kept), growth_params)
    uniform_params = param_count(vocab_size, settings.hidden_size, [uniform_width] * len(kept))
    uniform = (Phase("uniform", tuple(kept), steps=total),)
    arms = {
        "growth_100": ArmPlan("growth_100", full, widths, False),
        "growth_50": ArmPlan("growth_50", half, widths, False),
        "uniform_100": ArmPlan("uniform_100", uniform, (uniform_width,) * len(kept), True),
    }
    config = TrainConfig(
        vocab_size=vocab_size, hidden_size=settings.hidden_size, heads=settings.heads,
        seq_len=settings.seq_len, batch_size=settings.batch_size, lr=settings.lr,
        warmup_frac=settings.warmup_frac, weight_decay=settings.weight_decay, grad_clip=settings.grad_clip,
        eval_every=max(1, settings.eval_every), checkpoint_every=max(0, settings.checkpoint_every),
        device="cpu" if settings.device == "auto" else settings.device,
        dtype="float32" if settings.dtype == "auto" else settings.dtype,
    )  # fmt: skip
    return Design(
        arms={a: arms[a] for a in ARMS if a in settings.arms},
        kept=kept,
        params={"growth": growth_params, "uniform": uniform_params},
        train_config=config,
        steps_per_epoch=per_epoch,
    )


def plan_doc(plan: ArmPlan) -> dict[str, Any]:
    return {
        "steps": plan.total_steps,
        "phases": [
            {"name": p.name, "start": s, "steps": p.steps, "layers": list(p.layers),
             "clone_from": {str(k): v for k, v in p.clone_from}, "ffn_scale": p.ffn_scale}
            for p, s in zip(plan.phases, plan.starts(), strict=True)
        ],
    }  # fmt: skip


def planned_arms(settings: GrowthSettings) -> dict[str, dict[str, Any]] | None:
    """The arms' phases as `growth.plan` will carry them, before any data is read (the console shows
    them before the first run); None when the table is in epochs, whose steps need the corpus."""
    if not settings.steps:
        return None
    tokens = settings.batch_size * settings.seq_len
    plan = design(settings, vocab_size=256, train_tokens=tokens * settings.steps)  # steps fix the phases
    return {name: plan_doc(arm) for name, arm in plan.arms.items()}
