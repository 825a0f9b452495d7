"""One member of the family: its model, its parameter count, its memory, and its training.

The model: a Llama-style decoder (transformers' LlamaForCausalLM, built by growth's `build_model`:
untied head, one FFN width, seeded init) of the member's depth and width, or `--model`'s config with
its depth, width, heads and vocabulary replaced. N, the parameter count of 6 N D, leaves out the
input and output embeddings (Kaplan et al.'s convention).

The recipe: AdamW (betas 0.9, 0.95) over every parameter through engine.training's Trainer (float32
weights, the forward autocast to the run's dtype), the learning rate warmed up linearly over
`--warmup-frac` of the member's steps, then cosine-decayed to 0 at its last; gradients clipped.
Step s of seed k reads growth's `train_batch` windows, drawn from a generator seeded with (k, s), so
a member's data depend on its seed and step alone, and a resumed member sees what it would have seen.

Checkpoints (growth's: weights, AdamW's moments in safetensors, the step, the curve and AdamW's
groups in JSON, never a pickle) go to the member's own folder every `--checkpoint-every` steps and
at its end; a resumed member continues from the last one and ends where an uninterrupted one ends.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Progress
from engine.experiments.depth_family.text import FamilyText
from engine.experiments.depth_family.vocabulary import CurvePoint, DepthFamilySettings, MemberSpec, MemberStep
from engine.experiments.growth.architecture import build_model
from engine.experiments.growth.checkpoint import load_checkpoint, optimizer_tensors, restore_optimizer, save_checkpoint
from engine.experiments.growth.data import train_batch
from engine.experiments.growth.trainer import evaluate
from engine.models.memory import MemoryPlan, ModelShape, Training, check_fits, free_memory, training_bytes
from engine.training.trainer import Stopwatch, Trainer, blocks_forward

BETAS = (0.9, 0.95)


def member_steps(settings: DepthFamilySettings, tokens: int) -> int:
    """Optimizer steps of a member of `tokens` training tokens (at least one)."""
    return max(1, tokens // (settings.batch_size * settings.context))


def learning_rate(step: int, total: int, peak: float, warmup_frac: float) -> float:
    """Linear warm-up over `warmup_frac` of the steps, then cosine decay to 0 at the last step."""
    warmup = round(total * warmup_frac)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def ffn_width(settings: DepthFamilySettings, width: int) -> int:
    return max(1, round(settings.ffn_ratio * width))


def member_config(settings: DepthFamilySettings, spec: MemberSpec, vocab_size: int, base: Any | None) -> Any:
    """The member's transformers config: Llama-style, or `base` (--model's) resized."""
    if base is None:
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=vocab_size, hidden_size=spec.width, num_hidden_layers=spec.depth,
                           num_attention_heads=settings.heads, num_key_value_heads=settings.heads,
                           intermediate_size=ffn_width(settings, spec.width),
                           max_position_embeddings=settings.context + 1, tie_word_embeddings=False,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = copy.deepcopy(base)
    changes: dict[str, Any] = {"num_hidden_layers": spec.depth, "hidden_size": spec.width,
                               "num_attention_heads": settings.heads, "vocab_size": vocab_size,
                               "intermediate_size": ffn_width(settings, spec.width)}
    if getattr(config, "num_key_value_heads", None) is not None:
        changes["num_key_value_heads"] = settings.heads
    if getattr(config, "head_dim", None) is not None:
        changes["head_dim"] = spec.width // settings.heads
    if getattr(config, "max_position_embeddings", 0) < settings.context + 1:
        changes["max_position_embeddings"] = settings.context + 1
    pattern = getattr(config, "layer_types", None)
    if pattern:  # a per-layer pattern (sliding and full attention): repeated to the member's depth
        changes["layer_types"] = [pattern[i % len(pattern)] for i in range(spec.depth)]
    for name, value in changes.items():
        setattr(config, name, value)
    config.use_cache = False
    return config


def build_member(settings: DepthFamilySettings, spec: MemberSpec, config: Any) -> Any:
    """The member's freshly initialised model (seeded by its seed), float32, in training mode."""
    if settings.base_model is None:
        return build_model(config.vocab_size, spec.width, settings.heads,
                           [config.intermediate_size] * spec.depth, settings.context + 1, spec.seed, uniform=True)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    return AutoModelForCausalLM.from_config(config).float()


