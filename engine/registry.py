"""The experiments anatomy-tui knows: one row per command, the one list the CLI, the console, jobs,
printers, snapshots, the documentation's event table (docs/events.md) and the tests all read.

An experiment is a folder, `engine/experiments/<name>/`: its `vocabulary` module (settings, events,
result document, its upgrade of older documents, a sample result and its presets; torch-free) and
its computation (`run(settings, context)`, and `shard_plan` where its sweep splits). A row holds
its package, whose `contract()` and `computation()` import them (engine/experiments/contract.py):
the vocabulary when the row's settings, result or sample are first asked for, or one of its event
kinds is read (engine/core/events.py `declare_vocabulary`), the computation when a run wants it; so
the console paints and `anatomy-tui --help` answers before the experiments' hundred and more
dataclasses are built, and before torch loads. Adding one is its folder, its view
(`tui/views/<name>.py`) and a row here; `register` adds a row at run time (a test's throwaway
experiment).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.events import Event, Progress, ResultDocument, declare_vocabulary, event_types, forget_types
from engine.core.settings import Settings
from engine.disk.atomic import atomic_write_bytes
from engine.experiments import (
    ablation,
    depth_family,
    dynamics,
    evaluate,
    growth,
    manipulate,
    prune,
    recovery,
    scaling_fit,
    toy_depth,
    weights,
)
from engine.experiments.context import RunContext as RunContext  # re-exported: a run is started from here
from engine.experiments.contract import Contract, ExperimentFolder

if TYPE_CHECKING:
    from engine.models.distributed import ShardPlan


@dataclass(frozen=True)
class Experiment:
    """One command: `anatomy-tui run NAME`. Its folder (engine/experiments/<name>/, see
    engine/experiments/contract.py) declares its vocabulary, `contract()`: the Settings class, the
    result document class, `sample()` (the tests' and snapshots' example), presets (`--preset NAME`)
    and its sample's frame and figure; and its computation, `computation()`: a module with
    `run(settings, context) -> Iterator[Event]` and, when the row is `shardable`,
    `shard_plan(settings, n_layers, inputs, model_name) -> ShardPlan` (how its sweep splits over
    workers). `reads` and `reads_folders` are the edges to other experiments: the results handed
    over in RunContext.inputs, and the experiments whose checkpoint folders it reads
    (RunContext.folder_of)."""

    name: str
    help: str
    folder: ExperimentFolder  # its package; each part imported when first asked for
    needs_model: bool = True
    resumable: bool = False
    reads: tuple[str, ...] = ()  # session results handed over in RunContext.inputs
    reads_folders: tuple[str, ...] = ()  # experiments whose checkpoint folders it reads (evaluate: recovery's layers)
    long: bool = False  # the console runs it as its own process rather than in a thread
    preset: str = ""  # the preset `--preset` starts from when not given
    shardable: bool = False  # its sweep splits over worker processes (`--shards N`, torchrun)
    oom_advice: str = "a smaller --eval-batch-size or --max-length, or --dtype float16"  # flags that need less memory
    console_flags: tuple[str, ...] = ()  # the flags the console's form for it starts with (growth: its tiny preset)

    def contract(self) -> Contract:
        """Its vocabulary's declaration (the vocabulary imported now if it was not yet)."""
        return self.folder.contract()

    @property
    def settings_class(self) -> type[Settings]:
        return self.contract().settings

    @property
    def result_class(self) -> type[ResultDocument]:
        return self.contract().result

    @property
    def presets(self) -> Mapping[str, Settings]:
        """Its named settings, `--preset NAME` (none: an empty mapping)."""
        return self.contract().presets

    def sample(self) -> ResultDocument:
        """A result built from the class: the tests' and snapshots' example."""
        return self.contract().sample()

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
        plan: ShardPlan = self.folder.computation().shard_plan(settings, n_layers, inputs or {}, model_name)
        return plan

    def known_units(self, settings: Settings) -> int | None:
        """How many units its sweep has when the settings alone fix it (layers given, or no model
        at all); None when it depends on the model's depth."""
        layers = getattr(settings, "layers", None)
        if layers:
            return len(self.shard_plan(settings, max(layers) + 1).items)
        return None if self.needs_model else len(self.shard_plan(settings, 0).items)

    def import_frozen(self, with_model: bool) -> None:
        """Imports its computation, and transformers' model code when a model loads, kept from the
        garbage collector: only in a process that runs this one job (engine.core.frozen_imports)."""
        from engine.core.frozen_imports import import_frozen

        import_frozen(self.folder.computation, *(("transformers.modeling_utils",) if with_model else ()))

    def run(self, settings: Settings, context: RunContext) -> Generator[Event, None, None]:
        """The experiment's events, its context told which other experiments' folders it may read
        (`reads_folders`). Out of memory anywhere in it is one line naming the experiment and the
        flags to change, raised after the memory is given back (every front end, every worker)."""
        from engine.models.oom import out_of_memory_guard

        yield Progress(0, 0, f"{self.name}: starting", phase="starting")  # said before any forward
        runner: Callable[[Any, RunContext], Iterator[Event]] = self.folder.computation().run
        with out_of_memory_guard(self.name, self.oom_advice):
            yield from runner(settings, dataclasses.replace(context, folders_read=self.reads_folders))


