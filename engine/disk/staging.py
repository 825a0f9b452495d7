"""A set of files written as one (a report and its figures): each into a hidden staging folder inside
the destination folder (so on its filesystem), and moved over the files there only once every one
is whole.

A failure at any point before the moves (a full disk, an error, Ctrl-C) removes the staging folder
and leaves the folder as it was; a writer killed outright leaves its staging folder behind, and the
next writer of the same prefix removes it, with any leftovers the caller names (an older version's
`.NAME.XXXXXXXX.tmp` files). A lock on the folder (flock), held throughout, makes sure what is
removed is no live writer's. The files are made by the caller with plain `open` (or a library's),
so they get the user's permissions (the umask: 0644 under umask 022), not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from engine.core.errors import UserError
from engine.disk.atomic import _fsync_dir, locked


def remove(path: Path) -> None:
    """Deletes a leftover: a folder with all in it, or a file or link (never what a link names)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()


@contextlib.contextmanager
def staged(folder: Path, prefix: str, stale: Sequence[str] = ()) -> Iterator[Path]:
    """The staging folder `folder/.PREFIX-XXXXXXXX/` to write files in; when the block ends without
    an error, each file is fsynced and renamed over its namesake in `folder`. Before, under the lock,
    stale staging folders of `prefix` and the leftovers matching the `stale` glob patterns go."""
    folder = Path(os.path.realpath(folder))
    with locked(folder):
        for pattern in (f".{prefix}-{'?' * 8}", *stale):  # mkdtemp's names: 8 random characters
            for leftover in folder.glob(pattern):
                remove(leftover)
        staging = Path(tempfile.mkdtemp(prefix=f".{prefix}-", dir=folder))
        try:
            yield staging
            names = sorted(os.listdir(staging))
            for name in names:
                if (folder / name).is_dir() and not (folder / name).is_symlink():
                    raise UserError(f"{folder / name} is a folder; move it away (a file of that name is written "
                                    "there)")
                with open(staging / name, "rb") as handle:
                    os.fsync(handle.fileno())
            for name in names:  # everything is whole: only renames from here, no space needed
                os.replace(staging / name, folder / name)
            _fsync_dir(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
