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
    count_text,
)
from sessions.documents import Damaged, JobRecord, typed_result
from tui.depth_family_records import FamilyView
from tui.panel_records import MAX_POINTS, GrowthView, JobView, RecoveryRun, layer_class, thin

# the panels' records (tui/panel_records.py) are imported from here too
__all__ = ["MAX_POINTS", "Dirty", "GrowthView", "JobView", "RecoveryRun", "SessionState", "Span", "job_progress",
           "layer_class", "layer_list", "log_line", "thin"]

if TYPE_CHECKING:
    from engine.atlas.table import (
        AtlasDocument,  # an experiment's vocabulary is imported with its first event or result, never to paint
    )
    from engine.experiments.ablation.vocabulary import (
        AblationMap,
        AblationProxies,
        AblationRow,
        LayerAblated,
        LayerProxies,
    )
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
_NO_FILE = JobRecord(status="interrupted")  # a job that left no job file: its process is gone


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


class SessionState:
    """Folds events and result files into what the panels draw."""

    def __init__(self) -> None:
        self.ablation: dict[int, AblationRow] = {}
        self.ablation_map: AblationMap | None = None
        self.ablation_parts: dict[tuple[int, str], AblationRow] = {}  # (layer, "attention"/"mlp") -> row (--part)
        self.ablation_baseline: float | None = None
        self.ablation_layers: int | None = None  # depth told by the live events
        self.proxies: AblationProxies | None = None  # the first pass's Block Influence and angles
        self.passed: dict[int, tuple[float, float]] = {}  # a streamed map's, as its wavefront passes each layer
        self.previous: set[int] = set()  # rows of the whole map on record while a new map measures them again
        self.recovery: list[RecoveryRun] = []
        self.difficulty: dict[int, RecoveryRow] = {}
        self.growth = GrowthView()
        self.growth_arms: dict[str, GrowthArm] = {}
        self.growth_preview: tuple[str, dict[str, Any]] | None = None  # (flags, planned arms) before a run
        self.dynamics: list[DynamicsRow] = []
        self.family = FamilyView()  # the latest depth-family run, live (tui/depth_family_records.py)
        self.results: dict[str, dict[str, Any]] = {}  # as written (the Analyses pane's trees show them)
        self.typed: dict[str, ResultDocument | AtlasDocument] = {}  # the same, read as their classes
        self.jobs: dict[str, JobView] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        self.log: deque[tuple[str, str]] = deque(maxlen=500)
        self.new_log: deque[tuple[str, str]] = deque(maxlen=500)
        self.dirty: set[str] = set()

    # results --------------------------------------------------------------------------------
    def set_result(self, name: str, doc: dict[str, Any]) -> str:
        """Keeps the result, read as its class by the one reader (sessions/documents.py), and what
        the panels draw from it. Returns why a result the panels draw cannot be drawn ("" when it
        can): written by another version or damaged, it is kept as written and its panels stay empty."""
        self.results[name] = doc
        self.dirty.add(Dirty.RESULTS)
        try:
            result = typed_result(name, doc, f"results/{name}.json")
        except Damaged as exc:
            self.typed.pop(name, None)
            if name not in _RESULT_HANDLERS:
                return ""  # the Analyses pane shows it as written
            log.warning("result %s does not fit this version (%s); its panels stay empty", name, exc.why)
            return exc.why
        self.typed[name] = result
        take = _RESULT_HANDLERS.get(name)
        if take is not None:
            take(self, result)
        return ""

    def result(self, cls: type[R]) -> R | None:
        """The session's result of this class (results/<cls.name>.json) as its class; None when
        there is none, or one that does not fit this version."""
        found = self.typed.get(cls.name)
        return found if isinstance(found, cls) else None

    def _ablation_map(self, result: AblationMap) -> None:
        self.ablation_map = result
        self.ablation = {row.layer: row for row in result.layers}
        self.ablation_parts = {(row.layer, row.part): row for row in result.parts or ()}
        self.ablation_baseline = result.baseline_ppl
        self.previous = set()
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
        if event.experiment == "ablation":  # a new map: the layer map and its detail say it runs
            self.passed = {}
            whole = self.ablation_map is None or self.ablation_map.partial is not True  # a partial one it goes on
            self.previous = set(self.ablation) if whole else set()
            self.dirty.add(Dirty.LAYERS)

    def _progress(self, event: Progress) -> None:
        view = self.jobs.get(event.job)
        if view is not None:
            view.done, view.total, view.label = event.done, event.total, event.label
            view.phase, view.unit = event.phase, event.unit
            self.dirty.add(Dirty.JOBS)
            if view.experiment == "ablation":  # the layer map's line and its detail show the map's progress
                self.dirty.add(Dirty.LAYERS)

    def _message(self, event: Message) -> None:
        self.add_log(*log_line(event))

    def _cancelling(self, event: Cancelling) -> None:
        self.cancelling([event.job])  # its own word: shown as the key c shows it
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
        if view.experiment == "ablation":  # the layer map and its detail stop saying it runs
            self.dirty.add(Dirty.LAYERS)
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

    def follow_job_files(self, records: Mapping[str, JobRecord]) -> None:
        """Reads the job files (`Session.job_records()`) into the jobs: where each runs (its pid), the
        experiment its file records, and a job whose process is gone without a 'finished' event (or
        that left no job file) reads as its file says: interrupted; one a --resume finished since
        reads resumed."""
        for job_id, view in self.jobs.items():
            record = records.get(job_id, _NO_FILE)
            view.pid = record.pid or None
            view.experiment = view.experiment or record.experiment
            ended = view.status == "running" and record.status != "running"
            if ended or (record.status == "resumed" != view.status):
                self.mark_job(job_id, record.status)

    def _ablation_layer(self, event: LayerAblated) -> None:
        row = event.row()
        if event.part:  # a block's row (--part) stands beside its layer's, never in its place
            self.ablation_parts[(event.layer, event.part)] = row
        else:
            self.ablation[event.layer] = row
            self.previous.discard(event.layer)
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

    def _layer_proxies(self, event: LayerProxies) -> None:
        self.passed[event.layer] = (event.block_influence, event.angular_distance)
        self.ablation_layers = event.n_layers
        self.dirty.add(Dirty.LAYERS)

    def proxy(self, layer: int) -> tuple[float | None, float | None]:
        """(Block Influence, angular distance) of a layer: a streamed map's as its wavefront passed
        the layer (the newest), else the map's, else its first pass's."""
        if layer in self.passed:
            return self.passed[layer]
        row = self.ablation.get(layer)
        if row is not None and row.block_influence is not None:
            return row.block_influence, row.angular_distance
        if self.proxies is not None and layer < len(self.proxies.block_influence):
            return self.proxies.block_influence[layer], self.proxies.angular_distance[layer]
        return None, None

    def map_job(self) -> JobView | None:
        """The running layer map's job (in the console or its own process), if one runs."""
        return next((job for job in self.running_jobs() if job.experiment == "ablation"), None)

    def wavefront(self) -> int | None:
        """The layer a running streamed map reads now; None when no map streams its layers."""
        job = self.map_job()
        return job.done if job is not None and job.phase == "streaming" and job.done < job.total else None

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

    # the depth family ------------------------------------------------------------------------
    def _family(self, event: Event) -> None:
        self.family.apply(event)
        self.dirty.add(Dirty.RESULTS)  # its view in the Analyses pane draws the curves and the table

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


