"""Atomic file writes: a temporary file in the same folder, fsynced, then renamed over the target.

A crash or kill at any moment leaves either the old file or the new one, never half of either.
The rename replaces whatever is at the target, so it happens only over a regular file or a new
path: a device (`--json /dev/null` run as root), a directory, a FIFO or a socket is refused with
one line, and a symbolic link is followed to the file it names rather than replaced.

Logs are appended, not replaced: `append_line` writes a whole line under an exclusive lock and, when
the write fails (a full disk), cuts the file back to its size before, so no torn line is left and
two writers never interleave. `locked` serialises read-modify-write updates (a session's manifest).
A full disk is said in one line by `no_space`, naming the mount point that is full.

Below a guarded folder (`guard`: a session folder, untrusted), nothing is written or read through a
symbolic link: `unlinked` is the one check, an lstat of every part from the folder down, made by every
write and read here (`atomic_write`, `append_line`, `read_bytes`, `locked`), so a linked result,
checkpoint or log is refused in one line and the file it names is never touched. The last part is
also opened with O_NOFOLLOW where it is opened, and a rename replaces a link itself, never its target.
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
from typing import Any, BinaryIO

from engine.core.errors import UserError
from engine.core.untrusted import MAX_DOCUMENT_BYTES, loads

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


_GUARDED: set[Path] = set()  # folders below which no path is followed through a symbolic link (sessions)


def guard(root: Path | str) -> None:
    """From now on in this process, no path below `root` (a session folder) is written or read
    through a symbolic link by this module (`unlinked`). The store guards each session it opens."""
    _GUARDED.add(Path(os.path.abspath(root)))


def guarded_root(path: Path | str) -> Path | None:
    """The guarded folder that holds `path` (or is it), None when none does."""
    path = Path(os.path.abspath(path))
    for folder in (path, *path.parents):
        if folder in _GUARDED:
            return folder
    return None


def link_refused(link: Path | str, root: Path | str) -> str:
    """The one line for a symbolic link met at `link` in the guarded folder `root`."""
    link, root = Path(link), Path(root)
    if link == root:
        return (f"session folder {root} is a symbolic link; sessions never follow links (move the real folder "
                "into the sessions folder in its place)")
    return (f"session {root.name!r}: {link.relative_to(root)} is a symbolic link; sessions never follow links "
            "(replace it with a real file or folder)")


def unlinked(path: Path | str, root: Path | str | None = None) -> Path:
    """`path`, once no part of it from `root` down (`root` itself included) is a symbolic link: an
    lstat of each part that exists; else a one-line UserError naming the link. Without `root`, the
    guarded folder that holds `path` (none: nothing is checked, the path is not a session's)."""
    path = Path(path)
    absolute = Path(os.path.abspath(path))
    top = guarded_root(absolute) if root is None else Path(os.path.abspath(root))
    if top is None:
        return path
    try:
        parts = absolute.relative_to(top).parts
    except ValueError:
        raise UserError(f"{path} is not inside session folder {top}; sessions read and write only their own "
                        "files") from None
    current = top
    for part in ("", *parts):
        current = current / part if part else current
        try:
            mode = os.lstat(current).st_mode
        except OSError:  # missing (or below a file): nothing further down exists to follow
            break
        if stat.S_ISLNK(mode):
            raise UserError(link_refused(current, top))
    return path


def inside(path: Path | str, root: Path | str, what: str) -> Path:
    """`path` (a folder or file a session's own file names), when it lies inside the folder `root`
    with no symbolic link on the way nor, for a folder, anywhere in it (a model folder is read whole);
    else one line, `what` naming where the path came from."""
    absolute = Path(os.path.abspath(Path(path).expanduser()))  # `..` taken away: the path that is opened
    top = Path(os.path.abspath(root))
    if absolute != top and top not in absolute.parents:
        raise UserError(f"{what} names {path}, which is not inside session folder {top}; a session's files "
                        "are read from the session only (run it again to make them there)")
    unlinked(absolute, top)
    for folder, names, files in os.walk(absolute):  # never follows a link: each is met as a name here
        for name in (*names, *files):
            if os.path.islink(os.path.join(folder, name)):
                raise UserError(link_refused(Path(folder) / name, top))
    return absolute


def open_unlinked(path: Path | str, root: Path | str | None = None) -> BinaryIO:
    """The regular file `path` open for reading, never through a symbolic link below its guarded
    folder (`unlinked`, then O_NOFOLLOW on the last part); an OSError when it is missing or is not a
    regular file (a FIFO is never waited on, a directory never read)."""
    unlinked(path, root)
    top = guarded_root(path) if root is None else Path(os.path.abspath(root))
    flags = os.O_RDONLY | os.O_NONBLOCK | (os.O_NOFOLLOW if top is not None else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and top is not None:  # became a link since the check
            raise UserError(link_refused(Path(os.path.abspath(path)), top)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: Path | str, root: Path | str | None = None) -> bytes:
    """The bytes of the regular file `path`, read as `open_unlinked` opens it."""
    with open_unlinked(path, root) as handle:
        return handle.read()


def read_text(path: Path | str, root: Path | str | None = None) -> str:
    return read_bytes(path, root).decode("utf-8")


def read_json(path: Path | str, root: Path | str | None = None, limit: int = MAX_DOCUMENT_BYTES) -> Any:
    """The JSON document in the regular file `path`, opened as `open_unlinked` opens it and read no
    further than `limit` bytes: a larger, too deeply nested or broken one is DamagedJSON (a
    ValueError, engine.core.untrusted), whatever is in it."""
    with open_unlinked(path, root) as handle:
        return loads(handle.read(limit + 1), limit)


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
    path = unlinked(Path(path).expanduser())  # below a session folder: a link is refused, not followed
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


def _umask() -> int:
    """The process's umask, read without changing it (Linux's /proc); elsewhere set and put back."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _plain_mode(path: Path) -> int:
    """The permissions a plain `open(path, "w")` leaves: an existing file's own, a new file
    0666 less the umask (0644 under umask 022), never mkstemp's private 0600."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(path).st_mode)
    return 0o666 & ~_umask()


def atomic_write(path: Path, write: Callable[[Path], object], what: str = "output") -> None:
    """Calls `write(tmp_path)` and moves the finished file to `path` (a regular file or new path),
    with the permissions a plain write would leave it (`_plain_mode`)."""
    path = check_writable_path(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, _plain_mode(path))  # after the write: an existing read-only file's mode too
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
    unlinked(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except IsADirectoryError:
        raise UserError(f"{path} is not a regular file; move it away") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{path} is a symbolic link; logs are never appended through a link (replace it "
                            "with a real file)") from None
        raise
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
    fd = os.open(unlinked(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
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
