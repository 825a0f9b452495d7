"""A5: recovery speed. Gaussian noise (sigma * std(W)) hits the weight matrices of one layer, that
layer alone is fine-tuned with AdamW on training text, and the perplexity on held-out evaluation
texts is followed step by step until the budget runs out. The weights are put back exactly after
each run.

Layers below l are frozen and unchanged, so both training and evaluation start at layer l from a
prefix cache: the evaluation inputs of every layer come from `Evaluator.build_cache`, and the
training blocks' inputs of layer l are captured (in fixed groups of pool neighbours) the first
time a block is drawn, then reused every time the pool cycles (and by every repeat).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import CancelToken, Event, Message, Pace, Result, decode_or_none, kept_on_stop
from engine.data.eval_data import comparable
from engine.disk.session_layout import (
    LAYER_WEIGHTS,  # each recovered layer, for the prompt pane (sessions/layer_weights.py)
)
from engine.evaluation.perplexity import Evaluator
from engine.evaluation.statistics import spearman
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.context import RunContext
from engine.experiments.recovery.vocabulary import (
    DIFFICULTY_THRESHOLD,
    THRESHOLDS,
    LayerBudget,
    RecoveryBaseline,
    RecoveryBudget,
    RecoveryLayer,
    RecoveryPoint,
    RecoveryRepeat,
    RecoveryResult,
    RecoveryRow,
    RecoverySettings,
    RecoveryStart,
    RecoveryVsAblation,
)
from engine.experiments.sweep_checkpoint import CHECKPOINT_FILE, resumed, write_checkpoint
from engine.models.anatomy import LayerStack, execution_device
from engine.models.distributed import ShardPlan, Workers
from engine.training.trainer import (
    FINE_TUNE_ADVICE,
    FINE_TUNE_SCALE,
    Trainer,
    blocks_forward,
    next_token_loss,
    seeded_batches,
)


def threshold_key(threshold: float) -> str:
    return str(float(threshold))


def steps_to_thresholds(
    curve: Sequence[Sequence[float]], baseline: float, thresholds: Sequence[float] = THRESHOLDS
) -> dict[str, int | None]:
    """First evaluated step whose perplexity is below threshold x baseline (None: never)."""
    found: dict[str, int | None] = {}
    for threshold in thresholds:
        hits = [int(step) for step, ppl in curve if ppl < threshold * baseline]
        found[threshold_key(threshold)] = hits[0] if hits else None
    return found


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
    return max(1, min(settings.steps, round(eval_seconds / step_seconds)))


def evaluated(step: int, every: int, settings: RecoverySettings) -> bool:
    """Whether step `step` (1..steps) of a run is evaluated: every `every`-th and the last; with
    --eval-every auto also the first (whose times choose `every`)."""
    return step % every == 0 or step == settings.steps or (step == 1 and settings.eval_every is None)


class _Sweep:
    """Shared state of one sweep: model, evaluation cache (all the texts, and the subset evaluated
    between the first and the last step), training pool, baselines, progress."""

    def __init__(
        self, model, tokenizer, settings: RecoverySettings, cancel: CancelToken | None, keep_weights: KeepWeights
    ) -> None:
        self.model = model
        self.settings = settings
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
        its progress, sent as soon as it is known; and the subset's, from the same scores."""
        scores = yield from self.evaluator.building(phase="baseline")
        self.baseline = scores.perplexity
        if not self.settings.prefix_cache:
            self.evaluator.drop_cache()
        self.subset = self.evaluator.subset(self.subset_texts)
        self.subset_baseline = scores.of(self.subset.chosen).perplexity
        yield RecoveryBaseline(self.baseline, self.evaluator.n_texts, self.subset.n_texts, self.every or 0)
        yield Message(f"baseline perplexity {self.baseline:.4g} on {self.evaluator.n_texts} texts")

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
            yield RecoveryStart(index, repeat, after, baseline, settings.steps)
            yield RecoveryPoint(index, repeat, 0, None, after, after / baseline, everything)
            params = list(self.stack.matrices(index).values())
            with Trainer(params, execution_device(self.stack.layers[index]), params[0].dtype, lr=settings.lr,
                         init_scale=FINE_TUNE_SCALE, what=f"recovery training of layer {index}",
                         advice=FINE_TUNE_ADVICE) as trainer:
                for step in range(1, settings.steps + 1):
                    if self.cancel is not None:
                        self.cancel.check()
                    step_began = time.perf_counter()
                    with trainer.forward():
                        loss = self.train_loss(index, next(batches), prefix)
                    value = float(loss.detach())
                    if not math.isfinite(value):
                        status, diverged_at = "diverged", step
                        self.steps_done += settings.steps - step + 1  # the progress bar still ends full
                        yield Message(f"layer {index}: training loss {value} at step {step}; stopped", "warning")
                        break
                    trainer.step(loss)
                    step_seconds = time.perf_counter() - step_began
                    losses.append([step, value])
                    self.steps_done += 1
                    yield self.pace.at(self.steps_done)
                    if evaluated(step, self.every or 1, settings):
                        if step == settings.steps:
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


