"""Where `embforge run` logs: all of it, tracebacks included, to a file in the store; on the console,
an error the user can fix (bad input, config, a damaged artifact) is left to the command's own
one-line `error:`, without the traceback Prefect's engine logs with it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from tasks.config.base import INPUT_ERRORS


def _not_an_input_error(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], INPUT_ERRORS))


@contextlib.contextmanager
def logged(path: Path) -> Iterator[Path]:
    """Log everything at INFO and above to `path`; keep the console's records of input errors out."""
    root = logging.getLogger()
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_file.setLevel(logging.INFO)
    # A filter on the handler, not the logger: the file handler still gets the record with its traceback.
    consoles = [h for h in root.handlers if type(h) is not logging.FileHandler and isinstance(h, logging.StreamHandler)]
    for handler in consoles:
        handler.addFilter(_not_an_input_error)
    root.addHandler(to_file)
    try:
        yield path
    finally:
        root.removeHandler(to_file)
        to_file.close()
        for handler in consoles:
            handler.removeFilter(_not_an_input_error)