EXPERIMENTS: list[Experiment] = [
    Experiment("ablation", "layer-importance map: ablate each layer, measure perplexity", ablation,
               resumable=True, shardable=True),
    Experiment("recovery", "recovery speed: noise one layer, fine-tune it alone, follow its PPL", recovery,
               resumable=True, reads=("ablation",), long=True, shardable=True,
               oom_advice="a smaller --batch-size, --block-size or --eval-batch-size, or --dtype float16"),
    Experiment("growth", "grow a transformer phase by phase from an importance profile vs a uniform one", growth,
               needs_model=False, resumable=True, reads=("ablation",), long=True, preset="paper",
               oom_advice="a smaller --batch-size or --hidden-size, or --preset tiny",
               console_flags=("--preset", "tiny")),
    Experiment("dynamics", "hidden-state angles per layer, PCA and clusters of token profiles", dynamics,
               oom_advice="a smaller --eval-batch-size, --max-length or --max-tokens"),
    Experiment("scaling-fit", "fit L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 to training runs (CSV)", scaling_fit,
               needs_model=False),
    Experiment("toy-depth", "teacher-student toy models: student loss against depth, fitted a_l", toy_depth,
               needs_model=False, resumable=True, long=True, preset="tiny", shardable=True,
               oom_advice="a smaller --batch-size or --width, or --device cpu"),
    Experiment("depth-family", "train a family of small LMs over depths on a corpus: fitted a_l, each member's map",
               depth_family, needs_model=False, resumable=True, long=True,
               oom_advice="a smaller --batch-size, --context or --widths, or --device cpu"),
    Experiment("weights", "weight predictability (Ridge R², LOO), delta correlation, nulls, R²-PPL paradox",
               weights, oom_advice="--no-paradox, fewer --components, or a smaller --eval-batch-size"),
    Experiment("manipulate", "zero, clone, blend, low-rank SVD blend, scale layers: perplexity, samples", manipulate,
               reads=("ablation",), shardable=True),
    Experiment("prune", "remove layers by four criteria, heal the cut, export the pruned model", prune,
               reads=("ablation",), long=True,
               oom_advice="a smaller --eval-batch-size or --batch-size, or --heal-steps 0"),
    Experiment("evaluate", "zero-shot accuracy through lm-eval of the model and its variants, with a generation check",
               evaluate, reads=("prune", "growth", "evaluate"), reads_folders=("recovery",), long=True,
               oom_advice="a smaller --batch-size, or --dtype float16"),
]

BY_NAME: dict[str, Experiment] = {experiment.name: experiment for experiment in EXPERIMENTS}
for _entry in EXPERIMENTS:
    declare_vocabulary(_entry.name, _entry.folder.contract)


def register(entry: Experiment) -> None:
    """Adds a row at run time (a test's throwaway experiment); its vocabulary registers its events
    and result when imported. `unregister` takes it out again."""
    if entry.name in BY_NAME:
        raise ValueError(f"experiment {entry.name!r} registered twice")
    EXPERIMENTS.append(entry)
    BY_NAME[entry.name] = entry
    declare_vocabulary(entry.name, entry.folder.contract)


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
