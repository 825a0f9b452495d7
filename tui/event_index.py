"""The event log's index: which lines of `events.jsonl` the console's panels still depend on, so a
session whose log is large opens by folding those lines and the log's tail, not every line.

`<session>/events.index.json` (tui/session_files.py EVENT_INDEX), written by the console as it
follows the log (tui/lab.py), atomically:

    {"format": FORMAT, "covers": C, "lines": [[start, end], ...], "sha256": H}

`lines` are byte ranges of whole lines of the log before byte C (tui/line_keeper.py LineKeeper chooses
them), in order; H is the SHA-256 of those lines' bytes followed by the GUARD bytes before C. Like
every part of a session it is untrusted: JSON only, each field checked, each range a whole line of
the log, and the hash must match the log as it is now. So it can only select lines the log says;
anything that does not match (the log rewritten or cut, an index from another session, a forged
one) is logged and the whole log is folded instead, and the index written again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from engine.core.errors import UserError
from engine.core.events import Event, event_from_json
from engine.core.untrusted import loads
from engine.disk.atomic import atomic_write_bytes, open_unlinked, read_json
from sessions.store import Session, SessionError
from tui.session_files import EVENT_INDEX
from tui.state import Span

log = logging.getLogger(__name__)

FORMAT = "anatomy-tui event index 1"
GUARD = 4096  # bytes of the log just before `covers`, hashed too: a log cut or rewritten there is noticed
MAX_INDEX_BYTES = 256 << 20  # a larger file is not an index this version wrote


def parsed(data: bytes, offset: int) -> Iterator[tuple[Span, Event]]:
    """Each line of `data` (whole lines of the log starting at byte `offset`) with its span, decoded;
    a line that does not parse or fit an event (a torn write, another version's kind) is skipped."""
    start = offset
    for raw in data.split(b"\n")[:-1]:
        span = (start, start + len(raw) + 1)
        start = span[1]
        try:
            doc = loads(raw)  # too large or deeply nested: a ValueError too (engine.core.untrusted)
            if isinstance(doc, dict):
                yield span, event_from_json(doc)
        except (AttributeError, TypeError, ValueError) as exc:  # the log is untrusted
            log.debug("skipped line at byte %d of the event log: %s", span[0], exc)


def load(session: Session) -> tuple[list[tuple[Span, Event]], int] | None:
    """The indexed lines, decoded, and the byte the index covers the log up to; None (why is logged)
    when there is no index or it does not match the log."""
    try:
        path = session.part(EVENT_INDEX)
        if not path.exists():
            return None
        doc = read_json(path, limit=MAX_INDEX_BYTES)  # never through a link, a FIFO, too large or deep
        covers, spans, digest = _fields(doc)
        lines = _read(session, spans, covers, digest)
    except (OSError, ValueError, SessionError, UserError) as exc:
        log.info("event index of %s not used (%s): reading the whole log", session.name, exc)
        return None
    return [pair for span, raw in zip(spans, lines, strict=True) for pair in parsed(raw, span[0])], covers


def _fields(doc: Any) -> tuple[int, list[Span], str]:
    """`covers`, `lines` and `sha256` of an index document, checked: ValueError says what is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT!r} document")
    covers, lines, digest = doc.get("covers"), doc.get("lines"), doc.get("sha256")
    if type(covers) is not int or covers < 0 or not isinstance(lines, list) or not isinstance(digest, str):
        raise ValueError("'covers', 'lines' or 'sha256' missing or of the wrong type")
    spans: list[Span] = []
    end = 0
    for line in lines:
        if not (isinstance(line, list) and len(line) == 2 and all(type(n) is int for n in line)):
            raise ValueError("a line is not a [start, end] pair of integers")
        if not end <= line[0] < line[1] <= covers:
            raise ValueError("lines overlap, are out of order or past 'covers'")
        spans.append((line[0], line[1]))
        end = line[1]
    return covers, spans, digest


def _read(session: Session, spans: list[Span], covers: int, digest: str) -> list[bytes]:
    """The bytes of each span, each checked to be a whole line of the log, and the hash checked."""
    path = session.events_path
    lines = []
    sha = hashlib.sha256()
    with open_unlinked(path) as log_file:  # not a regular file, or a link: OSError, UserError
        if log_file.seek(0, 2) < covers:
            raise ValueError("the log is shorter than the index covers")
        for start, end in spans:
            log_file.seek(max(start - 1, 0))
            raw = log_file.read(end - max(start - 1, 0))
            if start > 0:
                before, raw = raw[:1], raw[1:]
                if before != b"\n":
                    raise ValueError(f"byte {start} does not start a line")
            if len(raw) != end - start or not raw.endswith(b"\n"):
                raise ValueError(f"bytes {start}..{end} are not a whole line")
            sha.update(raw)
            lines.append(raw)
        log_file.seek(max(covers - GUARD, 0))
        guard = log_file.read(covers - max(covers - GUARD, 0))
    if covers and not guard.endswith(b"\n"):
        raise ValueError(f"byte {covers} does not start a line")
    sha.update(guard)
    if sha.hexdigest() != digest:
        raise ValueError("the log's lines do not match the index's hash")
    return lines


def write(session: Session, spans: list[Span], covers: int) -> bool:
    """Writes the index of `spans` (whole lines of the log, in order) covering the log up to byte
    `covers`; False (logged) when it cannot be written: it is only ever a shortcut."""
    try:
        sha = hashlib.sha256()
        with open_unlinked(session.events_path) as log_file:
            for start, end in spans:
                log_file.seek(start)
                sha.update(log_file.read(end - start))
            log_file.seek(max(covers - GUARD, 0))
            sha.update(log_file.read(covers - max(covers - GUARD, 0)))
        doc = {"format": FORMAT, "covers": covers, "lines": [list(span) for span in spans], "sha256": sha.hexdigest()}
        atomic_write_bytes(session.part(EVENT_INDEX), json.dumps(doc, separators=(",", ":")).encode(), "event index")
    except (OSError, UserError, SessionError) as exc:
        log.warning("could not write the event index of %s: %s", session.name, exc)
        return False
    return True
