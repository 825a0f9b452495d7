"""The Log tab's older pages: its lines (job messages and job ends) read backwards from the event
log a page at a time, so a log of any size is never loaded whole. Page 0 is the live view (the
state's newest lines, tui/state.py); page k counts back from the log's end as it was when paging
began."""

from __future__ import annotations

from engine.core.errors import UserError
from engine.core.events import Finished, Message
from engine.disk.atomic import open_unlinked
from sessions.store import Session, SessionError
from tui import event_index
from tui.state import log_line

PAGE = 200  # lines a page
CHUNK = 1 << 20  # bytes read backwards at a time
_KINDS = (b'"job.message"', b'"job.finished"', b'"message"', b'"finished"')  # the kinds, any schema version


class LogPager:
    """Pages back through `session`'s log lines, from byte `end` of its log; each page oldest first."""

    def __init__(self, session: Session, end: int, page: int = PAGE) -> None:
        self.session = session
        self.page = page
        self.pages: list[list[tuple[str, str]]] = []  # pages[k - 1]: page k, once read
        self.end = end  # where the next older page ends

    def older(self, back: int) -> list[tuple[str, str]]:
        """Page `back` (1: the newest lines of the log), oldest line first; [] past the log's start."""
        while len(self.pages) < back and self.end > 0:
            lines, self.end = self._page(self.end)
            self.pages.append(lines)
        return self.pages[back - 1] if 1 <= back <= len(self.pages) else []

    def _page(self, end: int) -> tuple[list[tuple[str, str]], int]:
        """The `page` log lines ending before byte `end`, oldest first, and the byte where the first
        begins (0: the log's start), read backwards a CHUNK at a time."""
        found: list[tuple[str, str]] = []
        position, carry = end, b""
        while position > 0:
            start = max(position - CHUNK, 0)
            data = self._read(start, position) + carry
            cut = 0
            if start > 0:  # the first bytes end a line begun in the chunk before: kept for it
                cut = data.find(b"\n") + 1
                if cut == 0:
                    carry, position = data, start
                    continue
            carry, line_end = data[:cut], start + len(data)
            for raw in reversed(data[cut:].split(b"\n")[:-1]):
                line_start = line_end - len(raw) - 1
                line = self._line(raw, line_start) if any(kind in raw for kind in _KINDS) else None
                if line is not None:
                    found.append(line)
                    if len(found) == self.page:
                        return found[::-1], line_start
                line_end = line_start
            position = start
        return found[::-1], 0

    def _line(self, raw: bytes, start: int) -> tuple[str, str] | None:
        event = next((event for _, event in event_index.parsed(raw + b"\n", start)), None)
        return log_line(event) if isinstance(event, (Message, Finished)) else None

    def _read(self, start: int, end: int) -> bytes:
        try:
            with open_unlinked(self.session.events_path) as log_file:  # a folder, a FIFO, a link since: nothing
                log_file.seek(start)
                return log_file.read(end - start)
        except (OSError, SessionError, UserError):
            return b""
