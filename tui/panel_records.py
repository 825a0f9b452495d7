"""What the console's panels draw, one record each (a job, a recovery run, a growth run), and the
thinning of long curves: filled in by tui/state.py's SessionState, read by the widgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # an experiment's vocabulary is imported with its first event or result, never to paint
    from engine.experiments.ablation.vocabulary import AblationRow
    from engine.experiments.growth.vocabulary import GrowthArmDone, GrowthPhase, GrowthPhaseEnd, GrowthPlan
    from engine.experiments.recovery.vocabulary import RecoveryRow

T = TypeVar("T")


MAX_POINTS = 400  # per curve: about twice the widest plot, older points are thinned


def thin(points: list[T], limit: int = MAX_POINTS) -> list[T]:
    """Every other point of the older half once a curve outgrows `limit`, keeping the newest exact."""
    if len(points) <= limit:
        return points
    half = len(points) // 2
    return points[:half:2] + points[half:]


def layer_class(row: AblationRow) -> str:
    """'anti' when ablating the layer measurably helps; otherwise the engine's class."""
    return "anti" if row.anti else row.layer_class


@dataclass
class JobView:
    """One job as the status line and the picker show it."""

    id: str
    experiment: str  # as its Started event or its job file records it; "" until one is read
    status: str = "running"
    done: int = 0
    total: int = 0
    label: str = ""
    phase: str = ""  # of its latest progress: "streaming" while a streamed map's wavefront reads its layers
    unit: str = ""  # what it counts (texts, layers, steps); "" when its progress names none
    error: str = ""
    pid: int | None = None
    cancelling: bool = False  # asked to stop (key c), still running until its own word or its process ends


@dataclass
class RecoveryRun:
    """One noise-injection run on one layer: its curve of eval perplexity against steps."""

    job: str
    layer: int
    repeat: int = 0
    sigma: float | None = None
    steps: int | None = None
    lr: float | None = None
    baseline_ppl: float | None = None
    noised_ppl: float | None = None
    points: list[tuple[float, float]] = field(default_factory=list)
    status: str = "running"
    summary: RecoveryRow | None = None

    @property
    def label(self) -> str:
        sigma = "" if self.sigma is None else f" σ={self.sigma:g}"
        repeat = f" #{self.repeat}" if self.repeat else ""
        return f"L{self.layer}{sigma}{repeat}"


@dataclass
class GrowthView:
    """A growth run: the plan, where each arm is, and its loss curves."""

    job: str = ""
    plan: GrowthPlan | None = None
    current: dict[str, GrowthPhase] = field(default_factory=dict)  # arm -> the phase it is in
    step: dict[str, int] = field(default_factory=dict)
    train: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    val: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    phase_done: dict[str, list[GrowthPhaseEnd]] = field(default_factory=dict)
    arm_done: dict[str, GrowthArmDone] = field(default_factory=dict)
    status: str = ""
