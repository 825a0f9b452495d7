"""Pruning's words: PruneSettings (criteria, counts, healing, export, accuracy) with what healing
trains, the `prune.*` events, and results/prune.json (curves, depth law). Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.core.codec import ABSENT
from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, event, result, table_row
from engine.core.settings import MAX_SEED, setting
from engine.data.eval_data import EvalProtocol
from engine.data.text_settings import EvalTextSettings, TrainTextSettings
from engine.evaluation.accuracy import GenerationCheck, LmEvalProtocol, LmEvalSettings, TaskScore
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.export.folder import check_export_folder
from engine.models.memory import ModelShape, Training

METHODS = ("angular", "angular_last", "bi", "ppl", "map", "last")
BLOCK_METHODS = ("angular", "angular_last")  # criteria whose cut is one run of consecutive layers
HEALS = ("adjacent", "lora", "last")
REPLACEMENTS = ("linear", "linear-cosine")  # engine/experiments/prune/replace.py (ReplaceMe)
UNITS = ("layer", "block")  # what the criteria rank and remove: whole layers, or attention and MLP blocks apart
HEAD_AND_LAST = 3  # --heal last: the LM head and this many last kept layers (Reassessing Layer Pruning)


def check_run(n_layers: int, count: int, how: str = "linear") -> None:
    """A replaced run of `count` layers needs a layer before it (the map folds into its MLP output)
    and must not reach the last layer."""
    if count > n_layers - 2:
        raise UserError(f"--replace {how}: a run of {count} layers in a model of {n_layers} needs a layer before "
                        f"it and must not reach the last layer; remove at most {max(n_layers - 2, 0)}")


def replaced_label(method: str, how: str) -> str:
    """The curve's name for a criterion's block replaced by a linear map: `angular+linear`."""
    return f"{method}+{how}"


@dataclass(frozen=True)
class PruneSettings(TrainTextSettings, EvalTextSettings, LmEvalSettings):
    """Defaults: every criterion, 1, 2, 4 and 8 layers removed, no healing, no export."""

    method: str = setting("all", "criterion: angular (all tokens), angular_last (the last token, Gromov et al.), bi, "
                          "ppl, map, last (the last layers before the final norm: the baseline), or all of them",
                          choices=METHODS + ("all",))
    remove: tuple[int, ...] = setting((1, 2, 4, 8), "numbers of layers to remove", low=1)
    max_fraction: float | None = setting(None, "instead of --remove: every count up to this fraction of the layers",
                                         above=0.0, high=1.0, none_word="off")
    bootstrap: int = setting(1000, "bootstrap resamples of the evaluation texts for intervals (0: none)", low=0)
    seed: int = setting(0, "seed of the bootstrap and of the healing batches", low=0, high=MAX_SEED)
    heal_steps: int = setting(0, "fine-tuning steps after each cut (0: no healing)", low=0)
    heal: str = setting("adjacent", "what healing trains: the layers next to each cut, LoRA on every layer, or "
                        "the LM head and the last three kept layers (last)", choices=HEALS)
    replace: tuple[str, ...] = setting((), "replace each block criterion's cut (angular, angular_last) by a linear "
                                           "map folded into the MLP output of the layer before it (ReplaceMe): "
                                           "linear (least squares), linear-cosine; extra rows of the curve",
                                       choices=REPLACEMENTS)
    lora_rank: int = setting(8, "rank of the LoRA adapters (--heal lora)", low=1)
    lr: float = setting(1e-4, "AdamW learning rate of healing", above=0.0)
    export: str | None = setting(None, "save the pruned (and healed) model here as a Hugging Face folder")
    export_count: int | None = setting(None, "how many layers the exported model lacks (default: the largest count)",
                                       low=1, none_word="largest")
    export_method: str | None = setting(None, "the curve whose cut is exported: a criterion, or a replaced one "
                                              "(angular+linear); default: the lowest perplexity at the count",
                                        none_word="best")
    force: bool = setting(False, "export into a folder that is not empty")
    evaluate_tasks: tuple[str, ...] = setting((), "lm-eval tasks to score each cut on, beside its perplexity "
                                                  "(e.g. piqa,arc_easy; none: no accuracy)")
    evaluate_batch_size: int = setting(1, "lm-eval batch size of --evaluate-tasks (recorded)", low=1)
    export_adapter: bool = setting(False, "with --heal lora: export only the LoRA adapter (PEFT format), "
                                          "not the merged weights")
    unit: str = setting("layer", "what each criterion ranks and removes: whole layers, or attention and MLP "
                        "blocks apart (block: each count of --remove is that many layers' worth of parameters, "
                        "blocks cut until their parameters reach it)", choices=UNITS)

    def check(self) -> None:
        if not self.remove and self.max_fraction is None:
            raise UserError("--remove needs at least one count, e.g. 1,2,4,8, or give --max-fraction")
        if self.export_count is not None and self.export is None:
            raise UserError("--export-count needs --export DIR")
        if self.export_method is not None:
            labels = self.labels()
            if self.export is None:
                raise UserError("--export-method needs --export DIR")
            if self.export_method not in labels:
                raise UserError(f"--export-method {self.export_method}: not a curve of this run; "
                                f"one of {', '.join(labels)}")
        if self.export_adapter and (self.export is None or self.heal != "lora" or not self.heal_steps):
            raise UserError("--export-adapter needs --export DIR, --heal lora and --heal-steps N")
        if self.unit == "block" and (self.replace or self.export_adapter):
            raise UserError(f"{'--replace' if self.replace else '--export-adapter'} works on whole layers; "
                            "drop it or use --unit layer")
        if self.replace and not set(self.methods()) & set(BLOCK_METHODS):
            raise UserError(f"--replace {','.join(self.replace)} replaces a run of consecutive layers: it needs a "
                            f"block criterion ({', '.join(BLOCK_METHODS)}), not --method {self.method}")

    def counts(self, n_layers: int) -> tuple[int, ...]:
        """The counts of the curve for a model of this depth, checked."""
        if self.max_fraction is not None:
            top = int(math.floor(self.max_fraction * n_layers + 1e-9))
            if top < 1:
                raise UserError(f"--max-fraction {self.max_fraction:g} of {n_layers} layers removes none; raise it")
            wanted = tuple(range(1, top + 1))
        else:
            wanted = tuple(sorted(set(self.remove)))
        if wanted[-1] >= n_layers:
            raise UserError(f"cannot remove {wanted[-1]} layers: this model has {n_layers}; "
                            f"remove at most {n_layers - 1}")
        if self.export is not None and self.export_count is not None and self.export_count not in wanted:
            raise UserError(f"--export-count {self.export_count} is not a count of the curve "
                            f"({','.join(map(str, wanted))})")
        return wanted

    def methods(self) -> tuple[str, ...]:
        return METHODS if self.method == "all" else (self.method,)

    def labels(self) -> tuple[str, ...]:
        """The curves' names: each criterion, then each block criterion replaced (`angular+linear`)."""
        methods = self.methods()
        return methods + tuple(replaced_label(m, how) for m in methods if m in BLOCK_METHODS for how in self.replace)

    def check_against(self, shape: ModelShape) -> None:
        """The counts against the model's depth, and the export folder: new or empty (or --force)."""
        counts = self.counts(shape.n_layers)
        if self.unit == "block" and shape.family:
            from engine.models.families import check_parts

            check_parts(shape.family, "--unit")
            if shape.family == "opt" and self.heal == "lora" and self.heal_steps:
                raise UserError("--unit block --heal lora: OPT's MLP has no module of its own, so LoRA would wrap "
                                "a removed block's fc2; use --heal adjacent or last")
        if self.replace:
            check_run(shape.n_layers, counts[-1], self.replace[0])
        if self.export is not None:
            check_export_folder(self.export, self.force)

    def edits_weights(self) -> bool:
        return self.heal_steps > 0  # healing trains the kept layers; removal alone only skips layers

    def training_needs(self, shape: ModelShape) -> Training | None:
        """The memory plan's need: what healing trains at once, at most. Nothing at 0 steps;
        adjacent healing, every kept layer next to a cut (up to two per removed layer, as
        `neighbours_of_cuts` finds them); LoRA, the adapters of every kept layer; the graph spans the
        kept layers."""
        if not self.heal_steps:
            return None
        counts = self.counts(shape.n_layers)
        kept = shape.n_layers - min(counts)
        if self.heal == "lora":
            params = kept * self.lora_rank * shape.layer_matrix_sides
        elif self.heal == "last":
            params = min(HEAD_AND_LAST, kept) * shape.layer_params + shape.vocab * shape.hidden
        elif self.unit == "block":  # the blocks cut may sit in as many layers, each with its neighbours
            params = shape.n_layers * shape.layer_params
        else:
            params = max(min(2 * count, shape.n_layers - count) for count in counts) * shape.layer_params
        return Training(params, self.batch_size, self.block_size, kept)


