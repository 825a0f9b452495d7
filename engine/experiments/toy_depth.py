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
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch

from engine import powerfit
from engine.errors import UserError
from engine.events import CancelToken, Event, Message, Progress, Result, event_type
from engine.models import training_precision
from engine.settings import setting

REGIMES = ("tied", "independent")


@dataclass(frozen=True)
class ToyDepthSettings:
    """Defaults are the paper's reference settings (`--preset paper`)."""

    width: int = 32
    outputs: int = 128
    teacher_depth: int = 128
    student_depths: tuple[int, ...] = (6, 12, 16, 24, 32, 48)
    regimes: tuple[str, ...] = REGIMES
    temperatures: tuple[float, ...] = tuple(float(f"{10 ** (-2 + 2 * i / 15):.4g}") for i in range(16))
    steps: int = 40000
    batch_size: int = 1024
    lr: float = 6e-4  # Adam, cosine decay to zero over `steps`
    seeds: int = 3  # students per depth (independent inits, shared inputs)
    eval_size: int = 8192
    fit_floor: bool = False  # fit L = c/l^a + L0 instead of c/l^a
    bootstrap: int = 1000
    log_every: int = 50
    seed: int = 0
    threads: int = 1  # torch CPU threads while training: one is fastest for these small matrices
    device: str = setting("auto", "where to train: auto (the GPU when there is one), cpu, cuda or cuda:N")
    dtype: str = setting("auto", "students' forward precision; weights and Adam stay float32 (mixed precision)",
                         choices=("auto", "float32", "bfloat16", "float16"))


PRESETS: dict[str, ToyDepthSettings] = {
    "paper": ToyDepthSettings(),
    "tiny": ToyDepthSettings(
        teacher_depth=32,
        student_depths=(2, 3, 4, 6, 8, 12, 16),
        temperatures=(1.0,),
        steps=1500,
        batch_size=128,
        lr=3e-3,
        seeds=2,
        eval_size=4096,
    ),
}


@event_type
@dataclass(frozen=True)
class StudentStep(Event):
    """Training loss (KL, mean over the seeds) of the students of one depth at one step."""

    kind: ClassVar[str] = "toy-depth-step"
    regime: str
    temperature: float
    depth: int
    step: int
    steps: int
    loss: float


@event_type
@dataclass(frozen=True)
class StudentDone(Event):
    """Held-out KL of each seed's student of one depth after training."""

    kind: ClassVar[str] = "toy-depth-student"
    regime: str
    temperature: float
    depth: int
    losses: list[float]
    loss: float
    seconds: float


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
) -> Iterator[StudentStep | list[float]]:
    """Trains `settings.seeds` students of one depth; yields StudentStep events, then the held-out KLs."""
    device = "cpu" if settings.device == "auto" else settings.device
    dtype = "float32" if settings.dtype == "auto" else settings.dtype
    students = Students(depth, settings.seeds, settings, generator).to(device)  # float32 master weights
    optimiser = torch.optim.Adam(students.parameters(), lr=settings.lr)
    scaler = torch.amp.GradScaler(torch.device(device).type, enabled=dtype == "float16")
    half = contextlib.nullcontext() if dtype == "float32" else torch.autocast(
        torch.device(device).type, dtype=getattr(torch, dtype))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, settings.steps) / settings.steps))
    )
    for step in range(1, settings.steps + 1):
        if cancel is not None:
            cancel.check()
        x = torch.randn(settings.batch_size, settings.width, generator=generator).to(device)
        with half:  # the teacher's targets stay float32; the KL is taken in float32
            student_log = students(x)
        per_seed = kl(teacher.log_probs(x, temperature), student_log.float()).mean(dim=1)
        optimiser.zero_grad(set_to_none=True)
        scaler.scale(per_seed.sum()).backward()  # seeds do not interact: each gets its own mean KL's gradient
        scaler.step(optimiser)
        scaler.update()
        schedule.step()
        if step % settings.log_every == 0 or step == settings.steps:
            yield StudentStep(regime=teacher.regime, temperature=temperature, depth=depth, step=step,
                              steps=settings.steps, loss=float(per_seed.detach().mean()))
    with torch.no_grad():
        eval_x = eval_x.to(device)
        with half:
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


