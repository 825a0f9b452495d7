"""The lm-eval evaluation's words: EvaluateSettings (tasks, variants, folder, adapter), the
`evaluate.model` event, and results/evaluate.json (scores and generation checks). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.events import (
    Event,
    ResultDocument,
    event,
    result,
    table_row,
)
from engine.core.settings import setting
from engine.evaluation.accuracy import GenerationCheck, LmEvalProtocol, LmEvalSettings, TaskScore
from engine.experiments.contract import Contract, FigureShape, Frame

SESSION_VARIANTS = ("original", "pruned", "healed", "recovered", "growth", "uniform")


@dataclass(frozen=True)
class EvaluateSettings(LmEvalSettings):
    """Defaults: the original model, each task's own number of shots, every item, batch size 1."""

    tasks: tuple[str, ...] = setting((), "lm-eval tasks, comma-separated: piqa,arc_easy,... "
                                          "(local ones: --include-path)")
    variants: tuple[str, ...] = setting(("original",), "models to evaluate, comma-separated", choices=SESSION_VARIANTS)
    remove: tuple[int, ...] = setting((), "pruned (and --adapter): these layers (0-based) dropped instead of the "
                                          "session's prune cut", low=0)
    folder: str | None = setting(None, "also evaluate this exported Hugging Face model folder")
    adapter: str | None = setting(None, "also evaluate the loaded model with this PEFT adapter folder")
    batch_size: int = setting(1, "lm-eval batch size (fixed, and recorded: lm-eval's scores move with it); with "
                                 "--stream the perplexity's", low=1)
    stream: bool = setting(False, "no lm-eval: the perplexity of the original or of the cut (--variants pruned "
                           "--remove LAYERS) on the built-in texts, the model read from its safetensors layer by "
                           "layer, each kept layer once (a model larger than memory)", resume_free=True)

    def check(self) -> None:
        if len(set(self.variants)) != len(self.variants):
            raise UserError("--variants: each variant once")
        if self.stream:
            self.check_streamed()
        from engine.models.sources import safetensors_only

        for flag, value in (("--folder", self.folder), ("--adapter", self.adapter)):
            if value is not None and not Path(value).is_dir():
                raise UserError(f"{flag} {value}: not a folder")
            if value is not None:  # before the model loads: no pickle is ever read
                safetensors_only(Path(value), adapter=flag == "--adapter", what=f"{flag} {value}")
        self.check_include_path()

    def check_inputs(self) -> None:
        """Before the model loads: a task to run (the defaults name none, so `run evaluate` alone
        says what it needs)."""
        super().check_inputs()
        if not self.tasks and not self.stream:
            raise UserError("--tasks: name at least one lm-eval task, e.g. --tasks piqa,arc_easy")

    def check_streamed(self) -> None:
        """--stream scores the perplexity of a model the pass reads: the original or its cut."""
        if self.tasks:
            raise UserError("lm-eval tasks do not stream (each request would be a branch of the pass): drop "
                            "--tasks for the perplexity streamed, or drop --stream to load the whole model")
        others = [f"--variants {v}" for v in self.variants if v not in ("original", "pruned")]
        others += [flag for flag, value in (("--folder", self.folder), ("--adapter", self.adapter)) if value]
        if others:
            raise UserError(f"{', '.join(others)}: not streamed (a model other than the checkpoint or its cut); "
                            "with --stream: --variants original,pruned")

    def branches(self, n_layers: int) -> int:
        """A streamed pass's states, in units of one set of hidden states of every text: the running ones."""
        return 1

    def window(self) -> int:
        """Layers a streamed pass holds while one computes."""
        return 1

    def cuts(self) -> list[tuple[int, ...]]:
        """With --stream: the layers each variant's pass leaves unread (the original none, the pruned
        one --remove; an empty --remove is the session's prune cut, known when the run starts)."""
        return [() if variant == "original" else self.remove for variant in self.variants]

    def check_against(self, shape: Any) -> None:
        """--remove against the model's depth, from its config before the load (engine/models/preflight.py)."""
        if self.remove:
            from engine.models.pruning import check_removal

            check_removal(shape.n_layers, self.remove)


