"""The console's thread workers. Each takes everything it needs as arguments, captured on the UI
thread when it was started, and reports through `post` (the app's thread-safe `post_message`):
none of them reads or writes a widget or an attribute of the app. torch loads here, after the
first paint."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from textual.message import Message

from engine.core.errors import UserError
from engine.core.events import CancelToken
from engine.core.settings import Settings
from engine.core.turns import ModelTurns
from engine.experiments.variants import SavedModels, Variant
from engine.models.options import ModelOptions
from sessions.store import Session
from tui.messages import (
    ExperimentFinished,
    GenerationDone,
    GrowthPreview,
    ModelFailed,
    ModelLoaded,
    ModelProgress,
    TextGenerated,
)

if TYPE_CHECKING:  # the model's module is imported by the worker that loads it
    from engine.models.loading import LoadedModel

log = logging.getLogger("anatomy_tui.console")

Post = Callable[[Message], Any]


def load_model_work(post: Post, options: ModelOptions) -> None:
    """Loads the model as `options` say (over several devices with --device-map); posts
    ModelLoaded, or ModelFailed with the reason."""
    from tui.logging_setup import route_transformers_logs

    route_transformers_logs()

    def report(text: str) -> None:
        log.info(text)
        post(ModelProgress(text))

    try:
        loaded = options.load(report)
    except Exception as exc:
        log.exception("loading %s failed", options.model)
        post(ModelFailed(str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"))
        return
    post(ModelLoaded(loaded))


def experiment_work(
    post: Post, session: Session, loaded: LoadedModel, options: ModelOptions, turns: ModelTurns,
    name: str, settings: Settings, token: CancelToken, resume: bool = False,
) -> None:
    """An experiment of the registry in the console (the layer map), written into the session like a
    job of its own, with its settings and model recorded as data. It takes the model a forward at a
    time (`turns`), so the prompt pane's generations go on while it runs. A resumable one keeps its
    checkpoint in the session as a job in its own process does, and with `resume` goes on from it."""
    from engine.experiments.context import RunContext
    from engine.registry import experiment
    from sessions.job_runner import run_job

    try:
        spec = {**settings.to_dict(), "model": loaded.describe()}
        entry = experiment(name)
        folder = session.checkpoint_dir(name) if entry.resumable else None
        context = RunContext(model=loaded, cancel=token, turns=turns, checkpoint_dir=folder, resume=resume)
        run_job(session, name, spec, entry.run(settings, context), settings=settings.to_dict(),
                model=options.to_dict(), cancel=token, resume=resume)
    finally:
        post(ExperimentFinished(name))


def growth_preview_work(post: Post, flags: tuple[str, ...]) -> None:
    """The growth form's planned phases (torch is imported here, off the UI thread)."""
    from cli.flags import settings_from_flags
    from engine.experiments.growth.design import planned_arms
    from engine.registry import BY_NAME

    try:
        arms = planned_arms(settings_from_flags(BY_NAME["growth"], flags))  # type: ignore[arg-type]  # growth's row makes GrowthSettings
    except UserError as exc:
        log.info("no growth preview for %s: %s", flags, exc)
        return
    if arms is not None:
        post(GrowthPreview(flags, arms))


@dataclass(frozen=True)
class Column:
    """One prompt column: the variant it generates with, or why it cannot (`problem`)."""

    id: str
    variant: Variant | None = None
    problem: str = ""


@dataclass(frozen=True)
class GenerationPlan:
    """One prompt, every column, and what the worker needs, all captured on the UI thread."""

    run: int
    prompt: str
    columns: tuple[Column, ...]
    tokens: int
    loaded: LoadedModel
    turns: ModelTurns  # one turn a column, while the loaded model's weights are changed and used
    stop: threading.Event
    session: Session
    saved_models: SavedModels


def generate_work(post: Post, plan: GenerationPlan, show: Post | None = None) -> None:
    """Each column in turn, its text streamed through TextGenerated to `show` (the console screen;
    `post` when None); GenerationDone, through `post`, at the end."""
    show = show or post
    try:
        for column in plan.columns:
            if plan.stop.is_set():
                show(TextGenerated(plan.run, column.id, "", "stopped"))
            elif column.problem:
                show(TextGenerated(plan.run, column.id, "", column.problem))
            else:
                try:
                    _generate_column(show, plan, column)
                except UserError as exc:  # out of memory, a layer that cannot be changed: said in the column
                    show(TextGenerated(plan.run, column.id, "", str(exc)))
    finally:
        post(GenerationDone(plan.run))


def _generate_column(post: Post, plan: GenerationPlan, column: Column) -> None:
    from engine.evaluation.generation import generate_text
    from engine.experiments.variants import ON_LOADED_MODEL, applied
    from engine.models.oom import out_of_memory_guard
    from sessions.layer_weights import load_layers

    variant = column.variant
    assert variant is not None  # a column without a variant has a problem instead
    text = ""

    def show(piece: str = "", note: str = "") -> None:
        nonlocal text
        text += piece
        post(TextGenerated(plan.run, column.id, text, note))

    with ExitStack() as held:
        if variant.name in ON_LOADED_MODEL:
            held.enter_context(plan.turns.turn(waiting=lambda: show(note="waiting for the map's current batch")))
            if variant.name == "recovered":
                variant = replace(variant, weights=load_layers(plan.session, "recovery", plan.loaded.name))
            model = held.enter_context(applied(plan.loaded.model, variant))
            tokenizer = plan.loaded.tokenizer
        else:
            assert variant.path is not None  # a saved arm's variant has its folder, else a problem (Lab.variant)
            model, tokenizer = plan.saved_models.get(variant.path)
        with out_of_memory_guard("generation", "stopping the job that holds the GPU, or --dtype float16"):
            generate_text(model, tokenizer, plan.prompt, plan.tokens, stop=plan.stop.is_set, on_text=show)
    show(note="stopped" if plan.stop.is_set() else "")
