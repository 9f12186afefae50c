"""How far a long stage is, as a progress artifact on its Prefect task run (seen in the Prefect UI).

Outside a Prefect task run (plain scripts, tests) a `StageProgress` only counts, so the training
loop, the encoder and summary generation keep running without Prefect. It is named after the stage
being built (`embed[crops]`, set by Stage.run), so the UI says which model or recipe it is about.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar

log = logging.getLogger("embforge.progress")

# What is being built, e.g. ("embed[crops]", its key): set by Stage.run around a build.
current_stage: ContextVar[tuple[str, str]] = ContextVar("current_stage", default=("", ""))
_silenced: ContextVar[bool] = ContextVar("silenced", default=False)


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Progress inside shows nothing (no API call, no bar): for work that is timed (tasks/speed.py)."""
    token = _silenced.set(True)
    try:
        yield
    finally:
        _silenced.reset(token)


class StageProgress:
    """`done` of `total` `unit` of the current stage, e.g. "train[crops]: 120 of 400 steps · 3f9a1c2e".

    The artifact shows what was sent last: on a failure it stays at the last value, not at 100.
    """

    # Each update is an HTTP call to the Prefect API, and a training step can take milliseconds.
    min_interval_s = 2.0

    def __init__(self, total: int, unit: str, done: int = 0):
        self.total, self.unit, self.done = total, unit, done
        label, self.key = current_stage.get()
        self.label = label or "progress"
        self._artifact_id = None
        # A task run implies Prefect is loaded: plain scripts do not pay its import (~1.5 s).
        context = sys.modules.get("prefect.context")
        self.shown = not _silenced.get()  # whether a bar may show it too
        self._reporting = self.shown and context is not None and context.TaskRunContext.get() is not None
        if self._reporting:
            self._send()

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    @property
    def description(self) -> str:
        return f"{self.label}: {self.done} of {self.total} {self.unit}" + (f" · {self.key[:8]}" if self.key else "")

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def update(self, done: int) -> None:
        self.done = done
        if self._reporting and time.monotonic() - self._sent_at >= self.min_interval_s:
            self._send()

    def close(self) -> None:
        """Send the final count (100 % when every unit is done); later calls send nothing."""
        if self._reporting:
            self._send()
            self._reporting = False

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        try:
            if self._artifact_id is None:
                self._artifact_id = create_progress_artifact(progress=self.percent, description=self.description)
            else:
                update_progress_artifact(self._artifact_id, progress=self.percent, description=self.description)
        except Exception as e:  # the UI's progress bar is not worth failing a stage for
            log.warning("%s: Prefect progress updates stopped, the API failed: %s", self.label, e)
            self._reporting = False
        self._sent_at = time.monotonic()