def layer_list(layers: Iterable[int]) -> str:
    """0-3,7: runs of consecutive layers as ranges."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def job_progress(job: JobView) -> str:
    """Where a job is, as the panels say it: its count, `cancelling` once asked to stop, and a streamed
    map's wavefront by the layer numbers the map shows (from 0) with the bytes and rate its progress
    line ends with: `streaming: wavefront at layer 12, layers 12/30 passed (1.2 GB read, 0.8 GB/s)`."""
    if job.cancelling:
        return "cancelling"
    if job.phase != "streaming":
        return count_text(job.done, job.total, job.unit)
    reading = job.label[job.label.rfind("("):] if job.label.endswith(")") else ""
    front = f"wavefront at layer {job.done}, " if job.done < job.total else ""
    return f"streaming: {front}layers {job.done}/{job.total} passed {reading}".rstrip()


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
    "ablation.layer_proxies": SessionState._layer_proxies,
    "recovery.start": SessionState._recovery_start,
    RECOVERY_POINT: SessionState._recovery_point,
    "recovery.layer": SessionState._recovery_layer,
    "growth.plan": SessionState._growth_plan,
    "growth.phase": SessionState._growth_phase,
    GROWTH_STEP: SessionState._growth_step,
    GROWTH_EVAL: SessionState._growth_eval,
    "growth.phase_end": SessionState._growth_phase_end,
    "growth.arm_done": SessionState._growth_arm_done,
    **dict.fromkeys(("depth-family.plan", "depth-family.step", "depth-family.member", "depth-family.fit"),
                    SessionState._family),
}
# the results whose contents the panels draw (the others are kept as they are, for the Analyses views)
_RESULT_HANDLERS: dict[str, Callable[[SessionState, Any], None]] = {
    "ablation": SessionState._ablation_map,
    "recovery": SessionState._recovery_result,
    "growth": SessionState._growth_result,
    "dynamics": SessionState._dynamics_result,
}
