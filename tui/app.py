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
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Input, RichLog
from textual.worker import Worker, WorkerState

from sessions.store import Session, SessionError, SessionStore
from tui.jobs import BackgroundJob, reap, start_job, stop_job
from tui.screens.confirm import ConfirmScreen
from tui.screens.console import TABS, ConsoleScreen
from tui.screens.help import HelpScreen
from tui.screens.layer_detail import LayerDetailScreen
from tui.screens.picker import SessionPicker
from tui.state import SessionState
from tui.widgets.layer_map import LayerMap
from tui.widgets.prompt_column import PromptColumn
from tui.widgets.status_line import StatusLine

log = logging.getLogger("anatomy_tui.console")

POLL_SECONDS = 0.25  # the event log is read and the panels redrawn at most 4 times a second
RECONCILE_EVERY = 8  # polls between checks of job processes that died without a word
GENERATE_TOKENS = 64
ON_LOADED_MODEL = ("original", "modified", "noised", "recovered")  # the rest are the session's growth models

# (key, action, title, description): one table drives the bindings, the help screen and the palette.
ACTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("f1,h", "help", "Help", "every key and what it does"),
    ("f2", "show_tab('layers')", "Layers tab", "the layer map and the selected layer's detail"),
    ("f3", "show_tab('recovery')", "Recovery tab", "noise injection and live recovery curves"),
    ("f4", "show_tab('growth')", "Growth tab", "the growth timeline and loss curves"),
    ("f5", "show_tab('prompt')", "Prompt tab", "generate text with two models side by side"),
    ("f6", "show_tab('analyses')", "Analyses tab", "weight statistics, angle profiles, scaling fit"),
    ("f7", "show_tab('log')", "Log tab", "messages from jobs and the console"),
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
class ModelOptions:
    """The model flags of `anatomy-tui` (also passed on to jobs the console starts)."""

    model: str = "smollm2-135m"
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    explicit: bool = True  # False: --model was left at its default, so a session's own model wins

    def job_args(self) -> list[str]:
        args = ["--model", self.model, "--device", self.device, "--dtype", self.dtype]
        return args + (["--trust-remote-code"] if self.trust_remote_code else [])


@dataclass
class Generation:
    """Text a generation worker produced that the UI has not shown yet (flushed on each poll)."""

    prompt: str
    pending: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, column: str, piece: str = "", note: str | None = None) -> None:
        with self.lock:
            self.pending.setdefault(column, []).append(piece)
            if note is not None:
                self.notes[column] = note

    def take(self) -> tuple[dict[str, str], dict[str, str]]:
        with self.lock:
            pieces = {column: "".join(parts) for column, parts in self.pending.items()}
            self.pending.clear()
            return pieces, dict(self.notes)


def available_experiments() -> set[str]:
    from tui.cli import RUN_COMMANDS

    return {name for name, _, _ in RUN_COMMANDS}


def accepts_resume(experiment: str) -> bool:
    """Whether `anatomy-tui run EXPERIMENT` has a --resume flag (its command module says)."""
    import argparse
    import importlib

    from tui.cli import RUN_COMMANDS

    for name, module_name, _ in RUN_COMMANDS:
        if name == experiment:
            parser = argparse.ArgumentParser(add_help=False)
            importlib.import_module(f"tui.commands.{module_name}").add_arguments(parser)
            return "--resume" in parser._option_string_actions
    return False


