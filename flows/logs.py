"""Where a command's log goes: the whole of it, tracebacks included, to a file in the store; on the
console, an error the user can fix (bad input, config, a damaged artifact) is said in one line,
without the traceback Prefect's engine logs with it."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from pathlib import Path

from tasks.stage import INPUT_ERRORS


class BriefInputErrors(logging.Formatter):
    """Wraps a console handler's formatter: records of INPUT_ERRORS lose their traceback there (only)."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and isinstance(record.exc_info[1], INPUT_ERRORS):
            record = copy.copy(record)  # the log file's handler gets the record with its traceback
            record.exc_info, record.exc_text = None, None
        return self.inner.format(record)


@contextlib.contextmanager
def logged(path: Path) -> Iterator[Path]:
    """Log everything at INFO and above to `path` and keep input errors brief on the console."""
    root = logging.getLogger()
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_file.setLevel(logging.INFO)
    consoles = [h for h in root.handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)]
    formatters = [h.formatter for h in consoles]
    for handler in consoles:
        handler.setFormatter(BriefInputErrors(handler.formatter))
    root.addHandler(to_file)
    try:
        yield path
    finally:
        root.removeHandler(to_file)
        to_file.close()
        for handler, formatter in zip(consoles, formatters):
            handler.setFormatter(formatter)
