"""The console's policy, without Textual: which session opens, when a new session maps its layers by
itself, where a job runs (beside the console's model, on another GPU, or after the console releases
its model, reloaded when the job ends), cancelling, resume offers, jobs whose process died without
a word, and which prompt-pane models this session has.

The app (tui/app.py) routes keys, requests and worker messages here and draws what the lab keeps;
the lab answers with data and talks back through three callables (a line for the user, the status
line changed, a model to load), so tests drive it directly, with no terminal.

One Lab, one job a module: what the parts share (tui/lab_base.py), the console's model and the
prompt pane (tui/lab_model.py), the experiments it starts (tui/lab_jobs.py), and here the session:
opening it, following its event log, its index and view, and jobs whose process died.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any

from engine.core.errors import UserError
from sessions.documents import JobRecord
from tui import console_view, event_index
from tui.jobs import reap
from tui.lab_jobs import LabJobs
from tui.lab_model import LabModel
from tui.log_pager import LogPager
from tui.logging_setup import log_to_file
from tui.session_files import APP_LOG, FIGURES
from tui.state import JobView

log = logging.getLogger("anatomy_tui.console")

RECONCILE_EVERY = 8  # polls between checks of job processes that died without a word
READ_LIMIT = 4 << 20  # bytes of the event log read per poll at most
FOLD_SECONDS = 0.15  # folding per poll at most: a large log comes in over several polls, drawn, keys answered
CATCH_UP_REDRAW = 4  # polls between redraws while a large log is read (redrawing costs more than folding)
INDEX_EVERY = 4 << 20  # bytes of the log folded between writes of its index (tui/event_index.py)
INDEX_IDLE_SECONDS = 10.0  # or, with the log read to its end, this long after the last write
VIEW_SECONDS = 2.0  # the console's view (layer, tab, forms) is written at most this often, and on quitting


class Lab(LabJobs, LabModel):
    """What the console knows and decides: its parts' methods on one object (the app's and the tests'
    one handle), and the session's own here."""

    def save_figures(self, names: tuple[str, ...]) -> None:
        """The publication figures (figures/) of these results, as PNG and SVG in the session's
        figures/ folder; says where, or why none was saved."""
        drawable = [name for name in names if name in self.state.results]
        if self.session is None or not drawable:
            self.say("no result in this panel to draw yet", "warning")
            return
        import figures

        written = []
        try:
            folder = self.session.part(FIGURES)
            for name in drawable:
                result = self.state.typed.get(name)  # read as its class by the one reader when it came
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
            if last:
                return last
            if recent is not None:
                return recent.name
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
        self.adopt_started(log_read=not behind)
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
        if self.session is not None:  # a job still starting has no job file yet: its own process stands for it
            starting = {job.starting: JobRecord(status="running", experiment=job.experiment, pid=job.pid)
                        for job in self.background if job.starting and job.alive()}
            self.state.follow_job_files({**self.session.job_records(), **starting})

    def running_jobs(self) -> list[tuple[JobView, str]]:
        """The running jobs, each with where it runs, for the status line: its pid says (a job this
        console launched has its pid from the start); a job whose job file is not read yet runs in
        the console only when the console runs one of its experiment."""
        me = os.getpid()

        def where(job: JobView) -> str:
            here = job.pid == me if job.pid is not None else job.experiment in self.cancels
            return "in console" if here else "own process"

        return [(job, where(job)) for job in self.state.running_jobs()]

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