@event("evaluate.model")
class ModelEvaluated(Event):
    """One model of an evaluation is scored: lm-eval's numbers per task (`scores`) and its greedy
    continuations of the fixed prompts against the original's (`generation`, None with --gen-tokens 0)."""

    variant: str
    label: str
    scores: list[TaskScore]
    generation: GenerationCheck | None


@dataclass(frozen=True)
class EvaluatedModel:
    """One row of results/evaluate.json `models`: a model variant (`original`, `pruned`, `healed`,
    `recovered`, `growth`, `uniform`, `folder`, `adapter`), named uniquely by `label`."""

    variant: str
    label: str
    description: str
    n_layers: int
    scores: list[TaskScore]
    generation: GenerationCheck | None
    seconds: float
    perplexity: float | None = None  # --stream: on the built-in texts (no lm-eval scores then)


@result("evaluate")
class EvaluateResult(ResultDocument):
    """results/evaluate.json: the loaded model and its variants side by side, original first. A run
    keeps the earlier run's rows for the variants it did not evaluate when model and protocol match."""

    model: str
    protocol: LmEvalProtocol
    prompts: list[str]
    gen_tokens: int
    models: list[EvaluatedModel]
    settings: EvaluateSettings  # as the run resolved them
    seconds: float

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per model and task: the variant, its depth and lm-eval's accuracies with their errors."""
        return [{"variant": model.variant, "label": model.label, "n_layers": model.n_layers,
                 **table_row(score, "task", "acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "samples")}
                for model in self.models for score in model.scores]


def sample_score(task: str, acc: float, acc_norm: float | None = None, samples: int = 80) -> TaskScore:
    """One lm-eval task's scores as engine/evaluation/accuracy.py reads them from simple_evaluate,
    with binomial standard errors: the sample's rows, and the tests' scores."""
    stderr = (acc * (1 - acc) / (samples - 1)) ** 0.5
    metrics = {"acc,none": acc, "acc_stderr,none": stderr}
    if acc_norm is not None:
        metrics |= {"acc_norm,none": acc_norm, "acc_norm_stderr,none": stderr}
    return TaskScore(task=task, acc=acc, acc_stderr=stderr, acc_norm=acc_norm,
                     acc_norm_stderr=None if acc_norm is None else stderr, samples=samples, metrics=metrics)


def sample() -> EvaluateResult:
    """The original and two variants on two local tasks, side by side: the tests' and snapshots' example."""
    protocol = LmEvalProtocol(tasks=["everyday_sense", "tiny_qa"], batch_size=1, limit=None, num_fewshot=None,
                              include_path="/data/tasks", lm_eval_version="0.4.13",
                              n_shot={"everyday_sense": 0, "tiny_qa": 0},
                              task_versions={"everyday_sense": "Yaml", "tiny_qa": "Yaml"})

    def row(variant: str, label: str, description: str, n_layers: int, accs: tuple[float, float],
            agreement: tuple[float, float] | None) -> EvaluatedModel:
        check = None if agreement is None else GenerationCheck(
            texts=[f"Paris, the city of light ({label})"], unit="token", prefix_agreement=agreement[0],
            token_agreement=agreement[1])
        return EvaluatedModel(variant=variant, label=label, description=description, n_layers=n_layers,
                              scores=[sample_score("everyday_sense", accs[0], accs[0] - 0.05),
                                      sample_score("tiny_qa", accs[1])],
                              generation=check, seconds=12.5)

    models = [row("original", "original", "tiny, 6 layers", 6, (0.6, 0.5), (1.0, 1.0)),
              row("pruned", "pruned -2,3", "layers 2,3 removed (the session's prune cut)", 4, (0.45, 0.5),
                  (0.25, 0.4)),
              row("folder", "folder /models/smol-minus-2", "the exported model in /models/smol-minus-2", 4,
                  (0.55, 0.5), None)]
    return EvaluateResult(model="tiny", protocol=protocol, prompts=["The capital of France is"],
                          gen_tokens=32, models=models, settings=EvaluateSettings(), seconds=40.0)


CONTRACT = Contract(
    EvaluateSettings, EvaluateResult, sample,
    frame=Frame(columns=("variant", "label", "n_layers", "task", "acc", "acc_stderr", "acc_norm", "acc_norm_stderr",
                        "samples"), rows=3 * 2),
    figure=FigureShape(panels=(("task", "accuracy"), ("", "token agreement with original"))),
)
