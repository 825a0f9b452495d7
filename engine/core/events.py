"""The events and results every experiment speaks: the project's one vocabulary.

An experiment is a generator of `Event`s that ends by yielding a `Result`. Events are JSON lines
with a schema version, and each one carries enough to redraw the UI from it alone, so a console
that reopens a session replays the log instead of recomputing. Every event class lives here, in a
module that imports neither torch nor numpy, so the console and the store can decode them all.

Spelling: a kind is `<command>.<what>` with the command as typed (`scaling-fit.stage`), and the
generic ones are `job.*`. The same thing has the same field name everywhere, in events and in
result documents: a layer index is `layer`, an importance class is `layer_class`.

Every experiment's result document has a frozen dataclass here too, named by its module's `RESULT`
(`AblationMap`, `RecoveryResult`, `PruneResult`...): the engine builds it and puts `json_safe(doc)` in
its Result; the printers, the console's views and state, the prompt pane's variants and the test
fixtures read it with `Class.from_json(doc)`, so a renamed field breaks the tests on both sides. The
JSON is what the dicts these classes replaced wrote, key for key and in their order; a key a document
has in one shape and not another is a field that may be `ABSENT`.

Version 1 (anatomy-tui 0.1) spelled some kinds with hyphens or without a command, and said `index`
and `class`; `upgrade_event` and `upgrade_result` rewrite such documents on reading, so a 0.1
session still opens.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

EVENT_SCHEMA_VERSION = 2

_EVENT_TYPES: dict[str, type[Event]] = {}
T = TypeVar("T")


class Cancelled(Exception):
    """Raised inside an experiment when its cancel flag is set."""


class CancelToken:
    """A flag the front end sets and the experiment checks between steps."""

    def __init__(self) -> None:
        self._flag = threading.Event()

    def cancel(self) -> None:
        self._flag.set()

    @property
    def cancelled(self) -> bool:
        return self._flag.is_set()

    def check(self) -> None:
        if self._flag.is_set():
            raise Cancelled()


def event_type(cls: type[Event]) -> type[Event]:
    """Class decorator: registers an event class under its `kind` for `event_from_json`."""
    if cls.kind in _EVENT_TYPES and _EVENT_TYPES[cls.kind] is not cls:
        raise ValueError(f"event kind {cls.kind!r} registered twice")
    _EVENT_TYPES[cls.kind] = cls
    return cls


def event_types() -> dict[str, type[Event]]:
    """Every registered kind and its class, in the order they are declared here."""
    return dict(_EVENT_TYPES)


class _Absent:
    """The value of a field its document leaves out (see `ABSENT`)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False

    def __copy__(self) -> _Absent:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Absent:
        return self


# A field whose key a document has in one case and lacks in another (toy-depth's `se`, written only
# when the law was fitted) defaults to ABSENT: `json_safe` writes no key for it, and a document
# without the key reads back as ABSENT, so the class writes each shape byte for byte.
ABSENT: Any = _Absent()


def json_safe(value: Any) -> Any:
    """NaN and inf are not JSON: they become null, which every reader handles. A dataclass becomes
    its fields in their order, less those that are ABSENT."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return {name: json_safe(v) for name, v in fields if v is not ABSENT}
    if hasattr(value, "item") and callable(value.item):  # numpy or torch scalar
        return json_safe(value.item())
    return value


# --- typed decoding -----------------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _decoder(hint: Any) -> Callable[[Any], Any] | None:
    """How a JSON value (not None) becomes the annotated type, worked out once per type: nested
    dataclasses rebuilt, lists to tuples where declared; None: the value as it is."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _decoder(next(a for a in args if a is not type(None)))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return functools.partial(from_doc, hint)
    if origin is list or origin is tuple:
        item = _decoder(args[0] if origin is list or (len(args) == 2 and args[1] is Ellipsis) else Any)
        if item is None:
            return origin
        return lambda value: origin(None if v is None else item(v) for v in value)
    if origin is dict:
        item = _decoder(args[1])
        return lambda value: {k: v if v is None or item is None else item(v) for k, v in value.items()}
    return None