def summarise_run(curve: Sequence[Sequence[float]], baseline: float, status: str) -> dict[str, Any]:
    """What one run's curve says: thresholds, best and final perplexity, anti-layer signature."""
    ppls = [ppl if math.isfinite(ppl) else math.inf for _, ppl in curve]
    best = int(np.argmin(ppls))
    final = curve[-1][1]
    return {
        "status": status,
        "ppl_after_noise": curve[0][1],
        "ratio_after_noise": curve[0][1] / baseline,
        "steps_to": steps_to_thresholds(curve, baseline),
        "best_ppl": curve[best][1],
        "best_step": int(curve[best][0]),
        "final_ppl": final,
        "final_ratio": final / baseline,
        "improved_over_baseline": bool(final < baseline),
        "curve": [[int(step), ppl] for step, ppl in curve],
    }


def difficulty(steps_to: dict[str, int | None], budget: int) -> int:
    """Steps to get below 1.1x the baseline; never reached (or diverged first) counts as the budget."""
    steps = steps_to[threshold_key(DIFFICULTY_THRESHOLD)]
    return budget if steps is None else int(steps)


def layer_row(index: int, runs: list[RecoveryRepeat], budget: int) -> RecoveryRow:
    """The layer's result: run 0 at the top, every run under `repeats`, spread over repeats.
    Non-finite numbers become null here, so the row can be saved as it is."""
    shared = {f.name for f in fields(RecoveryRow)}
    top = {k: v for k, v in asdict(runs[0]).items() if k in shared}
    final_ratios = [math.nan if run.final_ratio is None else run.final_ratio for run in runs]  # None: saved inf/nan
    mean, sd, reached = {}, {}, {}
    for threshold in THRESHOLDS:
        key = threshold_key(threshold)
        hits = [run.steps_to[key] for run in runs if run.steps_to[key] is not None]
        reached[key] = len(hits)
        mean[key] = float(np.mean(hits)) if hits else None
        sd[key] = float(np.std(hits, ddof=1)) if len(hits) > 1 else None
    return RecoveryRow.from_json(json_safe({
        "layer": index,
        **top,
        "difficulty": float(np.mean([difficulty(run.steps_to, budget) for run in runs])),
        "mean_final_ratio": float(np.mean(final_ratios)),
        "steps_to_mean": mean,
        "steps_to_sd": sd,
        "steps_to_reached": reached,
        "repeats": runs,
    }))


def training_budget(rows: list[RecoveryRow], steps: int) -> RecoveryBudget:
    """The paper's Table 10 idea: a uniform budget against steps sized by measured difficulty.

    `proposed_steps` gives each layer the steps it needed to get below 1.1x the baseline (the full
    budget when it never did); `reallocated_steps` splits the uniform total in proportion to
    difficulty instead (same cost, more steps for the hard layers).
    """
    uniform_total = steps * len(rows)
    total_difficulty = sum(row.difficulty for row in rows)
    per_layer = []
    for row in rows:
        share = row.difficulty / total_difficulty if total_difficulty else 1 / len(rows)
        per_layer.append(
            LayerBudget(
                layer=row.layer,
                difficulty=row.difficulty,
                uniform_steps=steps,
                proposed_steps=min(steps, math.ceil(row.difficulty)),
                reallocated_steps=round(uniform_total * share),
            )
        )
    proposed_total = sum(item.proposed_steps for item in per_layer)
    return RecoveryBudget(
        rule="proposed: steps to get below 1.1x baseline (never reached = the full budget); "
        "reallocated: the uniform total split in proportion to that difficulty",
        uniform_total=uniform_total,
        proposed_total=proposed_total,
        saving_steps=uniform_total - proposed_total,
        saving_pct=100.0 * (uniform_total - proposed_total) / uniform_total if uniform_total else 0.0,
        per_layer=per_layer,
    )


