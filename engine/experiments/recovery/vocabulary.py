"""Recovery's words: RecoverySettings (sigma, steps, lr, layers, repeats) with what a run trains and
keeps, the `recovery.*` curve events, and results/recovery.json (RecoveryResult). Torch-free."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.codec import ABSENT, from_doc
from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, event, renamed_v1, result
from engine.core.settings import MAX_SEED, check_layers, setting
from engine.data.eval_data import EvalProtocol
from engine.data.text_settings import EvalTextSettings, TrainTextSettings
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.models.memory import ModelShape, Training

PAPER_LAYERS = (11, 14, 17)
PAPER_STEPS = 200


THRESHOLDS = (2.0, 1.5, 1.1)


DIFFICULTY_THRESHOLD = 1.1  # difficulty = steps to get below 1.1x the baseline


@dataclass(frozen=True)
class RecoverySettings(TrainTextSettings, EvalTextSettings):
    """Defaults follow the paper (A5): sigma 0.5, AdamW lr 1e-4, layers 11, 14, 17, and on a GPU 200
    steps; `steps` auto is sized for the device (engine/models/placement.py training_budget_seconds)."""

    layers: tuple[int, ...] | None = setting(PAPER_LAYERS, "layers to noise and recover, in this order",
                                             low=0, none_word="all", resume_free=True)
    sigma: float = setting(0.5, "noise = sigma * std(W) per matrix", above=0)
    steps: int | None = setting(
        None, f"fine-tuning steps per layer (auto: the paper's {PAPER_STEPS} on a GPU; on the CPU as many as fit about "
        "2.5 minutes a layer at the step time estimated from the first evaluation pass)", low=1, none_word="auto")
    lr: float = setting(1e-4, "AdamW learning rate", above=0)
    eval_every: int | None = setting(
        None, "evaluate every N steps (auto: every step, or every few when one evaluation costs more than a "
        "training step, as measured); the last step is always evaluated", low=1, none_word="auto")
    eval_texts: int | None = setting(
        None, "evaluation texts (or windows) at the steps between the first and the last: whole evaluation "
        "batches spread over them (a fixed subset); the baseline, step 0 and the last step use them all "
        "(auto: as many as cost a quarter of a training step's tokens, at least 8)", low=1, none_word="auto")
    repeats: int = setting(1, "noise seeds per layer", low=1, high=1000,
                           why="each repeat is a whole fine-tuning run of --steps for every layer")
    seed: int = setting(0, "seed for noise and batch order", low=0, high=MAX_SEED)
    prefix_cache: bool = setting(True, "start at the noised layer from cached inputs (off only to measure "
                                 "the straightforward version)", cli=False, resume_free=True)

    @property
    def settled_steps(self) -> int:
        """The steps each layer trains, once `--steps auto` is settled (by the sweep, before any
        training, for its device: engine/experiments/recovery/sweep.py `Sweep.sized`)."""
        if self.steps is None:
            raise ValueError("--steps auto is settled by the sweep before it trains")
        return self.steps

    def check(self) -> None:
        if self.layers is not None and not self.layers:
            raise UserError("--layers needs at least one layer number, or 'all'")

    def resolve_layers(self, n_layers: int) -> tuple[int, ...]:
        """The layers to sweep, in the order given, each checked against the model's depth."""
        if self.layers is None:
            return tuple(range(n_layers))
        check_layers(self.layers, n_layers, "--layers")
        return tuple(dict.fromkeys(self.layers))

    def check_against(self, shape: ModelShape) -> None:
        self.resolve_layers(shape.n_layers)

    def edits_weights(self) -> bool:
        return True  # noises a layer and trains it

    def training_needs(self, shape: ModelShape) -> Training:
        """The memory plan's need: one layer's matrices trained at once, the graph over every layer."""
        return Training(shape.layer_matrices, self.batch_size, self.block_size, shape.n_layers)

    def checkpoint_params(self, shape: ModelShape) -> int:
        """The disk check's need: every recovered layer's matrices are kept (the prompt pane and
        `export --model recovered` read them)."""
        layers = shape.n_layers if self.layers is None else min(len(set(self.layers)), shape.n_layers)
        return layers * shape.layer_matrices  # a layer out of range is refused by the checks before the load


BASELINE_FILE = "baseline.json"  # in recovery's checkpoint folder: the baseline a later run reuses


@dataclass(frozen=True)
class KnownBaseline:
    """checkpoints/recovery/baseline.json: a baseline perplexity measured already (by a recovery run,
    or the console's layer map) and the fingerprint of what it was measured on; a run whose own
    fingerprint is the same skips its baseline pass. Read as untrusted: checked field by field."""

    fingerprint: str
    baseline_ppl: float
    measured_by: str  # "recovery", "the console's layer map"

    @classmethod
    def from_json(cls, doc: Any) -> KnownBaseline:
        known: KnownBaseline = from_doc(cls, doc)
        if not (math.isfinite(known.baseline_ppl) and known.baseline_ppl >= 1.0):
            raise ValueError(f"baseline_ppl {known.baseline_ppl} is no perplexity")
        return known


