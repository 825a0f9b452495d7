"""The experiments anatomy-tui knows: one row per command, the one list the CLI, the console, jobs,
printers, snapshots, the documentation's event table (docs/events.md) and the tests all read.

An experiment is a folder, `engine/experiments/<name>/`: its `vocabulary` module (settings, events,
result document, its upgrade of older documents and a sample result; torch-free, imported here)
and its computation (`run(settings, context)`, and `shard_plan` where its sweep splits), named by
module and imported only when a run wants it, so the console paints and `anatomy-tui --help`
answers before torch loads. Adding one is its folder, its view (`tui/views/<name>.py`) and a row
here; `register` adds a row at run time (a test's throwaway experiment).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.events import Event, Progress, ResultDocument, event_types, forget_types
from engine.core.settings import Settings
from engine.disk.atomic import atomic_write_bytes
from engine.experiments.ablation import vocabulary as ablation
from engine.experiments.context import RunContext
from engine.experiments.dynamics import vocabulary as dynamics
from engine.experiments.evaluate import vocabulary as evaluate
from engine.experiments.growth import vocabulary as growth
from engine.experiments.manipulate import vocabulary as manipulate
from engine.experiments.prune import vocabulary as prune
from engine.experiments.recovery import vocabulary as recovery
from engine.experiments.scaling_fit import vocabulary as scaling_fit
from engine.experiments.toy_depth import vocabulary as toy_depth
from engine.experiments.weights import vocabulary as weights

if TYPE_CHECKING:
    from engine.models.distributed import ShardPlan


@dataclass(frozen=True)
class Experiment:
    """One command: `anatomy-tui run NAME`. Its computation module defines `run(settings, context)
    -> Iterator[Event]` and, when the row is `shardable`, `shard_plan(settings, n_layers, inputs,
    model_name) -> ShardPlan` (how its sweep splits over workers)."""

    name: str
    help: str
    settings_class: type[Settings]
    result_class: type[ResultDocument]  # results/<result_class.name>.json
    computation: str  # the module with `run` (and `shard_plan`)
    sample: Callable[[], ResultDocument]  # a result built from the class: the tests' and snapshots' example
    needs_model: bool = True
    resumable: bool = False
    reads: tuple[str, ...] = ()  # session results handed over in RunContext.inputs
    long: bool = False  # the console runs it as its own process rather than in a thread
    presets: Mapping[str, Settings] = field(default_factory=dict)  # `--preset NAME`
    preset: str = ""  # the preset `--preset` starts from when not given
    shardable: bool = False  # its sweep splits over worker processes (`--shards N`, torchrun)
    oom_advice: str = "a smaller --eval-batch-size or --max-length, or --dtype float16"  # flags that need less memory
    console_flags: tuple[str, ...] = ()  # the flags the console's form for it starts with (growth: its tiny preset)

    @property
    def writes(self) -> str:
        """Its result file's name, `results/<writes>.json`."""
        return self.result_class.name

    def defaults(self) -> Settings:
        """The settings a run starts from before any flag: the default preset, or the field defaults."""
        return self.presets[self.preset] if self.preset else self.settings_class()

    def default_texts(self) -> dict[str, str]:
        """Each flag's default as a user types it (1e-4, not 0.0001): what the console's forms start
        with, from the settings class alone (no torch); fields whose default has no text are left out."""
        defaults, texts = self.defaults(), {}
        for spec in self.settings_class.fields():
            value = getattr(defaults, spec.name)
            if isinstance(value, float) and value and abs(value) < 1e-3:
                mantissa, exponent = f"{value:e}".split("e")
                texts[spec.name] = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
            elif value is not None or spec.meta.get("none_word"):
                texts[spec.name] = spec.show_text(value)
        return texts

    def shard_plan(self, settings: Settings, n_layers: int, inputs: Mapping[str, dict[str, Any]] | None = None,
                   model_name: str = "") -> ShardPlan:
        """The split of its sweep over workers; `inputs` are the session results it reads (recovery's
        ablation map, for its Spearman over all layers; manipulate's, for its default layers)."""
        if not self.shardable:
            names = ", ".join(entry.name for entry in EXPERIMENTS if entry.shardable)
            raise UserError(f"{self.name} does not split over workers; --shards applies to {names}")
        return importlib.import_module(self.computation).shard_plan(settings, n_layers, inputs or {}, model_name)

    def known_units(self, settings: Settings) -> int | None:
        """How many units its sweep has when the settings alone fix it (layers given, or no model
        at all); None when it depends on the model's depth."""
        layers = getattr(settings, "layers", None)
        if layers:
            return len(self.shard_plan(settings, max(layers) + 1).items)
        return None if self.needs_model else len(self.shard_plan(settings, 0).items)

    def run(self, settings: Settings, context: RunContext) -> Iterator[Event]:
        """The experiment's events. Out of memory anywhere in it is one line naming the experiment and
        the flags to change, raised after the memory is given back (every front end, every worker)."""
        from engine.models.oom import out_of_memory_guard

        yield Progress(0, 0, f"{self.name}: starting", phase="starting")  # said before any forward
        runner: Callable[[Any, RunContext], Iterator[Event]] = importlib.import_module(self.computation).run
        with out_of_memory_guard(self.name, self.oom_advice):
            yield from runner(settings, context)


def _row(name: str, help: str, vocabulary: Any, settings: type[Settings], result: type[ResultDocument],
         **options: Any) -> Experiment:
    """A row whose computation is its folder's `run` module (growth's is `experiment`)."""
    folder = vocabulary.__name__.rsplit(".", 1)[0]
    computation = options.pop("computation", f"{folder}.run")
    return Experiment(name, help, settings, result, computation, vocabulary.sample, **options)