def body_params(model: Any) -> int:
    """N: the parameters outside the input and output embeddings."""
    skip = {id(p) for module in (model.get_input_embeddings(), model.get_output_embeddings()) if module is not None
            for p in module.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def check_memory(settings: DepthFamilySettings, spec: MemberSpec, config: Any) -> int:
    """The member's training memory (weights, AdamW, one step's activations and logits), refused in
    one line when it exceeds the device's free memory; returns N (from the meta model: no memory)."""
    from engine.models.loading import meta_model

    meta = meta_model(config)
    shape = ModelShape.from_meta(config, meta)
    training = training_bytes(shape, settings.dtype,
                              Training(shape.params, settings.batch_size, settings.context, spec.depth))
    plan = MemoryPlan(device=settings.device, dtype=settings.dtype, weights=4 * shape.params, prefix_cache=0,
                      activations=0, logits=0, training=training)
    check_fits(plan, free_memory(settings.device), f"member {spec.name}")
    return body_params(meta)


@dataclass
class Trained:
    """A member after training: the model (on the run's device), its losses and curve, its seconds."""

    model: Any
    steps: int
    train_loss: float
    heldout_loss: float
    seconds: float
    curve: list[CurvePoint] = field(default_factory=list)


def _state_tensors(model: Any, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[Any]]:
    tensors = {f"model.{name}": p.detach().clone() for name, p in model.named_parameters()}
    opt, groups = optimizer_tensors(optimizer)
    return tensors | opt, groups


def _restore(model: Any, trainer: Trainer, folder: Path) -> tuple[int, float, list[CurvePoint]]:
    """The member's last checkpoint put back into the model and AdamW: (step, seconds, curve)."""
    found = load_checkpoint(folder)
    if found is None:
        return 0, 0.0, []
    state, tensors = found
    with torch.no_grad():
        for name, p in model.named_parameters():
            if f"model.{name}" not in tensors:
                raise UserError(f"the checkpoint in {folder} belongs to another model; run without --resume")
            p.copy_(tensors[f"model.{name}"])
    restore_optimizer(trainer.optimizer, tensors, state["optimizer"])
    if state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    curve = [CurvePoint(int(s), float(t), None if h is None else float(h)) for s, t, h in state["curve"]]
    return int(state["step"]), float(state["seconds"]), curve


def _trainer(model: Any, settings: DepthFamilySettings, spec: MemberSpec) -> Trainer:
    """The recipe's AdamW on every parameter of the member, in the run's precision."""
    return Trainer(list(model.parameters()), torch.device(settings.device), getattr(torch, settings.dtype),
                   lr=settings.lr, clip=settings.grad_clip, betas=BETAS, weight_decay=settings.weight_decay,
                   what=f"training member {spec.name}", advice="a smaller --batch-size, --context or --widths")


def _step(model: Any, trainer: Trainer, batch: torch.Tensor, lr: float | None) -> torch.Tensor:
    """One optimizer step on a batch of windows; the loss, left on the device."""
    with trainer.forward():
        logits = blocks_forward(model, batch[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    trainer.step(loss, lr)
    return loss.detach()


def train_member(spec: MemberSpec, settings: DepthFamilySettings, text: FamilyText, config: Any,
                 cancel: CancelToken | None = None, folder: Path | None = None, resume: bool = False,
                 ) -> Generator[Event, None, Trained]:
    """Trains one member by the recipe, yielding a MemberStep per step (its held-out loss at every
    `eval_every`-th and the last); with `folder`, checkpoints there, and with `resume` continues
    from the last checkpoint there."""
    device = torch.device(settings.device)
    model = build_member(settings, spec, config).to(device)
    model.train()
    trainer = _trainer(model, settings, spec)
    heldout = list(text.heldout.split(settings.batch_size))
    total = member_steps(settings, spec.tokens)
    step, seconds, curve = _restore(model, trainer, folder) if folder is not None and resume else (0, 0.0, [])
    if step:
        yield Message(f"{spec.name}: continued from its checkpoint at step {step} of {total}")
    losses: list[torch.Tensor] = []
    clock = Stopwatch(device)
    with trainer:
        clock.start()
        while step < total:
            if cancel is not None:
                cancel.check()
            batch = train_batch(text.train, spec.seed, step, settings.batch_size, settings.context).to(device)
            losses.append(_step(model, trainer, batch, learning_rate(step, total, settings.lr, settings.warmup_frac)))
            step += 1
            evaluating = step % settings.eval_every == 0 or step == total
            saving = folder is not None and (step == total or bool(settings.checkpoint_every
                                                                    and step % settings.checkpoint_every == 0))
            if not (evaluating or saving):
                continue
            seconds += clock.stop()
            yield from _report(spec, settings, step, total, torch.stack(losses).tolist(), curve,
                               evaluate(model, heldout, trainer) if evaluating else None)
            losses = []
            if saving and folder is not None:
                tensors, groups = _state_tensors(model, trainer.optimizer)
                save_checkpoint(folder, str(step), tensors, {
                    "step": step, "seconds": seconds, "optimizer": groups, "scaler": trainer.scaler.state_dict(),
                    "curve": [[p.step, p.train_loss, p.heldout_loss] for p in curve]})
            clock.start()
    model.eval()  # left on the device: the anatomy reads it there
    final = curve[-1]
    assert final.heldout_loss is not None  # the last step is always evaluated
    tail = [p.train_loss for p in curve[-settings.eval_every:]]
    return Trained(model, total, sum(tail) / len(tail), final.heldout_loss, seconds, curve)


def _report(spec: MemberSpec, settings: DepthFamilySettings, step: int, total: int, values: Sequence[float],
            curve: list[CurvePoint], heldout: float | None) -> Generator[Event, None, None]:
    """The steps since the last report: a MemberStep each, the last carrying the held-out loss, then
    the member's progress (a line on the command line's stderr)."""
    first = step - len(values) + 1
    for at, value in enumerate(values, first):
        held = heldout if at == step else None
        curve.append(CurvePoint(at, float(value), held))
        yield MemberStep(member=spec.name, depth=spec.depth, width=spec.width, tokens=spec.tokens, seed=spec.seed,
                         step=at, steps=total, train_loss=float(value), heldout_loss=held,
                         lr=learning_rate(at - 1, total, settings.lr, settings.warmup_frac))
    yield Progress(step, total, spec.name, phase="member", unit="steps")


def step_seconds(settings: DepthFamilySettings, spec: MemberSpec, config: Any, text: FamilyText,
                 repeats: int = 3) -> float:
    """Seconds of one training step of this member, measured on a throwaway copy after one warm-up step."""
    device = torch.device(settings.device)
    model = build_member(settings, spec, config).to(device)
    trainer = _trainer(model, settings, spec)
    clock = Stopwatch(device)
    with trainer:
        for index in range(repeats + 1):
            if index == 1:
                clock.start()
            batch = train_batch(text.train, spec.seed, index, settings.batch_size, settings.context).to(device)
            _step(model, trainer, batch, None)
    return clock.stop() / repeats
