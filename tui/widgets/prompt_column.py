"""One side of the prompt pane: a model picker and the text it generates, streamed in."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Select, Static

MODEL_CHOICES = (
    ("original", "original"),
    ("modified", "modified (x-marked layers)"),
    ("noised", "noised (x-marked layers, sigma)"),
    ("recovered", "recovered (session's recovery)"),
    ("pruned", "pruned (session's prune run)"),
    ("growth", "growth (session)"),
    ("uniform", "uniform (session)"),
)


class PromptColumn(Vertical):
    """`begin` clears the output for a new prompt; `show` draws the text generated so far."""

    def __init__(self, default: str, id: str) -> None:  # noqa: A002 - Textual's own argument name
        super().__init__(id=id, classes="prompt-column")
        self.default = default
        self.prompt = ""
        self.text = ""

    def compose(self) -> ComposeResult:
        yield Select(
            [(label, value) for value, label in MODEL_CHOICES],
            value=self.default,
            allow_blank=False,
            classes="model-choice",
        )
        with VerticalScroll(classes="generation"):
            yield Static("", classes="generated")

    @property
    def model_choice(self) -> str:
        return str(self.query_one(Select).value)

    def begin(self, prompt: str) -> None:
        self.prompt, self.text = prompt, ""
        self._show(f"[b]{_escape(prompt)}[/b]")

    def show(self, text: str, note: str = "") -> None:
        self.text = text
        tail = f"\n[dim]{_escape(note)}[/dim]" if note else ""
        self._show(f"[b]{_escape(self.prompt)}[/b]{_escape(text)}{tail}")

    def _show(self, markup: str) -> None:
        for output in self.query(".generated").results(Static):  # none while the app shuts down
            output.update(markup)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
