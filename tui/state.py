"""What the console knows about a session, rebuilt from its event log and results alone.

The console never recomputes on reopen: it replays `events.jsonl`, decoded into the typed events of
`engine.core.events` and each experiment's vocabulary (torch-free, so torch stays unimported), and
reads `results/*.json` into the result types there. Events and results are folded by their kind and
name, so an experiment's vocabulary is imported when its first event or result is read, not before
the first paint. Each panel asks only for the part it draws; `dirty` says which parts changed.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from engine.core.events import (
    Cancelling,
    Event,
    Finished,
    Message,
    Progress,
    Result,
    ResultDocument,
    Started,
    decode_or_none,
)
from engine.registry import BY_NAME

if TYPE_CHECKING:  # an experiment's vocabulary is imported with its first event or result, never to paint
    from engine.experiments.ablation.vocabulary import AblationMap, AblationProxies, AblationRow, LayerAblated
    from engine.experiments.dynamics.vocabulary import DynamicsResult, DynamicsRow
    from engine.experiments.growth.vocabulary import (
        GrowthArm,
        GrowthArmDone,
        GrowthEval,
        GrowthPhase,
        GrowthPhaseEnd,
        GrowthPlan,
        GrowthResult,
        GrowthStep,
    )
    from engine.experiments.recovery.vocabulary import (
        RecoveryLayer,
        RecoveryPoint,
        RecoveryResult,
        RecoveryRow,
        RecoveryStart,
    )

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R", bound=ResultDocument)


class Dirty:
    """The parts of the console a change marks for redrawing (`SessionState.dirty`), named once:
    the state marks them, the app and the console screen read them."""

    LAYERS = "layers"  # the layer map and the layer detail
    RECOVERY = "recovery"
    GROWTH = "growth"
    RESULTS = "results"  # a result file: the map's columns and every analysis
    JOBS = "jobs"  # the status line's running jobs
    SELECTION = "selection"  # the map's selected layer
    LOG = "log"
    MARKS = "marks"  # the layers marked for the prompt pane's modified and noised models
    EVERY = frozenset({LAYERS, RECOVERY, GROWTH, RESULTS, JOBS, SELECTION, LOG, MARKS})


CLASSES = ("critical", "important", "minor", "redundant", "anti")
MAX_POINTS = 400  # per curve: about twice the widest plot, older points are thinned


def thin(points: list[T], limit: int = MAX_POINTS) -> list[T]:
    """Every other point of the older half once a curve outgrows `limit`, keeping the newest exact."""
    if len(points) <= limit:
        return points
    half = len(points) // 2
    return points[:half:2] + points[half:]


def layer_class(row: AblationRow) -> str:
    """'anti' when ablating the layer measurably helps; otherwise the engine's class."""
    return "anti" if row.anti else row.layer_class


@dataclass
class JobView:
    """One job as the status line and the picker show it."""

    id: str
    experiment: str  # as its Started event or its job file records it; "" until one is read
    status: str = "running"
    done: int = 0
    total: int = 0
    label: str = ""
    error: str = ""
    pid: int | None = None
    cancelling: bool = False  # asked to stop (key c), still running until its own word or its process ends


@dataclass
class RecoveryRun:
    """One noise-injection run on one layer: its curve of eval perplexity against steps."""

    job: str
    layer: int
    repeat: int = 0
    sigma: float | None = None
    steps: int | None = None
    lr: float | None = None
    baseline_ppl: float | None = None
    noised_ppl: float | None = None
    points: list[tuple[float, float]] = field(default_factory=list)
    status: str = "running"
    summary: RecoveryRow | None = None

    @property
    def label(self) -> str:
        sigma = "" if self.sigma is None else f" σ={self.sigma:g}"
        repeat = f" #{self.repeat}" if self.repeat else ""
        return f"L{self.layer}{sigma}{repeat}"


@dataclass
class GrowthView:
    """A growth run: the plan, where each arm is, and its loss curves."""

    job: str = ""
    plan: GrowthPlan | None = None
    current: dict[str, GrowthPhase] = field(default_factory=dict)  # arm -> the phase it is in
    step: dict[str, int] = field(default_factory=dict)
    train: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    val: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    phase_done: dict[str, list[GrowthPhaseEnd]] = field(default_factory=dict)
    arm_done: dict[str, GrowthArmDone] = field(default_factory=dict)
    status: str = ""