def versus_ablation(rows: list[RecoveryRow], ablation: AblationMap | None) -> RecoveryVsAblation | None:
    """Spearman of recovery measures against the ablation map's D%, over the layers both have."""
    if ablation is None:
        return None
    degradation = {row.layer: row.degradation_pct for row in ablation.layers}
    shared = [row for row in rows if row.layer in degradation]
    d = [degradation[row.layer] for row in shared]
    return RecoveryVsAblation(
        layers=len(shared),
        ablation_method=ablation.method,
        difficulty=spearman([row.difficulty for row in shared], d),
        final_ratio=spearman([row.mean_final_ratio for row in shared], d),
        ratio_after_noise=spearman([row.ratio_after_noise for row in shared], d),
    )


def ranking(rows: list[RecoveryRow]) -> list[int]:
    """Layer indices from hardest to easiest: difficulty, then how far from baseline they ended."""
    def key(row: RecoveryRow) -> tuple[float, float]:
        ratio = row.mean_final_ratio
        return row.difficulty, ratio if ratio is not None and math.isfinite(ratio) else math.inf

    return [row.layer for row in sorted(rows, key=key, reverse=True)]


def run_recovery(
    model,
    tokenizer,
    settings: RecoverySettings,
    cancel: CancelToken | None = None,
    model_name: str = "",
    done_layers: Sequence[dict[str, Any]] = (),
    ablation: AblationMap | None = None,
    keep_weights: KeepWeights = None,
    runs: Collection[tuple[int, int]] | None = None,
) -> Iterator[Event]:
    """The sweep. `done_layers` are rows finished earlier with the same settings (--resume), as
    saved (JSON): those layers are not run again. `ablation` is the session's ablation map, for the
    Spearman. `runs` limits it to these (layer, repeat) runs, a worker's share of a split sweep:
    a layer's row then holds its runs made here (`whole_layers` and `merge_shards` join them).
    Every run's numbers depend on its layer and repeat alone (`noise_seed`, `layer_inputs`), not on
    the runs made before it.
    `keep_weights(index, matrices)` receives each layer's recovered matrices (first repeat) before
    the original weights are restored, so a front end can save them (the console's prompt pane)."""
    settings.validate()
    layers = settings.resolve_layers(len(LayerStack(model)))
    started = time.perf_counter()
    sweep = _Sweep(model, tokenizer, settings, cancel, keep_weights)
    yield from sweep.baselines()
    done = [RecoveryRow.from_json(row) for row in done_layers]
    rows = {row.layer: row for row in done if row.layer in layers}
    todo = [index for index in layers if index not in rows]
    repeats = {index: [r for r in range(settings.repeats) if runs is None or (index, r) in runs] for index in todo}
    sweep.steps_total = sum(map(len, repeats.values())) * settings.steps
    sweep.pace = Pace("training", sweep.steps_total, "steps", "recovery")
    if rows:
        yield Message(f"resuming: layers {', '.join(map(str, rows))} already finished, skipped")
    ablation_map = ablation
    if ablation_map is not None and model_name and ablation_map.model not in ("", model_name):
        yield Message(f"the session's ablation map is for {ablation_map.model}, not {model_name}; "
                      "no Spearman", "warning")
        ablation_map = None
    if ablation_map is not None and (differs := comparable(ablation_map.protocol or None, sweep.evaluator.protocol)):
        yield Message(f"the session's ablation map and this run: {differs}; the Spearman compares rankings only",
                      "warning")
    yield sweep.pace.at(0)

    def trained() -> Iterator[Event]:
        for index in todo:
            prefix: dict[int, torch.Tensor] = {}
            made = []
            for repeat in repeats[index]:
                run = yield from sweep.recover(index, repeat, prefix)
                made.append(run)
            rows[index] = layer_row(index, made, settings.steps)
            yield RecoveryLayer(index, rows[index])

    def document(partial: bool) -> RecoveryResult:
        return RecoveryResult(
            model=model_name,
            baseline_ppl=sweep.baseline,
            eval_tokens=sweep.evaluator.n_tokens,
            eval_texts=sweep.evaluator.n_texts,
            train_source=sweep.train_source,
            train_blocks=len(sweep.blocks),
            settings=settings,
            **over_layers([rows[index] for index in layers if index in rows], settings, ablation_map),
            resumed_layers=[index for index in layers if index not in todo],
            seconds=time.perf_counter() - started,
            protocol=sweep.evaluator.protocol,
            **({"partial": True} if partial else {}),
        )

    # stopped: the layers finished so far (a curve cut short is not a row), marked partial
    yield from kept_on_stop(trained(), lambda: Result("recovery", json_safe(document(True))) if rows else None)
    yield Result("recovery", json_safe(document(False)))


