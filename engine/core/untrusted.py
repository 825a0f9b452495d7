"""What a file someone else may have written says, read with bounds and shown escaped.

A session folder may come from anyone, so every JSON document of it (the manifest, job files,
results, each line of the event log, the console's own files there) is read by `loads` alone: a
document larger than its bound is refused before it is parsed, and so is one nested deeper than
MAX_DEPTH (counted by a scan of its brackets outside strings, without recursing: json's decoder
recurses, and 2,000 levels in 4 KB is a RecursionError), and every other failure (not JSON, not
UTF-8, out of memory) becomes the one DamagedJSON, a ValueError whose message is the reason in one
line. So a reader says "damaged: REASON" for that file or that line only, and goes on.

Text read from such a file (a model's name, a job's error) reaches a terminal or a log line only
through `printable`: control characters (C0, DEL, C1, and the invisible ones that reorder or hide
text: bidi overrides, zero-width marks, line separators) are escaped, so a name cannot clear the
screen, forge a log line or run the text backwards. NO_CONTROL is the same rule as a settings
pattern, for names that come in (`--model`).
"""

from __future__ import annotations

import itertools
import json
import re
from array import array
from typing import Any

MAX_DEPTH = 100  # arrays and objects within each other: every document this version writes has fewer than 10
MAX_DOCUMENT_BYTES = 64 << 20  # a result, or an event line (a job's result event carries its document)
MAX_SMALL_BYTES = 1 << 20  # a manifest, a job file: settings and a command line

_CONTROL = "\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
NO_CONTROL = f"[^{_CONTROL}]*"  # text without a control character, as a settings `pattern`
_CONTROL_CHAR = re.compile(f"[{_CONTROL}]")

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes and all
_OPEN_CLOSE = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 and -1 as signed bytes
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_SCAN = 1 << 16  # brackets summed at a time: a deep document is refused at its first chunk too deep


class DamagedJSON(ValueError):
    """A JSON document that cannot be used; the message is why, in one line."""


def depth(data: bytes) -> int:
    """How deep arrays and objects nest in `data` (JSON), at least as deep as MAX_DEPTH + 1 when it
    is deeper: the brackets outside strings, summed as +1 and -1, without recursion."""
    brackets = array("b", _STRING.sub(b"", data).translate(_OPEN_CLOSE, _NOT_BRACKET))
    level = deepest = 0
    for start in range(0, len(brackets), _SCAN):
        running = list(itertools.accumulate(brackets[start:start + _SCAN], initial=level))
        level, deepest = running[-1], max(deepest, *running)
        if deepest > MAX_DEPTH:
            break
    return deepest


def loads(data: bytes | str, limit: int = MAX_DOCUMENT_BYTES) -> Any:
    """The JSON document `data`; DamagedJSON when it is larger than `limit` bytes, nested deeper
    than MAX_DEPTH, or not JSON."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > limit:
        raise DamagedJSON(f"larger than {_size(limit)}")
    if depth(raw) > MAX_DEPTH:
        raise DamagedJSON(f"nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError, MemoryError) as exc:  # UnicodeDecodeError is a ValueError
        raise DamagedJSON(f"not JSON ({printable(str(exc)) or type(exc).__name__})") from None


def has_control(text: str) -> bool:
    return _CONTROL_CHAR.search(text) is not None


def printable(text: str) -> str:
    """`text` with each control character written as its escape (\\n, \\x1b, \\u202e): one line that
    shows what it holds and does nothing to a terminal or a log."""
    return _CONTROL_CHAR.sub(lambda found: repr(found.group())[1:-1], text)


def _size(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} bytes"
