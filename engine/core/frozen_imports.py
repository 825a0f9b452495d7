"""Imports for a process that runs one headless job, kept out of the garbage collector's way.

Torch and transformers make about a million objects as they import, and nearly all of them live as
long as the process. The cyclic collector walks every one again at each full collection, during the
import and all through the run: a third of a small run's CPU (benchmarks/frozen_imports.py). In a
process that runs one job (the command line's `run` or `atlas`, a shard worker, a cluster task) they
import with the collector off and are then frozen (`gc.freeze`): left out of every later collection.
Anywhere else (the console, a notebook, a test calling `main([...])`) they import as usual: a frozen
object that later becomes part of a garbage cycle is never freed, which a long-lived process must
not risk."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable

_one_job = False
_frozen = False  # once: an atlas runs many measures in its process, and a later freeze would keep
# whatever an earlier measure left in garbage cycles (a model's weights) for the rest of it


def one_job_process() -> None:
    """This process was started for one headless job: `import_frozen` freezes from now on."""
    global _one_job
    _one_job = True


def import_frozen(*modules: str | Callable[[], object]) -> None:
    """Imports `modules` (a name, or a function that imports: an experiment's `computation`); in a
    one-job process, the first time, with the collector off, then freezes all the process holds."""
    global _frozen
    freezing = _one_job and not _frozen
    paused = freezing and gc.isenabled()
    if paused:
        gc.disable()
    try:
        for module in modules:
            if callable(module):
                module()
            else:
                importlib.import_module(module)
    finally:
        if freezing:
            gc.freeze()
            _frozen = True
        if paused:
            gc.enable()
