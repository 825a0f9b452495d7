"""The messages of the console: what workers report up to the app, and what the console screen asks
the app to do. Workers never touch a widget or an attribute of the app; they post one of these
(`post_message` is thread-safe) and a handler on the UI thread does the rest. Everything a worker
needs is captured on the UI thread before it starts."""

from __future__ import annotations

from typing import Any

from textual.message import Message

# from workers -------------------------------------------------------------------------------------


class ModelLoaded(Message):
    """The model-loading worker has the model (an `engine.models.loading.LoadedModel`)."""

    def __init__(self, loaded: Any) -> None:
        super().__init__()
        self.loaded = loaded


class ModelProgress(Message):
    """A line of the model loader's progress (the first dequantisation of the embedded model);
    a newer one replaces an older one still queued."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ModelProgress)


class ModelFailed(Message):
    """The model could not be loaded; `error` says why in one line."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class TextGenerated(Message):
    """Everything generation `run` has produced so far for one prompt column, and a note under it
    ('stopped', 'waiting for ...'). The text is whole, not a piece, so a newer message replaces an
    older one still in the queue: a fast model never floods the UI."""

    def __init__(self, run: int, column: str, text: str, note: str = "") -> None:
        super().__init__()
        self.run = run
        self.column = column
        self.text = text
        self.note = note

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TextGenerated) and (message.run, message.column) == (self.run, self.column)


class GenerationDone(Message):
    """Generation `run` has finished every column (or was stopped)."""

    def __init__(self, run: int) -> None:
        super().__init__()
        self.run = run


class GrowthPreview(Message):
    """The phases a growth run with `flags` would go through (growth.plan's `arms`), for the growth
    panel before any run."""

    def __init__(self, flags: tuple[str, ...], arms: dict[str, Any]) -> None:
        super().__init__()
        self.flags = flags
        self.arms = arms


class ExperimentFinished(Message):
    """An experiment running in a thread worker of the console has ended, however it ended."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


# from the console screen --------------------------------------------------------------------------


class ConsoleReady(Message):
    """The console screen has painted once: now the slow things (torch, the model) may start."""


class TabShown(Message):
    """A tab came into view; `redraw` names the parts of it to draw again from the state (its plots,
    which were drawn while hidden: `tui.state.Dirty` names)."""

    def __init__(self, tab: str, redraw: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.tab = tab
        self.redraw = redraw


class LogPageRequested(Message):
    """The Log tab wants page `back` of its lines (0: the live view, 1: the newest page of the event
    log, higher: older; tui/log_pager.py)."""

    def __init__(self, back: int) -> None:
        super().__init__()
        self.back = back


class LayerSelected(Message):
    """The map's cursor moved to `layer`: what shows the selected layer is redrawn on the next poll."""

    def __init__(self, layer: int | None) -> None:
        super().__init__()
        self.layer = layer


class Notice(Message):
    """A line for the user (a form that does not parse, say): the app notifies and logs it."""

    def __init__(self, text: str, level: str = "info") -> None:
        super().__init__()
        self.text = text
        self.level = level


class InjectRequested(Message):
    """Noise `layer` with `sigma` and let it recover for `steps` at `lr` (the recovery form)."""

    def __init__(self, layer: int, sigma: float, steps: int, lr: float) -> None:
        super().__init__()
        self.layer = layer
        self.sigma = sigma
        self.steps = steps
        self.lr = lr


class MapRequested(Message):
    """Compute the layer map: in the console (a thread worker), or as its own process (`job`)."""

    def __init__(self, job: bool) -> None:
        super().__init__()
        self.job = job


class DetailRequested(Message):
    """Show everything the session knows about `layer` (the map's selection)."""

    def __init__(self, layer: int | None) -> None:
        super().__init__()
        self.layer = layer


class MarkRequested(Message):
    """Mark `layer` ablated in the prompt pane's modified model, or unmark it."""

    def __init__(self, layer: int) -> None:
        super().__init__()
        self.layer = layer


class CancelRequested(Message):
    """Cancel the running jobs of `experiment` (the job of the panel in view)."""

    def __init__(self, experiment: str) -> None:
        super().__init__()
        self.experiment = experiment


class StopGenerationRequested(Message):
    """Stop the text being generated."""


class ResumeRequested(Message):
    """Offer the newest interrupted job for resume."""


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
