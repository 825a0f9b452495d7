"""Another model for a session whose model could not load: why it failed, in one line, and a field
for the model to load instead (a name, a folder, a .gguf file or a hub id), checked as it is given,
so a session never stays bound to a model it cannot load."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class ModelChoice(ModalScreen[str]):
    """`choose(name)` loads `name` for the session and answers '' (the screen closes), or why it
    cannot be loaded (said here, the field kept for another try). Escape: on without a model."""

    BINDINGS = [Binding("escape", "dismiss('')", "Without a model")]
    DEFAULT_CSS = """
    ModelChoice { align: center middle; }
    #model-choice { width: 90%; max-width: 100; height: auto; border: round $error; padding: 0 1;
                    background: $surface; }
    #model-choice-problem { color: $error; }
    """

    def __init__(self, model: str, reason: str, choose: Callable[[str], str]) -> None:
        super().__init__()
        self.model, self.reason, self.choose = model, reason, choose

    def compose(self) -> ComposeResult:
        with Vertical(id="model-choice"):
            yield Static(f"{self.model} could not load: {self.reason}", id="model-choice-reason", markup=False)
            yield Static("Load another model for this session (smollm2-135m, a folder, a .gguf file or a hub id):")
            yield Input(self.model, id="model-choice-input")
            yield Static("", id="model-choice-problem", markup=False)
            yield Static("enter: load it    escape: go on without a model", classes="dim")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        name = event.value.strip()
        problem = self.choose(name) if name else "type a model to load"
        if problem:
            self.query_one("#model-choice-problem", Static).update(problem)
            return
        self.dismiss(name)