@event("prune.scores")
class PruneScores(Event):
    """One criterion's per-layer score (low = cheapest to remove), once it is known."""

    method: str
    scores: list[float | None]


@event("prune.point")
class PrunePoint(Event):
    """One point of a criterion's curve: `removed` layers (`layers`, original indices from 0) cut;
    `healed_ppl` is None without --heal-steps."""

    method: str
    removed: int
    layers: list[int]
    ppl: float
    baseline_ppl: float
    ci_low: float | None = None
    ci_high: float | None = None
    healed_ppl: float | None = None


@event("prune.exported")
class PruneExported(Event):
    """The pruned (and healed) model was saved as a Hugging Face folder."""

    folder: str
    method: str
    layers: list[int]
    ppl: float


@dataclass(frozen=True)
class PrunedBlock:
    """One attention or MLP block of a block cut (--unit block): its layer (from 0) and `part`."""

    layer: int
    part: str  # "attention" or "mlp"


@dataclass(frozen=True)
class PruneCut:
    """One point of results/prune.json's `curve` (and its `exported_point`): the `removed` layers
    `layers` (original indices from 0) that `method` cuts, the perplexity without them with its
    bootstrap interval, and after healing (None without --heal-steps). `removed_params`: the
    parameters the cut leaves unused (the curve's comparable x-axis). With --unit block, `removed`
    is the layers' worth of parameters asked for, `blocks` every block cut and `layers` the layers
    that lost both (removed whole). With --evaluate-tasks:
    lm-eval's scores of the cut (and of the healed cut), the generation check against the full
    model, and where accuracy and perplexity disagree, how (`disagreement`, else None)."""

    method: str
    removed: int
    layers: list[int]
    ppl: float | None  # None: the saved inf or nan
    ci_low: float | None
    ci_high: float | None
    healed_ppl: float | None
    accuracy: list[TaskScore] = field(default=ABSENT, kw_only=True)
    healed_accuracy: list[TaskScore] | None = field(default=ABSENT, kw_only=True)
    generation: GenerationCheck | None = field(default=ABSENT, kw_only=True)
    disagreement: str | None = field(default=ABSENT, kw_only=True)
    removed_params: int = field(default=ABSENT, kw_only=True)  # absent from older results
    blocks: list[PrunedBlock] = field(default=ABSENT, kw_only=True)  # --unit block


