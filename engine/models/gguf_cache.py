"""The dequantized cache of GGUF files: a GGUF load parses the file's header and dequantizes every
tensor (a minute of CPU for SmolLM2 on a busy 2-core machine, its percentage and time left said as it
goes: engine/models/load_progress.py), so the float weights are saved once as safetensors, a folder
per file and dtype, and later loads read that folder instead. A staging folder left by a killed
process is removed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.core.process import pid_alive
from engine.models.load_progress import DEQUANTIZE_LOOP, LoadProgress
from engine.models.sources import Report, cache_home, quiet

CACHE_FORMAT = 1  # bump when the cached folder layout changes


def gguf_cache_dir(gguf: Path, dtype: str = "float32") -> Path:
    """One cached folder per GGUF file and dtype (a 7B model cached in float16 takes half the disk
    and RAM of float32; float32 keeps the key it always had)."""
    stat = gguf.stat()
    key = f"{CACHE_FORMAT}:{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    if dtype != "float32":
        key += f":{dtype}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    name = f"{gguf.stem}-{digest}" if dtype == "float32" else f"{gguf.stem}-{dtype}-{digest}"
    return cache_home() / "dequantized" / name


def dequantized_copy(gguf: Path) -> Path | None:
    """A folder the dequantization of `gguf` saved, in any dtype, or None: its config.json and
    tokenizer are the GGUF's, and read in milliseconds, where the GGUF's header, with its whole
    token list, takes seconds to parse."""
    for dtype in ("float32", "bfloat16", "float16"):
        folder = gguf_cache_dir(gguf, dtype)
        if (folder / "config.json").exists():
            return folder
    return None


def gguf_config_source(gguf: Path) -> tuple[str, dict[str, Any]]:
    """Where `from_pretrained` reads the config and tokenizer of a GGUF file: its dequantized copy
    when there is one, else the file itself (`gguf_file=`)."""
    copy = dequantized_copy(gguf)
    return (str(copy), {}) if copy is not None else (str(gguf.parent), {"gguf_file": gguf.name})


_reading = threading.Lock()  # one load at a time shares its parsed headers


@contextmanager
def headers_read_once() -> Iterator[None]:
    """For the duration, each GGUF file's header is parsed once: transformers parses it again for
    the config, the tokenizer, the model's config and its tensors (each parse reads the whole token
    list: seconds), and builds the tensor-name table once per submodule (hundreds of times); both
    come from the `gguf` package, looked up when called, so they are memoized there. Re-entrant; a
    second load at the same time parses on its own."""
    import gguf as gguf_module

    gguf: Any = gguf_module  # its attributes are swapped for the duration
    if not _reading.acquire(blocking=False):
        yield
        return
    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, Any] = {}

    def read_once(path: Any, mode: str = "r") -> Any:
        key = f"{os.path.realpath(path)}:{mode}"
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.cache(names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, names
        _reading.release()


STAGING_OWNER = ".owner"  # the pid of the process writing a staging folder
STAGING_GRACE_S = 60.0  # a staging folder with no owner file yet may be seconds old


def clean_stale_staging(parent: Path, prefix: str = ".") -> list[Path]:
    """Removes staging folders (names starting with `prefix`) left by a dequantization or an export
    that was killed (their owner process is gone), so a crash does not leave gigabytes behind.
    Returns what it removed."""
    import time

    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_dir():
            continue
        owner = entry / STAGING_OWNER
        try:
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is None:
            try:
                stale = time.time() - entry.stat().st_mtime > STAGING_GRACE_S
            except OSError:
                continue
        else:
            stale = not pid_alive(pid)
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def dequantized_folder(gguf: Path, report: Report = quiet, dtype: str = "float32") -> Path:
    """A folder of safetensors + config + tokenizer made from the GGUF file once, in the dtype the
    run uses, then reused. Each step is said as it goes (`report`, a `LoadProgress` or any `Report`):
    the tokenizer, then the tensors with their percentage and the time left, then the write."""
    folder = gguf_cache_dir(gguf, dtype)
    clean_stale_staging(folder.parent)
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress = report if isinstance(report, LoadProgress) else LoadProgress(report)
    with progress.running(), headers_read_once():
        progress.step(f"reading {gguf.name}'s tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        progress(f"dequantizing {gguf.name} to {dtype} once; later loads read the copy")
        progress.step(f"dequantizing {gguf.name}")
        with progress.counting(DEQUANTIZE_LOOP, size=lambda tensor: tensor.n_bytes):
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=getattr(torch, dtype))
        progress.step(f"writing the float copy of {gguf.name} to the cache")
        folder.parent.mkdir(parents=True, exist_ok=True)
        _write_copy(model, tokenizer, folder)
    return folder


def _write_copy(model: Any, tokenizer: Any, folder: Path) -> None:
    """The copy written to a staging folder, then moved into place at once."""
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (staging / STAGING_OWNER).write_text(str(os.getpid()))
        _save_float_copy(model, staging)
        tokenizer.save_pretrained(staging)
        (staging / STAGING_OWNER).unlink()
        os.replace(staging, folder)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / "config.json").exists():  # a concurrent loader may have won the race
            raise


def _save_float_copy(model: Any, folder: Path) -> None:
    """save_pretrained refuses GGUF-loaded models, so write config + safetensors directly."""
    from safetensors.torch import save_file

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]  # as save_pretrained writes it (mergekit reads it)
    config.save_pretrained(folder)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})

