"""Trains one arm (a growth protocol or the uniform baseline) for one seed.

Optimizer: one AdamW over every parameter of the final model, made once. Layers that do not exist
yet get no gradient, so AdamW leaves them and their state alone; a layer joins with fresh moments
and its own step counter (Adam's bias correction starts over for it), while the layers already
trained keep their moments across the boundary. The learning rate follows one schedule over the
arm's whole budget (linear warm-up, cosine decay to 10 %), the same shape for every arm.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from engine.events import CancelToken, Event, GrowthEval, GrowthPhase, GrowthPhaseEnd, GrowthStep
from engine.experiments.growth.architecture import GrowingModel, build_model
from engine.experiments.growth.checkpoint import optimizer_tensors, restore_optimizer
from engine.experiments.growth.data import train_batch
from engine.experiments.growth.protocol import Phase
from engine.models import autocast


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


def synchronize(device: str) -> None:
    """Waits for queued GPU work, so a timing covers the work and not only its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, batches: Sequence[torch.Tensor], device: str = "cpu", dtype: str = "float32"
) -> float:
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    for batch in batches:
        batch = batch.to(device)
        with autocast(device, dtype):
            logits = model(batch[:, :-1], use_cache=False).logits
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    model.train()
    return float(total) / len(batches)


def _tensors(grow: GrowingModel, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
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
    model = build_model(c.vocab_size, c.hidden_size, c.heads, plan.widths, c.seq_len + 1, seed, plan.uniform)
    model.to(c.device)  # float32 parameters (the master weights); the forward runs under autocast
    grow = GrowingModel(model, kept)
    params = list(grow.named.values())
    optimizer = torch.optim.AdamW(params, lr=c.lr, betas=(0.9, 0.95), weight_decay=c.weight_decay)
    scaler = torch.amp.GradScaler(torch.device(c.device).type, enabled=c.dtype == "float16")
    total, tokens_per_step = plan.total_steps, c.batch_size * c.seq_len
    step, seconds, phase_seconds = 0, 0.0, [0.0] * len(plan.phases)
    if resume is not None:
        state, tensors = resume
        with torch.no_grad():
            for name, p in grow.named.items():
                p.copy_(tensors[f"model.{name}"])
        restore_optimizer(optimizer, tensors, state["optimizer"])
        if state.get("scaler"):  # float16: the loss scale and its growth counter continue
            scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(tensors["rng.torch"])
        step, seconds, phase_seconds = state["step"], state["seconds"], list(state["phase_seconds"])

    def checkpoint() -> None:
        if save is not None:
            tensors, groups = _tensors(grow, optimizer)
            state = {"step": step, "seconds": seconds, "phase_seconds": phase_seconds, "optimizer": groups,
                     "scaler": scaler.state_dict()}  # a few numbers ({} unless float16): JSON
            save(state, tensors)

    model.train()
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
        while step < end:
            if cancel is not None:
                cancel.check()
            batch = train_batch(train_tokens, seed, step, c.batch_size, c.seq_len)
            lr = learning_rate(step, total, c.lr, c.warmup_frac)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = batch.to(c.device)
            synchronize(c.device)
            began = time.perf_counter()
            with autocast(c.device, c.dtype):
                logits = model(batch[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # clip the true gradients
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], c.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            synchronize(c.device)
            took = time.perf_counter() - began
            step, seconds = step + 1, seconds + took
            phase_seconds[index] += took
            yield GrowthStep(
                arm=plan.name, seed=seed, phase=phase.name, step=step, total_steps=total,
                train_loss=loss.item(), tokens_per_s=tokens_per_step / took, lr=lr,
                n_layers=len(phase.layers),
            )  # fmt: skip
            if step % c.eval_every == 0 or step == end:
                val_loss = evaluate(model, val_set, c.device, c.dtype)
                yield GrowthEval(arm=plan.name, seed=seed, phase=phase.name, step=step, val_loss=val_loss)
            if step == end or (c.checkpoint_every and step % c.checkpoint_every == 0):
                checkpoint()
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
    final = evaluate(model, val_set, c.device, c.dtype)
    model.to("cpu")  # generation and saving read the final model on the host
    return ArmOutcome(final, seconds, step, step * tokens_per_step, stats, grow)