@dataclass(frozen=True)
class ChinchillaPrior:
    """The depth exponent fitted to the reconstructed Chinchilla runs, printed beside a prune run's own."""

    a_l: float
    sd: float
    source: str


CHINCHILLA_A_L = ChinchillaPrior(a_l=1.2, sd=0.3, source="Paper B, fit to reconstructed Chinchilla runs")


@dataclass(frozen=True)
class DepthLaw:
    """results/prune.json `depth_fit` (exploratory): the ppl criterion's loss (ln PPL) against the
    remaining depth l, fitted to c / l^a + L0, with a's bootstrap interval."""

    a: float | None
    c: float | None
    L0: float | None
    ci95: list[float] | None
    points: int
    depths: list[float]
    label: str
    chinchilla: ChinchillaPrior


@dataclass(frozen=True)
class PruneHeal:
    """results/prune.json `heal`: how every cut was healed."""

    steps: int
    what: str  # adjacent or lora
    train_source: str
    train_blocks: int


@result("prune")
class PruneResult(ResultDocument):
    """results/prune.json."""

    model: str
    baseline_ppl: float
    eval_tokens: int
    eval_texts: int
    n_layers: int
    settings: PruneSettings  # as the run resolved them
    methods: list[str]
    curve: list[PruneCut]
    agreement: dict[str, float | None]  # Spearman of each criterion's scores with the ppl criterion's
    agreement_note: str
    scores: dict[str, list[float | None]]  # criterion -> per-layer score
    depth_fit: DepthLaw | None
    heal: PruneHeal | None
    exported: str | None  # the folder of the exported model
    exported_point: PruneCut | None
    seconds: float

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per point of each criterion's curve: the layers it cuts, the perplexity without them
        with its interval, and after healing (None without --heal-steps)."""
        return [table_row(cut, "method", "removed", "layers", "ppl", "ci_low", "ci_high", "healed_ppl")
                for cut in self.curve]
    evaluation: LmEvalProtocol = field(default=ABSENT, kw_only=True)  # with --evaluate-tasks
    baseline_accuracy: list[TaskScore] = field(default=ABSENT, kw_only=True)  # the full model's
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4


def sample() -> PruneResult:
    """Perplexity with 1..4 layers removed by three criteria, with the depth law fitted: the tests'
    and snapshots' example."""
    baseline, growth = 20.0, {"angular": 1.3, "bi": 1.5, "ppl": 1.2}
    curve = [PruneCut(method=method, removed=k, layers=list(range(k)), ppl=baseline * factor**k, ci_low=None,
                      ci_high=None, healed_ppl=None)
             for method, factor in growth.items() for k in range(1, 5)]  # fmt: skip
    fit = DepthLaw(a=1.1, c=2.0, L0=1.0, ci95=[0.7, 1.6], points=5, depths=[6.0, 5.0, 4.0, 3.0, 2.0], label="",
                   chinchilla=CHINCHILLA_A_L)  # fmt: skip
    return PruneResult(
        model="tiny", baseline_ppl=baseline, eval_tokens=100, eval_texts=4, n_layers=6, settings=PruneSettings(),
        methods=list(growth), curve=curve, agreement={"angular": 0.6, "bi": 0.8}, agreement_note="", scores={},
        depth_fit=fit, heal=None, exported=None, exported_point=None, seconds=1.0,
    )  # fmt: skip


CONTRACT = Contract(
    PruneSettings, PruneResult, sample,
    frame=Frame(columns=("method", "removed", "layers", "ppl", "ci_low", "ci_high", "healed_ppl"), rows=3 * 4),
    figure=FigureShape(panels=(("layers removed", "perplexity"),)),
)
