"""The status line: session, model and device, and every running job with a progress bar."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.state import JobView


def text_bar(done: int, total: int, width: int = 10) -> str:
    """A progress bar in plain characters (no animation, so screenshots stay stable)."""
    if total <= 0:
        return "·" * width
    filled = min(width, round(width * done / total))
    return "█" * filled + "·" * (width - filled)


def job_text(job: JobView, where: str) -> Text:
    text = Text(f" {job.experiment}", style="bold")
    if job.total:
        text.append(f" {text_bar(job.done, job.total)} {job.done}/{job.total}")
    if job.cancelling:
        text.append(" cancelling", style="bold yellow")
    text.append(f" ({where})", style="dim")
    return text


class StatusLine(Static):
    """One line; the app calls `show` whenever the model or the jobs change. The running jobs come
    before the model, so a narrow terminal cuts the model's description, never a job."""

    def show(self, session: str, model: str, jobs: list[tuple[JobView, str]]) -> None:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f" {session} ", style="reverse")
        for job, where in jobs:
            text.append_text(job_text(job, where))
        text.append(f"  {model}")
        if not jobs:
            text.append("  no jobs running", style="dim")
        self.update(text)
