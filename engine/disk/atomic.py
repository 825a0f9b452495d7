"""Atomic file writes: a temporary file in the same folder, fsynced, then renamed over the target.

A crash or kill at any moment leaves either the old file or the new one, never half of either.
The rename replaces whatever is at the target, so it happens only over a regular file or a new
path: a device (`--json /dev/null` run as root), a directory, a FIFO or a socket is refused with
one line, and a symbolic link is followed to the file it names rather than replaced.

Logs are appended, not replaced: `append_line` writes a whole line under an exclusive lock and, when
the write fails (a full disk), cuts the file back to its size before, so no torn line is left and
two writers never interleave. `locked` serialises read-modify-write updates (a session's manifest).
A full disk is said in one line by `no_space`, naming the mount point that is full.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from engine.core.errors import UserError

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


def append_line(path: Path, line: bytes) -> None:
    """Appends `line` (ending in a newline) to the log at `path` as one write under an exclusive
    lock. If the log's last line is torn (a killed writer left no newline), a newline ends it
    first. If the write fails (ENOSPC), the file is cut back to its size before and the error is
    raised: the log holds whole lines only, whatever fails."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except IsADirectoryError:
        raise UserError(f"{path} is not a regular file; move it away") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"{path} is not a regular file; move it away")
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        try:
            written = os.write(fd, line)
            while written < len(line):  # a short write (a disk filling up): the rest, or the error
                written += os.write(fd, line[written:])
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on `folder` (flock on the directory itself, so no lock file is left) for
    a read-modify-write of a file in it by several processes at once."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def mount_point(path: Path | str) -> Path:
    """The mount point of the filesystem `path` (or its nearest existing folder) is on."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def no_space(path: Path | str, what: str) -> str:
    """The one line for a full disk while writing `path`: which filesystem, and that nothing was
    deleted to make room. `what` says what became of the work ("kept the result at X")."""
    return f"no space left on {mount_point(path)} (writing {path}): freed nothing, {what}"

@contextlib.contextmanager
def no_space_is_one_line(path: Path | str, what: str) -> Iterator[None]:
    """Turns a full disk (ENOSPC, EDQUOT) while writing under `path` into the one-line UserError of
    `no_space`; `what` says what became of the work."""
    try:
        yield
    except OSError as exc:
        if not is_no_space(exc):
            raise
        raise UserError(no_space(getattr(exc, "filename", None) or path, what)) from None


def check_free_space(folder: Path | str, need: int, what: str) -> None:
    """A one-line UserError when the filesystem of `folder` (or its nearest existing parent) has
    fewer than `need` bytes free: called before a run that will write that much (a model export)."""
    where = Path(os.path.abspath(folder))
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return  # cannot be measured here: the write itself will say
    if free < need:
        raise UserError(f"{what} needs about {_size(need)} in {folder} but {mount_point(where)} has "
                        f"{_size(free)} free; free some space or choose a folder on another disk")


def _size(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 100e6 else f"{size / 1e6:.2f} MB"
