"""The toy teacher-student models' words: ToyDepthSettings and its presets, the `toy-depth.step`
and `toy-depth.student` events, and results/toy-depth.json (loss against depth). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.codec import ABSENT
from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, event, result
from engine.core.settings import MAX_SEED, Settings, setting
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.models.options import TRAIN_DEVICE_HELP, device_setting, dtype_setting

REGIMES = ("tied", "independent")


@dataclass(frozen=True)
class ToyDepthSettings(Settings):
    """Defaults are the paper's reference settings (`--preset paper`)."""

    preset: str = setting("paper", "the preset these settings started from", choices=("paper", "tiny"), cli=False)
    width: int = setting(32, "residual width (paper 32)", low=1)
    outputs: int = setting(128, "number of output classes (paper 128)", low=2)
    teacher_depth: int = setting(128, "teacher layers (paper 128, tiny 32)", low=1)
    student_depths: tuple[int, ...] = setting((6, 12, 16, 24, 32, 48), "student depths (paper 6,12,16,24,32,48)",
                                              low=1)
    regimes: tuple[str, ...] = setting(REGIMES, "teachers to run", choices=REGIMES)
    temperatures: tuple[float, ...] = setting(
        tuple(float(f"{10 ** (-2 + 2 * i / 15):.4g}") for i in range(16)),
        "target temperatures; the first is the primary one", above=0,
    )
    steps: int = setting(40000, "training steps per student", low=1)
    batch_size: int = setting(1024, "fresh Gaussian inputs per step (shared by the seeds)", low=1)
    lr: float = setting(6e-4, "Adam learning rate (cosine decay to zero)", above=0)
    seeds: int = setting(3, "students per depth (trained together, independent inits, shared inputs)", low=1)
    eval_size: int = setting(8192, "held-out inputs for the final loss", low=1)
    fit_floor: bool = setting(False, "fit L = c/l^a + L0 instead of L = c/l^a")
    bootstrap: int = setting(1000, "bootstrap resamples for the a_l interval", low=0)
    log_every: int = setting(50, "emit a training-loss event every N steps", low=1, resume_free=True)
    seed: int = setting(0, "random seed of teachers, students and data", low=0, high=MAX_SEED)
    threads: int = setting(1, "torch CPU threads while training (one is fastest for these small matrices)", low=1,
                           resume_free=True)
    device: str = device_setting(TRAIN_DEVICE_HELP)
    dtype: str = dtype_setting("students' forward precision; weights and Adam stay float32 (mixed precision)")

    def check(self) -> None:
        if not self.student_depths or not self.temperatures or not self.regimes:
            raise UserError("--student-depths, --temperatures and --regimes each need at least one value")


PRESETS: dict[str, ToyDepthSettings] = {
    "paper": ToyDepthSettings(),
    "tiny": ToyDepthSettings(
        preset="tiny",
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


@event("toy-depth.step", v1_kind="toy-depth-step")
class StudentStep(Event):
    """Training loss (KL, mean over the seeds) of the students of one depth at one step."""

    regime: str
    temperature: float
    depth: int
    step: int
    steps: int
    loss: float


@event("toy-depth.student", v1_kind="toy-depth-student")
class StudentDone(Event):
    """Held-out KL of each seed's student of one depth after training."""

    regime: str
    temperature: float
    depth: int
    losses: list[float]
    loss: float
    seconds: float


@dataclass(frozen=True)
class ToyDepthCurve:
    """One (regime, temperature) curve of results/toy-depth.json: the held-out loss of every
    student depth (mean over seeds, and per seed) and the law L = c / l^alpha_l (+ L0) fitted to it,
    with alpha_l's bootstrap interval; all None where too few depths had a loss to fit."""

    depths: list[int]
    loss: list[float | None]
    loss_per_seed: list[list[float | None]]
    alpha_l: float | None
    c: float | None
    L0: float | None
    ci95: list[float] | None
    se: float | None = field(default=ABSENT, kw_only=True)  # alpha_l's bootstrap sd; ABSENT where not fitted
    bootstrap_valid: int  # bootstrap draws with enough depths to fit


@dataclass(frozen=True)
class ToyDepthShare:
    """What a worker of a split run hands back (its Result's data, read by the run's merge): each of
    its groups of students as (regime, temperature, depth, held-out loss of each seed), and the
    settings as the worker resolved them (its device and dtype)."""

    students: list[tuple[str, float, int, list[float | None]]]
    settings: ToyDepthSettings
    seconds: float


@result("toy-depth")
class ToyDepthResult(ResultDocument):
    """results/toy-depth.json."""

    preset: str
    regimes: dict[str, ToyDepthCurve]  # at the first temperature
    temperature: float  # the first temperature
    by_temperature: dict[str, dict[str, ToyDepthCurve]]  # temperature (as %g) -> regime -> curve
    fit: str  # the law fitted
    settings: ToyDepthSettings  # as the run resolved them
    seconds: float

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per temperature, regime, student depth and seed: that student's held-out loss, and
        the exponent alpha_l fitted to its curve."""
        return [{"temperature": float(temperature), "regime": regime, "depth": depth, "seed": seed, "loss": loss,
                 "alpha_l": curve.alpha_l}
                for temperature, curves in self.by_temperature.items() for regime, curve in curves.items()
                for depth, losses in zip(curve.depths, curve.loss_per_seed, strict=True)
                for seed, loss in enumerate(losses)]


def sample() -> ToyDepthResult:
    """Both regimes over depths 1..16 with their fitted exponents: the tests' and snapshots' example."""
    def regime(c: float, alpha: float) -> ToyDepthCurve:
        depths = [1, 2, 4, 8, 16]
        loss = [c / d**alpha * (1.02 if d % 4 else 0.98) for d in depths]
        return ToyDepthCurve(depths=depths, loss=loss, loss_per_seed=[[v] for v in loss], alpha_l=alpha, c=c, L0=None,
                             ci95=[alpha - 0.1, alpha + 0.1], se=0.05, bootstrap_valid=50)  # fmt: skip

    regimes = {"compositional": regime(2.0, 0.9), "ensemble": regime(1.5, 0.4)}
    return ToyDepthResult(preset="tiny", regimes=regimes, temperature=1.0, by_temperature={"1": regimes},
                          fit="L = c / l^alpha_l", settings=PRESETS["tiny"], seconds=1.0)  # fmt: skip


CONTRACT = Contract(
    ToyDepthSettings, ToyDepthResult, sample, presets=PRESETS,
    frame=Frame(columns=("temperature", "regime", "depth", "seed", "loss", "alpha_l"), rows=2 * 5),
    figure=FigureShape(panels=(("student depth l", "held-out loss"),)),
)