class SessionState:
    """Folds events and result files into what the panels draw."""

    def __init__(self) -> None:
        self.ablation: dict[int, AblationRow] = {}
        self.ablation_map: AblationMap | None = None
        self.ablation_parts: dict[tuple[int, str], AblationRow] = {}  # (layer, "attention"/"mlp") -> row (--part)
        self.ablation_baseline: float | None = None
        self.ablation_layers: int | None = None  # depth told by the live events
        self.proxies: AblationProxies | None = None  # the first pass's Block Influence and angles
        self.recovery: list[RecoveryRun] = []
        self.difficulty: dict[int, RecoveryRow] = {}
        self.growth = GrowthView()
        self.growth_arms: dict[str, GrowthArm] = {}
        self.growth_preview: tuple[str, dict[str, Any]] | None = None  # (flags, planned arms) before a run
        self.dynamics: list[DynamicsRow] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, JobView] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        self.log: deque[tuple[str, str]] = deque(maxlen=500)
        self.new_log: deque[tuple[str, str]] = deque(maxlen=500)
        self.dirty: set[str] = set()

    # results --------------------------------------------------------------------------------
    def set_result(self, name: str, doc: dict[str, Any]) -> str:
        """Keeps the result and decodes what the panels draw from it. Returns why it cannot be drawn
        ("" when it can): written by another version or damaged, it is kept raw and its panels stay empty."""
        self.results[name] = doc
        self.dirty.add(Dirty.RESULTS)
        take = _RESULT_HANDLERS.get(name)
        if take is None:
            return ""
        unfit: list[Exception] = []
        result = decode_or_none(BY_NAME[name].result_class, doc, on_error=unfit.append)
        if result is None:
            why = f"{type(unfit[0]).__name__}: {unfit[0]}" if unfit else "no document"
            log.warning("result %s does not fit this version (%s); its panels stay empty", name, why)
            return why
        take(self, result)
        return ""

    def result(self, cls: type[R]) -> R | None:
        """The session's result of this class (results/<cls.name>.json) decoded; None when there is
        none, or one that does not fit this version."""
        return decode_or_none(cls, self.results.get(cls.name))

    def _ablation_map(self, result: AblationMap) -> None:
        self.ablation_map = result
        self.ablation = {row.layer: row for row in result.layers}
        self.ablation_parts = {(row.layer, row.part): row for row in result.parts or ()}
        self.ablation_baseline = result.baseline_ppl
        self.dirty.add(Dirty.LAYERS)

    def _recovery_result(self, result: RecoveryResult) -> None:
        for summary in result.layers:
            self.difficulty[summary.layer] = summary
        self.dirty.add(Dirty.LAYERS)

    def _growth_result(self, result: GrowthResult) -> None:
        self.growth_arms = result.arms
        self.dirty.add(Dirty.GROWTH)

    def _dynamics_result(self, result: DynamicsResult) -> None:
        self.dynamics = result.layers

    # events ---------------------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Folds one event in; a kind the console does not draw, or an event whose values do not fit
        (the log is untrusted: a string for a step), is logged and skipped."""
        handler = _HANDLERS.get(event.kind)
        if handler is None:
            log.debug("no panel draws %s events; skipped", event.kind)
            return
        try:
            handler(self, event)
        except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError) as exc:  # a forged line
            log.warning("skipped a %s event that does not fit (%s: %s)", event.kind, type(exc).__name__, exc)

    def _started(self, event: Started) -> None:
        self.jobs[event.job] = JobView(event.job, event.experiment)
        self.specs[event.job] = event.spec
        self.dirty.add(Dirty.JOBS)
        if event.experiment == "growth":
            self.growth = GrowthView(job=event.job, status="running")
            self.dirty.add(Dirty.GROWTH)

    def _progress(self, event: Progress) -> None:
        view = self.jobs.get(event.job)
        if view is not None:
            view.done, view.total, view.label = event.done, event.total, event.label
            self.dirty.add(Dirty.JOBS)

    def _message(self, event: Message) -> None:
        self.add_log(*log_line(event))

    def _cancelling(self, event: Cancelling) -> None:
        view = self.jobs.get(event.job)
        if view is not None and view.status == "running":
            view.label = "cancelling"
            self.dirty.add(Dirty.JOBS)
        self.add_log("warning", f"{event.job} cancelling: it stops at its next forward")

    def _result(self, event: Result) -> None:
        self.set_result(event.name, event.data)

    def _finished(self, event: Finished) -> None:
        job = event.job
        view = self._job(job)
        view.error = event.error
        self.add_log(*log_line(event))
        self.mark_job(job, event.status)

    def _job(self, job: str) -> JobView:
        """The job's view; one the log never saw start (its line torn) knows its experiment once
        `follow_job_files` reads its job file: a job id is never parsed for it."""
        return self.jobs.setdefault(job, JobView(job, ""))

    def mark_job(self, job: str, status: str) -> None:
        """A job ended (its own word, or its process is gone): so did its runs."""
        view = self._job(job)
        view.status = status
        self.dirty.add(Dirty.JOBS)
        for run in self.recovery:
            if run.job == job and run.status == "running":
                run.status = status
                self.dirty.add(Dirty.RECOVERY)
        if self.growth.job == job:
            self.growth.status = status
            self.dirty.add(Dirty.GROWTH)

    def cancelling(self, jobs: Iterable[str]) -> None:
        """The running `jobs` were asked to stop: the status line and their panels say so at once."""
        for job in jobs:
            view = self.jobs.get(job)
            if view is not None and view.status == "running":
                view.cancelling = True
                self.dirty.update({Dirty.JOBS, Dirty.LAYERS, Dirty.RECOVERY, Dirty.GROWTH})

    def shown_status(self, job: str, status: str) -> str:
        """A run's status as its panel says it: `cancelling` while its running job was asked to stop."""
        view = self.jobs.get(job)
        return "cancelling" if status == "running" and view is not None and view.cancelling else status

    def follow_job_files(self, docs: Mapping[str, Mapping[str, Any]]) -> None:
        """Reads the job files (`Session.jobs()`) into the jobs: where each runs (its pid), the
        experiment its file records, and a job whose process is gone without a 'finished' event (or
        that left no job file) reads as its file says: interrupted; one a --resume finished since
        reads resumed."""
        for job_id, view in self.jobs.items():
            doc = docs.get(job_id, {"status": "interrupted"})
            view.pid = doc.get("pid")
            view.experiment = view.experiment or str(doc.get("experiment") or "")
            ended = view.status == "running" and doc.get("status") != "running"
            if ended or (doc.get("status") == "resumed" != view.status):
                self.mark_job(job_id, str(doc.get("status")))

    def _ablation_layer(self, event: LayerAblated) -> None:
        row = event.row()
        if event.part:  # a block's row (--part) stands beside its layer's, never in its place
            self.ablation_parts[(event.layer, event.part)] = row
        else:
            self.ablation[event.layer] = row
        if self.ablation_baseline is None:
            self.ablation_baseline = event.baseline_ppl
        self.ablation_layers = event.n_layers
        self.dirty.add(Dirty.LAYERS)

    def _ablation_proxies(self, event: AblationProxies) -> None:
        self.proxies = event
        self.ablation_layers = len(event.block_influence)
        if self.ablation_baseline is None:
            self.ablation_baseline = event.baseline_ppl
        self.dirty.update({Dirty.LAYERS, Dirty.RECOVERY})

    def proxy(self, layer: int) -> tuple[float | None, float | None]:
        """(Block Influence, angular distance) of a layer: the map's, else the first pass's."""
        row = self.ablation.get(layer)
        if row is not None and row.block_influence is not None:
            return row.block_influence, row.angular_distance
        if self.proxies is not None and layer < len(self.proxies.block_influence):
            return self.proxies.block_influence[layer], self.proxies.angular_distance[layer]
        return None, None

    def recovering(self) -> set[int]:
        """The layers a recovery run is working on now."""
        return {run.layer for run in self.recovery if run.status == "running"}

    # recovery -------------------------------------------------------------------------------
    def _run_for(self, job: str, layer: int, repeat: int) -> RecoveryRun:
        for run in reversed(self.recovery):
            if (run.job, run.layer, run.repeat) == (job, layer, repeat):
                return run
        spec = self.specs.get(job, {})
        run = RecoveryRun(job=job, layer=layer, repeat=repeat, sigma=_number(spec.get("sigma")),
                          lr=_number(spec.get("lr")), steps=spec.get("steps"))
        self.recovery.append(run)
        return run

    def _recovery_start(self, event: RecoveryStart) -> None:
        run = self._run_for(event.job, event.layer, event.repeat)
        run.baseline_ppl = _number(event.baseline_ppl)
        run.noised_ppl = _number(event.ppl_after_noise)
        run.steps = event.steps
        self.dirty.add(Dirty.RECOVERY)

    def _recovery_point(self, event: RecoveryPoint) -> None:
        run = self._run_for(event.job, event.layer, event.repeat)
        ppl = _number(event.eval_ppl)
        if ppl is not None:
            run.points = thin([*run.points, (float(event.step), ppl)])
        self.dirty.add(Dirty.RECOVERY)

    def _recovery_layer(self, event: RecoveryLayer) -> None:
        for run in self.recovery:
            if run.job == event.job and run.layer == event.layer:
                run.status = "done"
                run.summary = event.result
        self.difficulty[event.layer] = event.result
        self.dirty.update({Dirty.RECOVERY, Dirty.LAYERS})

    # growth -----------------------------------------------------------------------------------
    def _growth_plan(self, event: GrowthPlan) -> None:
        if self.growth.job != event.job:
            self.growth = GrowthView(job=event.job, status="running")
        self.growth.plan = event
        self.dirty.add(Dirty.GROWTH)

    def _growth_phase(self, event: GrowthPhase) -> None:
        self.growth.current[event.arm] = event
        self.dirty.add(Dirty.GROWTH)

    def _growth_step(self, event: GrowthStep) -> None:
        arm = _arm_key(event.arm, event.seed)
        self.growth.step[arm] = event.step
        loss = _number(event.train_loss)
        if loss is not None:
            self.growth.train[arm] = thin([*self.growth.train.get(arm, []), (float(event.step), loss)])
        self.dirty.add(Dirty.GROWTH)

    def _growth_eval(self, event: GrowthEval) -> None:
        arm = _arm_key(event.arm, event.seed)
        loss = _number(event.val_loss)
        if loss is not None:
            self.growth.val[arm] = thin([*self.growth.val.get(arm, []), (float(event.step), loss)])
        self.dirty.add(Dirty.GROWTH)

    def _growth_phase_end(self, event: GrowthPhaseEnd) -> None:
        self.growth.phase_done.setdefault(event.arm, []).append(event)
        self.dirty.add(Dirty.GROWTH)

    def _growth_arm_done(self, event: GrowthArmDone) -> None:
        self.growth.arm_done[_arm_key(event.arm, event.seed)] = event
        self.dirty.add(Dirty.GROWTH)

    def add_log(self, level: str, text: str) -> None:
        self.log.append((level, text))
        self.new_log.append((level, text))
        self.dirty.add(Dirty.LOG)

    def take_new_log(self) -> list[tuple[str, str]]:
        lines = list(self.new_log)
        self.new_log.clear()
        return lines

    # queries ----------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        if self.ablation_layers is not None:
            return self.ablation_layers
        return max(self.ablation, default=-1) + 1

    def running_jobs(self) -> list[JobView]:
        return [job for job in self.jobs.values() if job.status == "running"]

    def take_dirty(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        return dirty


Span = tuple[int, int]  # one line of the event log: [start, end) in bytes, its newline included


class LineKeeper:
    """Folds events into `state` and remembers which lines of the log the state still depends on
    (`spans`): every line that changes it for good, each job's last progress line, the newest
    messages the log panel keeps, each curve's points' lines (thinned with the points, `thin`) and
    each growth arm's last step. Folding just those lines, in order, gives the same state as folding
    them all: what tui/event_index.py writes down so a large log opens fast."""

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self._kept: list[Span] = []
        self._progress: dict[str, Span] = {}
        self._messages: deque[Span] = deque(maxlen=state.log.maxlen)
        self._recovery: dict[tuple[str, int, int], list[Span]] = {}
        self._runs: dict[tuple[str, int, int], RecoveryRun] = {}
        self._growth = state.growth  # the growth view the lines below belong to
        self._train: dict[str, list[Span]] = {}
        self._val: dict[str, list[Span]] = {}
        self._step: dict[str, Span] = {}

    def fold(self, span: Span, event: Event) -> None:
        try:
            self._fold(span, event)
        except TypeError:  # a forged line whose values cannot be keys (a list for a layer): kept whole
            self._kept.append(span)

    def _fold(self, span: Span, event: Event) -> None:
        kind, state = event.kind, self.state
        if kind == RECOVERY_POINT:
            key = (event.job, event.layer, event.repeat)
            before = self._points(key)
            state.apply(event)
            if self._points(key) is not before:  # a point was added (and the curve maybe thinned)
                self._recovery[key] = thin([*self._recovery.get(key, []), span])
            return
        if kind in (GROWTH_STEP, GROWTH_EVAL):
            if state.growth is not self._growth:
                self._growth, self._train, self._val, self._step = state.growth, {}, {}, {}
            arm = _arm_key(event.arm, event.seed)
            series, lines = (state.growth.train, self._train) if kind == GROWTH_STEP else (state.growth.val, self._val)
            before = series.get(arm)
            state.apply(event)
            if series.get(arm) is not before:
                lines[arm] = thin([*lines.get(arm, []), span])
            if kind == GROWTH_STEP:
                self._step[arm] = span
            return
        state.apply(event)
        if kind == Progress.kind:
            self._progress[event.job] = span
        elif kind == Message.kind:
            self._messages.append(span)
        elif kind in _HANDLERS:
            self._kept.append(span)

    def _points(self, key: tuple[str, int, int]) -> list[tuple[float, float]] | None:
        """The points of the recovery run `key` (job, layer, repeat), as `SessionState._run_for` finds it
        (a run, once made, stays the one for its key)."""
        run = self._runs.get(key)
        if run is None:
            run = next((run for run in reversed(self.state.recovery) if (run.job, run.layer, run.repeat) == key), None)
            if run is None:
                return None
            self._runs[key] = run
        return run.points

    def spans(self) -> list[Span]:
        """The lines the state depends on, in the log's order."""
        spans = {*self._kept, *self._progress.values(), *self._messages}
        for lines in self._recovery.values():
            spans.update(lines)
        if self._growth is self.state.growth:
            for series in (*self._train.values(), *self._val.values()):
                spans.update(series)
            spans.update(self._step.values())
        return sorted(spans)


def log_line(event: Message | Finished) -> tuple[str, str]:
    """(level, text) of the log panel's line for a message or a job's end."""
    if isinstance(event, Message):
        return event.level, f"{event.job}: {event.text}" if event.job else event.text
    level = "info" if event.status == "done" else "error" if event.status == "failed" else "warning"
    return level, f"{event.job} {event.status} {event.error}".rstrip()


def _arm_key(arm: str, seed: int) -> str:
    return arm if seed == 0 else f"{arm}/{seed}"


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


# what the console folds, by event kind and result name: its own words for the experiments' (each
# vocabulary's class declares the same kind; a test checks they agree)
RECOVERY_POINT, GROWTH_STEP, GROWTH_EVAL = "recovery.point", "growth.step", "growth.eval"
_HANDLERS: dict[str, Callable[[SessionState, Any], None]] = {
    Started.kind: SessionState._started,
    Progress.kind: SessionState._progress,
    Message.kind: SessionState._message,
    Cancelling.kind: SessionState._cancelling,
    Result.kind: SessionState._result,
    Finished.kind: SessionState._finished,
    "ablation.layer": SessionState._ablation_layer,
    "ablation.proxies": SessionState._ablation_proxies,
    "recovery.start": SessionState._recovery_start,
    RECOVERY_POINT: SessionState._recovery_point,
    "recovery.layer": SessionState._recovery_layer,
    "growth.plan": SessionState._growth_plan,
    "growth.phase": SessionState._growth_phase,
    GROWTH_STEP: SessionState._growth_step,
    GROWTH_EVAL: SessionState._growth_eval,
    "growth.phase_end": SessionState._growth_phase_end,
    "growth.arm_done": SessionState._growth_arm_done,
}
# the results whose contents the panels draw (the others are kept as they are, for the Analyses views)
_RESULT_HANDLERS: dict[str, Callable[[SessionState, Any], None]] = {
    "ablation": SessionState._ablation_map,
    "recovery": SessionState._recovery_result,
    "growth": SessionState._growth_result,
    "dynamics": SessionState._dynamics_result,
}
