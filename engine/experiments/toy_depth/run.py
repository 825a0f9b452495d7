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
import math
import time
from collections.abc import Callable, Collection, Generator, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.core.codec import from_doc, json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress, Result
from engine.core.settings import from_preset
from engine.disk.atomic import atomic_write_bytes, atomic_write_json, read_json
from engine.evaluation import powerfit
from engine.experiments.context import RunContext
from engine.experiments.toy_depth.vocabulary import (
    PRESETS,
    REGIMES,
    StudentDone,
    StudentStep,
    ToyDepthCurve,
    ToyDepthResult,
    ToyDepthSettings,
    ToyDepthShare,
)
from engine.models.distributed import ShardPlan
from engine.models.loading import precision_messages, training_precision
from engine.training.trainer import Trainer


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],))


def block_update(h: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One residual MLP block's update, W2 relu(W1 rmsnorm(h) + b)^2; batched over a leading axis."""
    return torch.relu(torch.matmul(rms_norm(h), w1) + b1).square().matmul(w2)


class Teacher:
    """The deep residual network whose output distribution the students imitate.

    `w1[k]`, `b1[k]`, `w2[k]` are block k's weights; in the tied regime every k holds the same tensor
    objects as block 0.
    """

    def __init__(self, regime: str, settings: ToyDepthSettings, generator: torch.Generator) -> None:
        if regime not in REGIMES:
            raise UserError(f"unknown regime {regime!r}; use {' or '.join(REGIMES)}")
        d, hidden, depth = settings.width, 4 * settings.width, settings.teacher_depth
        n_blocks = 1 if regime == "tied" else depth
        blocks = [
            (
                _uniform((d, hidden), d, generator),
                _uniform((hidden,), d, generator),
                _uniform((hidden, d), hidden, generator) / math.sqrt(depth),
            )
            for _ in range(n_blocks)
        ]
        self.regime = regime
        self.w1, self.b1, self.w2 = ([blocks[k % n_blocks][i] for k in range(depth)] for i in range(3))
        self.head = _uniform((d, settings.outputs), d, generator)

    def hidden_states(self, x: torch.Tensor) -> list[torch.Tensor]:
        """h_0 = rmsnorm(x), ..., h_L: the residual stream after each block."""
        states = [rms_norm(x)]
        with torch.no_grad():
            for w1, b1, w2 in zip(self.w1, self.b1, self.w2, strict=True):
                states.append(states[-1] + block_update(states[-1], w1, b1, w2))
        return states

    def to(self, device: str) -> Teacher:
        """The teacher on `device`; tied blocks stay one tensor."""
        moved: dict[int, torch.Tensor] = {}

        def move(t: torch.Tensor) -> torch.Tensor:
            return moved.setdefault(id(t), t.to(device))

        self.w1, self.b1, self.w2 = ([move(t) for t in ts] for ts in (self.w1, self.b1, self.w2))
        self.head = self.head.to(device)
        return self

    @torch.no_grad()
    def log_probs(self, x: torch.Tensor, temperature: float) -> torch.Tensor:
        return torch.log_softmax(rms_norm(self.hidden_states(x)[-1]) @ self.head / temperature, dim=-1)


def _uniform(shape: tuple[int, ...], fan_in: int, generator: torch.Generator) -> torch.Tensor:
    """torch.nn.Linear's default initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return (torch.rand(shape, generator=generator) * 2 - 1) / math.sqrt(fan_in)


class Students(torch.nn.Module):
    """`seeds` independent students of one depth, stacked on a leading seed axis."""

    def __init__(self, depth: int, seeds: int, settings: ToyDepthSettings, generator: torch.Generator):
        super().__init__()
        d, hidden = settings.width, 4 * settings.width
        self.depth = depth
        self.w1 = torch.nn.Parameter(_uniform((depth, seeds, d, hidden), d, generator))
        self.b1 = torch.nn.Parameter(_uniform((depth, seeds, 1, hidden), d, generator))
        self.w2 = torch.nn.Parameter(torch.zeros(depth, seeds, hidden, d))  # zero: start as the identity
        self.head = torch.nn.Parameter(torch.zeros(seeds, d, settings.outputs))  # zero: start uniform

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, width), shared by the seeds -> log-probabilities (seeds, batch, outputs)."""
        h = rms_norm(x).expand(self.head.shape[0], -1, -1)
        for k in range(self.depth):
            h = h + block_update(h, self.w1[k], self.b1[k], self.w2[k])
        return torch.log_softmax(torch.matmul(rms_norm(h), self.head), dim=-1)


def kl(target_log: torch.Tensor, student_log: torch.Tensor) -> torch.Tensor:
    """KL(target || student) per example, summed over outputs."""
    return (target_log.exp() * (target_log - student_log)).sum(dim=-1)


def train_students(
    teacher: Teacher,
    depth: int,
    temperature: float,
    settings: ToyDepthSettings,
    generator: torch.Generator,
    eval_x: torch.Tensor,
    cancel: CancelToken | None = None,
    on_trained: Callable[[Students], None] | None = None,
) -> Iterator[StudentStep | list[float]]:
    """Trains `settings.seeds` students of one depth; yields StudentStep events, then the held-out KLs.
    `on_trained` receives the trained students (for a checkpoint) before the KLs are yielded."""
    device = torch.device("cpu" if settings.device == "auto" else settings.device)
    dtype = "float32" if settings.dtype == "auto" else settings.dtype
    students = Students(depth, settings.seeds, settings, generator).to(device)  # float32 master weights
    trainer = Trainer(list(students.parameters()), device, getattr(torch, dtype), lr=settings.lr,
                      weight_decay=0.0,  # AdamW without decay is Adam, as in the paper's code
                      what=f"toy-depth training of depth {depth}", advice="a smaller --batch-size or fewer --seeds")
    with trainer:
        for step in range(1, settings.steps + 1):
            if cancel is not None:
                cancel.check()
            x = torch.randn(settings.batch_size, settings.width, generator=generator).to(device)
            with trainer.forward():  # the teacher's targets stay float32; the KL is taken in float32
                student_log = students(x)
            per_seed = kl(teacher.log_probs(x, temperature), student_log.float()).mean(dim=1)
            cosine = 0.5 * (1 + math.cos(math.pi * (step - 1) / settings.steps))  # decays to zero
            trainer.step(per_seed.sum(), settings.lr * cosine)  # seeds do not interact: each its own mean KL
            if step % settings.log_every == 0 or step == settings.steps:
                yield StudentStep(regime=teacher.regime, temperature=temperature, depth=depth, step=step,
                                  steps=settings.steps, loss=float(per_seed.detach().mean()))
    if on_trained is not None:
        on_trained(students)
    with torch.no_grad():
        eval_x = eval_x.to(device)
        with trainer.autocast():
            student_log = students(eval_x)
        yield [float(v) for v in kl(teacher.log_probs(eval_x, temperature), student_log.float()).mean(dim=1)]


def fit_depth_law(
    depths: list[int], losses: list[list[float]], floor: bool, bootstrap: int, seed: int
) -> dict[str, Any]:
    """Fits L(l) = c / l^a (+ L0) to every (depth, seed) loss; 95 % interval of a from a two-level
    bootstrap: depths drawn with replacement, then each drawn depth's seeds with replacement."""
    l_arr = np.repeat(np.asarray(depths, dtype=float), [len(v) for v in losses])
    y_arr = np.asarray([v for row in losses for v in row], dtype=float)
    ok = np.isfinite(y_arr) & (y_arr > 0)
    if len(set(l_arr[ok])) < (3 if floor else 2):
        return {"alpha_l": None, "c": None, "L0": None, "ci95": None, "bootstrap_valid": 0}
    x = np.log(l_arr)
    centre = np.array([x[ok].mean()])
    u = (x - centre[0])[:, None]
    y = np.where(ok, np.log(np.where(ok, y_arr, 1.0)), 0.0)
    rng = np.random.default_rng(seed)
    restarts = 32
    starts = powerfit.random_starts(rng, restarts, 1, y[ok], floor=floor)
    fit = powerfit.fit_batched(u, y, ok.astype(float), starts, floor=floor)
    best, _ = powerfit.best_per_group(fit, 1)
    nat = powerfit.to_natural(best, centre, floor=floor)
    doc: dict[str, Any] = {
        "alpha_l": float(nat["alpha"][0, 0]),
        "c": float(np.exp(nat["log_c"][0, 0])),
        "L0": float(nat["L0"][0]),
    }
    # two-level bootstrap as multiplicity weights over the points
    owner = np.repeat(np.arange(len(depths)), [len(v) for v in losses])
    weights = np.zeros((bootstrap, len(y)))
    for b in range(bootstrap):
        for dep in rng.integers(0, len(depths), len(depths)):
            members = np.flatnonzero(owner == dep)
            np.add.at(weights[b], rng.choice(members, len(members)), 1.0)
    weights *= ok
    distinct = np.array([len(set(l_arr[w > 0])) for w in weights])
    valid = weights[distinct >= (3 if floor else 2)]
    k = 4
    if len(valid) > 1:
        starts = powerfit.random_starts(rng, len(valid) * k, 1, y[ok], floor=floor).reshape(len(valid), k, -1)
        starts[:, 0] = best[0]
        boot = powerfit.fit_batched(u, y, np.repeat(valid, k, axis=0), starts.reshape(len(valid) * k, -1),
                                    floor=floor)
        theta, _ = powerfit.best_per_group(boot, len(valid))
        alphas = powerfit.to_natural(theta, centre, floor=floor)["alpha"][:, 0]
        low, high = np.percentile(alphas, [2.5, 97.5])
        doc["ci95"] = [float(low), float(high)]
        doc["se"] = float(np.std(alphas, ddof=1))
    else:
        doc["ci95"], doc["se"] = None, None
    doc["bootstrap_valid"] = int(len(valid))
    return doc


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Sets torch's CPU thread count for a block and restores the previous one."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- checkpoints: one per trained group of students -----------------------------------------------
# Every student's result depends only on (regime, temperature, depth) and the settings: the teacher
# and held-out inputs are rebuilt from the seed, and each depth has its own generator. So a resumed
# run restores the finished students from their files and trains the rest, giving exactly the numbers
# of an uninterrupted run. A student's JSON is written after its weights: it marks the student done.

RUN_FILE = "toy-depth-run.json"


def student_name(regime: str, temperature: float, depth: int) -> str:
    return f"student-{regime}-T{temperature!r}-d{depth}"


def _student_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("student-*") if p.suffix in (".json", ".safetensors"))


