"""Teacher-student toy models of paper B: how the loss of a student falls with its depth.

Teacher and students share one architecture, after the paper's reference code: Gaussian inputs,
RMS-normed, then pre-norm residual MLP blocks h <- h + W2 relu(W1 rmsnorm(h) + b)^2 (hidden 4 x width),
a final RMS norm and a linear head. The teacher's target is softmax(logits / T); its block outputs
are scaled by 1/sqrt(L). Its layers either all share block 0's weights (tied: one smooth flow,
"procedural assembly") or are drawn independently (independent: uncorrelated small updates,
"ensemble averaging"). Students of several depths l start with zero output projections and a zero
head (a uniform prediction) and minimise KL(teacher || student) on fresh inputs every step, so there
is no finite data set: what is left is what depth cannot express, plus what training did not reach.
The loss against depth is fitted with L(l) = c / l^a_l (+ L0 with `fit_floor`); a_l gets a
bootstrap interval.

All seeds of one student depth train together as one batched model (bmm over a seed axis, the same
inputs for every seed), which costs little more than one seed on a small CPU.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Collection, Generator, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.core.codec import json_safe
from engine.core.events import CancelToken, Event, Message, Progress, Result
from engine.core.settings import from_preset
from engine.experiments.context import RunContext
from engine.experiments.toy_depth.checkpoints import (
    finish_student,
    load_student,
    prepare_run,
    save_student,
    student_name,
)
from engine.experiments.toy_depth.fit import fit_line, fit_lines, group_fit, merge_shards, result_doc
from engine.experiments.toy_depth.networks import Teacher, train_students
from engine.experiments.toy_depth.vocabulary import (
    PRESETS,
    StudentDone,
    StudentStep,
    ToyDepthCurve,
    ToyDepthSettings,
    ToyDepthShare,
)
from engine.models.distributed import ShardPlan
from engine.models.precision import precision_messages, training_precision


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Sets torch's CPU thread count for a block and restores the previous one."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_toy_depth(settings: ToyDepthSettings, preset: str = "", cancel: CancelToken | None = None,
                  checkpoint_dir: Path | None = None, resume: bool = False) -> Iterator[Event]:
    """Trains every (regime, temperature, depth) group of students, then fits a_l per regime.

    With `checkpoint_dir`, each finished group is saved there (weights as safetensors, held-out
    losses as JSON); `resume` continues a run saved there, refusing other settings."""
    settings.validate()
    prepare_run(checkpoint_dir, resume, settings)
    with torch_threads(settings.threads):
        yield from _run(settings, preset, cancel, checkpoint_dir)


Student = tuple[str, float, int]  # a group of students: (regime, temperature, depth)


def students(settings: ToyDepthSettings) -> list[Student]:
    """Every group of students a run trains, in the order it trains them."""
    depths = sorted(set(settings.student_depths))
    return [(regime, t, depth) for regime in settings.regimes for t in settings.temperatures for depth in depths]


def _run(settings: ToyDepthSettings, preset: str, cancel: CancelToken | None,
         checkpoint_dir: Path | None = None, only: Collection[Student] | None = None) -> Iterator[Event]:
    """Trains the groups of students (those in `only`: a worker's share of a split run, whose
    Result lists its students' losses for `merge_shards`), fitting each complete (regime,
    temperature) curve as it ends."""
    started = time.perf_counter()
    settings = replace(settings, **training_precision(settings.device, settings.dtype))
    yield from precision_messages(settings.device, settings.dtype)
    depths = sorted(set(settings.student_depths))
    wanted = [student for student in students(settings) if only is None or student in only]
    losses: dict[Student, list[float]] = {}
    by_temperature: dict[str, dict[str, ToyDepthCurve]] = {}
    yield Progress(0, len(wanted), "students", unit="students")
    for regime in dict.fromkeys(regime for regime, _, _ in wanted):
        generator = torch.Generator().manual_seed(settings.seed)
        teacher = Teacher(regime, settings, generator).to(settings.device)
        eval_x = torch.randn(settings.eval_size, settings.width, generator=generator)
        yield Message(f"{regime} teacher: {settings.teacher_depth} layers, width {settings.width}")
        for temperature in settings.temperatures:
            for depth in depths:
                if (regime, temperature, depth) not in wanted:
                    continue
                losses[regime, temperature, depth] = yield from _student(
                    teacher, temperature, depth, settings, eval_x, cancel, checkpoint_dir)
                yield Progress(len(losses), len(wanted), f"{regime} T={temperature:g} depth {depth}", unit="students")
            if only is None:
                fit = group_fit(settings, [losses[regime, temperature, depth] for depth in depths])
                by_temperature.setdefault(f"{temperature:g}", {})[regime] = fit
                yield Message(fit_line(regime, temperature, fit))
    seconds = time.perf_counter() - started
    if only is None:
        yield Result(name="toy-depth", data=result_doc(settings, preset, by_temperature, seconds))
    else:
        students_done: list[tuple[str, float, int, list[float | None]]] = [
            (regime, t, depth, list(value)) for (regime, t, depth), value in losses.items()]
        share = ToyDepthShare(students=students_done, settings=settings, seconds=seconds)
        yield Result(name="toy-depth", data=json_safe(share))


def _student(teacher: Teacher, temperature: float, depth: int, settings: ToyDepthSettings, eval_x: torch.Tensor,
             cancel: CancelToken | None, checkpoint_dir: Path | None) -> Generator[Event, None, list[float]]:
    """One group of students, restored from its checkpoint or trained (its generator depends on
    the seed and depth alone, so it does not matter which groups came before); returns the
    held-out losses of its seeds."""
    regime, t0 = teacher.regime, time.perf_counter()
    name = student_name(regime, temperature, depth)
    record, why = (None, "") if checkpoint_dir is None else load_student(
        checkpoint_dir, name, regime, temperature, depth, settings.seeds)
    if record is not None:
        yield Message(f"{regime} T={temperature:g} depth {depth}: restored from its checkpoint")
        yield StudentDone(regime=regime, temperature=temperature, depth=depth, losses=record["losses"],
                          loss=float(np.mean(record["losses"])), seconds=float(record["seconds"]))
        restored: list[float] = record["losses"]
        return restored
    if why not in ("", "absent"):
        yield Message(f"{regime} T={temperature:g} depth {depth}: checkpoint not used ({why}); training it again")
    save = None if checkpoint_dir is None else (lambda students: save_student(checkpoint_dir, name, students))
    student_gen = torch.Generator().manual_seed(settings.seed * 1_000_003 + depth)
    losses: list[float] = []
    for item in train_students(teacher, depth, temperature, settings, student_gen, eval_x, cancel, on_trained=save):
        if isinstance(item, StudentStep):
            yield item
        else:
            losses = item
    seconds = time.perf_counter() - t0
    if checkpoint_dir is not None:
        finish_student(checkpoint_dir, name, {"regime": regime, "temperature": temperature, "depth": depth,
                                              "losses": losses, "seconds": seconds})
    yield StudentDone(regime=regime, temperature=temperature, depth=depth, losses=losses,
                      loss=float(np.mean(losses)), seconds=seconds)
    return losses


def shard_plan(settings: ToyDepthSettings, n_layers: int, inputs: Mapping[str, dict[str, Any]], model_name: str
               ) -> ShardPlan:
    """The registry's split (`--shards`): by group of students, each share's in RunContext.share;
    rank 0 prepares the checkpoint folder first (cleared, or checked for --resume) and logs the
    fits once the merge has made them."""
    merge = functools.partial(merge_shards, settings=settings)
    prepare = functools.partial(prepare_run, settings=settings)
    return ShardPlan(students(settings), lambda share: settings, merge, prepare, summary=fit_lines)


def preset_settings(name: str, **changes: Any) -> ToyDepthSettings:
    return from_preset(PRESETS, name, **changes)


def run(settings: ToyDepthSettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry: checkpoints per student in the session, so `--resume` continues a kill.
    A worker's share of a split run (`context.share`) finds the folder prepared by rank 0 (cleared,
    or checked for --resume) and keeps or restores the checkpoints of its own students there."""
    if context.share is None:
        yield from run_toy_depth(settings, settings.preset, context.cancel, context.checkpoint_dir, context.resume)
        return
    settings.validate()
    with torch_threads(settings.threads):
        yield from _run(settings, settings.preset, context.cancel, context.checkpoint_dir, set(context.share))
