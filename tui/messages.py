"""The messages of the console: what workers report up to the app, and what the console screen asks
the app to do. Workers never touch a widget or an attribute of the app; they post one of these
(`post_message` is thread-safe) and a handler on the UI thread does the rest. Everything a worker
needs is captured on the UI thread before it starts.

A message the lab answers alone is a `ForTheLab`: it names the lab's call (`answer`), and the app
routes every one of them with a single handler. The others need the screen or a worker too."""

from __future__ import annotations

from typing import Any

from textual.message import Message


class ForTheLab(Message):
    """A message the lab (tui/lab.py) answers alone: the app calls `answer(lab)` on the UI thread."""

    def answer(self, lab: Any) -> None:
        raise NotImplementedError


# from workers -------------------------------------------------------------------------------------


class ModelLoaded(Message):
    """The model-loading worker has the model (an `engine.models.loading.LoadedModel`)."""

    def __init__(self, loaded: Any) -> None:
        super().__init__()
        self.loaded = loaded


class ModelProgress(ForTheLab):
    """A line of the model loader's progress (the first dequantisation of the embedded model);
    a newer one replaces an older one still queued."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ModelProgress)

    def answer(self, lab: Any) -> None:
        lab.model_progress(self.text)


class ModelFailed(Message):
    """The model could not be loaded; `error` says why in one line."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class TextGenerated(Message):
    """Everything generation `run` has produced so far for one prompt column, and a note under it
    ('stopped', 'waiting for ...'). The text is whole, not a piece, so a newer message replaces an
    older one still in the queue: a fast model never floods the UI. Posted to the console screen,
    which shows it (it goes no further)."""

    bubble = False

    def __init__(self, run: int, column: str, text: str, note: str = "") -> None:
        super().__init__()
        self.run = run
        self.column = column
        self.text = text
        self.note = note

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TextGenerated) and (message.run, message.column) == (self.run, self.column)


class GenerationDone(ForTheLab):
    """Generation `run` has finished every column (or was stopped)."""

    def __init__(self, run: int) -> None:
        super().__init__()
        self.run = run

    def answer(self, lab: Any) -> None:
        lab.generation_done(self.run)


class GrowthPreview(ForTheLab):
    """The phases a growth run with `flags` would go through (growth.plan's `arms`), for the growth
    panel before any run."""

    def __init__(self, flags: tuple[str, ...], arms: dict[str, Any]) -> None:
        super().__init__()
        self.flags = flags
        self.arms = arms

    def answer(self, lab: Any) -> None:
        lab.growth_previewed(self.flags, self.arms)


class ExperimentFinished(ForTheLab):
    """An experiment running in a thread worker of the console has ended, however it ended."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def answer(self, lab: Any) -> None:
        lab.console_run_ended(self.name)


# from the console screen --------------------------------------------------------------------------


class ConsolePainted(Message):
    """The console screen's first frame is on the terminal (at `time.perf_counter()` `at`); the
    panes out of view are built next."""

    def __init__(self, at: float) -> None:
        super().__init__()
        self.at = at


class ConsoleReady(Message):
    """The console screen has painted once and built every pane: now the slow things (torch, the
    model) may start."""


class LogPageRequested(Message):
    """The Log tab wants page `back` of its lines (0: the live view, 1: the newest page of the event
    log, higher: older; tui/log_pager.py)."""

    def __init__(self, back: int) -> None:
        super().__init__()
        self.back = back


class Notice(ForTheLab):
    """A line for the user (a form that does not parse, say): the app notifies and logs it."""

    def __init__(self, text: str, level: str = "info") -> None:
        super().__init__()
        self.text = text
        self.level = level

    def answer(self, lab: Any) -> None:
        lab.say(self.text, self.level)


class InjectRequested(Message):
    """Noise `layer` with `sigma` and let it recover for `steps` at `lr` (the recovery form; `steps`
    None: auto, sized for the device)."""

    def __init__(self, layer: int, sigma: float, steps: int | None, lr: float) -> None:
        super().__init__()
        self.layer = layer
        self.sigma = sigma
        self.steps = steps
        self.lr = lr


class MarkRequested(ForTheLab):
    """Mark `layer` (with `part`, its attention or MLP block) in the prompt pane's modified model, or
    unmark it."""

    def __init__(self, layer: int, part: str | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.part = part

    def answer(self, lab: Any) -> None:
        if self.part is None:
            lab.toggle_mark(self.layer)
        else:
            lab.toggle_block_mark(self.layer, self.part)


class FigureRequested(ForTheLab):
    """Save the figures of these results (the panel in view's) in the session's figures/ folder."""

    def __init__(self, results: tuple[str, ...]) -> None:
        super().__init__()
        self.results = results

    def answer(self, lab: Any) -> None:
        lab.save_figures(self.results)


class ViewChanged(ForTheLab):
    """The console screen's selected layer, tab or a form changed (a `tui.console_view.ConsoleView`):
    the lab keeps it for the next start."""

    def __init__(self, view: Any) -> None:
        super().__init__()
        self.view = view

    def answer(self, lab: Any) -> None:
        lab.view_changed(self.view)


class CancelRequested(ForTheLab):
    """Cancel the running jobs of `experiment` (the job of the panel in view)."""

    def __init__(self, experiment: str) -> None:
        super().__init__()
        self.experiment = experiment

    def answer(self, lab: Any) -> None:
        lab.cancel(self.experiment)


class GrowthPreviewRequested(Message):
    """Plan the phases a growth run with the growth form's `flags` would go through (the app asked
    for them once the model is settled)."""

    def __init__(self, flags: tuple[str, ...]) -> None:
        super().__init__()
        self.flags = flags


class GrowthRequested(Message):
    """Start a growth run with these command-line flags (the growth form)."""

    def __init__(self, flags: tuple[str, ...]) -> None:
        super().__init__()
        self.flags = flags


class GenerateRequested(Message):
    """Generate from `prompt` with each column's model (column id -> variant name); `sigma` is the
    recovery form's noise scale at the moment of asking, for the noised variant."""

    def __init__(self, prompt: str, columns: dict[str, str], sigma: float) -> None:
        super().__init__()
        self.prompt = prompt
        self.columns = columns
        self.sigma = sigma
