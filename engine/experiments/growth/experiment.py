"""The growth experiment: settings, presets, and `run_growth`, which trains every arm for every
seed, generates from the final models and assembles the result document.

Arms: growth_100 (the phase table at the full budget), growth_50 (every phase scaled to half the
steps), uniform_100 (the uniform baseline, all layers, the full budget). The budget is optimizer
steps x batch tokens; every arm uses the same batch, so equal steps mean equal tokens, and the
growth arms count their steps over all phases. Each seed fixes the initialisation and the data
order, which is the same for every arm of that seed.

Paper preset dimensions (the paper's are not public, these are ours): 12 layers, hidden 256,
8 heads of 32, SwiGLU FFN with base width 345 (critical 1380, important and minor 690, redundant
345), character vocabulary (~104), untied embeddings, context 128, batch 32 (4096 tokens a step),
656 steps, AdamW lr 2e-3, betas (0.9, 0.95), weight decay 0.01, 5 % warm-up then cosine to 10 %,
gradient clip 1.0: 9.56 M parameters; the uniform baseline solves to FFN width 690 (same count).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress, Result
from engine.core.settings import from_preset
from engine.disk.atomic import guarded_root, inside
from engine.disk.session_layout import GROWTH_MODELS
from engine.evaluation.generation import generate_text
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.context import RunContext
from engine.experiments.growth.checkpoint import load_checkpoint, save_checkpoint
from engine.experiments.growth.data import load_corpus, val_batches
from engine.experiments.growth.design import design, plan_doc
from engine.experiments.growth.profile import (
    profile_from_ablation,
)
from engine.experiments.growth.results import PROMPTS, result_doc
from engine.experiments.growth.trainer import ArmOutcome, train_arm
from engine.experiments.growth.vocabulary import (
    PRESETS,
    GrowthArmDone,
    GrowthPlan,
    GrowthSettings,
    GrowthStep,
)
from engine.models.precision import precision_messages, training_precision


def preset_settings(name: str, **changes: Any) -> GrowthSettings:
    return from_preset(PRESETS, name, **changes)


def saved_settings(checkpoint_dir: Path) -> GrowthSettings | None:
    """The settings of the run checkpointed in `checkpoint_dir`, for --resume."""
    found = load_checkpoint(checkpoint_dir)
    return None if found is None else GrowthSettings.from_dict(found[0]["settings"])


def run_growth(
    settings: GrowthSettings,
    cancel: CancelToken | None = None,
    checkpoint_dir: Path | None = None,
    model_dir: Path | None = None,
    resume: bool = False,
) -> Iterator[Event]:
    """Every arm for every seed; checkpoints go to `checkpoint_dir`, final models (first seed) to
    `model_dir/<arm>` with `save_pretrained`. `resume` continues the run checkpointed there."""
    import torch

    settings.validate()
    previous = torch.get_num_threads()
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    try:
        yield from _run(settings, cancel, checkpoint_dir, model_dir, resume)
    finally:
        torch.set_num_threads(previous)


def _run(
    settings: GrowthSettings,
    cancel: CancelToken | None,
    checkpoint_dir: Path | None,
    model_dir: Path | None,
    resume: bool,
) -> Iterator[Event]:
    settings = dataclasses.replace(settings, **training_precision(settings.device, settings.dtype))
    yield from precision_messages(settings.device, settings.dtype)
    corpus = load_corpus(settings.train_file)
    plan = design(settings, corpus.tokenizer.vocab_size, len(corpus.train))
    spec = settings.to_dict()
    val_set = val_batches(corpus.val, settings.eval_batches, settings.batch_size, settings.seq_len)
    completed: dict[str, dict[str, Any]] = {}
    in_progress: tuple[dict[str, Any], dict[str, Any]] | None = None
    if resume:
        found = load_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
        if found is None:
            raise UserError(f"nothing to resume: no checkpoint in {checkpoint_dir}")
        state, tensors = found
        if state["settings"] != spec:
            raise UserError("the checkpoint was made with other settings; resume without changing flags")
        completed = state["completed"]
        if state.get("arm") is not None:
            in_progress = (state["arm"], tensors)
    yield Message(
        f"parameters: growth {plan.params['growth']:,}, uniform {plan.params['uniform']:,} "
        f"({100 * (plan.params['uniform'] / plan.params['growth'] - 1):+.3f} %); data {corpus.source}, "
        f"{len(corpus.train):,} train / {len(corpus.val):,} val characters, "
        f"vocabulary {corpus.tokenizer.vocab_size}"
    )
    yield GrowthPlan(
        arms={name: plan_doc(arm) for name, arm in plan.arms.items()},
        seeds=list(settings.seeds),
        params=plan.params,
        profile=list(settings.profile),
        batch_tokens=settings.batch_size * settings.seq_len,
    )
    total_steps = len(settings.seeds) * sum(a.total_steps for a in plan.arms.values())
    done_steps = sum(r["steps"] for r in completed.values())
    if in_progress is not None:
        done_steps += in_progress[0].get("step", 0)

    def save(key: str | None, arm_state: dict[str, Any] | None, tensors: dict[str, Any]) -> None:
        if checkpoint_dir is not None:
            doc = {"settings": spec, "completed": completed, "arm": None}
            if key is not None:
                doc["arm"] = {"key": key, **(arm_state or {})}
            tag = f"{(key or 'done').replace('/', '-')}-{(arm_state or {}).get('step', 0)}"
            save_checkpoint(checkpoint_dir, tag, tensors, doc)

    for seed in settings.seeds:
        for name, arm in plan.arms.items():
            key = f"{name}/{seed}"
            if key in completed:
                continue
            resume_arm = None
            if in_progress is not None and in_progress[0]["key"] == key:
                resume_arm = in_progress
            run = train_arm(
                arm, seed, plan.train_config, plan.kept, corpus.train, val_set, cancel,
                save=functools.partial(save, key), resume=resume_arm,
            )  # fmt: skip
            outcome: ArmOutcome
            while True:
                try:
                    event = next(run)
                except StopIteration as stop:
                    outcome = stop.value
                    break
                yield event
                if isinstance(event, GrowthStep):
                    done_steps += 1
                    if event.step % 10 == 0 or event.step == event.total_steps:
                        yield Progress(done_steps, total_steps, f"{name} seed {seed} {event.phase}", phase="training",
                                       unit="steps")
            record = {
                "arm": name, "seed": seed, "val_loss": outcome.val_loss, "seconds": outcome.seconds,
                "tokens_per_s": outcome.tokens_per_s, "steps": outcome.steps, "phases": outcome.phase_stats,
                "curve": outcome.curve, "generations": [],
            }  # fmt: skip
            if seed == settings.seeds[0]:
                assert outcome.model is not None  # train_arm returns the model it trained
                model = outcome.model.model
                model.eval()
                record["generations"] = [
                    generate_text(model, corpus.tokenizer, p, settings.gen_tokens, context=settings.seq_len)
                    for p in PROMPTS
                ]
                if model_dir is not None:
                    folder = Path(model_dir) / name  # in a session: never saved through a link, in it or on the way
                    inside(folder, guarded_root(folder) or folder, "the growth run's model folder")
                    outcome.model.save(Path(model_dir) / name)
                    corpus.tokenizer.save(Path(model_dir) / name)
            completed[key] = record
            save(None, None, {})
            yield GrowthArmDone(
                arm=name, seed=seed, val_loss=outcome.val_loss, seconds=outcome.seconds,
                tokens_per_s=outcome.tokens_per_s, steps=outcome.steps,
            )  # fmt: skip
    yield Result(name="growth", data=result_doc(settings, plan, completed, corpus, model_dir))


def run(settings: GrowthSettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry. With `context.resume` the checkpoint's own settings are used (so a
    resumed run is the interrupted one), and a run stopped before its first checkpoint starts again
    from the beginning with the settings given (the `continue with` command carries them all);
    final models go to `context.output_dir/growth_models`."""
    folder = context.checkpoint_dir
    resume = context.resume
    saved = saved_settings(folder) if resume and folder is not None else None
    if saved is not None:
        yield Message("resuming with the checkpoint's settings (other settings are ignored)")
        settings = saved
    elif resume:  # stopped before its first checkpoint: the run this command describes, from its start
        yield Message("no growth checkpoint in this session yet (the run stopped before its first): "
                      "starting from the beginning with these settings")
        resume = False
    if saved is None and settings.profile_from is not None:
        ablation = context.input(AblationMap)
        if ablation is None:
            raise UserError(f"session {settings.profile_from!r} has no ablation result; "
                            "run `anatomy-tui run ablation` there first")
        profile = profile_from_ablation(ablation, settings.profile_layers)
        yield Message(f"profile from session {settings.profile_from}'s ablation map: {','.join(profile)}")
        settings = dataclasses.replace(settings, profile=profile, profile_from=None)
        settings.validate()
    models = context.output_dir / GROWTH_MODELS if context.output_dir is not None else None
    yield from run_growth(settings, context.cancel, folder, models, resume)
