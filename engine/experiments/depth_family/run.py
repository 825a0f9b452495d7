"""The depth family (paper B on the user's own data): a grid of small decoder LMs, one member per
(depth, width, tokens, seed), trained one after another by one recipe on one corpus
(engine/experiments/depth_family/members.py, text.py); each member's map and angles
(anatomy.py); then the CSV, the depth term with its interval and the full law (fit.py).

Before the first step: the corpus checked against the held-out split and the budgets, every
member's memory checked, and the compute plan (N, 6 N D, a step of the largest and of the smallest
member timed, the estimate) sent and refused beyond --max-hours, each a one-line error.

Resuming: the finished members are kept in the checkpoint folder (engine/experiments/sweep_checkpoint.py,
`layers.json`, keyed by the settings), the running member in its own folder (members.py); a resumed
family restores the finished, continues the running member from its last checkpoint and trains the
rest. A stop hands over the finished members as a partial result.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from engine.core.codec import from_doc, json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress, Result, kept_on_stop
from engine.experiments.context import RunContext
from engine.experiments.depth_family.anatomy import anatomy_by_depth, heldout_source, member_anatomy
from engine.experiments.depth_family.fit import family_fit, full_law, write_csv
from engine.experiments.depth_family.members import (
    BETAS,
    check_memory,
    member_config,
    member_steps,
    step_seconds,
    train_member,
)
from engine.experiments.depth_family.text import FamilyText, family_text
from engine.experiments.depth_family.vocabulary import (
    ComputePlan,
    DepthFamilyResult,
    DepthFamilySettings,
    FamilyFit,
    FamilyPlan,
    Member,
    MemberDone,
    MemberSpec,
    PlannedMember,
    Recipe,
)
from engine.experiments.sweep_checkpoint import CHECKPOINT_FILE, resumed, write_checkpoint
from engine.models.precision import precision_messages, training_precision

CSV_NAME = "family.csv"


@dataclass(frozen=True)
class FamilyKey:
    """What the finished members' numbers depend on besides the settings (sweep_checkpoint's key)."""

    name: str
    dtype_name: str
    device: str


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch's CPU threads set to `n` for the block (0: left as they are)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compute_plan(settings: DepthFamilySettings, specs: Sequence[MemberSpec], params: dict[MemberSpec, int],
                 configs: dict[MemberSpec, Any], text: FamilyText) -> ComputePlan:
    """Every member's N, steps and 6 N D; a step of the largest and of the smallest member timed, and
    the others' steps interpolated linearly in N between them."""
    window = settings.batch_size * settings.context
    planned = [PlannedMember(name=s.name, depth=s.depth, width=s.width, tokens=s.tokens, seed=s.seed,
                             params=params[s], steps=member_steps(settings, s.tokens),
                             flops=6.0 * params[s] * member_steps(settings, s.tokens) * window) for s in specs]
    big, small = max(specs, key=params.__getitem__), min(specs, key=params.__getitem__)
    t_big = step_seconds(settings, big, configs[big], text)
    t_small = t_big if params[small] == params[big] else step_seconds(settings, small, configs[small], text)

    def per_step(n: int) -> float:
        if params[big] == params[small]:
            return t_big
        return t_small + (t_big - t_small) * (n - params[small]) / (params[big] - params[small])

    hours = sum(p.steps * max(per_step(p.params), 0.0) for p in planned) / 3600
    return ComputePlan(members=planned, total_flops=sum(p.flops for p in planned), measured_step_seconds=t_big,
                       measured_member=big.name, estimate_hours=hours, device=settings.device)


def plan_line(plan: ComputePlan) -> str:
    minutes = plan.estimate_hours * 60
    estimate = f"{minutes:.1f} min" if minutes < 120 else f"{plan.estimate_hours:.1f} h"
    return (f"compute plan: {len(plan.members)} members, {plan.total_flops:.3g} training FLOPs (6 N D); a step of "
            f"{plan.measured_member} takes {plan.measured_step_seconds:.3g} s on {plan.device}: about {estimate} "
            "of training")