def baseline_fingerprint(model: str, dtype: str, device: str, protocol: EvalProtocol | Mapping[str, Any]) -> str:
    """What a baseline perplexity depends on, hashed: the model, its precision, the kind of device,
    and the evaluation protocol (the texts or windows, their count, context and scored tokens)."""
    shown = protocol if isinstance(protocol, Mapping) else dataclasses.asdict(protocol)
    text = json.dumps([model, dtype, device.split(":")[0], dict(shown)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@event("recovery.baseline")
class RecoveryBaseline(Event):
    """The model's perplexity before any noise, on every evaluation text: the curves' reference,
    sent as soon as it is measured; and the schedule of the evaluations between (`eval_texts` of
    the texts at intermediate steps; `eval_every` 0 while it is still to be measured)."""

    baseline_ppl: float
    texts: int
    eval_texts: int
    eval_every: int


@event("recovery.start")
class RecoveryStart(Event):
    """Noise is in: the perplexity the layer starts recovering from."""

    layer: int
    repeat: int
    ppl_after_noise: float
    baseline_ppl: float
    steps: int


@event("recovery.point")
class RecoveryPoint(Event):
    """One evaluated step of one layer's curve (step 0 is right after the noise, no training), on
    `texts` evaluation texts: all of them at step 0 and the last step; between, --eval-texts of
    them, whose ratio is to their own baseline and `eval_ppl` that ratio times the full baseline
    (0: a log from before the subset)."""

    layer: int
    repeat: int
    step: int
    train_loss: float | None
    eval_ppl: float
    ratio_to_baseline: float
    texts: int = 0


@event("recovery.layer", v1_fields={"index": "layer"})
class RecoveryLayer(Event):
    """A layer is finished (every repeat): its row of the result, ready to save for --resume."""

    layer: int
    result: RecoveryRow

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        doc = renamed_v1(doc, cls.v1_fields)
        doc["result"] = renamed_v1(doc.get("result"))
        return doc


@dataclass(frozen=True)
class RecoveryRepeat:
    """One noise seed on one layer: its curve [[step, ppl]...] and what the curve says."""

    status: str  # done or diverged
    ppl_after_noise: float | None
    ratio_after_noise: float | None
    steps_to: dict[str, int | None]  # threshold (x baseline) -> first step below it
    best_ppl: float | None
    best_step: int
    final_ppl: float | None
    final_ratio: float | None
    improved_over_baseline: bool
    curve: list[list[float | None]]
    repeat: int
    noise_seed: int
    diverged_at: int | None
    steps_run: int
    seconds: float
    seconds_per_step: float | None
    train_loss: list[list[float]]
    eval_every: int = field(default=ABSENT, kw_only=True)  # as used (auto: measured); absent in older results
    eval_texts: int = field(default=ABSENT, kw_only=True)  # texts at intermediate steps; absent in older results


@dataclass(frozen=True)
class RecoveryRow:
    """One layer of results/recovery.json: its first repeat's numbers at the top level, the spread
    over every repeat beside them, and every repeat under `repeats`."""

    layer: int
    status: str
    ppl_after_noise: float | None
    ratio_after_noise: float | None
    steps_to: dict[str, int | None]
    best_ppl: float | None
    best_step: int
    final_ppl: float | None
    final_ratio: float | None
    improved_over_baseline: bool
    curve: list[list[float | None]]
    diverged_at: int | None
    steps_run: int
    seconds: float
    seconds_per_step: float | None
    train_loss: list[list[float]]
    difficulty: float  # steps to get below 1.1x the baseline (never: the budget), mean over repeats
    mean_final_ratio: float | None
    steps_to_mean: dict[str, float | None]
    steps_to_sd: dict[str, float | None]
    steps_to_reached: dict[str, int]
    repeats: list[RecoveryRepeat]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RecoveryRow:
        return from_doc(cls, renamed_v1(dict(doc)))


@dataclass(frozen=True)
class LayerBudget:
    """One layer of results/recovery.json `budget.per_layer`: its steps under each rule."""

    layer: int
    difficulty: float
    uniform_steps: int
    proposed_steps: int  # the steps it needed to get below 1.1x the baseline (never: the budget)
    reallocated_steps: int  # the uniform total split in proportion to difficulty


@dataclass(frozen=True)
class RecoveryBudget:
    """results/recovery.json `budget`: the paper's Table 10 idea, a uniform budget against steps
    sized by measured difficulty."""

    rule: str
    uniform_total: int
    proposed_total: int
    saving_steps: int
    saving_pct: float
    per_layer: list[LayerBudget]


@dataclass(frozen=True)
class RecoveryVsAblation:
    """results/recovery.json `versus_ablation`: Spearman of each recovery measure against the
    session's ablation map's D%, over the `layers` both have."""

    layers: int
    ablation_method: str
    difficulty: float | None
    final_ratio: float | None
    ratio_after_noise: float | None


@result("recovery")
class RecoveryResult(ResultDocument):
    """results/recovery.json. `partial` (true) marks the result of a sweep stopped before its last
    layer: `layers` holds the layers it finished, each as a full sweep has it, and `--resume` goes on
    from them (absent from a finished sweep's)."""

    model: str
    baseline_ppl: float
    eval_tokens: int
    eval_texts: int
    train_source: str
    train_blocks: int
    settings: RecoverySettings  # as the run resolved them
    layers: list[RecoveryRow]  # in the order the layers were asked for
    ranking: list[int]  # hardest first
    spearman_vs_ablation: float | None  # versus_ablation's difficulty
    versus_ablation: RecoveryVsAblation | None  # None without the session's map of this model
    budget: RecoveryBudget
    seconds_per_step: float | None
    resumed_layers: list[int]
    seconds: float
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4
    partial: bool = field(default=ABSENT, kw_only=True)  # true: a stopped sweep's finished layers; absent: all

    def partial_text(self) -> str:
        """`partial: 2 of 3 layers` for a stopped sweep's result (`partial: 2 layers` when it asked
        for every layer); empty for a finished one."""
        if self.partial is not True:
            return ""
        asked = f" of {len(dict.fromkeys(self.settings.layers))}" if self.settings.layers is not None else ""
        return f"partial: {len(self.layers)}{asked} layers"

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per evaluated step of every layer's curve, each repeat's (a row without `repeats`:
        its one curve, repeat 0), with the training loss of that step where one was logged."""
        rows = []
        for row in self.layers:
            runs: list[RecoveryRepeat] | list[RecoveryRow] = row.repeats or [row]
            for run in runs:
                losses = {int(step): loss for step, loss in run.train_loss}
                rows += [{"layer": row.layer, "repeat": getattr(run, "repeat", 0), "step": int(step or 0),
                          "ppl": ppl, "ratio_to_baseline": None if ppl is None else ppl / self.baseline_ppl,
                          "train_loss": losses.get(int(step or 0))}
                         for step, ppl in run.curve]  # a curve's step is never null, its ppl may be
        return rows

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("layers"), list):
            doc["layers"] = [renamed_v1(row) for row in doc["layers"]]
        if isinstance(doc.get("budget"), dict):
            budget = dict(doc["budget"])
            budget["per_layer"] = [renamed_v1(row) for row in budget.get("per_layer", [])]
            doc["budget"] = budget
        return doc


def sample() -> RecoveryResult:
    """A sweep over layers 1 and 3 with one known curve: the tests' and snapshots' example."""
    baseline, points = 20.0, [(0, 80.0), (5, 50.0), (10, 35.0), (20, 25.0), (40, 21.5)]

    def row(layer: int, difficulty: float) -> RecoveryRow:
        return RecoveryRow(
            layer=layer, status="done", ppl_after_noise=points[0][1], ratio_after_noise=points[0][1] / baseline,
            steps_to={"2.0": 10, "1.5": 20, "1.1": None}, best_ppl=points[-1][1], best_step=points[-1][0],
            final_ppl=points[-1][1], final_ratio=points[-1][1] / baseline, improved_over_baseline=False,
            curve=[[float(step), ppl] for step, ppl in points], diverged_at=None, steps_run=40, seconds=2.0,
            seconds_per_step=0.05, train_loss=[[1, 3.0]], difficulty=difficulty,
            mean_final_ratio=points[-1][1] / baseline, steps_to_mean={"2.0": 10.0}, steps_to_sd={"2.0": None},
            steps_to_reached={"2.0": 1}, repeats=[],
        )  # fmt: skip

    rows = [row(1, 40.0), row(3, 10.0)]
    budget = RecoveryBudget(
        rule="proposed: steps to get below 1.1x baseline", uniform_total=80, proposed_total=50, saving_steps=30,
        saving_pct=37.5, per_layer=[LayerBudget(layer=row.layer, difficulty=row.difficulty, uniform_steps=40,
                                                proposed_steps=int(row.difficulty), reallocated_steps=40)
                                    for row in rows],
    )  # fmt: skip
    versus = RecoveryVsAblation(layers=2, ablation_method="mean", difficulty=1.0, final_ratio=None,
                                ratio_after_noise=-1.0)
    return RecoveryResult(
        model="tiny", baseline_ppl=baseline, eval_tokens=100, eval_texts=4, train_source="built-in", train_blocks=16,
        settings=RecoverySettings(steps=40), layers=rows, ranking=[1, 3], spearman_vs_ablation=1.0,
        versus_ablation=versus, budget=budget, seconds_per_step=0.05, resumed_layers=[], seconds=4.0,
    )  # fmt: skip


CONTRACT = Contract(
    RecoverySettings, RecoveryResult, sample,
    frame=Frame(columns=("layer", "repeat", "step", "ppl", "ratio_to_baseline", "train_loss"), rows=2 * 5),
    figure=FigureShape(panels=(("fine-tuning step", "PPL / baseline"), ("layer", "steps to 1.1×"))),
)
