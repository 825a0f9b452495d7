"""Turns on a model shared by threads: the console's prompt pane, its layer map and any experiment
it runs in a thread take the loaded model a forward at a time, in the order they asked (a FIFO
ticket lock), so a prompt waits for one batch of a map, never for the whole map.

Whoever changes the model (weights put in place, hooks that skip or capture layers) does it inside
its turn and puts it back before the turn ends: another thread never sees a half-changed model."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

Change = Callable[[], contextlib.AbstractContextManager[object]]  # changes the model for a block, then puts it back


class ModelTurns:
    """A fair lock: `turn()` waits for the turns asked before it, then holds the model until its
    block ends. Not re-entrant (a turn inside a turn of the same thread waits forever)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._issued = 0  # tickets handed out
        self._serving = 0  # the ticket whose turn it is

    @contextlib.contextmanager
    def turn(self, waiting: Callable[[], None] | None = None) -> Iterator[None]:
        """The model for the block; `waiting()` is called once, before waiting, when another turn
        holds it or is ahead in the queue."""
        with self._changed:
            ticket = self._issued
            self._issued += 1
            if ticket != self._serving and waiting is not None:
                waiting()
            while ticket != self._serving:
                self._changed.wait()
        try:
            yield
        finally:
            with self._changed:
                self._serving += 1
                self._changed.notify_all()

    @property
    def busy(self) -> bool:
        """Whether a turn is held or asked for now."""
        with self._changed:
            return self._issued != self._serving

    def around(self, change: Change | None = None) -> Callable[[], contextlib.AbstractContextManager[None]]:
        """A factory of blocks that each take a turn and, inside it, make `change()` (a context
        manager that changes the model and puts it back): what an experiment enters around each
        forward, so the change lasts only as long as its turn."""

        @contextlib.contextmanager
        def block() -> Iterator[None]:
            with self.turn(), (change() if change is not None else contextlib.nullcontext()):
                yield

        return block
