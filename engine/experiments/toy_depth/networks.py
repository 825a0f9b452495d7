"""toy-depth's networks: the teacher (tied or independent blocks) and a depth's students, batched
over their seeds, and the students' training on fresh inputs against the teacher's distribution."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from engine.core.errors import UserError
from engine.core.events import CancelToken
from engine.experiments.toy_depth.vocabulary import REGIMES, StudentStep, ToyDepthSettings
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