@functools.cache
def _field_decoders(cls: type) -> dict[str, Callable[[Any], Any] | None]:
    hints = _hints(cls)
    return {f.name: _decoder(hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def from_doc(cls: type[T], doc: Mapping[str, Any]) -> T:
    """Rebuilds dataclass `cls` from its JSON document. Keys it does not declare are ignored (a newer
    writer may add some); a missing field raises TypeError, so a rename cannot pass unnoticed."""
    decoders = _field_decoders(cls)
    return cls(**{
        k: v if v is None or (decode := decoders[k]) is None else decode(v)
        for k, v in doc.items() if k in decoders
    })  # fmt: skip


# --- version 1 --------------------------------------------------------------------------------

_V1_KINDS = {
    "started": "job.started", "progress": "job.progress", "message": "job.message",
    "result": "job.result", "finished": "job.finished",
    "toy-depth-step": "toy-depth.step", "toy-depth-student": "toy-depth.student",
    "scaling-fit-stage": "scaling-fit.stage",
}  # fmt: skip
_V1_FIELDS = {"index": "layer", "class": "layer_class"}
_V1_EVENT_FIELDS = {
    "ablation.layer": {"index": "layer"},
    "dynamics.layer": {"index": "layer"},
    "recovery.layer": {"index": "layer"},
    "growth.phase": {"index": "phase_index"},
    "growth.phase_end": {"index": "phase_index"},
}


def _renamed(row: Any, names: Mapping[str, str] = _V1_FIELDS) -> Any:
    return {names.get(k, k): v for k, v in row.items()} if isinstance(row, dict) else row


def upgrade_result(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """A result document of version 1 with its rows in version 2's names (`index` -> `layer`,
    `class` -> `layer_class`); a version 2 document comes back as it is."""
    doc = dict(doc)
    if name in ("ablation", "recovery", "dynamics") and isinstance(doc.get("layers"), list):
        doc["layers"] = [_renamed(row) for row in doc["layers"]]
    if name == "recovery" and isinstance(doc.get("budget"), dict):
        budget = dict(doc["budget"])
        budget["per_layer"] = [_renamed(row) for row in budget.get("per_layer", [])]
        doc["budget"] = budget
    if name == "weights" and isinstance(doc.get("components"), dict):
        doc["components"] = {
            key: {**comp, "per_layer": [_renamed(row) for row in comp.get("per_layer", [])]}
            for key, comp in doc["components"].items()
        }
    if name == "growth" and isinstance(doc.get("budget_table"), list):
        doc["budget_table"] = [_renamed(row) for row in doc["budget_table"]]
    return doc


def upgrade_event(doc: dict[str, Any]) -> dict[str, Any]:
    """An event document of any version in version 2's spelling: v1 kinds renamed (`started` ->
    `job.started`, `toy-depth-step` -> `toy-depth.step`...), `index` -> `layer` (or `phase_index`
    in growth's phase events), and the rows inside v1 results and recovery layers renamed too."""
    if doc.get("v", 1) >= 2:
        return doc
    kind = _V1_KINDS.get(doc.get("kind"), doc.get("kind"))  # type: ignore[arg-type]
    out = _renamed(doc, _V1_EVENT_FIELDS.get(kind, {})) | {"v": EVENT_SCHEMA_VERSION, "kind": kind}
    if kind == "job.result" and isinstance(out.get("data"), dict):
        out["data"] = upgrade_result(str(out.get("name")), out["data"])
    if kind == "recovery.layer":
        out["result"] = _renamed(out.get("result"))
    return out


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """Base of every event; `job` names the run (the job runner stamps it), `t` the wall time."""

    kind: ClassVar[str] = "event"
    job: str = field(default="", kw_only=True)
    t: float = field(default_factory=time.time, kw_only=True)

    def to_json(self) -> dict[str, Any]:
        body = json_safe(dataclasses.asdict(self))
        return {"v": EVENT_SCHEMA_VERSION, "kind": self.kind, **body}


def event_from_json(doc: dict[str, Any]) -> Event:
    """Rebuilds an event written by `Event.to_json` (any schema version, see `upgrade_event`);
    an unknown kind raises ValueError, a document missing a field TypeError."""
    doc = upgrade_event(doc)
    cls = _EVENT_TYPES.get(doc.get("kind"))  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {doc.get('kind')!r}")
    return from_doc(cls, doc)


@event_type
@dataclass(frozen=True)
class Started(Event):
    """A job began; `spec` is its full settings, so it can be resumed from the log alone."""

    kind: ClassVar[str] = "job.started"
    experiment: str
    spec: dict[str, Any]


@event_type
@dataclass(frozen=True)
class Progress(Event):
    """Generic progress of a long job: `done` of `total` units, with a short label."""

    kind: ClassVar[str] = "job.progress"
    done: int
    total: int
    label: str = ""


@event_type
@dataclass(frozen=True)
class Message(Event):
    """A line for the log panel (level: info, warning, error)."""

    kind: ClassVar[str] = "job.message"
    text: str
    level: str = "info"


@event_type
@dataclass(frozen=True)
class Result(Event):
    """The last event of an experiment: `name` is the result file, `data` its JSON document."""

    kind: ClassVar[str] = "job.result"
    name: str
    data: dict[str, Any]


@event_type
@dataclass(frozen=True)
class Finished(Event):
    """Written by the job runner when a job ends: status is done, cancelled or failed."""

    kind: ClassVar[str] = "job.finished"
    status: str
    error: str = ""


# ablation ---------------------------------------------------------------------------------------


@event_type
@dataclass(frozen=True)
class LayerAblated(Event):
    """One row of the map, as soon as it is known (before any bootstrap)."""

    kind: ClassVar[str] = "ablation.layer"
    layer: int
    n_layers: int
    ppl: float
    baseline_ppl: float
    degradation_pct: float
    layer_class: str


@event_type
@dataclass(frozen=True)
class AblationProxies(Event):
    """Block Influence and angular distance of every layer (lists indexed by layer) and the baseline
    perplexity, known after the first pass, long before the last ablation."""

    kind: ClassVar[str] = "ablation.proxies"
    block_influence: list[float]
    angular_distance: list[float]
    baseline_ppl: float


# recovery ---------------------------------------------------------------------------------------


@event_type
@dataclass(frozen=True)
class RecoveryStart(Event):
    """Noise is in: the perplexity the layer starts recovering from."""

    kind: ClassVar[str] = "recovery.start"
    layer: int
    repeat: int
    ppl_after_noise: float
    baseline_ppl: float
    steps: int


@event_type
@dataclass(frozen=True)
class RecoveryPoint(Event):
    """One evaluated step of one layer's curve (step 0 is right after the noise, no training)."""

    kind: ClassVar[str] = "recovery.point"
    layer: int
    repeat: int
    step: int
    train_loss: float | None
    eval_ppl: float
    ratio_to_baseline: float


@event_type
@dataclass(frozen=True)
class RecoveryLayer(Event):
    """A layer is finished (every repeat): its row of the result, ready to save for --resume."""

    kind: ClassVar[str] = "recovery.layer"
    layer: int
    result: RecoveryRow


# growth: every event names its arm and seed; steps count the arm's optimizer steps from 1 --------


@event_type
@dataclass(frozen=True)
class GrowthPlan(Event):
    """Sent first: every arm's phases (name, start step, steps, layers, clones) and the model sizes,
    so the whole timeline can be drawn before training starts."""

    kind: ClassVar[str] = "growth.plan"
    arms: dict[str, Any]
    seeds: list[int]
    params: dict[str, int]
    profile: list[str]
    batch_tokens: int


@event_type
@dataclass(frozen=True)
class GrowthPhase(Event):
    """A phase begins: `added` lists the layers that joined, each with its clone source and FFN scale."""

    kind: ClassVar[str] = "growth.phase"
    arm: str
    seed: int
    phase: str
    phase_index: int
    start_step: int
    steps: int
    layers: list[int]
    added: list[dict[str, Any]]


@event_type
@dataclass(frozen=True)
class GrowthStep(Event):
    """One optimizer step: training loss on its batch, learning rate, and the throughput of the steps
    reported with it (timed together, sent together at an evaluation, a checkpoint or a phase end)."""

    kind: ClassVar[str] = "growth.step"
    arm: str
    seed: int
    phase: str
    step: int
    total_steps: int
    train_loss: float
    tokens_per_s: float
    lr: float
    n_layers: int


@event_type
@dataclass(frozen=True)
class GrowthEval(Event):
    """Validation loss (mean cross-entropy per token, nats) after `step`."""

    kind: ClassVar[str] = "growth.eval"
    arm: str
    seed: int
    phase: str
    step: int
    val_loss: float


@event_type
@dataclass(frozen=True)
class GrowthPhaseEnd(Event):
    """A phase finished: its training seconds and tokens per second (evaluation excluded)."""

    kind: ClassVar[str] = "growth.phase_end"
    arm: str
    seed: int
    phase: str
    phase_index: int
    steps: int
    seconds: float
    tokens_per_s: float


@event_type
@dataclass(frozen=True)
class GrowthArmDone(Event):
    """An arm finished for one seed: final validation loss, training seconds, tokens per second."""

    kind: ClassVar[str] = "growth.arm_done"
    arm: str
    seed: int
    val_loss: float
    seconds: float
    tokens_per_s: float
    steps: int


# dynamics, weights, manipulate, scaling-fit, toy-depth --------------------------------------------


@event_type
@dataclass(frozen=True)
class DynamicsLayer(Event):
    """Per-layer medians over the tokens seen so far, sent once all batches are in."""

    kind: ClassVar[str] = "dynamics.layer"
    layer: int
    n_layers: int
    angle_state: float | None
    angle_update: float | None
    norm: float | None


@event_type
@dataclass(frozen=True)
class ComponentAnalysed(Event):
    """One component's headline numbers, real beside the independent null."""

    kind: ClassVar[str] = "weights.component"
    component: str
    r2_in_sample: float
    r2_loo: float
    delta_corr_mean: float
    null_delta_corr_mean: float


@event_type
@dataclass(frozen=True)
class ParadoxTrial(Event):
    """Predicted weights put into `layers_replaced`: the perplexity they give."""

    kind: ClassVar[str] = "weights.paradox"
    layers_replaced: tuple[int, ...]
    ppl: float
    baseline_ppl: float
    r2_in_sample_mean: float
    r2_loo_mean: float


@event_type
@dataclass(frozen=True)
class TrialDone(Event):
    """One manipulation trial: a strategy (with its parameter) on some layers, and what it gave."""

    kind: ClassVar[str] = "manipulate.trial"
    layers: tuple[int, ...]
    strategy: str
    param: float | None
    ppl: float
    baseline_ppl: float
    degradation_pct: float
    sample: str


@event_type
@dataclass(frozen=True)
class FitStage(Event):
    """A stage of the fit finished. stage "fit": `values` are the best parameters; stage "bootstrap":
    their bootstrap standard errors."""

    kind: ClassVar[str] = "scaling-fit.stage"
    stage: str
    values: dict[str, float]
    seconds: float


@event_type
@dataclass(frozen=True)
class StudentStep(Event):
    """Training loss (KL, mean over the seeds) of the students of one depth at one step."""

    kind: ClassVar[str] = "toy-depth.step"
    regime: str
    temperature: float
    depth: int
    step: int
    steps: int
    loss: float


@event_type
@dataclass(frozen=True)
class StudentDone(Event):
    """Held-out KL of each seed's student of one depth after training."""

    kind: ClassVar[str] = "toy-depth.student"
    regime: str
    temperature: float
    depth: int
    losses: list[float]
    loss: float
    seconds: float


# prune -------------------------------------------------------------------------------------------


@event_type
@dataclass(frozen=True)
class PruneScores(Event):
    """One criterion's per-layer score (low = cheapest to remove), once it is known."""

    kind: ClassVar[str] = "prune.scores"
    method: str
    scores: list[float | None]


@event_type
@dataclass(frozen=True)
class PrunePoint(Event):
    """One point of a criterion's curve: `removed` layers (`layers`, original indices from 0) cut;
    `healed_ppl` is None without --heal-steps."""

    kind: ClassVar[str] = "prune.point"
    method: str
    removed: int
    layers: list[int]
    ppl: float
    baseline_ppl: float
    ci_low: float | None = None
    ci_high: float | None = None
    healed_ppl: float | None = None


@event_type
@dataclass(frozen=True)
class PruneExported(Event):
    """The pruned (and healed) model was saved as a Hugging Face folder."""

    kind: ClassVar[str] = "prune.exported"
    folder: str
    method: str
    layers: list[int]
    ppl: float


# evaluate ----------------------------------------------------------------------------------------


@event_type
@dataclass(frozen=True)
class ModelEvaluated(Event):
    """One model of an evaluation is scored: lm-eval's numbers per task (`scores`) and its greedy
    continuations of the fixed prompts against the original's (`generation`, None with --gen-tokens 0)."""

    kind: ClassVar[str] = "evaluate.model"
    variant: str
    label: str
    scores: list[TaskScore]
    generation: GenerationCheck | None


# --- result documents ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalProtocol:
    """How a result's perplexity was measured (engine/data/eval_data.py): two runs' perplexities are
    comparable only when these match (`engine.data.eval_data.comparable`). `protocol` is `papers`
    (non-overlapping windows of `context` tokens, remainder dropped), `sliding` (windows every
    `stride` tokens, each scoring its new tokens) or `texts` (the built-in sets and --eval-file:
    each text alone, truncated at `context` = --max-length); `windows` counts windows or texts,
    `tokens` the scored tokens."""

    dataset: str  # a hub dataset's name, a local path, or builtin:full / builtin:paper / the --eval-file
    config: str | None
    split: str | None
    revision: str | None  # the hub commit where `datasets` says, else its version; None when unknown
    text_column: str | None
    protocol: str
    context: int
    stride: int | None
    windows: int
    tokens: int


@dataclass(frozen=True)
class AblationRow:
    """One layer of the importance map. A live row (from `LayerAblated`) has only the first four;
    the saved map fills in the rest."""

    layer: int
    ppl: float | None
    degradation_pct: float | None
    layer_class: str
    anti: bool = False
    anti_within_noise: bool = False
    ci_low: float | None = None
    ci_high: float | None = None
    block_influence: float | None = None
    angular_distance: float | None = None  # angular_all_tokens: arccos(cos(h_in, h_out)) / pi, mean over real tokens
    angular_last_token: float | None = field(default=ABSENT, kw_only=True)  # the same, of each text's last token


@dataclass(frozen=True)
class AblationMap:
    """results/ablation.json."""

    model: str
    method: str
    baseline_ppl: float
    eval_tokens: int
    eval_texts: int
    seconds: float
    settings: dict[str, Any]
    layers: list[AblationRow]
    spearman: dict[str, float | None]
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4
    # angular_block_n (Gromov et al.): n -> [arccos(cos(h_l, h_{l+n})) / pi of the last token, l = 0 .. depth - n]
    angular_blocks: dict[str, list[float]] = field(default=ABSENT, kw_only=True)
    angular_block_best: dict[str, int] = field(default=ABSENT, kw_only=True)  # n -> its smallest block's first layer

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AblationMap:
        return from_doc(cls, upgrade_result("ablation", dict(doc)))


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
        return from_doc(cls, _renamed(dict(doc)))


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


@dataclass(frozen=True)
class RecoveryResult:
    """results/recovery.json."""

    model: str
    baseline_ppl: float
    eval_tokens: int
    eval_texts: int
    train_source: str
    train_blocks: int
    settings: dict[str, Any]
    layers: list[RecoveryRow]  # in the order the layers were asked for
    ranking: list[int]  # hardest first
    spearman_vs_ablation: float | None  # versus_ablation's difficulty
    versus_ablation: RecoveryVsAblation | None  # None without the session's map of this model
    budget: RecoveryBudget
    seconds_per_step: float | None
    resumed_layers: list[int]
    seconds: float
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RecoveryResult:
        return from_doc(cls, upgrade_result("recovery", dict(doc)))

@dataclass(frozen=True)
class ManipulateRow:
    """One trial of results/manipulate.json (`results[]`)."""

    layers: list[int]
    strategy: str
    param: float | None  # alpha for scale, rank for svd
    ppl: float | None
    degradation_pct: float | None
    sample: str
    together: bool


@dataclass(frozen=True)
class ManipulateResult:
    """results/manipulate.json: every trial, one layer at a time (then together with --together)."""

    model: str
    baseline_ppl: float
    baseline_sample: str  # the unchanged model's greedy sample of `prompt`
    prompt: str
    layers: list[int]  # the layers manipulated
    eval_tokens: int
    seconds: float
    settings: dict[str, Any]
    results: list[ManipulateRow]  # in the order of the trials
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ManipulateResult:
        return from_doc(cls, upgrade_result("manipulate", dict(doc)))


@dataclass(frozen=True)
class ParadoxRow:
    """One row of results/weights.json's `paradox`: predicted weights in `layers_replaced`."""

    layers_replaced: list[int]
    ppl: float | None
    degradation_pct: float | None
    r2_in_sample_mean: float
    r2_loo_mean: float
    cosine_mean: float
    prediction: str  # in_sample or loo


@dataclass(frozen=True)
class WeightStats:
    """How predictable one component's matrices are from the layer index (Ridge R² in-sample and
    leave-one-layer-out, the mean leave-one-out cosine) and how its layer-to-layer differences
    correlate, over the predicted layers: of the real weights, or mean of a null's draws."""

    r2_in_sample: float | None
    r2_loo: float | None
    cosine_loo: float | None
    delta_corr_mean: float | None
    delta_corr_sd: float | None


@dataclass(frozen=True)
class NullModel(WeightStats):
    """results/weights.json `null_shuffled` (the layers in a random order) or `null_independent`
    (independent layers of the same means and spreads): the mean of each statistic over the draws,
    with its [min, max] `range`."""

    range: dict[str, list[float | None]]
    draws: int


@dataclass(frozen=True)
class FitSummary:
    """A component's Ridge fit over every layer (`all_layers`)."""

    r2_in_sample: float | None
    r2_loo: float | None
    cosine_loo: float | None


@dataclass(frozen=True)
class LayerFit:
    """One layer's prediction: R² and cosine with its real matrix, in-sample and leave-one-out."""

    r2_in_sample: float | None
    r2_loo: float | None
    cosine_in_sample: float | None
    cosine_loo: float | None


@dataclass(frozen=True)
class WeightsLayer:
    """One layer of a component's `per_layer`."""

    layer: int
    predicted: LayerFit | None  # None below --first-layer
    all_layers: LayerFit
    delta_corr: float | None  # corr(W_l+1 - W_l, W_l+2 - W_l+1); None on the last two layers
    mean: float
    std: float


@dataclass(frozen=True)
class WeightsComponent(WeightStats):
    """One component (attn.q, mlp.down...) of results/weights.json `components`: its statistics
    beside both nulls', a line `reading` each against them, and every layer."""

    shape: list[int]
    all_layers: FitSummary
    null_shuffled: NullModel
    null_independent: NullModel
    reading: dict[str, str]
    per_layer: list[WeightsLayer]


@dataclass(frozen=True)
class WeightsResult:
    """results/weights.json."""

    model: str
    family: str
    n_layers: int
    predicted_layers: list[int]  # [first, last]
    settings: dict[str, Any]
    components: dict[str, WeightsComponent]
    paradox: list[ParadoxRow]  # [] with --no-paradox
    baseline_ppl: float | None  # None with --no-paradox
    seconds: float
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> WeightsResult:
        return from_doc(cls, upgrade_result("weights", dict(doc)))


@dataclass(frozen=True)
class Quartiles:
    """Median and quartiles over tokens; null where no token had a value."""

    median: float | None
    q1: float | None
    q3: float | None


@dataclass(frozen=True)
class DynamicsRow:
    """One layer of results/dynamics.json: angles (degrees) and norms over tokens."""

    layer: int
    angle_state: Quartiles  # theta(h_l, h_l+1)
    angle_update: Quartiles  # theta(dh_l, dh_l+1); null on the last layer
    norm: Quartiles  # |h_l+1|
    update_norm: Quartiles  # |dh_l|
    relative_update: Quartiles  # |dh_l| / |h_l|
    angle_final: Quartiles | None = None  # theta(h_l+1, h_L); absent in 0.1 sessions
    progress: Quartiles | None = None  # <h_l+1 - h_0, h_L - h_0> / |h_L - h_0|^2; absent in 0.1 sessions
    lens_loss: float | None = None  # with --logit-lens or --lens


@dataclass(frozen=True)
class DepthPoints:
    """results/scaling-fit.json `depth_points`: the runs fitted, each with its depth, its loss and
    `rest`, the fit's width and token terms plus L0 at that run, so loss - rest is the part of the
    loss the depth term c_l / l^a_l has to explain (absent before anatomy-tui 0.3)."""

    depth: list[float]
    loss: list[float]
    rest: list[float]

    def depth_part(self) -> list[tuple[float, float]]:
        """(depth, loss - rest) for every run."""
        return [(d, loss - rest) for d, loss, rest in zip(self.depth, self.loss, self.rest, strict=True)]


@dataclass(frozen=True)
class ProfilePoint:
    """One point of results/scaling-fit.json `profile.alpha_l`: the objective with a_l held here."""

    alpha_l: float
    objective: float | None


@dataclass(frozen=True)
class ScalingProfile:
    """results/scaling-fit.json `profile`: the objective profiled over a_l (None with --huber)."""

    alpha_l: list[ProfilePoint] | None


@dataclass(frozen=True)
class FitRestarts:
    """results/scaling-fit.json `restarts`: how many random restarts reached the best objective."""

    n: int
    reaching_best: int
    best_objective: float | None


@dataclass(frozen=True)
class FitBootstrap:
    """results/scaling-fit.json `bootstrap`: the resamples behind `ci95` and `se`."""

    n: int
    n_valid: int
    restarts: int
    seconds: float


@dataclass(frozen=True)
class PaperFit:
    """results/scaling-fit.json `paper` (--optimizer paper): paper B's Adam procedure, its units,
    coefficients on its log scale, loss and the parameters at snapshots along the way."""

    steps: int
    units: dict[str, float]
    log_c: dict[str, float | None]
    loss: float | None
    trajectory: list[dict[str, float | None]]  # step, alpha_m, alpha_l, alpha_D, L0, objective


@dataclass(frozen=True)
class ScalingFitResult:
    """results/scaling-fit.json. The two optimizers write different parts: `lm` the profile,
    bootstrap intervals, restarts and held-out error, `paper` its procedure (`paper`); what a fit
    does not write is ABSENT, and so is what a result of an older version lacks."""

    source: str
    columns: dict[str, str]  # the CSV's column of loss, width, depth and tokens
    n_rows: int
    n_excluded: int
    n_points: int
    optimizer: str = field(default=ABSENT, kw_only=True)  # lm or paper; absent in 0.1
    loss_function: str = field(default=ABSENT, kw_only=True)  # least_squares or huber; absent in 0.1
    huber_delta: float | None
    params: dict[str, float | None]  # alpha_m, alpha_l, alpha_D, c_m, c_l, c_D, L0
    objective: float | None  # mean squared log residual (0.1 wrote the loss function's name here)
    depth_points: DepthPoints | None = field(default=ABSENT, kw_only=True)  # absent before 0.3
    profile: ScalingProfile = field(default=ABSENT, kw_only=True)
    alpha_l_profile_ci95: list[float | None] | None = field(default=ABSENT, kw_only=True)
    ci95: dict[str, list[float] | None] = field(default=ABSENT, kw_only=True)
    se: dict[str, float | None] = field(default=ABSENT, kw_only=True)
    train_rmse: float | None = field(default=ABSENT, kw_only=True)
    train_rmse_log: float | None = field(default=ABSENT, kw_only=True)
    restarts: FitRestarts = field(default=ABSENT, kw_only=True)
    bootstrap: FitBootstrap = field(default=ABSENT, kw_only=True)
    heldout_rmse: float | None = field(default=ABSENT, kw_only=True)
    heldout_rmse_log: float | None = field(default=ABSENT, kw_only=True)
    heldout_splits: int = field(default=ABSENT, kw_only=True)
    heldout_n_test: int = field(default=ABSENT, kw_only=True)
    paper: PaperFit = field(default=ABSENT, kw_only=True)
    optimal_shape: dict[str, Any]  # width and depth that minimise the fit at each budget
    settings: dict[str, Any]
    seconds: float

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ScalingFitResult:
        return from_doc(cls, upgrade_result("scaling-fit", dict(doc)))


@dataclass(frozen=True)
class PcaSample:
    """results/dynamics.json `pca.sample`: a fixed random sample of the tokens (at most a few
    hundred) in the first two PCA components, with their clusters, for a scatter of the clusters
    (absent before anatomy-tui 0.3). `token` indexes the analysed tokens in reading order."""

    token: list[int]
    pc1: list[float]
    pc2: list[float]
    label: list[int]


@dataclass(frozen=True)
class ToyDepthCurve:
    """One (regime, temperature) curve of results/toy-depth.json: the held-out loss of every
    student depth (mean over seeds, and per seed) and the law L = c / l^alpha_l (+ L0) fitted to it,
    with alpha_l's bootstrap interval; all None where too few depths had a loss to fit."""

    depths: list[int]
    loss: list[float | None]
    loss_per_seed: list[list[float | None]]
    alpha_l: float | None
    c: float | None
    L0: float | None
    ci95: list[float] | None
    se: float | None = field(default=ABSENT, kw_only=True)  # alpha_l's bootstrap sd; ABSENT where not fitted
    bootstrap_valid: int  # bootstrap draws with enough depths to fit


@dataclass(frozen=True)
class ToyDepthResult:
    """results/toy-depth.json."""

    preset: str
    regimes: dict[str, ToyDepthCurve]  # at the first temperature
    temperature: float  # the first temperature
    by_temperature: dict[str, dict[str, ToyDepthCurve]]  # temperature (as %g) -> regime -> curve
    fit: str  # the law fitted
    settings: dict[str, Any]
    seconds: float

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ToyDepthResult:
        return from_doc(cls, upgrade_result("toy-depth", dict(doc)))


@dataclass(frozen=True)
class DynamicsCore:
    """results/dynamics.json `core`: medians over the middle half of the layers (`layers`, first and
    last), the numbers behind 'updates near 90 degrees'."""

    layers: list[int]
    angle_update_median: float | None
    angle_state_median: float | None
    relative_update_median: float | None


@dataclass(frozen=True)
class TokenCluster:
    """One cluster of results/dynamics.json `pca.clusters`, largest (label 0, the bulk) first."""

    label: int
    bulk: bool
    size: int  # tokens
    fraction: float
    median_position: float
    top_tokens: list[list[Any]]  # [token, count], most frequent first
    angle_state_median: list[float | None]  # per layer, over the cluster's tokens
    angle_update_median: list[float | None]
    examples: list[str]  # the most typical tokens in context, the token in [[ ]]


@dataclass(frozen=True)
class DynamicsPca:
    """results/dynamics.json `pca`: PCA of the per-token angle profiles, KMeans in PCA space."""

    profile: str
    explained: list[float]
    k: int
    k_choice: str
    silhouette: dict[str, float]  # k -> silhouette score (empty when --clusters fixed k)
    bulk_fraction: float
    clusters: list[TokenCluster]
    sample: PcaSample | None = None  # absent before anatomy-tui 0.3


@dataclass(frozen=True)
class LensLosses:
    """results/dynamics.json `logit_lens`: the next-token loss read at every layer."""

    lens: str | None = field(default=None, kw_only=True)  # plain or last-block; absent in 0.1 sessions
    loss: list[float | None]  # per layer
    final_loss: float | None
    predicted_tokens: int


@dataclass(frozen=True)
class DynamicsResult:
    """results/dynamics.json."""

    model: str
    tokens: int
    texts: int
    text_source: str
    first_token: str  # included or excluded
    n_layers: int
    seconds: float
    settings: dict[str, Any]
    embedding_norm: Quartiles
    core: DynamicsCore
    layers: list[DynamicsRow]
    pca: DynamicsPca
    logit_lens: LensLosses | None  # None without --logit-lens

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DynamicsResult:
        return from_doc(cls, upgrade_result("dynamics", dict(doc)))


@dataclass(frozen=True)
class GrowthArm:
    """One arm of results/growth.json: losses per seed and their spread, time and throughput."""

    val_loss: list[float]
    mean: float
    sd: float
    seconds: float
    seconds_sd: float
    tokens_per_s: float
    tokens_per_s_sd: float
    steps: int
    tokens: int
    phases: list[dict[str, Any]]
    model: str | None



# prune -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PruneCut:
    """One point of results/prune.json's `curve` (and its `exported_point`): the `removed` layers
    `layers` (original indices from 0) that `method` cuts, the perplexity without them with its
    bootstrap interval, and after healing (None without --heal-steps). With --evaluate-tasks:
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
    chinchilla: dict[str, Any]


@dataclass(frozen=True)
class PruneHeal:
    """results/prune.json `heal`: how every cut was healed."""

    steps: int
    what: str  # adjacent or lora
    train_source: str
    train_blocks: int


@dataclass(frozen=True)
class PruneResult:
    """results/prune.json."""

    model: str
    baseline_ppl: float
    eval_tokens: int
    eval_texts: int
    n_layers: int
    settings: dict[str, Any]
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
    evaluation: LmEvalProtocol = field(default=ABSENT, kw_only=True)  # with --evaluate-tasks
    baseline_accuracy: list[TaskScore] = field(default=ABSENT, kw_only=True)  # the full model's
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PruneResult:
        return from_doc(cls, upgrade_result("prune", dict(doc)))


# growth ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrowthBudgetRow:
    """One layer of results/growth.json `budget_table`: the effective steps and epochs it trains
    in each arm (arm name -> number)."""

    layer: int
    layer_class: str
    steps: dict[str, int]
    epochs: dict[str, float]


@dataclass(frozen=True)
class GrowthWidths:
    """results/growth.json `widths`: the growth arm's FFN width per layer, the uniform arm's one width."""

    growth: list[int] | None
    uniform: int | None


@dataclass(frozen=True)
class GrowthData:
    """results/growth.json `data`: the character-level corpus the arms trained on."""

    source: str
    tokenizer: str
    vocab_size: int
    train_tokens: int
    val_tokens: int
    batch_tokens: int


@dataclass(frozen=True)
class GrowthResult:
    """results/growth.json."""

    preset: str
    params: dict[str, int]  # growth and uniform: parameters of each arm's full model
    arms: dict[str, GrowthArm]
    phases: list[dict[str, Any]]  # the growth arm's phases: the phase table's entry, start, seconds, tokens/s
    generations: list[dict[str, str]]  # per prompt: "prompt" and each arm's greedy text
    budget_table: list[GrowthBudgetRow]
    ratio_uniform_over_growth_seconds: float | None
    profile: list[str]
    widths: GrowthWidths
    data: GrowthData
    settings: dict[str, Any]
    paper: dict[str, float]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GrowthResult:
        return from_doc(cls, upgrade_result("growth", dict(doc)))


# evaluate ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskScore:
    """One lm-eval task (or group) scored on one model: accuracy and length-normalised accuracy with
    their standard errors under lm-eval's default filter (None where the task has no such metric),
    the items scored, and every numeric metric as lm-eval names it (`acc,none`)."""

    task: str
    acc: float | None
    acc_stderr: float | None
    acc_norm: float | None
    acc_norm_stderr: float | None
    samples: int
    metrics: dict[str, float | None]


@dataclass(frozen=True)
class GenerationCheck:
    """Greedy continuations of the fixed prompts (engine/evaluation/accuracy.py PROMPTS) by one model, and how
    much of the original's they reproduce: up to the first divergence (`prefix_agreement`) and
    position by position (`token_agreement`), as fractions of the longer continuation, counted in
    tokens, or in characters where the model's tokenizer is not the original's (`unit`)."""

    texts: list[str]
    unit: str
    prefix_agreement: float
    token_agreement: float


@dataclass(frozen=True)
class LmEvalProtocol:
    """What lm-eval's numbers depend on, recorded with them: two evaluations compare only when
    these match (the batch size too: lm-eval's scores move with it)."""

    tasks: list[str]
    batch_size: int
    limit: float | None
    num_fewshot: int | None  # None: each task's own
    include_path: str | None
    lm_eval_version: str
    n_shot: dict[str, int]  # as lm-eval ran each task
    task_versions: dict[str, Any]


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


@dataclass(frozen=True)
class EvaluateResult:
    """results/evaluate.json: the loaded model and its variants side by side, original first. A run
    keeps the earlier run's rows for the variants it did not evaluate when model and protocol match."""

    model: str
    protocol: LmEvalProtocol
    prompts: list[str]
    gen_tokens: int
    models: list[EvaluatedModel]
    settings: dict[str, Any]
    seconds: float

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EvaluateResult:
        return from_doc(cls, doc)


def events_markdown() -> str:
    """The README's table of live events, generated from the classes above (a test compares)."""
    lines = ["| kind | fields | meaning |", "|---|---|---|"]
    for kind, cls in _EVENT_TYPES.items():
        names = ", ".join(f.name for f in dataclasses.fields(cls) if f.name not in ("job", "t"))
        doc = " ".join((cls.__doc__ or "").split())
        lines.append(f"| `{kind}` | {names} | {doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(events_markdown())
