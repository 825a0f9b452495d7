"""The experiments anatomy-tui knows: one record per command, read by the CLI, the console, jobs
and tests alike.

Adding an experiment means one module under `engine/experiments/` (its Settings dataclass, its
`run(settings, context)` generator) and one record here. The module is the experiment's adapter: it
also declares, where it has them, what the sharding, the memory plan and the readers of its result
need (`shard_plan`, `training_needs`, `RESULT`: see `Experiment`), so `engine/models/distributed.py`,
`engine/models/memory.py` and the runner name no experiment. This module imports no torch: the record
names its module, which is imported only when the experiment's settings or run are wanted, so the
console paints and `anatomy-tui --help` answers before torch loads.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.events import CancelToken, Event

if TYPE_CHECKING:
    from engine.core.settings import Settings
    from engine.models.loading import LoadedModel


@dataclass
class RunContext:
    """What a front end hands an experiment besides its settings.

    `checkpoint_dir` is the experiment's own folder in the session (checkpoints, saved layers);
    `output_dir` the session folder, for files a run leaves for later (growth's final models);
    `resume` asks it to continue from what is there; `inputs` holds earlier results of the session
    the experiment reads (the ablation map, say), by result name. `share` is this worker's units of
    a split sweep (engine/models/distributed.py `plan`), where the experiment reads them from the context
    rather than its settings (manipulate's trials, toy-depth's students); None: all of them."""

    model: LoadedModel | None = None
    cancel: CancelToken = field(default_factory=CancelToken)
    checkpoint_dir: Path | None = None
    output_dir: Path | None = None
    resume: bool = False
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    share: list[Any] | None = None


@dataclass(frozen=True)
class Experiment:
    """One command: `anatomy-tui run NAME`.

    Its module defines `settings_name` and `run(settings, context) -> Iterator[Event]`, and may
    define (each read through the property or method of the same name, with its default):
      shard_plan(settings, n_layers, inputs, model_name) -> engine.models.distributed.ShardPlan
                   how its sweep splits over workers (with `shardable`); none: it does not split
      training_needs(settings, shape) -> engine.models.memory.Training | None
                   what a run trains at once, for the memory plan; none: it trains nothing
      checkpoint_params(settings, shape) -> int
                   parameters its checkpoints keep at most, for the disk check; none: 0
      RESULT       the class of its result document (engine/core/events.py); none: an untyped dict
    """

    name: str
    help: str
    module: str  # defines `settings_class` (below), `run` and the optional names above
    settings_name: str
    needs_model: bool = True
    resumable: bool = False
    writes: str = ""  # the result file, results/<writes>.json
    reads: tuple[str, ...] = ()  # session results handed over in RunContext.inputs
    long: bool = False  # the console runs it as its own process rather than in a thread
    preset: str = ""  # the preset `--preset` starts from when not given (experiments with PRESETS)
    shardable: bool = False  # its sweep splits over worker processes (`--shards N`, torchrun): distributed.plan
    oom_advice: str = "a smaller --eval-batch-size or --max-length, or --dtype float16"  # flags that need less memory
    console_flags: tuple[str, ...] = ()  # the flags the console's form for it starts with (growth: its tiny preset)

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    @property
    def settings_class(self) -> type[Settings]:
        return getattr(self.load(), self.settings_name)

    @property
    def presets(self) -> dict[str, Settings]:
        """Named Settings instances (`--preset NAME`), if the experiment has any."""
        return dict(getattr(self.load(), "PRESETS", {}))

    def declared_defaults(self) -> dict[str, str]:
        """The literal defaults its settings class declares, as written there (`setting(1e-4, ...)`:
        '1e-4'), read from the module's source without importing it, so no torch: what the
        console's forms show before the first paint. Fields declared in the class itself."""
        return _declared_defaults(self.module, self.settings_name)

    def defaults(self) -> Settings:
        """The settings a run starts from before any flag: the default preset, or the field defaults."""
        return self.presets[self.preset] if self.preset else self.settings_class()

    @property
    def shard_plan(self) -> Callable[..., Any] | None:
        """The module's `shard_plan(settings, n_layers, inputs, model_name) -> ShardPlan` (its units,
        a share's settings, the merge, what rank 0 prepares), when the record is `shardable`."""
        return getattr(self.load(), "shard_plan", None) if self.shardable else None

    def training_needs(self, settings: Settings, shape: Any) -> Any:
        """What a run with these settings trains at once on a model of this `engine.models.memory.ModelShape`
        (an `engine.models.memory.Training`), from the module's `training_needs`; None: it trains nothing."""
        needs = getattr(self.load(), "training_needs", None)
        return needs(settings, shape) if needs is not None else None

    def checkpoint_params(self, settings: Settings, shape: Any) -> int:
        """Parameters a run with these settings keeps in its checkpoints at most on a model of this
        shape, from the module's `checkpoint_params`; 0: its checkpoints are small or it has none."""
        params = getattr(self.load(), "checkpoint_params", None)
        return int(params(settings, shape)) if params is not None else 0

    @property
    def result_class(self) -> type | None:
        """The class of its result document (the module's `RESULT`), None where it has none yet."""
        return getattr(self.load(), "RESULT", None)

    def run(self, settings: Settings, context: RunContext) -> Iterator[Event]:
        """The experiment's events. Out of memory anywhere in it is one line naming the experiment and
        the flags to change, raised after the memory is given back (every front end, every worker)."""
        from engine.models.oom import out_of_memory_guard

        runner: Callable[[Any, RunContext], Iterator[Event]] = self.load().run
        with out_of_memory_guard(self.name, self.oom_advice):
            yield from runner(settings, context)


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("ablation", "layer-importance map: ablate each layer, measure perplexity",
               "engine.experiments.ablation", "AblationSettings", writes="ablation", shardable=True),
    Experiment("recovery", "recovery speed: noise one layer, fine-tune it alone, follow its PPL",
               "engine.experiments.recovery", "RecoverySettings", resumable=True, writes="recovery",
               reads=("ablation",), long=True, shardable=True,
               oom_advice="a smaller --batch-size, --block-size or --eval-batch-size, or --dtype float16"),
    Experiment("growth", "grow a transformer phase by phase from an importance profile vs a uniform one",
               "engine.experiments.growth", "GrowthSettings", needs_model=False, resumable=True,
               writes="growth", reads=("ablation",), long=True, preset="paper",
               oom_advice="a smaller --batch-size or --hidden-size, or --preset tiny",
               console_flags=("--preset", "tiny")),
    Experiment("dynamics", "hidden-state angles per layer, PCA and clusters of token profiles",
               "engine.experiments.dynamics", "DynamicsSettings", writes="dynamics",
               oom_advice="a smaller --eval-batch-size, --max-length or --max-tokens"),
    Experiment("scaling-fit", "fit L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 to training runs (CSV)",
               "engine.experiments.scaling_fit", "ScalingFitSettings", needs_model=False, writes="scaling-fit"),
    Experiment("toy-depth", "teacher-student toy models: student loss against depth, fitted a_l",
               "engine.experiments.toy_depth", "ToyDepthSettings", needs_model=False, resumable=True,
               writes="toy-depth", long=True, preset="tiny", shardable=True,
               oom_advice="a smaller --batch-size or --width, or --device cpu"),
    Experiment("weights", "weight predictability (Ridge R², LOO), delta correlation, nulls, R²-PPL paradox",
               "engine.experiments.weights", "WeightsSettings", writes="weights",
               oom_advice="--no-paradox, fewer --components, or a smaller --eval-batch-size"),
    Experiment("manipulate", "zero, clone, blend, low-rank SVD blend, scale layers: perplexity, samples",
               "engine.experiments.manipulate", "ManipulationSettings", writes="manipulate",
               reads=("ablation",), shardable=True),
    Experiment("prune", "remove layers by four criteria, heal the cut, export the pruned model",
               "engine.experiments.prune", "PruneSettings", writes="prune", reads=("ablation",), long=True,
               oom_advice="a smaller --eval-batch-size or --batch-size, or --heal-steps 0"),
    Experiment("evaluate", "zero-shot accuracy through lm-eval of the model and its variants, with a generation check",
               "engine.experiments.evaluate", "EvaluateSettings", writes="evaluate",
               reads=("prune", "growth", "evaluate"), long=True,
               oom_advice="a smaller --batch-size, or --dtype float16"),
)