def over_layers(ordered: list[RecoveryRow], settings: RecoverySettings, ablation_map: AblationMap | None
                ) -> dict[str, Any]:
    """The fields of the result (`RecoveryResult`) that compare layers: ranking, Spearman, budget,
    mean step time."""
    vs_ablation = versus_ablation(ordered, ablation_map)
    runs = [run for row in ordered for run in row.repeats]
    run_seconds = [run.seconds_per_step for run in runs if run.seconds_per_step]
    return {
        "layers": ordered,
        "ranking": ranking(ordered),
        "spearman_vs_ablation": vs_ablation.difficulty if vs_ablation else None,
        "versus_ablation": vs_ablation,
        "budget": training_budget(ordered, settings.steps),
        "seconds_per_step": float(np.mean(run_seconds)) if run_seconds else None,
    }


# --- the registry's entry: checkpoints after every layer, --resume ---------------------------------
def checkpointed(events: Iterator[Event], path: Path, state: dict[str, Any]) -> Iterator[Event]:
    """Passes events through; each finished layer is added to the checkpoint at once."""
    write_checkpoint(path, state)
    for event in events:
        if isinstance(event, RecoveryLayer):
            state["layers"][str(event.layer)] = event.result
            write_checkpoint(path, state)
        yield event


def save_layer_weights(folder: Path, index: int, tensors: dict[str, torch.Tensor], model: str) -> Path:
    """One recovered layer as safetensors (written atomically), tagged with the model's name."""
    from safetensors.torch import save_file

    from engine.disk.atomic import atomic_write

    if Path(folder).is_symlink():  # a session folder from elsewhere must not lead writes outside it
        raise UserError(f"{folder} is a symbolic link; recovered layers are not written through it")
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / f"layer-{index}.safetensors"
    contiguous = {name: tensor.contiguous() for name, tensor in tensors.items()}
    atomic_write(path, lambda tmp: save_file(contiguous, str(tmp), metadata={"model": model}))
    return path


def weights_keeper(folder: Path, model_name: str) -> KeepWeights:
    """Saves each recovered layer under the checkpoint folder (the console's prompt pane reads them)."""

    def keep(index: int, tensors: dict[str, torch.Tensor]) -> None:
        save_layer_weights(Path(folder) / LAYER_WEIGHTS, index, tensors, model_name)

    return keep


def run(settings: RecoverySettings, context: RunContext) -> Iterator[Event]:
    """The sweep on the context's model; with a checkpoint folder every finished layer is kept
    there, and `context.resume` skips the layers an earlier sweep with the same key finished."""
    loaded = context.model
    settings.resolve_layers(loaded.n_layers)  # layer range errors before anything runs
    folder = context.checkpoint_dir
    state, note = resumed(settings, loaded, folder, context.resume)
    yield from note
    keep = weights_keeper(folder, loaded.name) if folder is not None else None
    events = run_recovery(
        loaded.model, loaded.tokenizer, settings, context.cancel, loaded.name,
        done_layers=list(state["layers"].values()), ablation=context.input(AblationMap), keep_weights=keep,
    )  # fmt: skip
    yield from events if folder is None else checkpointed(events, Path(folder) / CHECKPOINT_FILE, state)






# --- the registry's split over workers (`--shards`): by (layer, repeat) run -------------------------


