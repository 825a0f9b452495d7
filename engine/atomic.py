"""Atomic file writes: a temporary file in the same folder, fsynced, then renamed over the target.

A crash or kill at any moment leaves either the old file or the new one, never half of either.
The rename replaces whatever is at the target, so it happens only over a regular file or a new
path: a device (`--json /dev/null` run as root), a directory, a FIFO or a socket is refused with
one line, and a symbolic link is followed to the file it names rather than replaced.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import UserError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def check_writable_path(path: Path | str, what: str = "output") -> Path:
    """The file an atomic write to `path` will replace (symlinks followed), or a one-line UserError.

    Front ends call this for every path they will write before a run starts, so a bad `--json`
    (or results file, log, cache) costs a second, not the whole computation.
    """
    path = Path(path).expanduser()
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot be checked ({exc.strerror}); choose another path") from None
    if mode is not None and not stat.S_ISREG(mode):
        link = f" (a link to {target})" if target != path else ""
        raise UserError(f"{what} {path}{link} is {_kind(mode)}; give the path of a regular file")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"{what} {path}: {folder} is not a directory; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: {folder} is not writable; choose another path")
    return target


def atomic_write(path: Path, write: Callable[[Path], None], what: str = "output") -> None:
    """Calls `write(tmp_path)` and moves the finished file to `path` (a regular file or new path)."""
    path = check_writable_path(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        check_writable_path(path, what)  # nothing else took the name while we wrote
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(path: Path, data: bytes, what: str = "output") -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data), what)


def atomic_write_json(path: Path, doc: Any, what: str = "output") -> None:
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), what)
