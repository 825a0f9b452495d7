"""What the console follows of a depth-family run (`depth-family.*` events): its plan, each member's
training and held-out curve, the members finished (the table that fills in) and the fit. Folded by
tui/state.py's SessionState, drawn by tui/views/depth_family.py; no Textual here (the lab imports
the state), and the vocabulary's classes are imported with the family's first event."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tui.panel_records import thin

if TYPE_CHECKING:
    from engine.experiments.depth_family.vocabulary import ComputePlan, FamilyFit, MemberDone, MemberStep

Points = list[tuple[float, float]]


@dataclass
class MemberCurve:
    """One member's live curve: its depth (its colour), its training loss at every step and its
    held-out loss where evaluated, each thinned past MAX_POINTS."""

    depth: int
    seed: int
    step: int = 0
    steps: int = 0
    train: Points = field(default_factory=list)
    heldout: Points = field(default_factory=list)


@dataclass
class FamilyView:
    """The latest depth-family run: its plan, its members' curves (in the order they started), the
    members finished (in the order they finished) and its fit."""

    job: str = ""
    plan: ComputePlan | None = None
    curves: dict[str, MemberCurve] = field(default_factory=dict)
    done: dict[str, MemberDone] = field(default_factory=dict)
    fit: FamilyFit | None = None

    def apply(self, event: Any) -> None:
        """Folds one `depth-family.*` event in (its kind read from the event: plan, step, member, fit)."""
        kind = event.kind.rpartition(".")[2]
        if kind == "plan":
            self.started(event.job, event.plan)
        elif kind == "step":
            self.step(event)
        elif kind == "member":
            self.done[event.member] = event
        elif kind == "fit":
            self.fit = event

    def started(self, job: str, plan: ComputePlan) -> None:
        """A run's plan: a new job starts the table and the fit again and keeps the curves of the
        members it plans (a resumed run continues them)."""
        if job != self.job:
            planned = {m.name for m in plan.members}
            self.curves = {name: curve for name, curve in self.curves.items() if name in planned}
            self.done, self.fit, self.job = {}, None, job
        self.plan = plan

    def step(self, event: MemberStep) -> None:
        """A point of a member's curve; a step at or before its last drops the points from there on (a
        resumed member continues from its checkpoint, a new run of it from its first step)."""
        curve = self.curves.setdefault(event.member, MemberCurve(event.depth, event.seed))
        if event.step <= curve.step:
            curve.train = [p for p in curve.train if p[0] < event.step]
            curve.heldout = [p for p in curve.heldout if p[0] < event.step]
        curve.step, curve.steps = event.step, event.steps
        curve.train = thin([*curve.train, (float(event.step), float(event.train_loss))])
        if event.heldout_loss is not None:
            curve.heldout = thin([*curve.heldout, (float(event.step), float(event.heldout_loss))])
