"""What the console knows about a session, rebuilt from its event log and results alone.

The console never recomputes on reopen: it replays `events.jsonl` as raw JSON documents (so it can
follow event kinds whose engine module it has not imported, and torch stays unimported) and reads
`results/*.json`. Each panel asks only for the part it draws; `dirty` says which parts changed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

CLASSES = ("critical", "important", "minor", "redundant", "anti")
MAX_POINTS = 400  # per curve: about twice the widest plot, older points are thinned


def thin(points: list[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Every other point of the older half once a curve outgrows `limit`, keeping the newest exact."""
    if len(points) <= limit:
        return points
    half = len(points) // 2
    return points[:half:2] + points[half:]


def layer_class(row: dict[str, Any]) -> str:
    """'anti' when ablating the layer measurably helps; otherwise the engine's class."""
    return "anti" if row.get("anti") else str(row.get("class") or row.get("layer_class") or "")


@dataclass
class JobView:
    """One job as the status line and the picker show it."""

    id: str
    experiment: str
    status: str = "running"
    done: int = 0
    total: int = 0
    label: str = ""
    error: str = ""
    pid: int | None = None


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
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        sigma = "" if self.sigma is None else f" σ={self.sigma:g}"
        repeat = f" #{self.repeat}" if self.repeat else ""
        return f"L{self.layer}{sigma}{repeat}"


@dataclass
class GrowthView:
    """A growth run: the plan, where each arm is, and its loss curves."""

    job: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    current: dict[str, dict[str, Any]] = field(default_factory=dict)  # arm -> phase event
    step: dict[str, int] = field(default_factory=dict)
    train: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    val: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    phase_done: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    arm_done: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: str = ""