EXPERIMENTS: list[Experiment] = [
    _row("ablation", "layer-importance map: ablate each layer, measure perplexity",
         ablation, ablation.AblationSettings, ablation.AblationMap, resumable=True, shardable=True),
    _row("recovery", "recovery speed: noise one layer, fine-tune it alone, follow its PPL",
         recovery, recovery.RecoverySettings, recovery.RecoveryResult, resumable=True, reads=("ablation",),
         long=True, shardable=True,
         oom_advice="a smaller --batch-size, --block-size or --eval-batch-size, or --dtype float16"),
    _row("growth", "grow a transformer phase by phase from an importance profile vs a uniform one",
         growth, growth.GrowthSettings, growth.GrowthResult, computation="engine.experiments.growth.experiment",
         needs_model=False, resumable=True, reads=("ablation",), long=True, presets=growth.PRESETS, preset="paper",
         oom_advice="a smaller --batch-size or --hidden-size, or --preset tiny", console_flags=("--preset", "tiny")),
    _row("dynamics", "hidden-state angles per layer, PCA and clusters of token profiles",
         dynamics, dynamics.DynamicsSettings, dynamics.DynamicsResult,
         oom_advice="a smaller --eval-batch-size, --max-length or --max-tokens"),
    _row("scaling-fit", "fit L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 to training runs (CSV)",
         scaling_fit, scaling_fit.ScalingFitSettings, scaling_fit.ScalingFitResult, needs_model=False),
    _row("toy-depth", "teacher-student toy models: student loss against depth, fitted a_l",
         toy_depth, toy_depth.ToyDepthSettings, toy_depth.ToyDepthResult, needs_model=False, resumable=True,
         long=True, presets=toy_depth.PRESETS, preset="tiny", shardable=True,
         oom_advice="a smaller --batch-size or --width, or --device cpu"),
    _row("weights", "weight predictability (Ridge R², LOO), delta correlation, nulls, R²-PPL paradox",
         weights, weights.WeightsSettings, weights.WeightsResult,
         oom_advice="--no-paradox, fewer --components, or a smaller --eval-batch-size"),
    _row("manipulate", "zero, clone, blend, low-rank SVD blend, scale layers: perplexity, samples",
         manipulate, manipulate.ManipulationSettings, manipulate.ManipulateResult, reads=("ablation",),
         shardable=True),
    _row("prune", "remove layers by four criteria, heal the cut, export the pruned model",
         prune, prune.PruneSettings, prune.PruneResult, reads=("ablation",), long=True,
         oom_advice="a smaller --eval-batch-size or --batch-size, or --heal-steps 0"),
    _row("evaluate", "zero-shot accuracy through lm-eval of the model and its variants, with a generation check",
         evaluate, evaluate.EvaluateSettings, evaluate.EvaluateResult, reads=("prune", "growth", "evaluate"),
         long=True, oom_advice="a smaller --batch-size, or --dtype float16"),
]

BY_NAME: dict[str, Experiment] = {experiment.name: experiment for experiment in EXPERIMENTS}


def register(entry: Experiment) -> None:
    """Adds a row at run time (a test's throwaway experiment); its vocabulary registers its events
    and result when imported. `unregister` takes it out again."""
    if entry.name in BY_NAME:
        raise ValueError(f"experiment {entry.name!r} registered twice")
    EXPERIMENTS.append(entry)
    BY_NAME[entry.name] = entry


def unregister(name: str) -> None:
    entry = BY_NAME.pop(name, None)
    EXPERIMENTS[:] = [row for row in EXPERIMENTS if row.name != name]
    if entry is not None:
        forget_types(name, entry.writes)


def experiment(name: str) -> Experiment:
    try:
        return BY_NAME[name]
    except KeyError:
        raise UserError(f"unknown experiment {name!r}; use one of {', '.join(BY_NAME)}") from None


# the documentation page that holds the table of live events, between these two markers
EVENTS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "events.md"
EVENTS_BEGIN, EVENTS_END = "<!-- events:begin -->\n", "\n<!-- events:end -->"


def events_markdown() -> str:
    """The table of live events (docs/events.md), generated from every registered event class (a test compares)."""
    lines = ["| kind | fields | meaning |", "|---|---|---|"]
    commands = ["job", *(entry.name for entry in EXPERIMENTS)]
    order = {command: place for place, command in enumerate(commands)}
    kinds = sorted(event_types().items(), key=lambda item: order.get(item[0].split(".")[0], len(order)))
    for kind, cls in kinds:
        names = ", ".join(f.name for f in dataclasses.fields(cls) if f.name not in ("job", "t"))
        doc = " ".join((cls.__doc__ or "").split())
        lines.append(f"| `{kind}` | {names} | {doc} |")
    return "\n".join(lines)


def with_events_table(page: str) -> str:
    """`page` with what lies between its events markers replaced by `events_markdown()`."""
    head, rest = page.split(EVENTS_BEGIN, 1)
    return head + EVENTS_BEGIN + events_markdown() + EVENTS_END + rest.split(EVENTS_END, 1)[1]


if __name__ == "__main__":  # in a checkout, regenerate the page's table; installed, print it
    if EVENTS_PAGE.is_file():
        atomic_write_bytes(EVENTS_PAGE, with_events_table(EVENTS_PAGE.read_text(encoding="utf-8")).encode())
        print(f"{EVENTS_PAGE}: the table of live events regenerated from the event classes")
    else:
        print(events_markdown())
