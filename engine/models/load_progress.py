"""What a model load is doing, said from its first second and every few seconds after: each step
as it begins (importing torch and transformers, reading a GGUF's header, dequantizing it, reading
the weights onto the device), then, while a step lasts, the same step again with the seconds it has
taken, or, where the step counts its work (the GGUF's tensors by their bytes, the weights one by
one), its percentage and the time left at the rate measured so far (from the first tensor on, so the
estimate is corrected as the work goes; never a fixed sentence).

transformers says its per-tensor progress only as tqdm bars on stderr (which the console does not
show); for the duration of a counted step the load replaces those bars' `tqdm` names in transformers'
modules with its own counter (`counting`), one load at a time.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

REPORT_EVERY_S = 2.0  # a step is said again at least this often while it lasts

# transformers' modules whose per-tensor loops iterate through a module-level `tqdm`:
# the GGUF dequantization, and the reading of the weights into the model
DEQUANTIZE_LOOP = "transformers.modeling_gguf_pytorch_utils"
WEIGHTS_LOOP = "transformers.core_model_loading"

_patching = threading.Lock()  # one load at a time replaces transformers' bars


def duration(seconds: float) -> str:
    """`12 s`, `3 min`, `1.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class LoadStep:
    """One step of a load: what it does, when it began, and, where it counts its work, how much of
    `total` is done (bytes, or items) with `unit` naming what `count` counts."""

    what: str
    started: float
    done: float = 0.0
    total: float = 0.0
    count: int = 0  # items done (tensors), said with the percentage
    items: int = 0  # items in all
    unit: str = "tensors"
    counted_from: float = 0.0  # when the counted work began (the step may prepare it first)

    def text(self, now: float) -> str:
        elapsed = now - self.started
        if self.total <= 0:
            return f"{self.what}… {elapsed:.0f} s" if elapsed >= 1 else f"{self.what}…"
        fraction = min(1.0, self.done / self.total)
        text = f"{self.what}: {100 * fraction:.0f}% ({self.count}/{self.items} {self.unit})"
        if 0 < fraction < 1:  # the rate measured so far: from the first tensor on, corrected as it goes
            text += f", about {duration((now - self.counted_from) * (1 - fraction) / fraction)} left"
        elif fraction >= 1:
            text += f" in {duration(elapsed)}"
        return text


class LoadProgress:
    """Says a load's steps through `report` (a `Report`: one line each): a step at once when it
    begins, and again every `every` seconds while it lasts (a daemon thread, while `running()`);
    a counted step also when its count moves, at most every `every` seconds, and at its end.
    Callable as a plain `Report` too, so the code it is handed to may say a line of its own."""

    def __init__(self, report: Callable[[str], None], every: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.report, self.clock = report, clock
        self.every = REPORT_EVERY_S if every is None else every
        self.current: LoadStep | None = None
        self.said_at = 0.0
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None

    def __call__(self, text: str) -> None:
        with self._lock:
            self.said_at = self.clock()
            self.report(text)

    def step(self, what: str) -> None:
        """A new step begins: said now."""
        with self._lock:
            self.current = LoadStep(what, self.clock())
            self._say()

    def advance(self, done: float, total: float, count: int, items: int) -> None:
        """The counted step's work so far: `done` of `total` (bytes), `count` of `items`."""
        with self._lock:
            step = self.current
            if step is None:
                return
            first = step.total <= 0
            step.done, step.total, step.count, step.items = done, total, count, items
            if first or done >= total or self.clock() - self.said_at >= self.every:
                self._say()

    def _say(self) -> None:
        if self.current is not None:
            self.said_at = self.clock()
            self.report(self.current.text(self.said_at))

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(max(self.every, 0.01) / 4):
            with self._lock:
                if self.clock() - self.said_at >= self.every:
                    self._say()

    @contextmanager
    def running(self) -> Iterator[LoadProgress]:
        """The heartbeat for the duration (re-entrant: an inner `running()` of the same progress adds none)."""
        if self._stop is not None:
            yield self
            return
        self._stop = stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(stop,), name="load progress", daemon=True)
        beat.start()
        try:
            yield self
        finally:
            stop.set()
            beat.join()
            self._stop = None
            self.current = None

    def counted(self, iterable: Iterable[Any], size: Callable[[Any], float] = lambda _: 1.0) -> Iterator[Any]:
        """`iterable` passed through, the current step advanced by each item's `size` (all sizes are
        known first: the GGUF's tensors are listed in its header)."""
        items = list(iterable)
        sizes = [float(size(item)) for item in items]
        total = sum(sizes) or 1.0
        done = 0.0
        with self._lock:
            if self.current is not None:
                self.current.counted_from = self.clock()
        for count, (item, weight) in enumerate(zip(items, sizes, strict=True), 1):
            yield item
            done += weight
            self.advance(done, total, count, len(items))

    @contextmanager
    def counting(self, module: str, size: Callable[[Any], float] = lambda _: 1.0) -> Iterator[None]:
        """transformers' per-tensor loop in `module` (DEQUANTIZE_LOOP, WEIGHTS_LOOP) counted by this
        progress instead of drawing a tqdm bar; where another load holds the bars, this one keeps
        only its heartbeat."""
        if not _patching.acquire(blocking=False):
            yield
            return
        try:
            loop: Any = importlib.import_module(module)
            bar = loop.tqdm

            def counter(iterable: Iterable[Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
                return self.counted(iterable, size)

            loop.tqdm = counter
            try:
                yield
            finally:
                loop.tqdm = bar
        finally:
            _patching.release()
