"""The lab console: a Textual app over one session of the store.

Everything the panels show comes from the session's event log and results, tailed a few times a
second, so a job running in the console (a thread worker) and a job running as its own process
(`anatomy-tui run ... --session S`) look the same, and reopening a session redraws it all without
recomputing. torch is imported only inside workers, after the first screen is painted.

The app routes: the console screen's requests and the workers' messages go to the lab
(tui/lab.py, the console's policy, no Textual), and what the lab keeps is drawn on the screen.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from engine.core.errors import UserError
from engine.core.untrusted import printable
from engine.models.options import ModelOptions
from sessions.store import Session, SessionError, SessionStore
from tui.console_settings import ConsoleSettings
from tui.console_work import ConsoleWork
from tui.lab import Lab
from tui.messages import (
    ConsolePainted,
    ConsoleReady,
    ForTheLab,
    GenerateRequested,
    GrowthPreviewRequested,
    GrowthRequested,
    InjectRequested,
    LogPageRequested,
    ModelFailed,
    ModelLoaded,
)
from tui.screens.confirm import ConfirmScreen
from tui.screens.console import ConsoleScreen, PanelData
from tui.screens.console_keys import ACTIONS, APP_ACTIONS, help_screen, palette
from tui.screens.picker import SessionPicker
from tui.state import Dirty, SessionState

POLL_SECONDS = 0.25  # the event log is read and the panels redrawn at most 4 times a second
GENERATE_TOKENS = 64  # the prompt pane's generations

# What is imported by now (Textual, the engine's core, the console's modules: tens of thousands of
# objects) lives as long as the process; frozen, the cyclic collector stops walking it at every full
# collection, each of which cost the first screen's build about 15 ms (benchmarks/startup.py).
gc.freeze()


class AnatomyApp(App[None]):
    """The console. `load_model=False` keeps the model out (tests, snapshots of stored sessions).

    Calls go down (the app calls the screen's methods), messages come up: the screen posts
    requests (tui/messages.py) and the workers (tui/workers.py) post what they did; both are
    answered here, on the UI thread, by asking the lab."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "anatomy-tui"
    # help and quit work on every screen; the console's other keys are the console screen's
    BINDINGS = [Binding(key, action, title) for key, action, title, _ in ACTIONS if action in APP_ACTIONS]

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
        self.requested = session
        self.resume = resume
        self.autoload = load_model
        self.lab = Lab(
            store or SessionStore(),
            options or ModelOptions(),
            # False: --model was left at its default, so a session's own model wins (given options are explicit)
            model_explicit=options is not None if model_explicit is None else model_explicit,
            settings=self.console_settings,
            tell=self.tell,
            status_changed=lambda: self.redraw({Dirty.JOBS}),  # the status line
            start_load=lambda options: self.work.load_model(options),
        )
        self.work = ConsoleWork(self.lab, self.post_message, self.run_worker, GENERATE_TOKENS)  # starts the workers
        self.first_paint: float | None = None
        self.exit_line = ""  # why the console ended before it began (a sessions folder it cannot use)

    # what the console shows, kept by the lab
    @property
    def state(self) -> SessionState:
        return self.lab.state

    @property
    def session(self) -> Session | None:
        return self.lab.session

    @property
    def session_name(self) -> str:
        return self.lab.session_name

    @property
    def loaded(self) -> Any:
        return self.lab.loaded

    # startup -----------------------------------------------------------------------------------
    def on_mount(self) -> None:
        try:
            name = self.lab.first_session(self.requested, self.resume)
        except SessionError as exc:  # the sessions folder is a file or cannot be written: its line, no traceback
            self.exit_line = f"anatomy-tui: error: {exc}"  # printed by cli/launch.py once the screen is gone
            self.exit(return_code=2)
            return
        if name is not None:
            self.open_session(name)
        else:
            self.push_screen(SessionPicker(self.lab.store, self.lab.last_session()), callback=self.open_session)

    def open_session(self, name: str | None) -> None:
        if not name:
            self.exit()
            return
        try:
            damaged = self.lab.open(name)
        except SessionError as exc:  # a damaged or refused session: say why and pick again
            self.notify(printable(str(exc)), severity="error", title="cannot open the session", timeout=20,
                        markup=False)
            self.push_screen(SessionPicker(self.lab.store, self.lab.last_session()), callback=self.open_session)
            return
        for reason in damaged:  # the session opens with what is readable; say what is not
            self.notify(printable(reason), severity="warning", title="damaged part of the session", timeout=20,
                        markup=False)
        self.push_screen(ConsoleScreen(self.console_settings, self.lab.state, self.lab.view))

    @on(ConsolePainted)
    def console_painted(self, message: ConsolePainted) -> None:
        self.first_paint = message.at

    @on(ConsoleReady)
    def console_ready(self) -> None:
        self.after_first_paint()

    def after_first_paint(self) -> None:
        """The console screen has painted and built its panes: now the slow things may start."""
        self.lab.state.dirty.update(Dirty.EVERY)
        self.poll()
        self.set_interval(POLL_SECONDS, self.poll)
        if self.lab.atlas:  # no model of its own: its measures, live, and its table once it is saved
            self.action_compare()
            return
        if self.autoload:
            self.lab.load_model()
        self.action_resume_job(asked=False)
        if not self.autoload:
            self.start_growth_preview()

    def start_growth_preview(self) -> None:
        """Asks the growth form for its flags, to plan their phases (after the model: that comes first)."""
        screen = self._console()
        if self.lab.growth_preview_wanted() and screen is not None:
            screen.ask_growth_preview()

    @on(GrowthPreviewRequested)
    def plan_growth_preview(self, request: GrowthPreviewRequested) -> None:
        self.work.growth_preview(request.flags)

    @on(ForTheLab)
    def to_the_lab(self, message: ForTheLab) -> None:
        """A worker's message or a request the lab answers alone (tui/messages.py names its call); what
        the answer changed (the growth form's phases, a mark, a notice) is drawn now, not at the next poll."""
        message.answer(self.lab)
        if self.lab.state.dirty and self._console() is not None:
            self.redraw(self.lab.state.take_dirty())

    @on(ModelLoaded)
    def model_loaded(self, message: ModelLoaded) -> None:
        if self.lab.model_loaded(message.loaded):
            self.action_compute_map()
        self.start_growth_preview()

    @on(ModelFailed)
    def model_failed(self, message: ModelFailed) -> None:
        """The model could not load: why, and a field for another model (the session keeps the one chosen)."""
        from tui.screens.model_choice import ModelChoice  # here: needed only when a load fails

        reason = self.lab.model_failed(message.error)
        self.push_screen(ModelChoice(self.lab.options.model, reason, self.lab.choose_model))
        self.start_growth_preview()

    # the event log, a few times a second ---------------------------------------------------------
    def poll(self) -> None:
        dirty = self.lab.poll()
        if dirty:
            self.redraw(dirty)

    def redraw(self, dirty: set[str]) -> None:
        screen = self._console()
        if screen is not None:
            lab = self.lab
            screen.redraw(PanelData(lab.state, lab.n_layers, lab.session_name, lab.model_status, lab.running_jobs(),
                                    lab.marks), dirty)

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

    def tell(self, text: str, level: str) -> None:
        """A notification (the lab also logs the line and shows it in the log panel)."""
        self.notify(printable(text), severity={"info": "information"}.get(level, level),  # type: ignore[arg-type]  # the lab's levels are Textual's but info
                    markup=False)  # the text may hold a session's (a job's error): never markup

    @on(LogPageRequested)
    def log_page(self, request: LogPageRequested) -> None:
        """An older or newer page of the Log tab, read from the event log; page 0, the live lines."""
        screen = self._console()
        lines = self.lab.log_page(request.back)
        if screen is not None:
            screen.show_log_page(request.back, lines if request.back else list(self.lab.state.log))

    # the failures of any worker (tui/console_work.py starts them) -------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.work.failed(event.worker)

    # requests from the console screen --------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(help_screen())

    def action_compare(self) -> None:
        from tui.screens.compare import CompareScreen  # here: its plots' modules are not needed to paint

        if isinstance(self.screen, CompareScreen):  # open already (an atlas's session opens on it)
            return
        try:
            shown = self.lab.comparison()
        except (UserError, SessionError) as exc:
            self.notify(str(exc), severity="warning", title="nothing to compare")
            return
        if shown is not None:
            self.push_screen(CompareScreen(shown))

    def action_map_job(self) -> None:
        self.lab.map_job()

    def action_compute_map(self) -> None:
        self.work.layer_map()

    @on(InjectRequested)
    def inject(self, request: InjectRequested) -> None:
        screen = self._console()
        if self.lab.inject(request.layer, request.sigma, request.steps, request.lr) and screen is not None:
            screen.show_tab("recovery")

    @on(GrowthRequested)
    def growth(self, request: GrowthRequested) -> None:
        screen = self._console()
        if self.lab.growth(request.flags) and screen is not None:
            screen.show_tab("growth")

    def action_resume_job(self, asked: bool = True) -> None:
        """Offers the newest interrupted job for resume, showing exactly the command that will run
        (key r; at startup, unasked: only when the lab says so)."""
        offer = self.lab.resume_offer(asked)
        if offer is not None:

            def answered(yes: bool | None) -> None:
                if yes:
                    self.lab.launch(offer.experiment, offer.argv)

            self.push_screen(ConfirmScreen(offer.question), callback=answered)

    async def action_quit(self) -> None:
        busy = self.lab.running_in_console()
        if not busy:
            self.lab.closing()
            self.exit()
            return
        question = f"{', '.join(busy)} is running in the console and will stop. Quit anyway?"
        self.push_screen(ConfirmScreen(question), callback=self.stop_and_quit)

    def stop_and_quit(self, yes: bool | None) -> None:
        if yes:
            self.lab.stop_console_runs()
            self.lab.closing()  # the view (marks, layer, tab, forms) is kept as on any quit
            self.exit()

    # the prompt pane -------------------------------------------------------------------------------
    @on(GenerateRequested)
    def generate(self, request: GenerateRequested) -> None:
        """Starts a generation with what the request captured (a running one is stopped first); its
        worker posts the text to the console screen."""
        screen = self._console()
        if screen is not None:
            self.work.generation(request.prompt, request.columns, request.sigma, screen)

    def action_stop_generation(self) -> None:
        self.lab.stop_generation()

    # the command palette: the console's actions too
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from palette(screen, self.run_action)
