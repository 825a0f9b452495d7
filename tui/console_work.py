"""The console's thread workers, started with what the lab answered: the model's load (a daemon
thread), the layer map in the console, the growth form's phases, the prompt pane's generations.
Everything a worker needs is captured here, on the UI thread, when it starts; the workers
(tui/workers.py) only post messages, which the app routes (tui/app.py); a generation's text goes
to the console screen, which shows it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from engine.models.options import ModelOptions
from tui.lab import Lab
from tui.screens.console import ConsoleScreen
from tui.workers import (
    Column,
    GenerationPlan,
    Post,
    experiment_work,
    generate_work,
    growth_preview_work,
    load_model_work,
)

log = logging.getLogger("anatomy_tui.console")


class ConsoleWork:
    """Starts the console's workers: `post` is the app's thread-safe `post_message`, `run_worker`
    the app's (a failure is said by the app, never raised into it); a generation makes `tokens`."""

    def __init__(self, lab: Lab, post: Post, run_worker: Callable[..., Any], tokens: int) -> None:
        self.lab = lab
        self.post = post
        self.run_worker = run_worker
        self.tokens = tokens

    def in_thread(self, work: Callable[[], None], name: str, group: str, description: str) -> None:
        """`work` in a thread worker; a failure is said by the app (its on_worker_state_changed)."""
        self.run_worker(work, name=name, group=group, thread=True, exit_on_error=False, description=description)

    def failed(self, worker: Any) -> None:
        """A worker (a Textual one) that raised: said in the log panel and app.log, never raised into the app."""
        error = worker.error
        self.lab.say(f"{worker.description or worker.name} failed: {type(error).__name__}: {error}", "error")
        log.error("worker %s failed", worker.name, exc_info=error)

    def load_model(self, options: ModelOptions) -> None:
        """The console's model, loaded on a daemon thread (the lab says when). Not a Textual worker:
        the app would wait for it on exit, so Ctrl+Q during a first load (a minute of dequantising)
        would not quit at once. The thread only posts messages."""
        work = partial(load_model_work, self.post, options)
        threading.Thread(target=work, name="load model", daemon=True).start()

    def layer_map(self) -> None:
        """The layer map in a thread worker of the console, written into the session like a job."""
        lab = self.lab
        run = lab.map_in_console()
        if run is None:
            return
        assert lab.session is not None  # the lab answers a run only with a session open
        work = partial(experiment_work, self.post, lab.session, lab.loaded, lab.options, lab.turns,
                       run.name, run.settings, run.token, run.resume)
        self.in_thread(work, run.name, "experiment", run.description)

    def growth_preview(self, flags: tuple[str, ...]) -> None:
        """Plans the growth form's phases (torch)."""
        self.in_thread(partial(growth_preview_work, self.post, flags), "growth preview", "preview",
                       "planning the growth phases")

    def generation(self, prompt: str, columns: dict[str, str], sigma: float, screen: ConsoleScreen) -> None:
        """A new generation of `prompt` in each column's model (a running one is stopped first), its
        text posted to the console screen, its end to the app; nothing if the lab says why."""
        lab = self.lab
        generation = lab.new_generation()
        if generation is None:
            return
        assert lab.session is not None  # the lab answers a generation only with a session open
        plan = GenerationPlan(
            run=generation.run,
            prompt=prompt,
            columns=tuple(Column(name, *lab.variant(choice, sigma)) for name, choice in columns.items()),
            tokens=self.tokens,
            loaded=lab.loaded,
            turns=lab.turns,
            stop=generation.stop,
            session=lab.session,
            saved_models=lab.saved_models,
        )
        screen.begin_generation(prompt, generation.run)
        work = partial(generate_work, self.post, plan, screen.post_message)
        self.in_thread(work, "generate", "generate", "generation")
