"""recovery's sweep: one layer noised (`add_noise`, seeded by layer and repeat), fine-tuned alone
from its prefix cache and evaluated step by step (on a subset of the texts between the first and
the last step, `--eval-texts`/`--eval-every auto`), its weights put back exactly afterwards."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Pace
from engine.disk.atomic import atomic_write_json, read_json
from engine.evaluation.perplexity import Evaluator
from engine.experiments.recovery.summary import summarise_run
from engine.experiments.recovery.vocabulary import (
    PAPER_STEPS,
    KnownBaseline,
    RecoveryBaseline,
    RecoveryPoint,
    RecoveryRepeat,
    RecoverySettings,
    RecoveryStart,
    baseline_fingerprint,
)
from engine.models.anatomy import LayerStack, execution_device
from engine.models.placement import training_budget_seconds
from engine.training.trainer import (
    FINE_TUNE_ADVICE,
    FINE_TUNE_SCALE,
    Trainer,
    blocks_forward,
    next_token_loss,
    seeded_batches,
)


def noise_seed(seed: int, layer: int, repeat: int) -> int:
    """One seed per (run seed, layer, repeat), independent of the order layers are swept in."""
    return (seed * 1_000_003 + layer * 1_009 + repeat) % 2**63


def add_noise(stack: LayerStack, index: int, sigma: float, seed: int) -> None:
    """W += N(0, (sigma * std(W))^2) on each matrix of the layer, in canonical order, drawn where the
    layer lives by a generator of that device seeded with `seed`: no noise matrix crosses from the
    host and no std is read back. A GPU's generator draws other numbers than the CPU's, so the device
    is part of a run's identity (recovery's resume key holds it)."""
    generator = torch.Generator(device=execution_device(stack.layers[index])).manual_seed(seed)
    with torch.no_grad():
        for param in stack.matrices(index).values():
            scale = sigma * param.detach().float().std()
            noise = torch.randn(param.shape, generator=generator, device=param.device, dtype=torch.float32)
            param.add_((noise * scale).to(param.dtype))


class _PrefixDone(Exception):
    """Stops a forward once the wanted layer input is captured."""


KeepWeights = Callable[[int, dict[str, torch.Tensor]], None] | None

AUTO_EVAL_SHARE = 0.25  # --eval-texts auto: an intermediate evaluation's tokens, against a training step's
MIN_AUTO_TEXTS = 8
BACKWARD_COST = 3  # a training step's forward and backward cost about three forwards of its tokens


def auto_eval_texts(settings: RecoverySettings, n_texts: int, n_tokens: int) -> int:
    """--eval-texts auto: as many texts as take a quarter of a training step's token passes (its
    forward and backward: three forwards of batch_size x block_size tokens), at least 8 (or all
    when there are fewer); counted in tokens, so the same on every machine."""
    if settings.eval_texts is not None:
        return min(settings.eval_texts, n_texts)
    step = BACKWARD_COST * settings.batch_size * settings.block_size
    fit = int(AUTO_EVAL_SHARE * step / (n_tokens / n_texts))
    return max(min(n_texts, MIN_AUTO_TEXTS), min(n_texts, fit))


def auto_eval_every(settings: RecoverySettings, eval_seconds: float, step_seconds: float) -> int:
    """--eval-every auto: every step, unless one intermediate evaluation (as measured at step 1)
    takes longer than 1.5 training steps (as measured at step 1): then every round(eval / step)
    steps, so evaluating costs about as much as training, at most half the run."""
    if settings.eval_every is not None:
        return settings.eval_every
    if step_seconds <= 0 or eval_seconds <= 1.5 * step_seconds:
        return 1
    return max(1, min(settings.settled_steps, round(eval_seconds / step_seconds)))


MIN_AUTO_STEPS = 5


def training_step_estimate(settings: RecoverySettings, layer_tokens: float, seconds: float, layers_trained: float
                           ) -> float | None:
    """A training step's seconds, from the rate the evaluation pass just measured (`layer_tokens`
    token-layers in `seconds`): its batch's tokens through the layers trained (and the output head,
    counted in layers), forward and backward (BACKWARD_COST forwards); None when nothing was timed."""
    if layer_tokens <= 0 or seconds <= 0:
        return None
    return BACKWARD_COST * settings.batch_size * settings.block_size * layers_trained * seconds / layer_tokens


def head_in_layers(model: Any, stack: LayerStack, index: int) -> float:
    """The output head's weights as a number of layer `index`'s (a small model's head costs several
    layers' work: 49152 x 576 against about 3.5M a layer in SmolLM2-135M)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    layer = sum(param.numel() for param in stack.matrices(index).values())
    return head.weight.numel() / layer if head is not None and layer else 0.0


def auto_steps(budget: float | None, step_seconds: float | None) -> int:
    """`--steps auto`: the paper's on an accelerator (no budget), else as many steps as fit the
    budget at the estimated step time with its evaluations (AUTO_EVAL_SHARE of a step each), at
    least MIN_AUTO_STEPS and at most the paper's."""
    if budget is None:
        return PAPER_STEPS
    if not step_seconds:
        return MIN_AUTO_STEPS
    fit = int(budget / (step_seconds * (1 + AUTO_EVAL_SHARE)))
    return max(MIN_AUTO_STEPS, min(PAPER_STEPS, fit))


def read_known_baseline(path: Path, fingerprint: str) -> tuple[KnownBaseline | None, str]:
    """The baseline kept at `path` when it was measured on what `fingerprint` says (read as untrusted,
    never through a link), else None and why (nothing when there is no file)."""
    if not path.exists():
        return None, ""
    try:
        known = KnownBaseline.from_json(read_json(path))
    except (OSError, ValueError, TypeError) as exc:
        return None, f"{path.name} ignored ({exc}); the baseline is measured again"
    if known.fingerprint != fingerprint:
        return None, (f"the baseline {known.measured_by} measured was on another model, precision, device or "
                      "texts; measured again")
    return known, ""


def keep_baseline(path: Path, known: KnownBaseline) -> Iterator[Event]:
    """Writes the baseline for the next run (atomically); a folder that cannot take it is said, not fatal."""
    try:
        atomic_write_json(path, dataclasses.asdict(known), "the recovery baseline")
    except (OSError, UserError) as exc:
        yield Message(f"the baseline was not kept for the next run: {exc}", "warning")


def evaluated(step: int, every: int, settings: RecoverySettings) -> bool:
    """Whether step `step` (1..steps) of a run is evaluated: every `every`-th and the last; with
    --eval-every auto also the first (whose times choose `every`)."""
    return step % every == 0 or step == settings.settled_steps or (step == 1 and settings.eval_every is None)


class Sweep:
    """Shared state of one sweep: model, evaluation cache (all the texts, and the subset evaluated
    between the first and the last step), training pool, baselines, progress."""

    def __init__(
        self, model: Any, tokenizer: Any, settings: RecoverySettings, cancel: CancelToken | None,
        keep_weights: KeepWeights, identity: tuple[str, str] = ("", ""), baseline_file: Path | None = None,
        deepest: int = 0,
    ) -> None:
        self.model = model
        self.settings = settings
        self.identity = identity  # the model's name and precision (LoadedModel.dtype_name): the baseline's fingerprint
        self.baseline_file = baseline_file  # a baseline measured already is read there, and this one's kept
        self.deepest = deepest  # the deepest layer the sweep noises: a known baseline's cache stops there
        self.step_estimate: float | None = None  # seconds a training step of the deepest layer should take
        self.cancel = cancel
        self.keep_weights = keep_weights
        blocks, self.train_source = settings.training_blocks(tokenizer)
        self.evaluator = Evaluator.for_settings(model, tokenizer, settings, cancel=cancel)
        self.stack = self.evaluator.stack
        self.blocks = blocks.to(self.stack.input_device())
        self.subset_texts = auto_eval_texts(settings, self.evaluator.n_texts, self.evaluator.n_tokens)
        self.subset = self.evaluator  # its batches are chosen once the cache is built (`baselines`)
        self.baseline = math.nan
        self.subset_baseline = math.nan
        self.every = settings.eval_every  # None until the first step's time is measured (auto)
        self.steps_done = 0
        self.steps_total = 0
        self.pace = Pace("training", 0, "steps", "recovery")  # sized once the runs to make are known

    def baselines(self) -> Iterator[Event]:
        """The model's perplexity before any noise on every text (building the prefix cache), with
        its progress, sent as soon as it is known; and the subset's, from the same scores. A baseline
        measured already on the same model, precision, device and texts (`baseline_file`, its
        fingerprint checked) is taken instead: the cache is built only up to the deepest layer, with
        no logits, and only the subset is scored, from there. A measured one is kept there."""
        fingerprint = baseline_fingerprint(*self.identity, str(self.stack.input_device()), self.evaluator.protocol)
        known = None
        if self.baseline_file is not None and self.settings.prefix_cache:
            known, note = read_known_baseline(self.baseline_file, fingerprint)
            if note:
                yield Message(note, "warning")
        head = head_in_layers(self.model, self.stack, self.deepest)
        began = time.perf_counter()
        if known is None:
            scores = yield from self.evaluator.building(phase="baseline")
            seconds, layers_run = time.perf_counter() - began, len(self.stack) + head
            self.baseline = scores.perplexity
            if not self.settings.prefix_cache:
                self.evaluator.drop_cache()
            self.subset = self.evaluator.subset(self.subset_texts)
            self.subset_baseline = scores.of(self.subset.chosen).perplexity
            how = ""
            if self.baseline_file is not None:
                yield from keep_baseline(self.baseline_file, KnownBaseline(fingerprint, self.baseline, "recovery"))
        else:
            yield from self.evaluator.caching_up_to(self.deepest, phase="prefix")
            seconds, layers_run = time.perf_counter() - began, self.deepest + 1
            self.baseline = known.baseline_ppl
            self.subset = self.evaluator.subset(self.subset_texts)
            whole = self.subset is self.evaluator  # every text: its baseline is the known one
            self.subset_baseline = self.baseline if whole else self.subset.perplexity(self.deepest)
            how = f", as {known.measured_by} measured it (same model, precision, device and texts): no baseline pass"
        self.step_estimate = training_step_estimate(self.settings, self.evaluator.n_tokens * layers_run, seconds,
                                                    len(self.stack) - self.deepest + head)
        yield RecoveryBaseline(self.baseline, self.evaluator.n_texts, self.subset.n_texts, self.every or 0)
        yield Message(f"baseline perplexity {self.baseline:.4g} on {self.evaluator.n_texts} texts{how}")

    def sized(self) -> Iterator[Event]:
        """`--steps auto` settled for this device (engine/models/placement.py), said with how to ask
        for the paper's steps; nothing when the steps were given."""
        if self.settings.steps is not None:
            return
        budget = training_budget_seconds(str(self.stack.input_device()))
        steps = auto_steps(budget, self.step_estimate)
        self.settings = replace(self.settings, steps=steps)
        if budget is not None:
            took = f"a training step takes about {self.step_estimate:.1f} s here" if self.step_estimate else "untimed"
            yield Message(f"--steps auto on the CPU: {steps} steps a layer ({took}, about "
                          f"{budget / 60:.1f} minutes a layer); the paper's settings: --steps {PAPER_STEPS}")

    def _start(self, index: int) -> int:
        return index if self.settings.prefix_cache else 0

    def evaluate(self, index: int) -> Generator[Event, None, float]:
        """The perplexity on every text, from the layer on, with its progress."""
        return (yield from self.evaluator.scoring(self._start(index))).perplexity

    def evaluate_subset(self, index: int) -> tuple[float, float]:
        """(ratio to the subset's own baseline, that ratio times the full baseline) on the subset;
        (ratio, perplexity) when the subset is every text."""
        ppl = self.subset.perplexity(self._start(index))
        if self.subset is self.evaluator:
            return ppl / self.baseline, ppl
        ratio = ppl / self.subset_baseline
        return ratio, ratio * self.baseline

    def layer_inputs(self, index: int, rows: list[int], prefix: dict[int, torch.Tensor]) -> torch.Tensor:
        """Input of layer `index` for these training blocks, captured once per block. A block is
        captured with the fixed group of `batch_size` pool neighbours it belongs to (the first time
        any of them is drawn), never with whichever blocks a step drew: a GPU's kernels may sum a
        row differently in a batch of another make-up, and so a run's numbers would depend on the
        runs before it. This way a repeat run alone (a worker's share of a split sweep) gets the
        bits the serial sweep gets."""
        size = self.settings.batch_size
        for group in dict.fromkeys(r // size for r in rows if r not in prefix):
            members = list(range(group * size, min((group + 1) * size, len(self.blocks))))
            prefix.update(zip(members, self._captured(index, members), strict=True))
        return torch.stack([prefix[r] for r in rows])

    def _captured(self, index: int, members: list[int]) -> torch.Tensor:
        """Layer `index`'s input for these blocks, from one forward stopped there."""
        got: list[torch.Tensor] = []

        def keep(_batch: Any, i: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
            if i == index:
                got.append(layer_input.detach())
                raise _PrefixDone

        with torch.no_grad(), self.stack.capture(keep), contextlib.suppress(_PrefixDone):
            blocks_forward(self.model, self.blocks[members])
        return got[0]

    def train_loss(self, index: int, rows: list[int], prefix: dict[int, torch.Tensor]) -> torch.Tensor:
        """Mean next-token loss of these blocks, with the graph from layer `index` up."""
        ids = self.blocks[rows]
        start = self._start(index)
        hidden = self.layer_inputs(index, rows, prefix) if start > 0 else None
        with self.stack.starting_at(start, hidden):
            logits = blocks_forward(self.model, ids).logits
        return next_token_loss(logits, ids)

    def recover(
        self, index: int, repeat: int, prefix: dict[int, torch.Tensor]
    ) -> Generator[Event, None, RecoveryRepeat]:
        """One noise seed on one layer: noise, fine-tune, curve. Returns the run's summary."""
        settings, baseline = self.settings, self.baseline
        seed = noise_seed(settings.seed, index, repeat)
        generator = torch.Generator().manual_seed(seed)
        batches = seeded_batches(len(self.blocks), settings.batch_size, generator)  # drawn before the noise
        started = time.perf_counter()
        status, diverged_at = "done", None
        losses: list[list[float]] = []
        with self.stack.preserved([index]):
            add_noise(self.stack, index, settings.sigma, seed)
            after = yield from self.evaluate(index)
            curve = [[0, after]]
            everything, part = self.evaluator.n_texts, self.subset.n_texts
            yield RecoveryStart(index, repeat, after, baseline, settings.settled_steps)
            yield RecoveryPoint(index, repeat, 0, None, after, after / baseline, everything)
            params = list(self.stack.matrices(index).values())
            with Trainer(params, execution_device(self.stack.layers[index]), params[0].dtype, lr=settings.lr,
                         init_scale=FINE_TUNE_SCALE, what=f"recovery training of layer {index}",
                         advice=FINE_TUNE_ADVICE) as trainer:
                for step in range(1, settings.settled_steps + 1):
                    if self.cancel is not None:
                        self.cancel.check()
                    step_began = time.perf_counter()
                    with trainer.forward():
                        loss = self.train_loss(index, next(batches), prefix)
                    value = float(loss.detach())
                    if not math.isfinite(value):
                        status, diverged_at = "diverged", step
                        self.steps_done += settings.settled_steps - step + 1  # the progress bar still ends full
                        yield Message(f"layer {index}: training loss {value} at step {step}; stopped", "warning")
                        break
                    trainer.step(loss)
                    step_seconds = time.perf_counter() - step_began
                    losses.append([step, value])
                    self.steps_done += 1
                    yield self.pace.at(self.steps_done)
                    if evaluated(step, self.every or 1, settings):
                        if step == settings.settled_steps:
                            ppl = yield from self.evaluate(index)
                            ratio, texts = ppl / baseline, everything
                        else:
                            eval_began = time.perf_counter()
                            ratio, ppl = self.evaluate_subset(index)
                            texts = part
                            if self.every is None:  # auto: chosen from step 1's times, kept for the sweep
                                self.every = auto_eval_every(settings, time.perf_counter() - eval_began,
                                                             step_seconds)
                                yield schedule_message(self.every, part, everything)
                        curve.append([step, ppl])
                        yield RecoveryPoint(index, repeat, step, value, ppl, ratio, texts)
            if repeat == 0 and self.keep_weights is not None:
                self.keep_weights(index, {n: p.detach().cpu().clone() for n, p in self.stack.matrices(index).items()})
        seconds = time.perf_counter() - started
        return RecoveryRepeat(
            **summarise_run(curve, baseline, status),
            repeat=repeat,
            noise_seed=seed,
            diverged_at=diverged_at,
            steps_run=len(losses),
            seconds=seconds,
            seconds_per_step=seconds / len(losses) if losses else None,
            train_loss=losses,
            eval_every=self.every or 1,
            eval_texts=self.subset.n_texts,
        )


def schedule_message(every: int, part: int, everything: int) -> Message:
    """The evaluation schedule a sweep settled on, and the flags that change it."""
    between = "every step" if every == 1 else f"every {every} steps"
    return Message(f"evaluating {between} on {part} of the {everything} texts (the first step, and the last "
                   f"on all of them); --eval-every 1 --eval-texts {everything} evaluates every step on all")

