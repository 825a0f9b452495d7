"""Out of memory, anywhere (load, forward, training, a console worker): one line that names what
ran out and the flag to change, with the memory given back first."""

from __future__ import annotations

import contextlib
import gc
import traceback
from collections.abc import Iterator

from engine.core.errors import UserError


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA), or a RuntimeError whose message says out of memory (CPU
    allocators, older builds)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def release_memory() -> None:
    """Frees what Python and the CUDA caching allocator can give back."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def out_of_memory_guard(what: str, advice: str) -> Iterator[None]:
    """An out-of-memory error inside becomes `UserError("out of memory in <what>; try <advice>")`,
    raised after memory is freed. The failed frames' locals are cleared first: the traceback keeps
    them, and so the tensors of the failed step, alive."""
    try:
        yield
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        traceback.clear_frames(exc.__traceback__)
        release_memory()
        raise UserError(f"out of memory in {what}; try {advice}") from None