class SessionState:
    """Folds event documents and result files into what the panels draw."""

    def __init__(self) -> None:
        self.ablation: dict[int, dict[str, Any]] = {}
        self.ablation_meta: dict[str, Any] = {}
        self.recovery: list[RecoveryRun] = []
        self.difficulty: dict[int, dict[str, Any]] = {}
        self.growth = GrowthView()
        self.results: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, JobView] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        self.log: deque[tuple[str, str]] = deque(maxlen=500)
        self.new_log: deque[tuple[str, str]] = deque(maxlen=500)
        self.dirty: set[str] = set()

    # results --------------------------------------------------------------------------------
    def set_result(self, name: str, doc: dict[str, Any]) -> None:
        self.results[name] = doc
        self.dirty.add("results")
        if name == "ablation":
            self.ablation = {int(row["index"]): dict(row) for row in doc.get("layers", [])}
            self.ablation_meta = {k: v for k, v in doc.items() if k != "layers"}
            self.dirty.add("layers")
        elif name == "recovery":
            for row in doc.get("layers", []):
                if "index" in row:
                    self.difficulty[int(row["index"])] = dict(row)
            self.dirty.add("layers")
        elif name == "growth":
            self.dirty.add("growth")

    # events ---------------------------------------------------------------------------------
    def apply(self, doc: dict[str, Any]) -> None:
        kind = str(doc.get("kind", ""))
        job = str(doc.get("job", ""))
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, job, doc)
        elif kind.startswith(("recovery.", "growth.")):
            self.dirty.add(kind.split(".")[0])

    def _started(self, job: str, doc: dict[str, Any]) -> None:
        self.jobs[job] = JobView(job, str(doc.get("experiment", "")))
        spec = doc.get("spec")
        self.specs[job] = spec if isinstance(spec, dict) else {}
        self.dirty.add("jobs")
        if doc.get("experiment") == "growth":
            self.growth = GrowthView(job=job, status="running")
            self.dirty.add("growth")

    def _progress(self, job: str, doc: dict[str, Any]) -> None:
        view = self.jobs.get(job)
        if view is not None:
            view.done, view.total, view.label = int(doc["done"]), int(doc["total"]), str(doc.get("label", ""))
            self.dirty.add("jobs")

    def _message(self, job: str, doc: dict[str, Any]) -> None:
        self.add_log(
            str(doc.get("level", "info")), f"{job}: {doc.get('text', '')}" if job else str(doc["text"])
        )

    def _result(self, job: str, doc: dict[str, Any]) -> None:
        if isinstance(doc.get("data"), dict):
            self.set_result(str(doc.get("name")), doc["data"])

    def _finished(self, job: str, doc: dict[str, Any]) -> None:
        status = str(doc.get("status", "done"))
        view = self.jobs.setdefault(job, JobView(job, job.split("-")[0]))
        view.error = str(doc.get("error", ""))
        level = "info" if status == "done" else "error" if status == "failed" else "warning"
        self.add_log(level, f"{job} {status} {view.error}".rstrip())
        self.mark_job(job, status)

    def mark_job(self, job: str, status: str) -> None:
        """A job ended (its own word, or its process is gone): so did its runs."""
        view = self.jobs.setdefault(job, JobView(job, job.split("-")[0]))
        view.status = status
        self.dirty.add("jobs")
        for run in self.recovery:
            if run.job == job and run.status == "running":
                run.status = status
                self.dirty.add("recovery")
        if self.growth.job == job:
            self.growth.status = status
            self.dirty.add("growth")

    def _ablation_layer(self, job: str, doc: dict[str, Any]) -> None:
        index = int(doc["index"])
        row = self.ablation.get(index, {})
        row.update(
            index=index,
            ppl=doc["ppl"],
            degradation_pct=doc["degradation_pct"],
            **{"class": doc["layer_class"]},
        )
        self.ablation[index] = row
        self.ablation_meta.setdefault("baseline_ppl", doc.get("baseline_ppl"))
        self.ablation_meta["n_layers"] = doc.get("n_layers")
        self.dirty.add("layers")

    # recovery: fields are read defensively, the engine module may add or rename some ---------
    def _run_for(self, job: str, layer: int, repeat: int) -> RecoveryRun:
        for run in reversed(self.recovery):
            if (run.job, run.layer, run.repeat) == (job, layer, repeat):
                return run
        spec = self.specs.get(job, {})
        run = RecoveryRun(job=job, layer=layer, repeat=repeat, sigma=_number(spec.get("sigma")),
                          lr=_number(spec.get("lr")), steps=spec.get("steps"))
        self.recovery.append(run)
        return run

    def _recovery_start(self, job: str, doc: dict[str, Any]) -> None:
        run = self._run_for(job, int(doc.get("layer", 0)), int(doc.get("repeat", 0)))
        run.baseline_ppl = _number(doc.get("baseline_ppl"))
        run.noised_ppl = _number(doc.get("ppl_after_noise"))
        if isinstance(doc.get("steps"), int):
            run.steps = doc["steps"]
        self.dirty.add("recovery")

    def _recovery_point(self, job: str, doc: dict[str, Any]) -> None:
        run = self._run_for(job, int(doc.get("layer", 0)), int(doc.get("repeat", 0)))
        ppl = _number(doc.get("eval_ppl"))
        if ppl is not None:
            run.points = thin([*run.points, (float(doc.get("step", len(run.points))), ppl)])
        self.dirty.add("recovery")

    def _recovery_layer(self, job: str, doc: dict[str, Any]) -> None:
        index = int(doc.get("index", 0))
        summary = doc.get("result") if isinstance(doc.get("result"), dict) else {}
        for run in self.recovery:
            if run.job == job and run.layer == index:
                run.status = "done"
                run.summary = summary
        self.difficulty[index] = summary
        self.dirty.update({"recovery", "layers"})

    # growth -----------------------------------------------------------------------------------
    def _growth_plan(self, job: str, doc: dict[str, Any]) -> None:
        if self.growth.job != job:
            self.growth = GrowthView(job=job, status="running")
        self.growth.plan = {k: doc[k] for k in ("arms", "seeds", "params", "profile") if k in doc}
        self.dirty.add("growth")

    def _growth_phase(self, job: str, doc: dict[str, Any]) -> None:
        self.growth.current[str(doc["arm"])] = doc
        self.dirty.add("growth")

    def _growth_step(self, job: str, doc: dict[str, Any]) -> None:
        arm = _arm_key(doc)
        self.growth.step[arm] = int(doc["step"])
        loss = _number(doc.get("train_loss"))
        if loss is not None:
            self.growth.train[arm] = thin([*self.growth.train.get(arm, []), (float(doc["step"]), loss)])
        self.dirty.add("growth")

    def _growth_eval(self, job: str, doc: dict[str, Any]) -> None:
        arm = _arm_key(doc)
        loss = _number(doc.get("val_loss"))
        if loss is not None:
            self.growth.val[arm] = thin([*self.growth.val.get(arm, []), (float(doc["step"]), loss)])
        self.dirty.add("growth")

    def _growth_phase_end(self, job: str, doc: dict[str, Any]) -> None:
        self.growth.phase_done.setdefault(str(doc["arm"]), []).append(doc)
        self.dirty.add("growth")

    def _growth_arm_done(self, job: str, doc: dict[str, Any]) -> None:
        self.growth.arm_done[_arm_key(doc)] = doc
        self.dirty.add("growth")

    def add_log(self, level: str, text: str) -> None:
        self.log.append((level, text))
        self.new_log.append((level, text))
        self.dirty.add("log")

    def take_new_log(self) -> list[tuple[str, str]]:
        lines = list(self.new_log)
        self.new_log.clear()
        return lines

    # queries ----------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        known = self.ablation_meta.get("n_layers")
        if isinstance(known, int):
            return known
        return max(self.ablation, default=-1) + 1

    def running_jobs(self) -> list[JobView]:
        return [job for job in self.jobs.values() if job.status == "running"]

    def take_dirty(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        return dirty


def _arm_key(doc: dict[str, Any]) -> str:
    seed = doc.get("seed")
    return f"{doc['arm']}" if seed in (None, 0) else f"{doc['arm']}/{seed}"


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


_HANDLERS = {
    "started": SessionState._started,
    "progress": SessionState._progress,
    "message": SessionState._message,
    "result": SessionState._result,
    "finished": SessionState._finished,
    "ablation.layer": SessionState._ablation_layer,
    "recovery.start": SessionState._recovery_start,
    "recovery.point": SessionState._recovery_point,
    "recovery.layer": SessionState._recovery_layer,
    "growth.plan": SessionState._growth_plan,
    "growth.phase": SessionState._growth_phase,
    "growth.step": SessionState._growth_step,
    "growth.eval": SessionState._growth_eval,
    "growth.phase_end": SessionState._growth_phase_end,
    "growth.arm_done": SessionState._growth_arm_done,
}