BY_NAME: dict[str, Experiment] = {experiment.name: experiment for experiment in EXPERIMENTS}


@functools.cache
def _declared_defaults(module: str, class_name: str) -> dict[str, str]:
    spec = importlib.util.find_spec(module)  # imports the parent packages only
    if spec is None or spec.origin is None:
        raise UserError(f"no module {module}")
    paths = [Path(spec.origin)]
    if spec.submodule_search_locations:  # a package: the class may live in any of its modules
        paths += sorted(p for folder in spec.submodule_search_locations for p in Path(folder).glob("*.py"))
    for path in paths:
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                return {
                    item.target.id: ast.get_source_segment(source, item.value.args[0]) or ""
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                    and isinstance(item.value, ast.Call) and isinstance(item.value.func, ast.Name)
                    and item.value.func.id == "setting" and item.value.args and _literal(item.value.args[0])
                }  # fmt: skip
    raise UserError(f"no class {class_name} in {module}")


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def owner(settings: Any) -> Experiment | None:
    """The experiment whose Settings class made `settings` (its module is imported, since the
    instance exists); None for other settings. The memory plan asks it what the run trains."""
    for entry in EXPERIMENTS:
        module = sys.modules.get(entry.module)
        if module is not None and type(settings) is getattr(module, entry.settings_name, None):
            return entry
    return None


def experiment(name: str) -> Experiment:
    try:
        return BY_NAME[name]
    except KeyError:
        raise UserError(f"unknown experiment {name!r}; use one of {', '.join(BY_NAME)}") from None