def shard_plan(settings: RecoverySettings, n_layers: int, inputs: Mapping[str, dict[str, Any]], model_name: str
               ) -> ShardPlan:
    """Every (layer, repeat) run is a unit; a share's layers reach it through its settings; the
    merge makes the comparisons across layers again over all (the Spearman with the session's
    ablation map); `sharded_sweep` runs the split."""
    runs = [(layer, repeat) for layer in settings.resolve_layers(n_layers) for repeat in range(settings.repeats)]
    merge = functools.partial(merge_shards, settings=settings, ablation=inputs.get(AblationMap.name))

    def layers_of(share: list[tuple[int, int]]) -> RecoverySettings:
        return replace(settings, layers=tuple(dict.fromkeys(layer for layer, _ in share)))

    return ShardPlan(runs, layers_of, merge, sweep=functools.partial(sharded_sweep, settings))


def sharded_sweep(settings: RecoverySettings, split: ShardPlan, context: RunContext, workers: Workers
                  ) -> Iterator[Event]:
    """Rank 0 reads the checkpoint (with --resume) and hands every worker the finished layers, whose
    runs are dealt last so the work left is shared evenly; only the missing layers are trained
    again. Each share is some (layer, repeat) runs; rank 0 checkpoints a layer once all of its
    runs are in. A worker that sees the session folder saves the layers it recovered there."""
    loaded = context.model
    folder = Path(context.checkpoint_dir) if context.checkpoint_dir is not None else None
    state, note = resumed(settings, loaded, folder if workers.world.is_main else None, context.resume)
    shared = workers.broadcast([state["layers"], str(folder) if folder is not None else None])
    done = list(shared[0].values())
    finished = {int(layer) for layer in shared[0]}
    items = [run for run in split.items if run[0] not in finished] + [run for run in split.items if run[0] in finished]
    where = Path(shared[1]) if shared[1] else None
    # the session is on this worker's disk: keep its layers there
    keep = weights_keeper(where, loaded.name) if where is not None and where.parent.is_dir() else None
    ablation = context.input(AblationMap)

    def run_share(share: list[tuple[int, int]]) -> Iterator[Event]:
        return run_recovery(
            loaded.model, loaded.tokenizer, split.restrict(share), context.cancel, loaded.name, done_layers=done,
            ablation=ablation, keep_weights=keep, runs=set(share),
        )  # fmt: skip

    events = whole_layers(workers.sweep(run_share, items, split.merge), settings)
    if workers.world.is_main and folder is not None:
        events = checkpointed(events, folder / CHECKPOINT_FILE, state)
    yield from note
    yield from events


def whole_layers(events: Iterable[Event], settings: RecoverySettings) -> Iterator[Event]:
    """A split sweep's events with every layer's RecoveryLayer whole: the rows of workers that ran
    some of a layer's repeats are held back and sent on as one row (repeats in order, the row a
    serial sweep makes) once the last of them arrives; whole rows pass at once."""
    parts: dict[int, dict[int, RecoveryRepeat]] = {}
    for event in events:
        if isinstance(event, RecoveryLayer) and len(event.result.repeats) < settings.repeats:
            got = parts.setdefault(event.layer, {})
            got.update({run.repeat: run for run in event.result.repeats})
            if len(got) < settings.repeats:
                continue
            event = RecoveryLayer(event.layer, layer_row(event.layer, [got[r] for r in sorted(got)], settings.steps))
        yield event


def merge_shards(docs: list[dict[str, Any]], settings: RecoverySettings, ablation: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """One result from the results of a split sweep (each over some (layer, repeat) runs): rows in
    the order the layers were asked for, and every comparison across layers made again over all;
    `ablation` is the session's ablation map as JSON (as the plan hands it over), read here."""
    shares = [RecoveryResult.from_json(doc) for doc in docs]
    parts = (RecoveryLayer(row.layer, row) for share in shares for row in share.layers)
    rows = {event.layer: event.result for event in whole_layers(parts, settings)}  # type: ignore[attr-defined]
    order = sorted(rows) if settings.layers is None else list(dict.fromkeys(settings.layers))
    resumed = {index for share in shares for index in share.resumed_layers}
    ablation_map = decode_or_none(AblationMap, ablation)
    return json_safe(replace(
        shares[0],
        settings=settings,
        **over_layers([rows[index] for index in order], settings, ablation_map),
        resumed_layers=[index for index in order if index in resumed],
        seconds=max(share.seconds for share in shares),
    ))
