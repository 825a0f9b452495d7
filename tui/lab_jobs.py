"""Experiments the console starts, for its policy (tui/lab.py): in a thread worker of the console
(ConsoleRun) or as their own process, placed beside the console's model, on another GPU, or after the
console releases its model; cancelling them, and the command that resumes an interrupted one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Any

from cli.argv import job_argv, resume_argv, typed
from cli.flags import settings_from_flags
from engine.core.errors import UserError
from engine.core.events import CancelToken
from engine.core.settings import Settings
from engine.models.options import ModelOptions
from engine.registry import BY_NAME
from tui.jobs import (
    BackgroundJob,
    interrupt,
    job_options,
    job_placement,
    last_line,
    launch_job,
    resumable_job,
    stop_job,
)
from tui.lab_base import NO_MODEL_IN_AN_ATLAS, LabBase
from tui.state import Dirty, GrowthView, JobView, RecoveryRun

log = logging.getLogger("anatomy_tui.console")

STARTING = "starting: loading the model in its own process"  # a job's word until its process writes its own


@dataclass(frozen=True)
class ConsoleRun:
    """An experiment to run in a thread worker of the console, its cancel flag already held;
    `resume`: it continues from the session's checkpoint (a partial layer map's finished layers)."""

    name: str
    settings: Settings
    token: CancelToken
    description: str
    resume: bool = False


@dataclass(frozen=True)
class ResumeOffer:
    """An interrupted job and the exact command that resumes it."""

    job: str
    experiment: str
    argv: list[str]

    @property
    def question(self) -> str:
        return f"Job {self.job} was interrupted. Resume it from its checkpoint?\n{typed(self.argv)}"


class LabJobs(LabBase):
    """The console's experiments: in a thread worker, or as their own process."""

    # experiments in the console --------------------------------------------------------------------
    def map_in_console(self) -> ConsoleRun | None:
        """The layer map for a thread worker of the console; None, said why, without a model, or while
        one runs in the console."""
        if self.session is None or not self.need_model():
            return None
        settings = self.settings_for("ablation")
        if settings is None:
            return None
        partial = self.state.ablation_map
        resume = (partial is not None and partial.partial is True and partial.settings == settings
                  and partial.model == self.loaded.name)  # fmt: skip
        if resume and partial is not None:
            self.say(f"the layer map is {partial.partial_text()}: the map goes on from its checkpoint")
        return self._console_run("ablation", settings, "layer map (ablation)", resume)

    def _console_run(self, name: str, settings: Settings, description: str, resume: bool = False
                     ) -> ConsoleRun | None:
        if name in self.cancels:
            self.say(f"{name} is already running in the console", "warning")
            return None
        token = self.cancels[name] = CancelToken()
        return ConsoleRun(name, settings, token, description, resume)

    def console_run_ended(self, name: str) -> None:
        self.cancels.pop(name, None)

    def running_in_console(self) -> list[str]:
        return list(self.cancels)

    def stop_console_runs(self) -> None:
        for token in self.cancels.values():
            token.cancel()

    # jobs as their own process ---------------------------------------------------------------------
    def settings_for(self, experiment: str, **changes: Any) -> Settings | None:
        """The experiment's default settings with `changes`, validated; a bad value is said, not raised."""
        try:
            return BY_NAME[experiment].defaults().override(changes)
        except UserError as exc:
            self.say(str(exc), "error")
            return None

    def map_job(self) -> BackgroundJob | None:
        settings = self.settings_for("ablation")
        return self.start_job("ablation", settings) if settings is not None else None

    def inject(self, layer: int, sigma: float, steps: int | None, lr: float) -> BackgroundJob | None:
        """Noise `layer` and let it recover, as its own process (`steps` None: auto, sized for the device),
        handed the baseline the session's layer map measured."""
        settings = self.settings_for("recovery", layers=(layer,), sigma=sigma, steps=steps, lr=lr)
        if settings is None:
            return None
        self.hand_over_baseline()
        return self.start_job("recovery", settings)

    def hand_over_baseline(self) -> None:
        """The layer map's baseline perplexity, written where a recovery job reads it (its checkpoint
        folder's baseline.json) with the fingerprint of what the map measured it on (the model,
        precision and device its job recorded, and its evaluation protocol): a job on the same skips
        its own baseline pass, any other measures it (engine/experiments/recovery/sweep.py)."""
        from engine.core.codec import ABSENT
        from engine.disk.atomic import atomic_write_json
        from engine.experiments.recovery.vocabulary import BASELINE_FILE, baseline_fingerprint

        shown = self.state.ablation_map
        ended = [self.state.specs.get(job.id, {}) for job in self.state.jobs.values()
                 if job.experiment == "ablation" and job.status != "running"]  # the map shown is the last one ended
        model = ended[-1].get("model") if ended else None
        if self.session is None or shown is None or shown.protocol is ABSENT or not isinstance(model, dict) \
                or model.get("name") != shown.model:
            return
        try:
            fingerprint = baseline_fingerprint(str(model["name"]), str(model["dtype"]), str(model["device"]),
                                               shown.protocol)
            atomic_write_json(self.session.checkpoint_dir("recovery") / BASELINE_FILE,
                              {"fingerprint": fingerprint, "baseline_ppl": shown.baseline_ppl,
                               "measured_by": "the console's layer map"}, "the map's baseline")
        except (KeyError, OSError, UserError, ValueError) as exc:  # the job measures it then
            log.info("the map's baseline was not handed over: %s", exc)

    def growth(self, flags: tuple[str, ...]) -> BackgroundJob | None:
        """A growth run with the growth form's flags, as its own process."""
        try:
            settings = settings_from_flags(BY_NAME["growth"], flags)
        except UserError as exc:
            self.say(f"growth flags: {exc}", "error")
            return None
        return self.start_job("growth", settings)

    def start_job(self, experiment: str, settings: Settings, resume: bool = False) -> BackgroundJob | None:
        """`anatomy-tui run EXPERIMENT ... --session S` as its own process, built from the settings
        (the same command a user would type; it outlives the console). A model job goes beside the
        console's model, to another GPU with room, or (`release`) where the console frees its model
        first; one that cannot fit even then is said, not started. With the console's `cluster`
        setting, a job (a resume too: the session's checkpoint goes with the task) is a Ray task there,
        with the model flags the console was given."""
        if self.session is None:
            return None
        if self.atlas:
            self.say(NO_MODEL_IN_AN_ATLAS, "warning")
            return None
        entry = BY_NAME[experiment]
        options = None
        cluster = self.settings.cluster
        if entry.needs_model:  # the device and dtype the console's model resolved to, not `auto` again
            options = self.options if cluster else self.released_options or job_options(self.options, self.loaded)
        try:
            placement = job_placement(experiment, settings, options, self.loaded) if options and not cluster \
                else "beside"  # on a cluster: its own GPU or CPU, found by Ray
            if placement.startswith("cuda") and options is not None:  # another GPU has room: the console keeps its
                options = replace(options, device=placement)
            argv = job_argv(experiment, settings, options, self.session.name, resume, cluster)
        except UserError as exc:
            self.say(str(exc), "error")
            return None
        if placement == "release" and not self.release_model(experiment, options):
            return None
        if placement.startswith("cuda"):
            self.say(f"the {experiment} job runs on {placement}: {self.loaded.device} holds the console's model")
        job = self.launch(experiment, argv, settings)
        if placement == "release":
            self.released_for = job
        return job

    def release_model(self, experiment: str, options: ModelOptions | None) -> bool:
        """Frees the console's model so a job can have its GPU (reloaded when the job ends); not
        while work in the console is using it."""
        busy = [*self.cancels, *(["generation"] if self.generation is not None else [])]
        if busy:
            self.say(f"the {experiment} job needs the GPU the console's model is on; wait for "
                     f"{', '.join(busy)} to finish", "warning")
            return False
        device = self.loaded.device
        self.loaded, self.released_options = None, options
        from engine.models.oom import release_memory

        release_memory()
        self.model_status = f"model: released from {device} for the {experiment} job, reloaded when it ends"
        self.say(f"{device} cannot hold the console's model and the {experiment} job: the console's model is "
                 "released while the job runs")
        self._status_changed()
        return True

    def launch(self, experiment: str, argv: list[str], settings: Settings | None = None) -> BackgroundJob | None:
        """Starts the job as its own process and shows it at once (`show_starting`)."""
        if self.session is None:
            return None
        job = launch_job(self.session, experiment, argv)
        self.background.append(job)
        self.show_starting(job, settings)
        self.say(f"started {experiment} as its own process (pid {job.pid}); log: {job.log_path.name}")
        return job

    def show_starting(self, job: BackgroundJob, settings: Settings | None) -> None:
        """A job just launched is in the status line (its own process: its pid is known) and in its
        panel at once (recovery's runs with their settings, a new growth run), saying it is starting,
        long before its process has loaded the model and written its first event."""
        job.starting = f"{job.experiment}-starting-{job.pid}"
        doing = STARTING if BY_NAME[job.experiment].needs_model else "starting its own process"
        state = self.state
        state.jobs[job.starting] = JobView(job.starting, job.experiment, label=doing, pid=job.pid)
        if job.experiment == "recovery" and settings is not None:  # its vocabulary stays unimported until it runs
            values: Any = settings
            state.recovery += [RecoveryRun(job.starting, layer, sigma=values.sigma, steps=values.steps, lr=values.lr)
                               for layer in values.layers or ()]
        if job.experiment == "growth":
            state.growth = GrowthView(job=job.starting, status="running")
        state.dirty.update({Dirty.JOBS, Dirty.LAYERS, Dirty.RECOVERY, Dirty.GROWTH})
        self._status_changed()  # drawn now, not at the next poll

    def adopt_started(self, log_read: bool = True) -> None:
        """A job this console launched has written its job file and its first event: its starting
        entry becomes that job (found by its process group, as the job file records it), with its
        pid, its cancel and its panels' runs. One whose process ended before that reads cancelled
        (when asked to) or failed with its log's last line; judged only once the event log is read to
        its end (`log_read`), so a job whose first events are still unread is not."""
        waiting = {job.pid: job for job in self.background if job.starting}
        if not waiting or self.session is None:
            return
        kinds = {job.experiment for job in waiting.values()}
        shown = {job.starting for job in waiting.values()}
        fresh = [view for view in self.state.running_jobs()
                 if view.experiment in kinds and view.id not in shown and view.pid in (None, *waiting)]
        records = self.session.job_records() if fresh or not log_read else {}
        for view in fresh:
            record = records.get(view.id)
            pids = (view.pid,) if record is None else (record.pid, record.pgid)
            found = next((waiting.pop(pid) for pid in pids if pid in waiting), None)
            if found is not None:
                self._adopt(found, view)
        if log_read:
            for job in waiting.values():
                if not job.alive():
                    self._never_started(job)

    def _adopt(self, job: BackgroundJob, view: JobView) -> None:
        state, key = self.state, job.starting
        job.starting = ""
        shown = state.jobs.pop(key, None)
        view.pid = view.pid or job.pid
        view.cancelling = view.cancelling or bool(shown and shown.cancelling)
        begun = {(run.layer, run.repeat) for run in state.recovery if run.job == view.id}
        state.recovery = [run for run in state.recovery if run.job != key or (run.layer, run.repeat) not in begun]
        for run in state.recovery:
            if run.job == key:
                run.job = view.id
        if state.growth.job == key:
            state.growth.job = view.id
        state.dirty.update({Dirty.JOBS, Dirty.LAYERS, Dirty.RECOVERY, Dirty.GROWTH})

    def _never_started(self, job: BackgroundJob) -> None:
        key = job.starting
        job.starting = ""
        shown = self.state.jobs.get(key)
        status = "cancelled" if shown is not None and shown.cancelling else "failed"
        why = last_line(job.log_path)
        if shown is not None:
            shown.error = why
        self.state.mark_job(key, status)  # and its runs in the panels
        self.say(f"{job.experiment} {status} before it began{': ' + why if why else ''} (log: {job.log_path.name})",
                 "warning" if status == "cancelled" else "error")

    def cancel(self, experiment: str) -> None:
        """Cancels the running jobs of `experiment`: in the console through the cancel flag, in their
        own process with SIGINT to the group."""
        if self.session is None:
            return
        cancelled = []
        me = os.getpid()
        if experiment in self.cancels:
            self.cancels[experiment].cancel()
            cancelled += [job.id for job in self.state.running_jobs() if job.experiment == experiment
                          and job.pid in (None, me)] or [experiment]
        for job_id, doc in self.session.jobs().items():
            mine = doc.get("experiment") == experiment and doc.get("status") == "running"
            if mine and doc.get("pid") != me and stop_job(doc):
                cancelled.append(job_id)
        cancelled += [job.starting for job in self.background  # no job file yet: its model is loading
                      if job.experiment == experiment and job.starting and interrupt(job)]
        self.state.cancelling(cancelled)
        self.say(f"cancelling {', '.join(cancelled)}" if cancelled else f"no {experiment} job is running")

    def resume_offer(self, asked: bool = True) -> ResumeOffer | None:
        """The newest interrupted job and the command that resumes it, rebuilt from the job's recorded
        experiment and settings, never from an argv in the file; None, said why, when there is none
        (said only when `asked`) or it cannot be resumed."""
        if self.session is None:
            return None
        interrupted = resumable_job(self.session.jobs())
        if interrupted is None:
            if asked:
                self.say("no interrupted job to resume in this session")
            return None
        job_id, doc = interrupted
        try:
            argv = resume_argv(doc, self.session)
        except UserError as exc:
            self.say(f"job {job_id} cannot be resumed: {exc}", "error")
            return None
        return ResumeOffer(job_id, str(doc["experiment"]), argv)