def check_settings(settings: ToyDepthSettings) -> None:
    """Raises UserError on settings no run can use; called before a session is opened."""
    if settings.width < 1 or settings.outputs < 2 or settings.teacher_depth < 1:
        raise UserError("--width must be 1 or more, --outputs 2 or more, --teacher-depth 1 or more")
    if not settings.student_depths or min(settings.student_depths) < 1:
        raise UserError("--student-depths must list depths of 1 or more, e.g. 2,4,8")
    if not settings.temperatures or min(settings.temperatures) <= 0:
        raise UserError("--temperatures must list positive temperatures, e.g. 1.0")
    unknown = [r for r in settings.regimes if r not in REGIMES]
    if unknown or not settings.regimes:
        raise UserError(f"--regimes takes {','.join(REGIMES)} (got {','.join(settings.regimes)})")
    if settings.steps < 1 or settings.batch_size < 1 or settings.seeds < 1 or settings.eval_size < 1:
        raise UserError("--steps, --batch-size, --seeds and --eval-size must be 1 or more")
    if settings.lr <= 0 or settings.log_every < 1 or settings.bootstrap < 0 or settings.threads < 1:
        raise UserError("--lr must be positive, --log-every and --threads 1 or more, --bootstrap 0 or more")


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Sets torch's CPU thread count for a block and restores the previous one."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_toy_depth(settings: ToyDepthSettings, preset: str = "", cancel: CancelToken | None = None
                  ) -> Iterator[Event]:
    """Trains every (regime, temperature, depth) group of students, then fits a_l per regime."""
    check_settings(settings)
    with torch_threads(settings.threads):
        yield from _run(settings, preset, cancel)


def _run(settings: ToyDepthSettings, preset: str, cancel: CancelToken | None) -> Iterator[Event]:
    started = time.perf_counter()
    settings = replace(settings, **training_precision(settings.device, settings.dtype))
    depths = sorted(set(settings.student_depths))
    total = len(settings.regimes) * len(settings.temperatures) * len(depths)
    done = 0
    by_temperature: dict[str, dict[str, Any]] = {}
    yield Progress(0, total, "students")
    for regime in settings.regimes:
        generator = torch.Generator().manual_seed(settings.seed)
        teacher = Teacher(regime, settings, generator).to(settings.device)
        eval_x = torch.randn(settings.eval_size, settings.width, generator=generator)
        yield Message(f"{regime} teacher: {settings.teacher_depth} layers, width {settings.width}")
        for temperature in settings.temperatures:
            losses = []
            for depth in depths:
                t0 = time.perf_counter()
                student_gen = torch.Generator().manual_seed(settings.seed * 1_000_003 + depth)
                for item in train_students(teacher, depth, temperature, settings, student_gen, eval_x,
                                           cancel):
                    if isinstance(item, StudentStep):
                        yield item
                    else:
                        losses.append(item)
                done += 1
                yield StudentDone(regime=regime, temperature=temperature, depth=depth, losses=losses[-1],
                                  loss=float(np.mean(losses[-1])), seconds=time.perf_counter() - t0)
                yield Progress(done, total, f"{regime} T={temperature:g} depth {depth}")
            fit = fit_depth_law(depths, losses, settings.fit_floor, settings.bootstrap, settings.seed)
            by_temperature.setdefault(f"{temperature:g}", {})[regime] = {
                "depths": depths,
                "loss": [float(np.mean(v)) for v in losses],
                "loss_per_seed": losses,
                **fit,
            }
            yield Message(f"{regime} T={temperature:g}: alpha_l={fit['alpha_l']} ci95={fit['ci95']}")
    primary = f"{settings.temperatures[0]:g}"
    doc = {
        "preset": preset or "custom",
        "regimes": by_temperature[primary],
        "temperature": settings.temperatures[0],
        "by_temperature": by_temperature,
        "fit": "L = c / l^alpha_l + L0" if settings.fit_floor else "L = c / l^alpha_l",
        "settings": asdict(settings),
        "seconds": time.perf_counter() - started,
    }
    yield Result(name="toy-depth", data=doc)


def preset_settings(name: str, **overrides: Any) -> ToyDepthSettings:
    """A preset with the given fields replaced (None values are ignored)."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; use {' or '.join(PRESETS)}")
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})
