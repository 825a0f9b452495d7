"""The status line: session, model and device, and every running job with a progress bar."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.widgets import Static

from engine.core.events import count_text
from tui.state import JobView

FULL, NO_BAR, SHORT = 0, 1, 2  # how much of a job the status line says: less only where the width asks


def text_bar(done: int, total: int, width: int = 10) -> str:
    """A progress bar in plain characters (no animation, so screenshots stay stable)."""
    if total <= 0:
        return "·" * width
    filled = min(width, round(width * done / total))
    return "█" * filled + "·" * (width - filled)


def job_text(job: JobView, where: str, detail: int = FULL) -> Text:
    """A job as the status line says it: its name, bar, count with its unit and where it runs
    (FULL); without the bar (NO_BAR); without the count's unit too (SHORT). Never less."""
    text = Text(f" {job.experiment}", style="bold")
    if job.total:
        bar = f" {text_bar(job.done, job.total)}" if detail == FULL else ""
        text.append(f"{bar} {count_text(job.done, job.total, job.unit if detail < SHORT else '')}")
    if job.cancelling:
        text.append(" cancelling", style="bold yellow")
    text.append(f" ({where})", style="dim")
    return text


def status_text(session: str, model: str, jobs: list[tuple[JobView, str]], width: int) -> Text:
    """The status line at `width` columns. What must give way, in order: the model's description
    (cut at its end), then each job's bar, then its count's unit; a job itself is never cut: jobs
    that do not fit one line go on to the next."""
    for detail in (FULL, NO_BAR, SHORT):
        parts = [Text(f" {session} ", style="reverse"), *(job_text(job, where, detail) for job, where in jobs)]
        if sum(part.cell_len for part in parts) <= width:
            break
    lines = [Text()]
    for part in parts:
        if lines[-1].cell_len and lines[-1].cell_len + part.cell_len > width:
            lines.append(Text())
        lines[-1].append_text(part)
    room = width - lines[-1].cell_len
    described = Text(f"  {model}" + ("" if jobs else "  no jobs running"))
    if not jobs:
        described.stylize("dim", len(f"  {model}"))
    if room > 4:  # less than a word of the description says nothing: left out
        described.truncate(room, overflow="ellipsis")
        lines[-1].append_text(described)
    return Text("\n").join(lines)


class StatusLine(Static):
    """One line (more only where the running jobs need them); the app calls `show` whenever the
    model or the jobs change. The running jobs come before the model, and the model's description
    is cut first (tui/widgets/status_line.py `status_text`), so a narrow terminal never cuts a job."""

    said: tuple[str, str, list[tuple[JobView, str]]] = ("", "", [])

    def show(self, session: str, model: str, jobs: list[tuple[JobView, str]]) -> None:
        self.said = (session, model, list(jobs))
        self.fit()

    def on_resize(self, event: events.Resize) -> None:
        self.fit()

    def fit(self) -> None:
        width = max(1, self.size.width or self.app.size.width)
        text = status_text(*self.said, width)
        self.styles.height = sum(-(-max(1, len(line)) // width) for line in text.plain.split("\n"))  # a job wider
        self.update(text)  # than the terminal folds onto lines of its own
