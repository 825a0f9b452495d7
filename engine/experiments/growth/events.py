"""Events of a growth run: enough for a console to draw the phase timeline and the loss curves live.

Every event names its `arm` ("growth_100", "growth_50", "uniform_100") and `seed`; steps count the
arm's optimizer steps from 1, over all its phases. A console keys curves on (arm, seed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from engine.events import Event, event_type


@event_type
@dataclass(frozen=True)
class GrowthPlan(Event):
    """Sent first: every arm's phases (name, start step, steps, layers, clones) and the model sizes,
    so the whole timeline can be drawn before training starts."""

    kind: ClassVar[str] = "growth.plan"
    arms: dict[str, Any]
    seeds: list[int]
    params: dict[str, int]
    profile: list[str]
    batch_tokens: int


@event_type
@dataclass(frozen=True)
class GrowthPhase(Event):
    """A phase begins: `added` lists the layers that joined, each with its clone source and FFN scale."""

    kind: ClassVar[str] = "growth.phase"
    arm: str
    seed: int
    phase: str
    index: int
    start_step: int
    steps: int
    layers: list[int]
    added: list[dict[str, Any]]


@event_type
@dataclass(frozen=True)
class GrowthStep(Event):
    """One optimizer step: training loss on its batch, throughput of that step, learning rate."""

    kind: ClassVar[str] = "growth.step"
    arm: str
    seed: int
    phase: str
    step: int
    total_steps: int
    train_loss: float
    tokens_per_s: float
    lr: float
    n_layers: int


@event_type
@dataclass(frozen=True)
class GrowthEval(Event):
    """Validation loss (mean cross-entropy per token, nats) after `step`."""

    kind: ClassVar[str] = "growth.eval"
    arm: str
    seed: int
    phase: str
    step: int
    val_loss: float


@event_type
@dataclass(frozen=True)
class GrowthPhaseEnd(Event):
    """A phase finished: its training seconds and tokens per second (evaluation excluded)."""

    kind: ClassVar[str] = "growth.phase_end"
    arm: str
    seed: int
    phase: str
    index: int
    steps: int
    seconds: float
    tokens_per_s: float


@event_type
@dataclass(frozen=True)
class GrowthArmDone(Event):
    """An arm finished for one seed: final validation loss, training seconds, tokens per second."""

    kind: ClassVar[str] = "growth.arm_done"
    arm: str
    seed: int
    val_loss: float
    seconds: float
    tokens_per_s: float
    steps: int
