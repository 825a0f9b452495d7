"""The console's policy, without Textual: which session opens, when a new session maps its layers by
itself, where a job runs (beside the console's model, on another GPU, or after the console releases
its model, reloaded when the job ends), cancelling, resume offers, jobs whose process died without
a word, and which prompt-pane models this session has.

The app (tui/app.py) routes keys, requests and worker messages here and draws what the lab keeps;
the lab answers with data and talks back through three callables (a line for the user, the status
line changed, a model to load), so tests drive it directly, with no terminal.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.core.errors import UserError
from engine.core.events import CancelToken, decode_or_none, result_class
from engine.core.settings import Settings
from engine.core.turns import ModelTurns
from engine.experiments.variants import SavedModels, Variant, pruned_layers, saved_model_path
from engine.models.options import ModelOptions
from engine.registry import BY_NAME
from sessions.layer_weights import saved_layers
from sessions.store import Session, SessionStore
from tui import console_view, event_index
from tui.console_settings import ConsoleSettings
from tui.flags import settings_from_flags
from tui.jobs import (
    BackgroundJob,
    job_argv,
    job_options,
    job_placement,
    launch_job,
    reap,
    resumable_job,
    resume_argv,
    stop_job,
    typed,
)
from tui.log_pager import LogPager
from tui.logging_setup import log_to_file
from tui.marks import Marks
from tui.session_files import APP_LOG, FIGURES
from tui.state import Dirty, JobView, LineKeeper, SessionState

log = logging.getLogger("anatomy_tui.console")

RECONCILE_EVERY = 8  # polls between checks of job processes that died without a word
READ_LIMIT = 4 << 20  # bytes of the event log read per poll at most
FOLD_SECONDS = 0.15  # folding per poll at most: a large log comes in over several polls, drawn, keys answered
CATCH_UP_REDRAW = 4  # polls between redraws while a large log is read (redrawing costs more than folding)
INDEX_EVERY = 4 << 20  # bytes of the log folded between writes of its index (tui/event_index.py)
INDEX_IDLE_SECONDS = 10.0  # or, with the log read to its end, this long after the last write
VIEW_SECONDS = 2.0  # the console's view (layer, tab, forms) is written at most this often, and on quitting


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


@dataclass(frozen=True)
class Generation:
    """The generation in progress: its number (messages of an older one are dropped) and its own
    stop flag."""

    run: int
    stop: threading.Event


def _no_word(text: str, level: str) -> None:
    pass


def _nothing(*args: Any) -> None:
    pass


NO_MODEL_IN_AN_ATLAS = ("an atlas's session has no model of its own: open one of its models' sessions "
                        "(ATLAS-MODEL) to run experiments; k shows the atlas")


class Lab:
    """What the console knows and decides. `tell(text, level)` shows a line to the user (the lab
    also logs it), `status_changed()` redraws the status line, `start_load(options)` loads the
    console's model off the UI thread (ModelLoaded or ModelFailed come back through the app)."""

    def __init__(
        self,
        store: SessionStore,
        options: ModelOptions,
        *,
        model_explicit: bool = True,
        settings: ConsoleSettings | None = None,
        tell: Callable[[str, str], None] = _no_word,
        status_changed: Callable[[], None] = _nothing,
        start_load: Callable[[ModelOptions], None] = _nothing,
    ) -> None:
        self.store = store
        self.options = options
        self.model_explicit = model_explicit  # False: --model was left at its default, so a session's own model wins
        self.settings = settings or ConsoleSettings()
        self._tell, self._status_changed, self._start_load = tell, status_changed, start_load
        self.session: Session | None = None
        self.atlas = False  # the session is an atlas's: no model of its own, its Compare view is what it shows
        self.state = SessionState()
        self.keeper = LineKeeper(self.state)  # which lines of the log the state depends on: the index
        self.offset = 0
        self.indexed = 0  # the log's bytes the written index covers
        self.index_written = time.monotonic()  # when it was written last
        self.pager: LogPager | None = None  # the Log tab's older pages, while it shows them
        self.polls = 0
        self.next_reconcile = 0  # the poll that checks the jobs' processes next
        self.loaded: Any = None
        self.model_status = "model: not loaded"
        self.turns = ModelTurns()  # the loaded model, a forward at a time: the prompt pane and the map share it
        self.saved_models = SavedModels()
        self.cancels: dict[str, CancelToken] = {}  # experiments running in the console
        self.background: list[BackgroundJob] = []
        # the job the console released its model for (reloaded when it ends), and the options the
        # released model had resolved to (later jobs keep them)
        self.released_for: BackgroundJob | None = None
        self.released_options: ModelOptions | None = None
        # where the console is in this session: the screen says, but for the marks (the lab's)
        self.view = console_view.ConsoleView()
        self.view_changes = False  # changed since it was last written
        self.view_saved = 0.0  # when it was last written (monotonic)
        self.generation: Generation | None = None
        self.generations = 0

    def say(self, text: str, level: str = "info") -> None:
        """A line for the user: a notification, a line in the log panel and one in app.log."""
        self._tell(text, level)
        self.state.add_log(level, text)
        log.log(logging.ERROR if level == "error" else logging.INFO, text)

    def save_figures(self, names: tuple[str, ...]) -> None:
        """The publication figures (figures/) of these results, as PNG and SVG in the session's
        figures/ folder; says where, or why none was saved."""
        drawable = [(name, cls) for name in names if name in self.state.results and (cls := result_class(name))]
        if self.session is None or not drawable:
            self.say("no result in this panel to draw yet", "warning")
            return
        import figures

        written = []
        try:
            folder = self.session.part(FIGURES)
            for name, cls in drawable:
                result = decode_or_none(cls, self.state.results[name])
                if result is not None:
                    written += figures.save_figure(result, folder / name, ("png", "svg"))
        except (UserError, OSError) as exc:
            self.say(f"figure not saved: {exc}", "error")
            return
        shown = ", ".join(path.name for path in written)
        self.say(f"saved {shown} in {folder}" if written else "these results do not fit this version: no figure")

    # the session -----------------------------------------------------------------------------------
    def first_session(self, requested: str | None, resume: bool) -> str | None:
        """The session to open at start: the one asked for, with --resume the one the console had
        open last (else the most recent), a new one on a first run (nothing to pick yet); None lets
        the user pick."""
        if requested:
            return requested
        if resume:
            last = self.last_session()
            recent = self.store.most_recent() if last is None else None
            if last or recent:
                return last or recent.name  # type: ignore[union-attr]
        home = self.store.home
        self.store.check_home(writing=False)  # a file, or not readable: its one line
        if not home.is_dir() or not any(path.is_dir() and not path.name.startswith(".") for path in home.iterdir()):
            return self.store.create(model=self.options.model).name  # what `store.list()` lists: none, unread
        return None

    def open(self, name: str) -> list[str]:
        """Opens (or creates) session `name` with what of it is readable, and returns what is not,
        a line each; SessionError when it cannot be opened at all. A session keeps its model unless
        --model was given."""
        self.session = self.store.open_or_create(name, model=self.options.model)
        self.atlas = self.session.is_atlas
        if self.atlas:
            self.model_status = "model: none, an atlas's session (k: its measures, live, and its table)"
        saved_model = self.session.manifest.get("model")
        if saved_model and saved_model != self.options.model and not self.model_explicit:
            self.options = replace(self.options, model=saved_model)
        app_log = self.session.writable_part(APP_LOG)
        if app_log is not None:
            log_to_file(app_log)
        log.info("opened session %s (%s)", self.session.name, self.session.path)
        console_view.remember_session(self.store, self.session.name)
        self.view, self.view_changes = console_view.load(self.session), False
        for result, doc in self.session.results().items():
            why = self.state.set_result(result, doc)
            if why:
                self.session.damage.append(f"result {result} cannot be shown ({why})")
        found = event_index.load(self.session)
        if found is not None:
            lines, self.offset = found
            for span, event in lines:
                self.keeper.fold(span, event)
            self.indexed = self.offset
        return self.session.check()

    def last_session(self) -> str | None:
        """The session the console had open last (not one a headless run wrote since), if it exists."""
        return console_view.last_session(self.store)

    def view_changed(self, view: console_view.ConsoleView) -> None:
        """The screen's selected layer, tab or forms changed: written within VIEW_SECONDS (a poll)."""
        view = replace(view, marks=self.view.marks)  # the screen does not hold them
        if view != self.view:
            self.view, self.view_changes = view, True

    def save_view(self, now: bool = False) -> None:
        """Writes the console's view when it changed, VIEW_SECONDS after the last write (`now`: at once)."""
        if self.session is None or not self.view_changes:
            return
        if now or time.monotonic() - self.view_saved >= VIEW_SECONDS:
            console_view.save(self.session, self.view)
            self.view_changes, self.view_saved = False, time.monotonic()

    @property
    def session_name(self) -> str:
        return self.session.name if self.session is not None else ""

    @property
    def n_layers(self) -> int:
        return self.loaded.n_layers if self.loaded is not None else self.state.n_layers

    def comparison(self) -> Any:
        """What the Compare view shows for this session (sessions/atlas.py `console_comparison`, read
        when asked: an atlas session's AtlasWatch, else an AtlasDocument); None without a session,
        UserError or SessionError when there is nothing to compare."""
        if self.session is None:
            return None
        from sessions.atlas import console_comparison

        return console_comparison(self.store, self.session.name)

    def poll(self) -> set[str]:
        """Folds the event log's new lines into the state, for FOLD_SECONDS at most (and every few
        polls, once the log is read to its end, checks the jobs' processes: a job whose end is
        still unread is not judged); returns the parts of the console to redraw (`Dirty` names)."""
        if self.session is None:
            return set()
        data, end = self.session.read_event_bytes(self.offset, READ_LIMIT)
        behind = READ_LIMIT is not None and len(data) > READ_LIMIT // 2  # the read stopped at the limit
        deadline = time.monotonic() + FOLD_SECONDS
        for span, event in event_index.parsed(data, self.offset):
            self.keeper.fold(span, event)
            if time.monotonic() > deadline:  # the rest on the next poll
                end, behind = span[1], True
                break
        self.offset = end
        stale = not behind and time.monotonic() - self.index_written >= INDEX_IDLE_SECONDS
        if self.offset - self.indexed >= INDEX_EVERY or (stale and self.offset > self.indexed):
            self.write_index()
        self.save_view()
        if not behind and self.polls >= self.next_reconcile:
            self.reconcile()
            self.next_reconcile = self.polls + RECONCILE_EVERY
        self.polls += 1
        if behind and self.polls % CATCH_UP_REDRAW:
            return set()  # catching up with a large log: the panels are redrawn every few polls, not each
        return self.state.take_dirty()

    def reconcile(self) -> None:
        """Jobs whose process is gone without a 'finished' event (or that left no job file) read as
        interrupted; the job file's pid tells the status line where each job runs. The job the
        console released its model for has ended: the model loads again."""
        reap(self.background)
        if self.released_for is not None and not self.released_for.alive():
            self.released_for = self.released_options = None
            self.say("the job that needed the GPU finished: reloading the console's model")
            self.load_model()
        if self.session is not None:
            self.state.follow_job_files(self.session.jobs())

    def running_jobs(self) -> list[tuple[JobView, str]]:
        """The running jobs, each with where it runs, for the status line."""
        me = os.getpid()
        return [(job, "in console" if job.pid in (None, me) else "own process") for job in self.state.running_jobs()]

    # the console's model ---------------------------------------------------------------------------
    def load_model(self) -> None:
        """The console's model, loading (at start, and again after a job that needed the GPU to itself)."""
        self.model_status = f"model: loading {self.options.model}…"
        self._start_load(self.options)
        self._status_changed()

    def model_loaded(self, loaded: Any) -> bool:
        """Keeps the loaded model; True when this session has no layer map yet and should start one
        now (the first run's map; `ConsoleSettings.auto_map` turns it off)."""
        self.loaded = loaded
        self.model_status = f"{loaded.name} · {loaded.device} · {loaded.dtype_name} · {loaded.n_layers} layers"
        if loaded.device_map:  # spread over devices: say where the layers live
            from engine.models.loading import placement_text

            self.model_status += f" · {placement_text(loaded.layer_devices)}"
        log.info("model loaded: %s", self.model_status)
        if (kept := self.marks.within(loaded.n_layers)) != self.marks:  # a saved mark of a deeper model
            self.say(f"marks beyond this model's {loaded.n_layers} layers dropped", "warning")
            self.set_marks(kept)
        self.state.dirty.update({Dirty.LAYERS, Dirty.JOBS})
        self._status_changed()
        if not self.settings.auto_map or self.session is None or "ablation" in self.state.results:
            return False
        busy = any(job.experiment == "ablation" for job in self.state.running_jobs())
        if busy or self.session.jobs():
            return False
        log.info("no layer map in this session yet: computing it")
        return True

    def model_progress(self, text: str) -> None:
        if self.loaded is None:
            self.model_status = f"model: {text}"
            self._status_changed()

    def model_failed(self, error: str) -> None:
        self.model_status = "model: failed to load (see Log)"
        self.say(f"loading {self.options.model} failed: {error}", "error")
        self._status_changed()

    def need_model(self) -> bool:
        if self.atlas:
            self.say(NO_MODEL_IN_AN_ATLAS, "warning")
            return False
        if self.loaded is None:
            self.say("the model is still loading (see the status line); try again in a moment", "warning")
            return False
        return True

    def growth_preview_wanted(self) -> bool:
        """Whether the growth panel still wants the phases its form would run (none drawn yet)."""
        return self.state.growth.plan is None

    def growth_previewed(self, flags: tuple[str, ...], arms: dict[str, Any]) -> None:
        self.state.growth_preview = (" ".join(flags), arms)
        self.state.dirty.add(Dirty.GROWTH)

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
        if resume:
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

    def inject(self, layer: int, sigma: float, steps: int, lr: float) -> BackgroundJob | None:
        """Noise `layer` and let it recover, as its own process."""
        settings = self.settings_for("recovery", layers=(layer,), sigma=sigma, steps=steps, lr=lr)
        return self.start_job("recovery", settings) if settings is not None else None

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
            if placement.startswith("cuda"):  # another GPU has room: the console keeps its model
                options = replace(options, device=placement)
            argv = job_argv(experiment, settings, options, self.session.name, resume, cluster)
        except UserError as exc:
            self.say(str(exc), "error")
            return None
        if placement == "release" and not self.release_model(experiment, options):
            return None
        if placement.startswith("cuda"):
            self.say(f"the {experiment} job runs on {placement}: {self.loaded.device} holds the console's model")
        job = self.launch(experiment, argv)
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

    def launch(self, experiment: str, argv: list[str]) -> BackgroundJob | None:
        if self.session is None:
            return None
        job = launch_job(self.session, experiment, argv)
        self.background.append(job)
        self.say(f"started {experiment} as its own process (pid {job.pid}); log: {job.log_path.name}")
        return job

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

    def log_page(self, back: int) -> list[tuple[str, str]]:
        """Page `back` of the Log tab's lines read from the event log (tui/log_pager.py), oldest
        first; page 0 (the live view) ends paging, so it starts again from the log's end then."""
        if self.session is None or back < 1:
            self.pager = None
            return []
        if self.pager is None:
            self.pager = LogPager(self.session, self.offset)
        return self.pager.older(back)

    def write_index(self) -> None:
        """Writes down which lines of the log the state depends on, so the next open folds only
        those and the tail (tui/event_index.py): every INDEX_EVERY bytes folded, INDEX_IDLE_SECONDS
        after the last write once the log is read to its end, and on quitting."""
        if self.session is not None and self.offset > self.indexed:
            if event_index.write(self.session, self.keeper.spans(), self.offset):
                self.indexed = self.offset
            self.index_written = time.monotonic()

    def closing(self) -> None:
        """The console quits: jobs in their own process keep running; a generation stops at its next
        token; the event log's index is brought up to date."""
        self.write_index()
        self.save_view(now=True)
        if self.state.running_jobs():
            log.info("quitting; jobs in their own process keep running")
        self.stop_generation()

    # the prompt pane -------------------------------------------------------------------------------
    @property
    def marks(self) -> Marks:
        """The layers and blocks marked for the modified model (kept in the session's console.json)."""
        return self.view.marks

    def set_marks(self, marks: Marks) -> None:
        self.view, self.view_changes = replace(self.view, marks=marks), True
        self.state.dirty.add(Dirty.MARKS)
        self.say(f"modified model: {marks.describe() or 'nothing marked, it answers as the original'}")

    def toggle_mark(self, layer: int) -> None:
        """Marks `layer` whole in the modified model (neighbour mean; noised in the noised one), or unmarks it."""
        self.set_marks(self.marks.toggle_layer(layer))

    def toggle_block_mark(self, layer: int, part: str) -> None:
        """Marks block `part` of `layer` removed in the modified model, or unmarks it."""
        self.set_marks(self.marks.toggle_block(layer, part))

    def variant(self, choice: str, sigma: float) -> tuple[Variant | None, str]:
        """The prompt pane's model `choice` in this session, with `sigma` for the noised one; or none
        and why (`problem`): what it is made from is not in the session yet."""
        assert self.session is not None
        layers = self.marks.sorted_layers
        problem, path, chosen = "", None, layers
        if choice == "recovered" and not saved_layers(self.session, "recovery"):
            problem = "no recovered layer in this session yet (inject noise: key i)"
        elif choice == "pruned":
            from engine.experiments.prune.vocabulary import PruneResult  # here: read only for the prompt pane

            chosen = pruned_layers(self.state.result(PruneResult))
            problem = "" if chosen else "no prune result in this session yet (anatomy-tui run prune)"
        elif choice in ("growth", "uniform"):
            from engine.experiments.growth.vocabulary import GrowthResult  # here: read only for the prompt pane

            try:
                path = saved_model_path(self.state.result(GrowthResult), choice, self.session.path)
                problem = "" if path else f"no {choice} model in this session yet (run growth: key g)"
            except UserError as exc:  # a folder outside the session (a forged result): never loaded
                problem = str(exc)
        if problem:
            return None, problem
        blocks = self.marks.sorted_blocks if choice == "modified" else ()
        return Variant(choice, layers=chosen, sigma=sigma, path=path, blocks=blocks), ""

    def new_generation(self) -> Generation | None:
        """A new generation, the running one stopped first; None (said why) without a model."""
        if self.session is None or not self.need_model():
            return None
        self.stop_generation()
        self.generations += 1
        self.generation = Generation(self.generations, threading.Event())
        return self.generation

    def current_generation(self, run: int) -> bool:
        return self.generation is not None and run == self.generation.run

    def generation_done(self, run: int) -> None:
        if self.current_generation(run):
            self.generation = None

    def stop_generation(self) -> None:
        if self.generation is not None:
            self.generation.stop.set()
