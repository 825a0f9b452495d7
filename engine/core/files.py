"""A user's text file, read with one-line errors for the usual mistakes: the one reader of every
file a setting names (`setting(..., file=...)`), so each is checked the same way before a load."""

from __future__ import annotations

from pathlib import Path

from engine.core.errors import UserError


def read_lines(path: Path, what: str) -> list[str]:
    """Non-empty lines of a UTF-8 file, with one-line errors for the usual mistakes."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist; give a UTF-8 text file, one text per line")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not UTF-8 text; convert it to UTF-8") from exc
    if "\0" in text:  # valid UTF-8 but binary (NUL bytes): scoring it would measure nothing meant
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UserError(f"{what} {path} is binary (a NUL byte on line {line}); give a UTF-8 text file")
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise UserError(f"{what} {path} is empty; put one text per line")
    return lines