def resumable_job(jobs: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The newest interrupted job that is the latest of its experiment (not resumed since) and
    whose command can resume, or None."""
    latest: dict[str, tuple[str, dict[str, Any]]] = {}
    for job_id, doc in sorted(jobs.items(), key=lambda item: float(item[1].get("started") or 0)):
        latest[str(doc.get("experiment"))] = (job_id, doc)
    found = [(job_id, doc) for job_id, doc in latest.values() if doc.get("status") == "interrupted"]
    found = [(job_id, doc) for job_id, doc in found if accepts_resume(str(doc.get("experiment")))]
    return max(found, key=lambda item: float(item[1].get("started") or 0), default=None)


class AnatomyApp(App[None]):
    """The console. `load_model=False` keeps the model out (tests, snapshots of stored sessions)."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "anatomy-tui"
    BINDINGS = [Binding(key, action, title, show=action in FOOTER) for key, action, title, _ in ACTIONS]

    def __init__(
        self,
        store: SessionStore | None = None,
        session: str | None = None,
        resume: bool = False,
        options: ModelOptions | None = None,
        load_model: bool = True,
    ) -> None:
        super().__init__()
        self.store = store or SessionStore()
        self.requested = session
        self.resume = resume
        self.options = options or ModelOptions(explicit=False)
        self.autoload = load_model
        self.session: Session | None = None
        self.state = SessionState()
        self.offset = 0
        self.polls = 0
        self.loaded: Any = None
        self.model_status = "model: not loaded"
        self.model_lock = threading.Lock()
        self.extra_models: dict[str, Any] = {}
        self.cancels: dict[str, Any] = {}
        self.background: list[BackgroundJob] = []
        self.modified_layers: set[int] = set()
        self.generation: Generation | None = None
        self.stop_event = threading.Event()
        self.experiments = available_experiments()
        self.first_paint: float | None = None

    # startup -----------------------------------------------------------------------------------
    def on_mount(self) -> None:
        if self.requested:
            self.open_session(self.requested)
        elif self.resume and self.store.most_recent() is not None:
            self.open_session(self.store.most_recent().name)  # type: ignore[union-attr]
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
        if saved_model and saved_model != self.options.model and not self.options.explicit:
            self.options = replace(self.options, model=saved_model)
        app_log = self.session.writable_part("app.log")
        if app_log is not None:
            self._log_to_file(app_log)
        log.info("opened session %s (%s)", self.session.name, self.session.path)
        for result, doc in self.session.results().items():
            try:
                self.state.set_result(result, doc)
            except (KeyError, TypeError, ValueError) as exc:
                self.session.damage.append(f"result {result} cannot be shown ({type(exc).__name__}: {exc})")
        for reason in self.session.check():  # the session opens with what is readable; say what is not
            self.notify(reason, severity="warning", title="damaged part of the session", timeout=20)
        self.push_screen(ConsoleScreen())

    def after_first_paint(self) -> None:
        """Called by the console screen once it has painted: now the slow things may start."""
        self.first_paint = time.perf_counter()
        self.state.dirty.update({"layers", "recovery", "growth", "results", "jobs", "selection"})
        self.poll()
        self.set_interval(POLL_SECONDS, self.poll)
        if self.autoload:
            self.run_worker(
                self.load_model_work,
                name="load model",
                group="model",
                thread=True,
                exit_on_error=False,
                description=f"loading {self.options.model}",
            )
        interrupted = resumable_job(self.session.jobs())
        if interrupted is not None:
            job = interrupted[0]
            self.push_screen(
                ConfirmScreen(f"Job {job} was interrupted. Resume it from its checkpoint?"),
                callback=lambda yes: self.action_resume_job() if yes else None,
            )

    def _log_to_file(self, path: Path) -> None:
        """Every log record (ours, libraries', warnings) goes to app.log in the session, none to the tty."""
        root = logging.getLogger()
        for handler in list(root.handlers):
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                root.removeHandler(handler)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        logging.captureWarnings(True)

    def load_model_work(self) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
        hf_logging.disable_progress_bar()
        from engine.models import load_model

        self.model_status = f"model: loading {self.options.model}…"
        loaded = load_model(
            self.options.model,
            device=self.options.device,
            dtype=self.options.dtype,
            trust_remote_code=self.options.trust_remote_code,
            report=log.info,
        )
        self.loaded = loaded
        self.model_status = (
            f"{loaded.name} · {loaded.device} · {loaded.dtype_name} · {loaded.n_layers} layers"
        )
        log.info("model loaded: %s", self.model_status)
        self.state.dirty.update({"layers", "jobs"})

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
        self.flush_generation()
        dirty = self.state.take_dirty()
        if dirty:
            self.redraw(dirty)

    def reconcile_jobs(self) -> None:
        """Jobs whose process is gone without a 'finished' event (or that left no job file) read as
        interrupted; the job file's pid tells the status line where each job runs."""
        reap(self.background)
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
            screen.redraw(self, dirty)
        except Exception as exc:  # a damaged or unexpected result must not take the console down
            self.say(f"could not draw {', '.join(sorted(dirty))}: {type(exc).__name__}: {exc}", "error")
            log.exception("redraw failed")
        if dirty & {"jobs", "layers"}:
            self.update_status()
        if "log" in dirty:
            view = screen.query_one("#log-view", RichLog)
            for level, text in self.state.take_new_log():
                view.write(f"[{level}] {text}")

    def update_status(self) -> None:
        screen = self._console()
        if screen is None:
            return
        me = os.getpid()
        jobs = [
            (job, "in console" if job.pid in (None, me) else "own process")
            for job in self.state.running_jobs()
        ]
        screen.query_one(StatusLine).show(self.session_name, self.model_status, jobs)

    def _console(self) -> ConsoleScreen | None:
        for screen in reversed(self.screen_stack):
            if isinstance(screen, ConsoleScreen):
                return screen
        return None

    @property
    def session_name(self) -> str:
        return self.session.name if self.session is not None else ""

    @property
    def selected_layer(self) -> int | None:
        """The layer under the map's cursor, read at the moment of use (keys typed ahead of the
        highlight messages still act on the right layer)."""
        screen = self._console()
        if screen is None:
            return None
        table = screen.query_one(LayerMap)
        return table.cursor_row if table.row_count else None

    @property
    def n_layers(self) -> int:
        return self.loaded.n_layers if self.loaded is not None else self.state.n_layers

    def has_experiment(self, name: str) -> bool:
        return name in self.experiments

    def say(self, text: str, level: str = "info") -> None:
        """A notification, a line in the log panel and one in app.log."""
        severity = {"info": "information"}.get(level, level)
        self.notify(text, severity=severity)  # type: ignore[arg-type]
        self.state.add_log(level, text)
        log.log(logging.ERROR if level == "error" else logging.INFO, text)

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
        if worker.group == "model" and event.state in (WorkerState.SUCCESS, WorkerState.ERROR):
            if event.state == WorkerState.ERROR:
                self.model_status = "model: failed to load (see Log)"
            self.update_status()
        if worker.group == "experiment" and event.state in (
            WorkerState.SUCCESS,
            WorkerState.ERROR,
            WorkerState.CANCELLED,
        ):
            self.cancels.pop(worker.name, None)

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

    def action_detail(self) -> None:
        if self._console() is not None:
            self.push_screen(LayerDetailScreen(self.state, self.selected_layer))

    def _need_model(self) -> bool:
        if self.loaded is None:
            self.say("the model is still loading (see the status line); try again in a moment", "warning")
            return False
        return True

    def run_experiment(self, name: str, work: Any, description: str) -> Worker | None:
        """An experiment in a thread worker of the console, writing into the session like a job."""
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
        self.run_experiment("ablation", self.ablation_work, "layer map (ablation)")

    def ablation_work(self, token: Any) -> None:
        from dataclasses import asdict

        from engine.experiments.ablation import AblationSettings, run_ablation
        from sessions.jobs import run_job

        settings = AblationSettings()
        with self.model_lock:
            spec = {**asdict(settings), "model": self.loaded.describe()}
            events = run_ablation(self.loaded.model, self.loaded.tokenizer, settings, token, self.loaded.name)
            run_job(self.session, "ablation", spec, events)

    def start_background(self, experiment: str, args: list[str]) -> BackgroundJob | None:
        if self.session is None:
            return None
        if not self.has_experiment(experiment):
            self.say(f"the {experiment} experiment is not in this version of anatomy-tui yet", "warning")
            return None
        job = start_job(self.session, experiment, args)
        self.background.append(job)
        self.say(f"started {experiment} as its own process (pid {job.pid}); log: {job.log_path.name}")
        return job

    def action_map_job(self) -> None:
        self.start_background("ablation", self.options.job_args())

    def action_inject(self) -> None:
        screen = self._console()
        if screen is None:
            return
        if self.selected_layer is None:
            self.say("select a layer first (Layers tab, arrows)", "warning")
            return
        values = {}
        for name in ("sigma", "steps", "lr"):
            raw = screen.query_one(f"#{name}", Input).value.strip()
            try:
                values[name] = int(raw) if name == "steps" else float(raw)
            except ValueError:
                self.say(f"{name} must be a number, not {raw!r}", "error")
                return
        args = [
            "--layers",
            str(self.selected_layer),
            "--sigma",
            str(values["sigma"]),
            "--steps",
            str(values["steps"]),
            "--lr",
            str(values["lr"]),
            *self.options.job_args(),
        ]
        if self.start_background("recovery", args) is not None:
            screen.show_tab("recovery")

    def action_growth(self) -> None:
        screen = self._console()
        if screen is None:
            return
        try:
            flags = shlex.split(screen.query_one("#growth-flags", Input).value)
        except ValueError as exc:
            self.say(f"growth flags: {exc}", "error")
            return
        if self.start_background("growth", flags) is not None:
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
        if self.session is None:
            return
        interrupted = resumable_job(self.session.jobs())
        if interrupted is None:
            self.say("no interrupted job to resume in this session")
            return
        argv = [str(a) for a in interrupted[1].get("argv", [])]
        if len(argv) < 3 or argv[1] != "run":
            self.say("the interrupted job did not record its command; start it again by hand", "warning")
            return
        args = [a for a in argv[3:] if a != "--resume"]
        if "--session" in args:  # start_job adds the session itself
            at = args.index("--session")
            del args[at : at + 2]
        self.start_background(argv[2], [*args, "--resume"])

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
        self.stop_event.set()  # a generation in progress ends at its next token
        self.exit()

    # the prompt pane -------------------------------------------------------------------------------
    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "prompt-input" and event.value.strip():
            self.generate(event.value)

    def generate(self, prompt: str) -> None:
        screen = self._console()
        if screen is None or not self._need_model():
            return
        columns = {column.id: column.model_choice for column in screen.query(PromptColumn)}
        for column in screen.query(PromptColumn):
            column.begin(prompt)
        self.generation = Generation(prompt)
        self.stop_event.clear()
        self.run_worker(
            partial(self.generate_work, self.generation, columns),
            name="generate",
            group="generate",
            thread=True,
            exclusive=True,
            exit_on_error=False,
            description="generation",
        )

    def generate_work(self, generation: Generation, columns: dict[str, str]) -> None:
        from engine.anatomy import LayerStack
        from tui.generation import stream_greedy

        for column, choice in columns.items():
            if self.stop_event.is_set():
                generation.add(column, note="stopped")
                continue
            model, tokenizer = self.model_for(choice)
            if model is None:
                generation.add(column, note=tokenizer)
                continue
            with ExitStack() as held:
                if choice in ON_LOADED_MODEL:
                    if not self.model_lock.acquire(blocking=False):
                        generation.add(column, note="waiting for the job running in the console")
                        self.model_lock.acquire()
                        generation.add(column, note="")
                    held.callback(self.model_lock.release)
                if choice in ON_LOADED_MODEL and choice != "original":
                    held.enter_context(self.changed_layers(LayerStack(model), choice))
                for piece in stream_greedy(
                    model, tokenizer, generation.prompt, GENERATE_TOKENS, self.stop_event.is_set
                ):
                    generation.add(column, piece)
            generation.add(column, note="stopped" if self.stop_event.is_set() else "")

    def changed_layers(self, stack: Any, choice: str) -> ExitStack:
        """The loaded model as `choice` sees it, for one generation; every change is undone exactly
        on exit. modified: x-marked layers ablated by neighbour mean; noised: x-marked layers with
        Gaussian noise of the recovery form's sigma (seed 0); recovered: the layers the session's
        recovery runs fine-tuned, as they ended."""
        import torch

        from engine.experiments.ablation import ablated
        from engine.experiments.recovery import add_noise
        from sessions.layer_weights import load_layers

        held = ExitStack()
        marked = sorted(self.modified_layers)
        if choice == "modified":
            for index in marked:
                held.enter_context(ablated(stack, index, "mean"))
        elif choice == "noised":
            held.enter_context(stack.preserved(marked))
            generator = torch.Generator().manual_seed(0)
            for index in marked:
                add_noise(stack, index, self.noise_sigma(), generator)
        elif choice == "recovered":
            held.enter_context(stack.holding(load_layers(self.session, "recovery", self.loaded.name)))
        return held

    def noise_sigma(self) -> float:
        try:
            value = float(self.screen.query_one("#sigma", Input).value)
        except (ValueError, LookupError):
            return 0.5
        return value if value > 0 else 0.5

    def model_for(self, choice: str) -> tuple[Any, Any]:
        """(model, tokenizer), or (None, why) when the session has no such model."""
        from sessions.layer_weights import saved_layers

        if choice in ON_LOADED_MODEL:
            if choice == "recovered" and not saved_layers(self.session, "recovery"):
                return None, "no recovered layer in this session yet (inject noise: key i)"
            return self.loaded.model, self.loaded.tokenizer
        if choice not in self.extra_models:
            arm = {"growth": "growth_100", "uniform": "uniform_100"}[choice]
            path = ((self.state.results.get("growth") or {}).get("arms", {}).get(arm) or {}).get("model")
            if not path or not Path(path).exists():
                return None, f"no {choice} model in this session yet (run growth: key g)"
            from engine.experiments.growth.architecture import load_growth_model

            self.extra_models[choice] = load_growth_model(path)
        return self.extra_models[choice]

    def flush_generation(self) -> None:
        generation = self.generation
        screen = self._console()
        if generation is None or screen is None:
            return
        pieces, notes = generation.take()
        for column in screen.query(PromptColumn):
            if column.id in pieces or column.id in notes:
                column.append(generation.prompt, pieces.get(column.id, ""), notes.get(column.id, ""))

    def action_stop_generation(self) -> None:
        self.stop_event.set()

    # the command palette ---------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for _, action, title, text in ACTIONS:
            if action != "quit":
                yield SystemCommand(title, text, partial(self.run_action, action))
