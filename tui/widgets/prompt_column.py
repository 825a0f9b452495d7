"""One side of the prompt pane: a model picker and the text it generates, streamed in."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Select, Static

from tui.marks import NO_MARKS, Marks

MODEL_CHOICES = (
    ("original", "original"),
    ("modified", "modified (x/t/m marks)"),
    ("noised", "noised (x-marked layers, sigma)"),
    ("recovered", "recovered (session's recovery)"),
    ("pruned", "pruned (session's prune run)"),
    ("growth", "growth (session)"),
    ("uniform", "uniform (session)"),
)


def marks_hint(choice: str, marks: Marks) -> str:
    """What the column's model is made of, for the choices built from the marks: the modified model
    from the layers (x) and blocks (t, m), the noised one from the layers."""
    if choice == "modified":
        return marks.describe() or "nothing marked (map: x layer, t attn, m mlp): it answers as the original"
    if choice != "noised":
        return ""
    if not marks.layers:
        return "no layer marked (x on the map): it answers as the original"
    return f"{marks.layer_text()} noised (sigma)"


class PromptColumn(Vertical):
    """`begin` clears the output for a new prompt; `show` draws the text generated so far; `mark`
    says which layers and blocks the modified and noised models change (a line under the model's name)."""

    def __init__(self, default: str, id: str) -> None:  # noqa: A002 - Textual's own argument name
        super().__init__(id=id, classes="prompt-column")
        self.default = default
        self.prompt = ""
        self.text = ""
        self.marked = NO_MARKS

    def compose(self) -> ComposeResult:
        yield Select(
            [(label, value) for value, label in MODEL_CHOICES],
            value=self.default,
            allow_blank=False,
            classes="model-choice",
        )
        yield Static(marks_hint(self.default, self.marked), classes="marks-hint")
        with VerticalScroll(classes="generation"):
            yield Static("", classes="generated")

    @property
    def model_choice(self) -> str:
        return str(self.query_one(Select).value)

    def on_mount(self) -> None:
        self._hint()

    def mark(self, marked: Marks) -> None:
        self.marked = marked
        self._hint()

    def on_select_changed(self) -> None:
        self._hint()

    def _hint(self) -> None:
        for hint in self.query(".marks-hint").results(Static):
            hint.update(marks_hint(self.model_choice, self.marked))

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