def recipe(settings: DepthFamilySettings, text: FamilyText, architecture: str) -> Recipe:
    """The one recipe, stated in full."""
    return Recipe(
        architecture=architecture, tokenizer=text.tokenizer_name, vocab_size=text.vocab_size, corpus=text.source,
        heldout=f"{text.heldout_rule}; {settings.eval_windows} windows of {settings.context + 1} tokens spread "
                "evenly over it, the same for every member",
        optimizer=f"AdamW (betas {BETAS[0]}, {BETAS[1]}, eps 1e-8) over every parameter, gradient norm clipped at "
                  f"{settings.grad_clip:g}",
        schedule=f"linear warmup over {settings.warmup_frac:.0%} of each member's steps, cosine decay to 0 at its "
                 "last; steps = tokens / (batch x context)",
        lr=settings.lr, betas=list(BETAS), weight_decay=settings.weight_decay, grad_clip=settings.grad_clip,
        batch_size=settings.batch_size, context=settings.context, heads=settings.heads, ffn_ratio=settings.ffn_ratio,
        seeds=",".join(map(str, settings.seeds)),
        precision=f"float32 weights and AdamW, forward in {settings.dtype}, on {settings.device}")


def _fresh(folder: Path, specs: Sequence[MemberSpec]) -> None:
    """A fresh run's member folders cleared: no running member's state from an earlier run is kept."""
    for spec in specs:
        path = folder / spec.name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)


def run_family(settings: DepthFamilySettings, cancel: CancelToken | None = None, folder: Path | None = None,
               resume: bool = False, output_dir: Path | None = None) -> Iterator[Event]:
    """The family trained, mapped and fitted; ends with its Result."""
    settings.validate()
    started = time.perf_counter()
    if resume and folder is None:
        raise UserError("--resume needs the session whose depth family to continue (--session NAME)")
    settings = replace(settings, **training_precision(settings.device, settings.dtype))
    yield from precision_messages(settings.device, settings.dtype)
    with _threads(settings.threads):
        text = family_text(settings)
        yield Message(f"corpus {text.source}: {len(text.train)} training tokens; held out: {text.heldout_rule}; "
                      f"tokenizer: {text.tokenizer_name} ({text.vocab_size} ids)")
        base = None
        if settings.base_model is not None:
            from transformers import AutoConfig

            base = AutoConfig.from_pretrained(settings.base_model)
        specs = settings.members()
        configs = {spec: member_config(settings, spec, text.vocab_size, base) for spec in specs}
        params = {spec: check_memory(settings, spec, configs[spec]) for spec in specs}
        plan = compute_plan(settings, specs, params, configs, text)
        yield FamilyPlan(plan)
        yield Message(plan_line(plan))
        if settings.max_hours is not None and plan.estimate_hours > settings.max_hours:
            raise UserError(f"the family's estimate is {plan.estimate_hours:.2f} h, over --max-hours "
                            f"{settings.max_hours:g}; fewer or smaller members (--depths, --widths, --tokens, "
                            "--seeds), or a higher --max-hours")
        architecture = (base.architectures or [type(base).__name__])[0] if base is not None else "LlamaForCausalLM"
        family = Family(settings, specs, params, configs, text, recipe(settings, text, architecture), plan)
        yield from family.train(cancel, folder, resume, started, output_dir)


