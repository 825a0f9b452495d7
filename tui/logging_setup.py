"""Where the console's log records go: to app.log in the open session, never to the terminal the
console draws on. Set up where the process starts (`setup_logging`, from cli/launch.py); the session
file is known only once a session is opened (`log_to_file`), and transformers' own handler only once
transformers is imported (`route_transformers_logs`, before the model loads). Each record is one line
with its control characters escaped (`EscapedFormatter`): a session's text in a message (a job's
error, a forged file's field) can neither forge a line of the log nor send a terminal escape to
whoever reads it."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from engine.core.untrusted import printable

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_session_file: list[logging.FileHandler] = []  # the handler log_to_file installed, if any


def setup_logging() -> None:
    """No record reaches the terminal; warnings become records; INFO and above are kept."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)


class EscapedFormatter(logging.Formatter):
    """FORMAT with the message's control characters escaped (engine.core.untrusted.printable), and
    a traceback's within each of its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return "\n".join(printable(line) for line in super().formatException(ei).split("\n"))


class _UnlinkedFileHandler(logging.FileHandler):
    """A log file opened without following a symbolic link (a session's app.log)."""

    def _open(self):
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        return open(fd, self.mode, encoding=self.encoding, errors=self.errors)


def log_to_file(path: Path) -> None:
    """Every record (ours, libraries', warnings) goes to `path` from now on, instead of the file of
    a session opened earlier."""
    setup_logging()
    root = logging.getLogger()
    while _session_file:
        earlier = _session_file.pop()
        root.removeHandler(earlier)
        earlier.close()
    handler = _UnlinkedFileHandler(path, encoding="utf-8")
    handler.setFormatter(EscapedFormatter(FORMAT))
    root.addHandler(handler)
    _session_file.append(handler)


def route_transformers_logs() -> None:
    """transformers logs to stderr through a handler of its own and draws progress bars there:
    its records go to the root logger (so to app.log) and the bars stay off."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    hf_logging.disable_progress_bar()
