"""Trains one arm (a growth protocol or the uniform baseline) for one seed.

Optimizer: one AdamW over every parameter of the final model, made once. Layers that do not exist
yet get no gradient, so AdamW leaves them and their state alone; a layer joins with fresh moments
and its own step counter (Adam's bias correction starts over for it), while the layers already
trained keep their moments across the boundary. The learning rate follows one schedule over the
arm's whole budget (linear warm-up, cosine decay to 10 %), the same shape for every arm.

A step reads nothing back from the device: the losses stay there and are read together at each
report point (an evaluation, a checkpoint, a phase end), and the time between report points is
measured with one wait at its end (CUDA events on a GPU); each step's event is sent then, with the
interval's throughput.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from engine.core.events import CancelToken, Event
from engine.experiments.growth.architecture import GrowingModel, build_model
from engine.experiments.growth.checkpoint import optimizer_tensors, restore_optimizer
from engine.experiments.growth.data import train_batch
from engine.experiments.growth.protocol import Phase
from engine.experiments.growth.vocabulary import GrowthEval, GrowthPhase, GrowthPhaseEnd, GrowthStep
from engine.training.trainer import Stopwatch, Trainer, blocks_forward


@dataclass(frozen=True)
class TrainConfig:
    """The numbers one arm needs (a slice of the experiment's settings)."""

    vocab_size: int
    hidden_size: int
    heads: int
    seq_len: int
    batch_size: int
    lr: float
    warmup_frac: float
    weight_decay: float
    grad_clip: float
    eval_every: int
    checkpoint_every: int
    device: str = "cpu"
    dtype: str = "float32"  # the forward's autocast dtype; parameters and AdamW stay float32


@dataclass(frozen=True)
class ArmPlan:
    """An arm: its phases (the uniform arm has one, with every layer) and per-layer FFN widths."""

    name: str
    phases: tuple[Phase, ...]
    widths: tuple[int, ...]
    uniform: bool

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    def starts(self) -> list[int]:
        starts, at = [], 0
        for phase in self.phases:
            starts.append(at)
            at += phase.steps
        return starts


@dataclass
class ArmOutcome:
    val_loss: float
    seconds: float
    steps: int
    tokens: int
    phase_stats: list[dict[str, Any]] = field(default_factory=list)
    model: GrowingModel | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss) at each evaluation

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


SaveFn = Callable[[dict[str, Any], dict[str, torch.Tensor]], None]


