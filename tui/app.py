"""The lab console: a Textual app over one session of the store.

Everything the panels show comes from the session's event log and results, tailed a few times a
second, so a job running in the console (a thread worker) and a job running as its own process
(`anatomy-tui run ... --session S`) look the same, and reopening a session redraws it all without
recomputing. torch is imported only inside workers, after the first screen is painted.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable
from textual.worker import Worker, WorkerState

from engine.errors import UserError
from engine.options import ModelOptions
from engine.registry import BY_NAME
from engine.settings import Settings
from engine.variants import SavedModels, Variant, pruned_layers, saved_model_path
from sessions.layer_weights import saved_layers
from sessions.store import Session, SessionError, SessionStore
from tui.console_settings import ConsoleSettings
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
)
from tui.logging_setup import log_to_file
from tui.messages import (
    ConsoleReady,
    ExperimentFinished,
    GenerateRequested,
    GenerationDone,
    GrowthPreview,
    GrowthRequested,
    InjectRequested,
    ModelFailed,
    ModelLoaded,
    ModelProgress,
    Notice,
    TabShown,
    TextGenerated,
)
from tui.screens.confirm import ConfirmScreen
from tui.screens.console import TABS, ConsoleScreen, PanelData
from tui.screens.help import HelpScreen
from tui.screens.layer_detail import LayerDetailScreen
from tui.screens.picker import SessionPicker
from tui.state import SessionState
from tui.widgets.layer_map import LayerMap
from tui.workers import (
    Column,
    GenerationPlan,
    experiment_work,
    generate_work,
    growth_preview_work,
    load_model_work,
)

log = logging.getLogger("anatomy_tui.console")

POLL_SECONDS = 0.25  # the event log is read and the panels redrawn at most 4 times a second
RECONCILE_EVERY = 8  # polls between checks of job processes that died without a word
GENERATE_TOKENS = 64

# (key, action, title, description): one table drives the bindings, the help screen and the palette.
ACTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("f1,h", "help", "Help", "every key and what it does"),
    ("f2", "show_tab('layers')", "Layers tab", "the layer map and the selected layer's detail"),
    ("f3", "show_tab('recovery')", "Recovery tab", "noise injection and live recovery curves"),
    ("f4", "show_tab('growth')", "Growth tab", "the growth timeline and loss curves"),
    ("f5", "show_tab('prompt')", "Prompt tab", "generate text with two models side by side"),
    ("f6", "show_tab('analyses')", "Analyses tab", "weight statistics, angle profiles, scaling fit"),
    ("f7", "show_tab('log')", "Log tab", "messages from jobs and the console"),
    ("w", "toggle_layout", "Dashboard / tabs", "all four panels at once, or one tab at a time"),
    ("a", "compute_map", "Compute layer map", "ablate every layer in the console (thread worker)"),
    ("b", "map_job", "Layer map as a job", "run the ablation map as its own process"),
    ("d", "detail", "Layer detail", "everything the session knows about the selected layer"),
    ("i", "inject", "Inject noise", "noise the selected layer and watch it recover (own process)"),
    ("c", "cancel", "Cancel job", "cancel the running job of this tab"),
    ("g", "growth", "Start growth run", "a tiny growth run against its uniform baseline (own process)"),
    ("x", "toggle_modified", "Mark layer ablated", "mark or unmark the selected layer in the modified model"),
    ("f9,s", "stop_generation", "Stop generation", "stop the text being generated"),
    ("r", "resume_job", "Resume interrupted job", "restart an interrupted job from its checkpoint"),
    ("q,ctrl+q", "quit", "Quit", "quit (jobs in their own process keep running)"),
)
FOOTER = {"help", "compute_map", "detail", "inject", "cancel", "growth", "quit"}


@dataclass(frozen=True)
class Generation:
    """The generation in progress: its number (messages of an older one are dropped) and its own
    stop flag."""

    run: int
    stop: threading.Event


class AnatomyApp(App[None]):
    """The console. `load_model=False` keeps the model out (tests, snapshots of stored sessions).

    Calls go down (the app calls the screen's methods), messages come up: the screen posts
    requests (tui/messages.py) and the workers (tui/workers.py) post what they did; both are
    answered here, on the UI thread."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "anatomy-tui"
    BINDINGS = [Binding(key, action, title, show=action in FOOTER) for key, action, title, _ in ACTIONS]

    def __init__(
        self,
        store: SessionStore | None = None,
        session: str | None = None,
        resume: bool = False,
        options: ModelOptions | None = None,
        model_explicit: bool | None = None,
        load_model: bool = True,
        console: ConsoleSettings | None = None,
    ) -> None:
        super().__init__()
        self.console_settings = console or ConsoleSettings()
        self.store = store or SessionStore()
        self.requested = session
        self.resume = resume
        self.options = options or ModelOptions()
        # False: --model was left at its default, so a session's own model wins (given options are explicit)
        self.model_explicit = options is not None if model_explicit is None else model_explicit
        self.autoload = load_model
        self.session: Session | None = None
        self.state = SessionState()
        self.offset = 0
        self.polls = 0
        self.loaded: Any = None
        self.model_status = "model: not loaded"
        self.model_lock = threading.Lock()  # a worker holds it while it uses the loaded model
        self.saved_models = SavedModels()
        self.cancels: dict[str, Any] = {}
        self.background: list[BackgroundJob] = []
        # the job the console released its model for (reloaded when it ends), and the options the
        # released model had resolved to (later jobs keep them)
        self.released_for: BackgroundJob | None = None
        self.released_options: ModelOptions | None = None
        self.modified_layers: set[int] = set()
        self.generation: Generation | None = None
        self.generations = 0
        self.first_paint: float | None = None

    # startup -----------------------------------------------------------------------------------
    def on_mount(self) -> None:
        if self.requested:
            self.open_session(self.requested)
        elif self.resume and self.store.most_recent() is not None:
            self.open_session(self.store.most_recent().name)  # type: ignore[union-attr]
        elif not self.store.list():  # a first run: nothing to pick yet, so a new session
            self.open_session(self.store.create(model=self.options.model).name)
        else:
            self.push_screen(SessionPicker(self.store), callback=self.open_session)

    def open_session(self, name: str | None) -> None:
        if not name:
            self.exit()
            return
        try:
            self.session = self.store.open_or_create(name, model=self.options.model)
        except SessionError as exc:  # a damaged or refused session: say why and pick again
            self.notify(str(exc), severity="error", title="cannot open the session", timeout=20)
            self.push_screen(SessionPicker(self.store), callback=self.open_session)
            return
        saved_model = self.session.manifest.get("model")
        if saved_model and saved_model != self.options.model and not self.model_explicit:
            self.options = replace(self.options, model=saved_model)
        app_log = self.session.writable_part("app.log")
        if app_log is not None:
            log_to_file(app_log)
        log.info("opened session %s (%s)", self.session.name, self.session.path)
        for result, doc in self.session.results().items():
            why = self.state.set_result(result, doc)
            if why:
                self.session.damage.append(f"result {result} cannot be shown ({why})")
        for reason in self.session.check():  # the session opens with what is readable; say what is not
            self.notify(reason, severity="warning", title="damaged part of the session", timeout=20)
        self.push_screen(ConsoleScreen(self.console_settings))

    @on(ConsoleReady)
    def console_ready(self) -> None:
        self.after_first_paint()

    def after_first_paint(self) -> None:
        """The console screen has painted: now the slow things may start."""
        self.first_paint = time.perf_counter()
        self.state.dirty.update({"layers", "recovery", "growth", "results", "jobs", "selection", "log"})
        self.poll()
        self.set_interval(POLL_SECONDS, self.poll)
        if self.autoload:
            self.load_model_in_background()
        if resumable_job(self.session.jobs()) is not None:
            self.action_resume_job()
        if not self.autoload:
            self.start_growth_preview()

    def start_growth_preview(self) -> None:
        """Plans the growth form's phases in a worker (torch), after the model: that comes first."""
        screen = self._console()
        if self.state.growth.plan is None and screen is not None:
            self.run_worker(
                partial(growth_preview_work, self.post_message, screen.growth_flags()),
                name="growth preview",
                group="preview",
                thread=True,
                exit_on_error=False,
                description="planning the growth phases",
            )

    @on(GrowthPreview)
    def growth_preview(self, message: GrowthPreview) -> None:
        self.state.growth_preview = (" ".join(message.flags), message.arms)
        self.state.dirty.add("growth")

    def load_model_in_background(self) -> None:
        """The console's model, loaded on a daemon thread (at start, and again after a job that needed
        the GPU to itself). Not a Textual worker: the app would wait for it on exit, so Ctrl+Q during
        a first load (a minute of dequantising) would not quit at once. The thread only posts messages."""
        options = self.options
        self.model_status = f"model: loading {options.model}…"
        work = partial(load_model_work, self.post_message, options)
        threading.Thread(target=work, name="load model", daemon=True).start()
        self.update_status()

    @on(ModelLoaded)
    def model_loaded(self, message: ModelLoaded) -> None:
        loaded = self.loaded = message.loaded
        self.model_status = f"{loaded.name} · {loaded.device} · {loaded.dtype_name} · {loaded.n_layers} layers"
        if loaded.device_map:  # spread over devices: say where the layers live
            from engine.models import placement_text

            self.model_status += f" · {placement_text(loaded.layer_devices)}"
        log.info("model loaded: %s", self.model_status)
        self.state.dirty.update({"layers", "jobs"})
        self.update_status()
        if self.console_settings.auto_map and self.session is not None and "ablation" not in self.state.results:
            busy = any(job.experiment == "ablation" for job in self.state.running_jobs())
            if not busy and not self.session.jobs():
                log.info("no layer map in this session yet: computing it")
                self.action_compute_map()
        self.start_growth_preview()

    @on(ModelProgress)
    def model_progress(self, message: ModelProgress) -> None:
        if self.loaded is None:
            self.model_status = f"model: {message.text}"
            self.update_status()

    @on(ModelFailed)
    def model_failed(self, message: ModelFailed) -> None:
        self.model_status = "model: failed to load (see Log)"
        self.say(f"loading {self.options.model} failed: {message.error}", "error")
        self.update_status()
        self.start_growth_preview()

    # the event log, a few times a second ---------------------------------------------------------
    def poll(self) -> None:
        if self.session is None:
            return
        events, self.offset = self.session.read_events(self.offset)
        for event in events:
            self.state.apply(event)
        if self.polls % RECONCILE_EVERY == 0:
            self.reconcile_jobs()
        self.polls += 1
        dirty = self.state.take_dirty()
        if dirty:
            self.redraw(dirty)

    def reconcile_jobs(self) -> None:
        """Jobs whose process is gone without a 'finished' event (or that left no job file) read as
        interrupted; the job file's pid tells the status line where each job runs."""
        reap(self.background)
        if self.released_for is not None and not self.released_for.alive():
            self.released_for = self.released_options = None
            self.say("the job that needed the GPU finished: reloading the console's model")
            self.load_model_in_background()
        if self.session is None:
            return
        docs = self.session.jobs()
        for job_id, view in self.state.jobs.items():
            doc = docs.get(job_id, {"status": "interrupted"})
            view.pid = doc.get("pid")
            if view.status == "running" and doc.get("status") != "running":
                self.state.mark_job(job_id, str(doc.get("status")))

    def redraw(self, dirty: set[str]) -> None:
        screen = self._console()
        if screen is None:
            return
        try:
            screen.redraw(self.panel_data(), dirty)
        except Exception as exc:  # a damaged or unexpected result must not take the console down
            self.say(f"could not draw {', '.join(sorted(dirty))}: {type(exc).__name__}: {exc}", "error")
            log.exception("redraw failed")
        if dirty & {"jobs", "layers"}:
            self.update_status()
        if "log" in dirty:
            screen.write_log(self.state.take_new_log())

    def panel_data(self) -> PanelData:
        return PanelData(self.state, self.n_layers, self.session_name)

    def update_status(self) -> None:
        screen = self._console()
        if screen is None:
            return
        me = os.getpid()
        jobs = [
            (job, "in console" if job.pid in (None, me) else "own process")
            for job in self.state.running_jobs()
        ]
        screen.show_status(self.session_name, self.model_status, jobs)

    def _console(self) -> ConsoleScreen | None:
        """The console screen once it is built and until the app starts shutting down (a message can
        arrive between its push and its mount, and a poll between the start of shutdown and the
        screen's own unmount, while its widgets are already being removed)."""
        if not self.is_running:
            return None
        for screen in reversed(self.screen_stack):
            if isinstance(screen, ConsoleScreen):
                return screen if screen.built else None
        return None

    @property
    def session_name(self) -> str:
        return self.session.name if self.session is not None else ""

    @property
    def selected_layer(self) -> int | None:
        """The layer under the map's cursor, read at the moment of use (keys typed ahead of the
        highlight messages still act on the right layer)."""
        screen = self._console()
        return screen.selected_layer if screen is not None else None

    @property
    def n_layers(self) -> int:
        return self.loaded.n_layers if self.loaded is not None else self.state.n_layers

    def say(self, text: str, level: str = "info") -> None:
        """A notification, a line in the log panel and one in app.log."""
        severity = {"info": "information"}.get(level, level)
        self.notify(text, severity=severity)  # type: ignore[arg-type]
        self.state.add_log(level, text)
        log.log(logging.ERROR if level == "error" else logging.INFO, text)

    @on(Notice)
    def notice(self, message: Notice) -> None:
        self.say(message.text, message.level)

    @on(TabShown)
    def tab_shown(self, message: TabShown) -> None:
        if message.tab in ("recovery", "growth"):
            self.state.dirty.add(message.tab)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Until a session is open (the picker), only help and quit apply."""
        return self.session is not None or action in ("help", "quit", "command_palette")

    # failures of any worker ------------------------------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.ERROR:
            error = worker.error
            self.say(f"{worker.description or worker.name} failed: {type(error).__name__}: {error}", "error")
            log.error("worker %s failed", worker.name, exc_info=error)

    @on(ExperimentFinished)
    def experiment_finished(self, message: ExperimentFinished) -> None:
        self.cancels.pop(message.name, None)

    # layer selection -------------------------------------------------------------------------------
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, LayerMap):
            self.state.dirty.add("selection")  # drawn on the next poll, with whatever else changed

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, LayerMap):
            self.action_detail()

    # actions -------------------------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(
            HelpScreen([(key.replace(",", " / "), f"{title}: {text}") for key, _, title, text in ACTIONS])
        )

    def action_show_tab(self, tab: str) -> None:
        screen = self._console()
        if screen is not None and tab in TABS:
            screen.show_tab(tab)

    def action_toggle_layout(self) -> None:
        screen = self._console()
        if screen is not None:
            screen.toggle_layout()

    def action_detail(self) -> None:
        if self._console() is not None:
            self.push_screen(LayerDetailScreen(self.state, self.selected_layer))

    def _need_model(self) -> bool:
        if self.loaded is None:
            self.say("the model is still loading (see the status line); try again in a moment", "warning")
            return False
        return True

    def run_experiment(self, name: str, work: Any, description: str) -> Worker | None:
        """An experiment in a thread worker of the console, writing into the session like a job.
        `work(token)` posts ExperimentFinished(name) when it ends."""
        if name in self.cancels:
            self.say(f"{name} is already running in the console", "warning")
            return None
        from engine.events import CancelToken

        token = CancelToken()
        self.cancels[name] = token
        return self.run_worker(
            partial(work, token),
            name=name,
            group="experiment",
            thread=True,
            exit_on_error=False,
            description=description,
        )

    def action_compute_map(self) -> None:
        if self.session is None or not self._need_model():
            return
        settings = self.settings_for("ablation")
        if settings is None:
            return
        work = partial(
            experiment_work, self.post_message, self.session, self.loaded, self.options, self.model_lock,
            "ablation", settings,
        )
        self.run_experiment("ablation", work, "layer map (ablation)")

    def start_background(self, experiment: str, settings: Settings, resume: bool = False) -> BackgroundJob | None:
        """`anatomy-tui run EXPERIMENT ... --session S` as its own process, built from the settings
        (the same command a user would type; it outlives the console)."""
        if self.session is None:
            return None
        entry = BY_NAME[experiment]
        options = None
        if entry.needs_model:  # the device and dtype the console's model resolved to, not `auto` again
            options = self.released_options or job_options(self.options, self.loaded)
        try:
            placement = job_placement(experiment, settings, options, self.loaded) if options else "beside"
            if placement.startswith("cuda"):  # another GPU has room: the console keeps its model
                options = replace(options, device=placement)
            argv = job_argv(experiment, settings, options, self.session.name, resume)
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
        from engine.oom import release_memory

        release_memory()
        self.model_status = f"model: released from {device} for the {experiment} job, reloaded when it ends"
        self.say(f"{device} cannot hold the console's model and the {experiment} job: the console's model is "
                 "released while the job runs")
        self.update_status()
        return True

    def launch(self, experiment: str, argv: list[str]) -> BackgroundJob | None:
        if self.session is None:
            return None
        job = launch_job(self.session, experiment, argv)
        self.background.append(job)
        self.say(f"started {experiment} as its own process (pid {job.pid}); log: {job.log_path.name}")
        return job

    def settings_for(self, experiment: str, **changes: Any) -> Settings | None:
        """The experiment's default settings with `changes`, validated; a bad value is said, not raised."""
        try:
            return BY_NAME[experiment].defaults().override(changes)
        except UserError as exc:
            self.say(str(exc), "error")
            return None

    def action_map_job(self) -> None:
        settings = self.settings_for("ablation")
        if settings is not None:
            self.start_background("ablation", settings)

    def action_inject(self) -> None:
        screen = self._console()
        if screen is not None:
            screen.request_inject()  # the form answers with InjectRequested (or a Notice)

    @on(InjectRequested)
    def inject(self, request: InjectRequested) -> None:
        settings = self.settings_for(
            "recovery", layers=(request.layer,), sigma=request.sigma, steps=request.steps, lr=request.lr
        )
        screen = self._console()
        if settings is not None and self.start_background("recovery", settings) is not None and screen is not None:
            screen.show_tab("recovery")

    def action_growth(self) -> None:
        screen = self._console()
        if screen is not None:
            screen.request_growth()  # answered with GrowthRequested (or a Notice)

    @on(GrowthRequested)
    def growth(self, request: GrowthRequested) -> None:
        from tui.flags import settings_from_flags

        try:
            settings = settings_from_flags(BY_NAME["growth"], request.flags)
        except UserError as exc:
            self.say(f"growth flags: {exc}", "error")
            return
        screen = self._console()
        if self.start_background("growth", settings) is not None and screen is not None:
            screen.show_tab("growth")

    def action_cancel(self) -> None:
        """Cancels the running jobs of the tab in view (the layer map's, recovery's or growth's):
        in the console through the cancel flag, in their own process with SIGINT to the group."""
        screen = self._console()
        tab = screen.active_tab if screen is not None else ""
        if tab == "prompt":
            self.action_stop_generation()
            return
        wanted = {"layers": "ablation", "recovery": "recovery", "growth": "growth"}.get(tab)
        if wanted is None or self.session is None:
            self.say("open the tab of the job to cancel (Layers, Recovery or Growth) and press c")
            return
        cancelled = []
        if wanted in self.cancels:
            self.cancels[wanted].cancel()
            cancelled.append(wanted)
        for job_id, doc in self.session.jobs().items():
            mine = doc.get("experiment") == wanted and doc.get("status") == "running"
            if mine and doc.get("pid") != os.getpid() and stop_job(doc):
                cancelled.append(job_id)
        self.say(f"cancelling {', '.join(cancelled)}" if cancelled else f"no {wanted} job is running")

    def action_toggle_modified(self) -> None:
        if self.selected_layer is None:
            return
        self.modified_layers ^= {self.selected_layer}
        marked = ", ".join(map(str, sorted(self.modified_layers))) or "none"
        self.say(f"modified model: layers ablated (neighbour mean): {marked}")

    def action_resume_job(self) -> None:
        """Offers the newest interrupted job for resume, showing exactly the command that will run:
        rebuilt from the job's recorded experiment and settings, never from an argv in the file."""
        if self.session is None:
            return
        interrupted = resumable_job(self.session.jobs())
        if interrupted is None:
            self.say("no interrupted job to resume in this session")
            return
        job_id, doc = interrupted
        try:
            argv = resume_argv(doc, self.session)
        except UserError as exc:
            self.say(f"job {job_id} cannot be resumed: {exc}", "error")
            return
        shown = shlex.join(["anatomy-tui", *argv[3:]])
        self.push_screen(
            ConfirmScreen(f"Job {job_id} was interrupted. Resume it from its checkpoint?\n{shown}"),
            callback=lambda yes: self.launch(str(doc["experiment"]), argv) if yes else None,
        )

    async def action_quit(self) -> None:
        if self.cancels:

            def answer(yes: bool | None) -> None:
                if yes:
                    for token in self.cancels.values():
                        token.cancel()
                    self.exit()

            self.push_screen(
                ConfirmScreen(
                    f"{', '.join(self.cancels)} is running in the console and will stop. Quit anyway?"
                ),
                callback=answer,
            )
            return
        if self.state.running_jobs():
            log.info("quitting; jobs in their own process keep running")
        self.action_stop_generation()  # a generation in progress ends at its next token
        self.exit()

    # the prompt pane -------------------------------------------------------------------------------
    @on(GenerateRequested)
    def generate(self, request: GenerateRequested) -> None:
        """Starts a generation with what the request captured; a running one is stopped first."""
        screen = self._console()
        if screen is None or self.session is None or not self._need_model():
            return
        self.action_stop_generation()
        layers = tuple(sorted(self.modified_layers))
        columns = []
        for column, choice in request.columns.items():
            problem, path = "", None
            chosen = layers
            if choice == "recovered" and not saved_layers(self.session, "recovery"):
                problem = "no recovered layer in this session yet (inject noise: key i)"
            elif choice == "pruned":
                chosen = pruned_layers(self.state.results.get("prune"))
                problem = "" if chosen else "no prune result in this session yet (anatomy-tui run prune)"
            elif choice in ("growth", "uniform"):
                path = saved_model_path(self.state.results.get("growth"), choice)
                problem = "" if path else f"no {choice} model in this session yet (run growth: key g)"
            variant = None if problem else Variant(choice, layers=chosen, sigma=request.sigma, path=path)
            columns.append(Column(column, variant, problem))
        self.generations += 1
        self.generation = Generation(self.generations, threading.Event())
        plan = GenerationPlan(
            run=self.generation.run,
            prompt=request.prompt,
            columns=tuple(columns),
            tokens=GENERATE_TOKENS,
            loaded=self.loaded,
            lock=self.model_lock,
            stop=self.generation.stop,
            session=self.session,
            saved_models=self.saved_models,
        )
        screen.begin_generation(request.prompt)
        self.run_worker(
            partial(generate_work, self.post_message, plan),
            name="generate",
            group="generate",
            thread=True,
            exit_on_error=False,
            description="generation",
        )

    @on(TextGenerated)
    def text_generated(self, message: TextGenerated) -> None:
        screen = self._console()
        if screen is not None and self.generation is not None and message.run == self.generation.run:
            screen.show_generated(message.column, message.text, message.note)

    @on(GenerationDone)
    def generation_done(self, message: GenerationDone) -> None:
        if self.generation is not None and message.run == self.generation.run:
            self.generation = None

    def action_stop_generation(self) -> None:
        if self.generation is not None:
            self.generation.stop.set()

    # the command palette ---------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for _, action, title, text in ACTIONS:
            if action != "quit":
                yield SystemCommand(title, text, partial(self.run_action, action))
