"""How embforge stops on a signal (Ctrl-C, SIGTERM): `stop_on_signals` makes both raise where
they land (a second one ends the process at once), and `StepBoundaryStop` lets a loop take the stop
at its next step boundary, where the state it saves is whole: a training step interrupted half-way
has moved some weights and not others. Signals are handled in the main thread only; elsewhere (a
task runner's thread) a stop is taken where the signal finds the work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from prefect.exceptions import TerminationSignal

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `timeout`, a Prefect worker), raised where Ctrl-C raises KeyboardInterrupt
    so that both stop the same way: the flow records the run interrupted, servers stop last. `signal`
    as in Prefect's TerminationSignal, which the flow engine raises for SIGTERM inside a flow run."""

    signal = signal.SIGTERM


class Lost(Terminated):
    """A process the run needs (its Prefect server, the LLM engine) died: the run stops as at a SIGTERM, with
    `what` died and the exit status of a failure the rerun resumes from (docs/stages.md)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


_LOST: list[str] = []  # what died, for the handler that raises in the main thread


def stop_for(what: str, first: Callable[[], None] = lambda: None) -> None:
    """From any thread: stop the run because `what` died. `lost()` says so from now on (a failure it causes is not
    retried), `first` runs (what waits on the dead process is set free), then the main thread raises `Lost` where a
    SIGTERM would land (training at its next step boundary, after saving it), so the stop takes the same path."""
    if _LOST:
        return
    _LOST.append(what)
    try:
        first()
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def watched(what: str, exit_code: Callable[[], int | None], first: Callable[[], None] = lambda: None,
            every_s: float = 0.5) -> Iterator[None]:
    """While inside: if `exit_code()` (None while the process runs) says `what` ended, stop the run (`stop_for`,
    calling `first`) within `every_s`, rather than waiting on it for minutes or for ever."""
    done = threading.Event()

    def stopped_if_dead() -> bool:
        if (code := exit_code()) is not None:
            stop_for(f"{what} died ({ended(code)})", first)
        return code is not None

    def watch() -> None:
        while not done.wait(every_s):
            if stopped_if_dead():
                return

    threading.Thread(target=watch, name=f"watch {what}", daemon=True).start()
    try:
        yield
    except BaseException:  # the wait may end in an error of its own before the watcher looks: the same stop
        stopped_if_dead()
        raise
    finally:
        done.set()


def ended(code: int) -> str:
    """A process's exit status in words: Popen's negative code is the signal that killed it."""
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def lost() -> str | None:
    """What died, if `stop_for` stopped this command."""
    return _LOST[0] if _LOST else None


def stop_signal(error: BaseException | None) -> KeyboardInterrupt | TerminationSignal | None:
    """The Ctrl-C or SIGTERM that `error` is, or that a library turned into an ordinary error of its own
    (found as its cause or context); None for a failure."""
    while error is not None and not isinstance(error, KeyboardInterrupt | TerminationSignal):
        error = error.__cause__ or error.__context__
    return error


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """A command's handlers while it runs: the first signal raises KeyboardInterrupt or Terminated, a
    second exits. The ones that were there are back after (a test calls commands in its process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.signal(signum, _stop) for signum in SIGNALS}
    _LOST.clear()
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _stop(signum: int, frame: FrameType | None) -> None:
    for each in SIGNALS:  # a second signal while stopping exits at once
        signal.signal(each, _exit_now)
    if signum == signal.SIGTERM:
        raise Lost(what) if (what := lost()) else Terminated
    raise KeyboardInterrupt


def _exit_now(signum: int, frame: FrameType | None) -> None:
    os._exit(128 + signum)  # the run's Prefect server dies with this process (flows/api.py)


class StepBoundaryStop:
    """`with StepBoundaryStop() as stop:` notes a first signal instead of acting on it; the loop
    calls `stop.requested` after each step and, once it has saved its state, `stop.now()`, which does
    what the signal would have done (the handler that was there: KeyboardInterrupt, Prefect's
    TerminationSignal, the command's own). A second signal does that at once."""

    def __init__(self, signals: tuple[int, ...] = SIGNALS) -> None:
        self.signum: int | None = None
        self.signals = signals  # the others keep their handler, and act where they land
        self._saved: dict[int, object] = {}

    def __enter__(self) -> StepBoundaryStop:
        if threading.current_thread() is threading.main_thread():
            self._saved = {s: signal.signal(s, self._note) for s in self.signals}
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # a second signal: no waiting for the step
            self.now()
        self.signum = signum

    def _restore(self) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)
        self._saved = {}

    def now(self) -> None:
        """Hand the signal to the handler it interrupted, which raises (or ends the process)."""
        handler = self._saved.get(self.signum, signal.SIG_DFL)
        self._restore()
        if callable(handler):
            handler(self.signum, None)
        elif handler == signal.SIG_DFL:
            signal.raise_signal(self.signum)  # the default action: end the process
