"""Which lines of the event log the console's state depends on (tui/state.py folds them; the event
index, tui/event_index.py, writes them down so a large log opens fast)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, cast

from engine.core.events import Event, Message, Progress
from tui.state import (
    _HANDLERS,
    GROWTH_EVAL,
    GROWTH_STEP,
    RECOVERY_POINT,
    RecoveryRun,
    SessionState,
    Span,
    _arm_key,
    thin,
)

if TYPE_CHECKING:
    from engine.experiments.growth.vocabulary import GrowthEval, GrowthStep
    from engine.experiments.recovery.vocabulary import RecoveryPoint


class LineKeeper:
    """Folds events into `state` and remembers which lines of the log the state still depends on
    (`spans`): every line that changes it for good, each job's last progress line, the newest
    messages the log panel keeps, each curve's points' lines (thinned with the points, `thin`) and
    each growth arm's last step. Folding just those lines, in order, gives the same state as folding
    them all: what tui/event_index.py writes down so a large log opens fast."""

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self._kept: list[Span] = []
        self._progress: dict[str, Span] = {}
        self._messages: deque[Span] = deque(maxlen=state.log.maxlen)
        self._recovery: dict[tuple[str, int, int], list[Span]] = {}
        self._runs: dict[tuple[str, int, int], RecoveryRun] = {}
        self._growth = state.growth  # the growth view the lines below belong to
        self._train: dict[str, list[Span]] = {}
        self._val: dict[str, list[Span]] = {}
        self._step: dict[str, Span] = {}

    def fold(self, span: Span, event: Event) -> None:
        try:
            self._fold(span, event)
        except TypeError:  # a forged line whose values cannot be keys (a list for a layer): kept whole
            self._kept.append(span)

    def _fold(self, span: Span, event: Event) -> None:
        kind, state = event.kind, self.state
        if kind == RECOVERY_POINT:
            point = cast("RecoveryPoint", event)  # an event is read back as the class registered for its kind
            key = (point.job, point.layer, point.repeat)
            before = self._points(key)
            state.apply(event)
            if self._points(key) is not before:  # a point was added (and the curve maybe thinned)
                self._recovery[key] = thin([*self._recovery.get(key, []), span])
            return
        if kind in (GROWTH_STEP, GROWTH_EVAL):
            if state.growth is not self._growth:
                self._growth, self._train, self._val, self._step = state.growth, {}, {}, {}
            growth = cast("GrowthStep | GrowthEval", event)  # likewise, by its kind
            arm = _arm_key(growth.arm, growth.seed)
            series, lines = (state.growth.train, self._train) if kind == GROWTH_STEP else (state.growth.val, self._val)
            before = series.get(arm)
            state.apply(event)
            if series.get(arm) is not before:
                lines[arm] = thin([*lines.get(arm, []), span])
            if kind == GROWTH_STEP:
                self._step[arm] = span
            return
        state.apply(event)
        if kind == Progress.kind:
            self._progress[event.job] = span
        elif kind == Message.kind:
            self._messages.append(span)
        elif kind in _HANDLERS:
            self._kept.append(span)

    def _points(self, key: tuple[str, int, int]) -> list[tuple[float, float]] | None:
        """The points of the recovery run `key` (job, layer, repeat), as `SessionState._run_for` finds it
        (a run, once made, stays the one for its key)."""
        run = self._runs.get(key)
        if run is None:
            run = next((run for run in reversed(self.state.recovery) if (run.job, run.layer, run.repeat) == key), None)
            if run is None:
                return None
            self._runs[key] = run
        return run.points

    def spans(self) -> list[Span]:
        """The lines the state depends on, in the log's order."""
        spans = {*self._kept, *self._progress.values(), *self._messages}
        for lines in self._recovery.values():
            spans.update(lines)
        if self._growth is self.state.growth:
            for series in (*self._train.values(), *self._val.values()):
                spans.update(series)
            spans.update(self._step.values())
        return sorted(spans)