@dataclass
class Family:
    """A run's members in the making, and how its result document is made of them."""

    settings: DepthFamilySettings
    specs: Sequence[MemberSpec]
    params: dict[MemberSpec, int]
    configs: dict[MemberSpec, Any]
    text: FamilyText
    recipe: Recipe
    plan: ComputePlan

    def train(self, cancel: CancelToken | None, folder: Path | None, resume: bool, started: float,
              output_dir: Path | None) -> Iterator[Event]:
        key = FamilyKey(self.settings.base_model or "llama-style", self.settings.dtype, self.settings.device)
        state, notes = resumed(self.settings, key, folder, resume)
        yield from notes
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            if not resume:
                _fresh(folder, self.specs)
            write_checkpoint(folder / CHECKPOINT_FILE, state)  # the key, before any member
        members: list[Member] = []

        def partial() -> Result | None:
            doc = self.document(members, folder, output_dir, started, partial=True) if members else None
            return None if doc is None else Result("depth-family", json_safe(doc))

        def work() -> Iterator[Event]:
            for spec in self.specs:
                record = state["layers"].get(spec.name)
                if record is not None:
                    member = from_doc(Member, record)
                    yield Message(f"{spec.name}: finished before, restored from its checkpoint")
                else:
                    member = yield from self.member(spec, cancel, folder, resume)
                    state["layers"][spec.name] = json_safe(member)
                    if folder is not None:
                        write_checkpoint(folder / CHECKPOINT_FILE, state)
                members.append(member)
                anatomy = member.anatomy
                yield MemberDone(member=spec.name, depth=spec.depth, width=spec.width, tokens=spec.tokens,
                                 seed=spec.seed, params=member.params, heldout_loss=member.heldout_loss,
                                 seconds=member.seconds,
                                 redundant_share=anatomy.redundant_share if anatomy else None,
                                 mean_angle=anatomy.mean_angle if anatomy else None,
                                 neighbour_similarity=anatomy.neighbour_similarity if anatomy else None,
                                 done=len(members), total=len(self.specs))
                yield Progress(len(members), len(self.specs), spec.name, phase="training", unit="members")

        yield from kept_on_stop(work(), partial)
        doc = self.document(members, folder, output_dir, started, partial=False)
        yield from fit_events(doc)
        yield Result("depth-family", json_safe(doc))

    def member(self, spec: MemberSpec, cancel: CancelToken | None, folder: Path | None, resume: bool
               ) -> Generator[Event, None, Member]:
        """One member trained (continued from its checkpoint on resume) and mapped."""
        own = None if folder is None else folder / spec.name
        if own is not None:
            own.mkdir(exist_ok=True)
        trained = yield from train_member(spec, self.settings, self.text, self.configs[spec], cancel, own, resume)
        anatomy = None
        if self.settings.anatomy:
            source = heldout_source(self.text.heldout, self.settings.anatomy_texts)
            anatomy = member_anatomy(trained.model, self.text.tokenizer, source, self.settings, cancel)
        return Member(name=spec.name, depth=spec.depth, width=spec.width, tokens=spec.tokens, seed=spec.seed,
                      params=self.params[spec], steps=trained.steps, train_loss=trained.train_loss,
                      heldout_loss=trained.heldout_loss, seconds=trained.seconds, curve=trained.curve,
                      anatomy=anatomy)

    def document(self, members: Sequence[Member], folder: Path | None, output_dir: Path | None, started: float,
                 partial: bool) -> DepthFamilyResult:
        """The result of the finished members: CSV written (in the checkpoint folder), fits, anatomy rows."""
        csv = ""
        if folder is not None:
            write_csv(folder / CSV_NAME, members)
            path = folder / CSV_NAME
            csv = str(path.relative_to(output_dir) if output_dir is not None and path.is_relative_to(output_dir)
                      else path)
        law, note = full_law(members, min(self.settings.bootstrap, 200))
        return DepthFamilyResult(
            recipe=self.recipe, plan=self.plan, members=list(members), csv=csv,
            fit=family_fit(members, self.settings.bootstrap), full_law=law, full_law_note=note,
            anatomy_by_depth=anatomy_by_depth(members), settings=self.settings,
            seconds=time.perf_counter() - started, **({"partial": True} if partial else {}))


def fit_events(doc: DepthFamilyResult) -> Iterator[Event]:
    """The fit said: its event and its line (a warning where no exponent could be fitted)."""
    fit = doc.fit
    if fit is None:
        yield Message("fewer than three depths finished: no exponent fitted", level="warning")
        return
    yield FamilyFit(alpha_l=fit.alpha_l, ci95=fit.ci95, c_l=fit.c_l, L0=fit.L0, loo_rmse=fit.loo_rmse,
                    weakly_identified=fit.weakly_identified)
    interval = f" [{fit.ci95[0]:.2f}, {fit.ci95[1]:.2f}]" if fit.ci95 else ""
    yield Message(f"a_l = {fit.alpha_l:.2f}{interval} (paper B: 1.2 ± 0.3), c_l = {fit.c_l:.3g}, L0 = "
                  f"{fit.L0:.3g}{'; weakly identified' if fit.weakly_identified else ''}")


def run(settings: DepthFamilySettings, context: RunContext) -> Iterator[Event]:
    """The registry's entry: members checkpointed in the session, so `--resume` continues a kill."""
    yield from run_family(settings, context.cancel, context.checkpoint_dir, context.resume, context.output_dir)
