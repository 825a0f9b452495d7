"""A run's progress on stderr: one updating line on a terminal, plain lines (a few per phase)
in a log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from engine.core.events import Cancelling, Event, Message, Progress
from engine.models.load_progress import duration  # the time left said alike by a run and a load


def progress_text(event: Progress) -> str:
    """A progress event in words, the pass and what it counts: `baseline: texts 12/48, 3.1/s, about
    12 s left`, `ablation: layers and blocks 45/90` (the count as `Progress.count` spells it)."""
    what = event.label or event.phase
    if event.phase and event.phase not in what:
        what = f"{what} ({event.phase})"
    if not event.count:
        return what
    text = f"{what}: {event.count}"
    if event.rate:
        text += f", {event.rate:.3g}/s"
    left = event.seconds_left
    if left is not None and event.done < event.total:
        text += f", about {duration(left)} left"
    return text


class ProgressLines:
    """Which progress events a log (stderr that is not a terminal) gets a line for: the first of each
    phase, its end, and every tenth of the way between, so a long run says where it is without a
    line for each of its thousand steps."""

    STEPS = 10

    def __init__(self) -> None:
        self._phase: tuple[str, str, str, int] | None = None
        self._tenth = -1

    def line(self, event: Progress) -> str | None:
        phase = (event.phase, event.label, event.unit, event.total)
        tenth = self.STEPS * event.done // event.total if event.total > 0 else 0
        if phase != self._phase:
            self._phase, self._tenth = phase, tenth
            return progress_text(event)
        if tenth > self._tenth:
            self._tenth = tenth
            return progress_text(event)
        return None


@contextlib.contextmanager
def progress_display(console: Any, experiment: str) -> Iterator[Callable[[Event], None]]:
    """`show(event)` for run_job: progress as one updating line on a terminal, plain lines elsewhere;
    messages always as lines."""
    if not console.is_terminal:
        lines = ProgressLines()

        def show_plain(event: Event) -> None:
            if isinstance(event, Progress) and (line := lines.line(event)) is not None:
                console.print(f"[progress] {line}", markup=False, highlight=False, soft_wrap=True)
            elif isinstance(event, (Message, Cancelling)):
                console.print(_message_line(event), markup=False, highlight=False, soft_wrap=True)

        yield show_plain
        return
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    with Bar(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
             transient=False) as bar:  # fmt: skip
        task = bar.add_task(experiment, total=None)

        def show(event: Event) -> None:
            if isinstance(event, Progress):
                bar.update(task, completed=event.done, total=event.total or None, description=progress_text(event))
            elif isinstance(event, (Message, Cancelling)):
                bar.console.print(_message_line(event), markup=False, highlight=False, soft_wrap=True)

        try:  # how a run ends is said once, by the caller: a failure as the one error line
            yield show
        except Exception:
            if not bar.tasks[0].completed:
                bar.live.transient = True  # no empty bar left above the error line
            raise


def _message_line(event: Message | Cancelling) -> str:
    if isinstance(event, Cancelling):
        return "[warning] cancelling: the run stops at its next forward"
    return f"[{event.level}] {event.text}"