def prepare_checkpoints(folder: Path, settings: ToyDepthSettings, resume: bool) -> None:
    """A fresh run clears the folder's student checkpoints and records its settings; a resume checks
    that the recorded settings are these, and refuses in one line otherwise."""
    folder = Path(folder)
    run_file = folder / RUN_FILE
    if resume:
        if not run_file.is_file():
            raise UserError(f"nothing to resume: no toy-depth checkpoint in {folder}; run without --resume")
        try:
            saved = read_json(run_file)["settings"]
            if not isinstance(saved, dict):
                raise TypeError("settings is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"the toy-depth checkpoint {run_file} is damaged ({exc}); run without --resume") from None
        now = settings.resume_key()
        differ = sorted(k for k in set(now) | set(saved) if saved.get(k) != now.get(k))
        if differ:
            k = differ[0]
            raise UserError(f"the checkpoint was made with other settings ({k}: {saved.get(k)} there, "
                            f"{now.get(k)} now); resume with the same settings or run without --resume")
        return
    folder.mkdir(parents=True, exist_ok=True)
    for path in _student_files(folder):
        path.unlink()
    atomic_write_json(run_file, {"experiment": "toy-depth", "settings": settings.resume_key()})


def save_student(folder: Path, name: str, students: Students) -> None:
    from safetensors.torch import save

    tensors = {k: v.detach().contiguous().clone() for k, v in students.state_dict().items()}
    atomic_write_bytes(Path(folder) / f"{name}.safetensors", save(tensors))


def finish_student(folder: Path, name: str, record: dict[str, Any]) -> None:
    atomic_write_json(Path(folder) / f"{name}.json", record)


def load_student(folder: Path, name: str, regime: str, temperature: float, depth: int, seeds: int
                 ) -> tuple[dict[str, Any] | None, str]:
    """A finished student's record, checked field by field; (None, why) if absent or damaged."""
    path = Path(folder) / f"{name}.json"
    if not path.is_file():
        return None, "absent"
    if not (Path(folder) / f"{name}.safetensors").is_file():
        return None, "its weights are missing"
    try:
        record = read_json(path)
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({exc})"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    if (record.get("regime"), record.get("temperature"), record.get("depth")) != (regime, temperature, depth):
        return None, "it belongs to another student"
    losses, seconds = record.get("losses"), record.get("seconds")
    if (not isinstance(losses, list) or len(losses) != seeds
            or not all(isinstance(v, float) and math.isfinite(v) for v in losses)):
        return None, f"its losses are not {seeds} finite numbers"
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
        return None, "its seconds are not a number"
    return record, ""


def prepare_run(checkpoint_dir: Path | None, resume: bool, settings: ToyDepthSettings) -> None:
    """The checkpoint folder made ready before any student trains (cleared, or checked for --resume)."""
    if resume and checkpoint_dir is None:
        raise UserError("--resume needs the session whose toy-depth run to continue (--session NAME)")
    if checkpoint_dir is not None:
        prepare_checkpoints(checkpoint_dir, settings, resume)


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
    yield Progress(0, len(wanted), "students")
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
                yield Progress(len(losses), len(wanted), f"{regime} T={temperature:g} depth {depth}")
            if only is None:
                fit = group_fit(settings, [losses[regime, temperature, depth] for depth in depths])
                by_temperature.setdefault(f"{temperature:g}", {})[regime] = fit
                yield Message(fit_line(regime, temperature, fit))
    seconds = time.perf_counter() - started
    if only is None:
        yield Result(name="toy-depth", data=result_doc(settings, preset, by_temperature, seconds))
    else:
        share = ToyDepthShare(students=[(*key, value) for key, value in losses.items()], settings=settings,
                              seconds=seconds)
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
        return record["losses"]
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


def group_fit(settings: ToyDepthSettings, losses: list[list[float]]) -> ToyDepthCurve:
    """One (regime, temperature) curve: the losses of every depth and the fitted law."""
    depths = sorted(set(settings.student_depths))
    return ToyDepthCurve(
        depths=depths,
        loss=[float(np.mean(v)) for v in losses],
        loss_per_seed=losses,
        **fit_depth_law(depths, losses, settings.fit_floor, settings.bootstrap, settings.seed),
    )


def result_doc(settings: ToyDepthSettings, preset: str, by_temperature: dict[str, dict[str, ToyDepthCurve]],
               seconds: float) -> dict[str, Any]:
    """results/toy-depth.json from the fitted curves; `settings` as the run resolved them."""
    temperature = settings.temperatures[0]
    return json_safe(ToyDepthResult(
        preset=preset or "custom",
        regimes=by_temperature[f"{temperature:g}"],
        temperature=temperature,
        by_temperature=by_temperature,
        fit="L = c / l^alpha_l + L0" if settings.fit_floor else "L = c / l^alpha_l",
        settings=settings,
        seconds=seconds,
    ))


def fit_line(regime: str, temperature: float, fit: ToyDepthCurve) -> str:
    return f"{regime} T={temperature:g}: alpha_l={fit.alpha_l} ci95={fit.ci95}"


def fit_lines(doc: dict[str, Any]) -> list[str]:
    """The per-curve log lines of a serial run, from a result: a split run fits its curves only
    once every share is in, so it logs them then."""
    fits = ToyDepthResult.from_json(doc).by_temperature
    return [fit_line(regime, float(t), fit) for t in fits for regime, fit in fits[t].items()]


def merge_shards(docs: list[dict[str, Any]], settings: ToyDepthSettings) -> dict[str, Any]:
    """One result from the results of a split run (each over some groups of students): every
    curve fitted over all its depths, as a serial run fits it."""
    shares = [from_doc(ToyDepthShare, doc) for doc in docs]
    losses = {(regime, t, depth): value for share in shares for regime, t, depth, value in share.students}
    depths = sorted(set(settings.student_depths))
    by_temperature: dict[str, dict[str, Any]] = {}
    for regime in settings.regimes:
        for t in settings.temperatures:
            curve = [losses[regime, t, depth] for depth in depths]
            by_temperature.setdefault(f"{t:g}", {})[regime] = group_fit(settings, curve)
    return result_doc(shares[0].settings, settings.preset, by_temperature, max(share.seconds for share in shares))


def shard_plan(settings: ToyDepthSettings, n_layers: int, inputs: Mapping[str, dict], model_name: str) -> ShardPlan:
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