def learning_rate(step: int, total: int, peak: float, warmup_frac: float) -> float:
    warmup = max(1, round(total * warmup_frac))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Sequence[torch.Tensor], trainer: Trainer) -> float:
    """Mean validation loss, in the trainer's precision on its device."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=trainer.device)
    for batch in batches:
        batch = batch.to(trainer.device)
        with trainer.autocast():
            logits = blocks_forward(model, batch[:, :-1]).logits
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    model.train()
    return float(total) / len(batches)


def _tensors(grow: GrowingModel, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[Any]]:
    tensors = {f"model.{name}": p.detach().clone() for name, p in grow.named.items()}
    opt_tensors, groups = optimizer_tensors(optimizer)
    tensors.update(opt_tensors)
    tensors["rng.torch"] = torch.get_rng_state()
    return tensors, groups


def train_arm(
    plan: ArmPlan,
    seed: int,
    config: TrainConfig,
    kept: Sequence[int],
    train_tokens: torch.Tensor,
    val_set: Sequence[torch.Tensor],
    cancel: CancelToken | None = None,
    save: SaveFn | None = None,
    resume: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None,
) -> Generator[Event, None, ArmOutcome]:
    """Yields step, eval and phase events; returns the outcome with the trained model.

    `save(state, tensors)` is called at every phase boundary and every `checkpoint_every` steps;
    `resume` is what such a call saved, and training continues exactly where it stopped.
    """
    c = config
    device = torch.device(c.device)
    model = build_model(c.vocab_size, c.hidden_size, c.heads, plan.widths, c.seq_len + 1, seed, plan.uniform)
    model.to(device)  # type: ignore[arg-type]  # transformers' @wraps(Module.to) loses the bound self
    # float32 parameters (the master weights); the forward runs under autocast
    grow = GrowingModel(model, kept)
    trainer = Trainer(list(grow.named.values()), device, getattr(torch, c.dtype), lr=c.lr, clip=c.grad_clip,
                      betas=(0.9, 0.95), weight_decay=c.weight_decay, what=f"growth training of {plan.name}",
                      advice="a smaller --batch-size or --seq-len")
    total, tokens_per_step = plan.total_steps, c.batch_size * c.seq_len
    step, seconds, phase_seconds = 0, 0.0, [0.0] * len(plan.phases)
    curve: list[tuple[int, float]] = []
    if resume is not None:
        state, tensors = resume
        with torch.no_grad():
            for name, p in grow.named.items():
                p.copy_(tensors[f"model.{name}"])
        restore_optimizer(trainer.optimizer, tensors, state["optimizer"])
        if state.get("scaler"):  # float16: the loss scale and its growth counter continue
            trainer.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(tensors["rng.torch"])
        step, seconds, phase_seconds = state["step"], state["seconds"], list(state["phase_seconds"])
        curve = [(int(at), float(loss)) for at, loss in state.get("curve", [])]  # absent before 0.4

    def checkpoint() -> None:
        if save is not None:
            tensors, groups = _tensors(grow, trainer.optimizer)
            state = {"step": step, "seconds": seconds, "phase_seconds": phase_seconds, "optimizer": groups,
                     "scaler": trainer.scaler.state_dict(), "curve": curve}  # a few numbers: JSON
            save(state, tensors)

    model.train()
    clock = Stopwatch(device)
    with trainer:
        for index, (phase, start) in enumerate(zip(plan.phases, plan.starts(), strict=True)):
            end = start + phase.steps
            if step >= end:
                continue
            if step == start:
                for layer, source in phase.clone_from:
                    grow.clone(layer, source, phase.ffn_scale)
                added = [{"layer": t, "source": s, "ffn_scale": phase.ffn_scale} for t, s in phase.clone_from]
                yield GrowthPhase(
                    arm=plan.name, seed=seed, phase=phase.name, phase_index=index, start_step=start,
                    steps=phase.steps, layers=list(phase.layers), added=added,
                )  # fmt: skip
            grow.set_active(phase.layers)
            losses: list[torch.Tensor] = []  # since the last report, on the device
            lrs: list[float] = []  # their learning rates
            clock.start()
            while step < end:
                if cancel is not None:
                    cancel.check()
                batch = train_batch(train_tokens, seed, step, c.batch_size, c.seq_len).to(device)
                with trainer.forward():
                    logits = blocks_forward(model, batch[:, :-1]).logits
                    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
                lrs.append(learning_rate(step, total, c.lr, c.warmup_frac))
                trainer.step(loss, lrs[-1])
                losses.append(loss.detach())
                step += 1
                evaluating = step % c.eval_every == 0 or step == end
                saving = step == end or bool(c.checkpoint_every and step % c.checkpoint_every == 0)
                if not (evaluating or saving):
                    continue
                took = clock.stop()
                seconds += took
                phase_seconds[index] += took
                speed = len(losses) * tokens_per_step / max(took, 1e-9)
                first = step - len(losses) + 1
                for at, (value, lr) in enumerate(zip(torch.stack(losses).tolist(), lrs, strict=True), first):
                    if cancel is not None:
                        cancel.check()
                    yield GrowthStep(
                        arm=plan.name, seed=seed, phase=phase.name, step=at, total_steps=total, train_loss=value,
                        tokens_per_s=speed, lr=lr, n_layers=len(phase.layers),
                    )  # fmt: skip
                losses, lrs = [], []
                if evaluating:
                    val_loss = evaluate(model, val_set, trainer)
                    curve.append((step, val_loss))
                    yield GrowthEval(arm=plan.name, seed=seed, phase=phase.name, step=step, val_loss=val_loss)
                if saving:
                    checkpoint()
                clock.start()
            rate = phase.steps * tokens_per_step / max(phase_seconds[index], 1e-9)
            yield GrowthPhaseEnd(
                arm=plan.name, seed=seed, phase=phase.name, phase_index=index, steps=phase.steps,
                seconds=phase_seconds[index], tokens_per_s=rate,
            )  # fmt: skip
    stats = [
        {"name": p.name, "steps": p.steps, "seconds": s,
         "tokens_per_s": p.steps * tokens_per_step / max(s, 1e-9)}
        for p, s in zip(plan.phases, phase_seconds, strict=True)
    ]  # fmt: skip
    grow.set_active(kept)
    final = evaluate(model, val_set, trainer)
    model.to("cpu")  # type: ignore[arg-type]  # transformers' @wraps(Module.to) loses the bound self
    # generation and saving read the final model on the host
    return ArmOutcome(final, seconds, step, step * tokens_per_step, stats, grow, curve)
