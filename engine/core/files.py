"""A user's text file, read with one-line errors for the usual mistakes: the one reader of every
file a setting names (`setting(..., file=...)`), so each is checked the same way before a load."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from engine.core.errors import UserError

TEXT_BUDGET = 64 * 2**20  # bytes of text a run reads whole at most (a larger one only with a bound)
BUDGET_TEXT = f"{TEXT_BUDGET // 2**20} MB"


def read_lines(path: Path, what: str) -> list[str]:
    """Non-empty lines of a UTF-8 file, with one-line errors for the usual mistakes: no such file,
    a folder, a name too long, no permission, over TEXT_BUDGET (refused before it is read), not
    UTF-8, binary."""
    path = Path(path)
    kind = path_kind(path, what)
    if kind == "folder":
        raise UserError(f"{what} {short_path(path)} is a folder; give a UTF-8 text file, one text per line")
    if kind == "other":
        raise UserError(f"{what} {short_path(path)} is not a regular file (a device or a pipe); give a UTF-8 text "
                        "file, one text per line")
    if kind != "file":
        raise UserError(f"{what} {short_path(path)} does not exist; give a UTF-8 text file, one text per line")
    try:
        size = path.stat().st_size
        if size > TEXT_BUDGET:
            beginning = ", or score its beginning: --eval-dataset FILE --max-tokens N" if "evaluation" in what else ""
            raise UserError(f"{what} {short_path(path)} is {size / 2**20:.0f} MB, over the {BUDGET_TEXT} a run reads "
                            f"whole; give a smaller file{beginning}")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not UTF-8 text; convert it to UTF-8") from exc
    except OSError as exc:
        raise UserError(f"{what} {short_path(path)}: {exc.strerror or exc}") from None
    if "\0" in text:  # valid UTF-8 but binary (NUL bytes): scoring it would measure nothing meant
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UserError(f"{what} {path} is binary (a NUL byte on line {line}); give a UTF-8 text file")
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise UserError(f"{what} {path} is empty; put one text per line")
    return lines


# OSErrors of a path a user gave (a name too long, no permission, a folder for a file, a loop of links):
# the user's to fix, one line naming the path (cli/main.py), never "the memory plan skipped"
PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.ELOOP,
                         errno.ENOENT, errno.EROFS})


def path_kind(path: Path, what: str) -> str:
    """'file', 'folder', 'other' (a device, a pipe) or 'missing' for a path a user gave; an OSError
    (a name too long, a folder that cannot be searched) is one line naming `what`."""
    try:
        return ("file" if path.is_file() else "folder" if path.is_dir() else "other" if path.exists()
                else "missing")
    except OSError as exc:
        raise UserError(f"{what} {short_path(path)}: {exc.strerror or str(exc)}") from None


def check_folder_target(path: Path, what: str) -> None:
    """A folder a run creates or writes into, after its work: checked before it, since the save
    would fail only then. One line for a symbolic link that leads nowhere, a folder that exists but
    cannot be written, and a path whose nearest existing ancestor (where the save stages its files
    and makes the folder) is a link to nothing, a file, or a folder that cannot be written."""
    if path.is_symlink() and not path.exists():
        raise UserError(f"{what} {short_path(path)} is a symbolic link to {os.readlink(path)}, which does not "
                        "exist; give a folder path, or remove the link")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{what} {short_path(path)} cannot be written (no permission); choose another folder")
    ancestor = path.parent
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        kind = "a symbolic link to nothing" if ancestor.is_symlink() else "not a folder"
        raise UserError(f"{what} {short_path(path)}: {short_path(ancestor)} is {kind}; give a path in a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"{what} {short_path(path)}: {short_path(ancestor)} cannot be written (no permission); "
                        "choose another place")


def short_path(path: Path | str) -> str:
    """A path as an error shows it: at most 80 characters."""
    text = str(path)
    return text if len(text) <= 80 else f"{text[:40]}...{text[-20:]} ({len(text)} characters)"
