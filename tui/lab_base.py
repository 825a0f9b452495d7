"""What every part of the console's policy (tui/lab.py) shares: the session, its state, the loaded
model and the running work, and the one way to tell the user something. The parts (tui/lab_model.py,
tui/lab_jobs.py, and the session's log in tui/lab.py) each add one job to it; the app sees one Lab.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.core.events import CancelToken
from engine.core.turns import ModelTurns
from engine.experiments.variants import SavedModels
from engine.models.options import ModelOptions
from sessions.store import Session, SessionStore
from tui import console_view
from tui.console_settings import ConsoleSettings
from tui.jobs import BackgroundJob
from tui.line_keeper import LineKeeper
from tui.log_pager import LogPager
from tui.state import SessionState

log = logging.getLogger("anatomy_tui.console")


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


class LabBase:
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

    @property
    def session_name(self) -> str:
        return self.session.name if self.session is not None else ""

    @property
    def n_layers(self) -> int:
        return self.loaded.n_layers if self.loaded is not None else self.state.n_layers

    def need_model(self) -> bool:
        if self.atlas:
            self.say(NO_MODEL_IN_AN_ATLAS, "warning")
            return False
        if self.loaded is None:
            self.say("the model is still loading (see the status line); try again in a moment", "warning")
            return False
        return True
