"""tasks/core/stopping.py: the first signal raises, a second exits; a signal noted during a step is
acted on at its end, a second one at once."""

import os
import signal
import subprocess
import sys
import threading

import pytest

from tasks.core import stopping
from tasks.core.stopping import StepBoundaryStop
from tests.helpers import REPO


def test_the_first_signal_stops_the_run_and_a_second_exits_at_once():
    saved = {s: signal.getsignal(s) for s in stopping.SIGNALS}
    with stopping.stop_on_signals():
        with pytest.raises(stopping.Terminated) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
        assert stopped.value.signal == signal.SIGTERM and isinstance(stopped.value, KeyboardInterrupt)
        assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is stopping._exit_now
    assert {s: signal.getsignal(s) for s in stopping.SIGNALS} == saved  # a command run in-process leaves none
    second = subprocess.run([sys.executable, "-c", "import os, signal, time; from tasks.core import stopping\n"
                             "with stopping.stop_on_signals():\n try:\n  os.kill(os.getpid(), signal.SIGINT)\n"
                             " except KeyboardInterrupt:\n  os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
                             "print('still here')"], cwd=REPO, capture_output=True, text=True)
    assert second.returncode == 130 and "still here" not in second.stdout  # the second: gone at once


def test_a_signal_is_taken_at_the_step_boundary_by_the_handler_it_interrupted():
    before = signal.getsignal(signal.SIGINT)
    with StepBoundaryStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # mid-step: noted, nothing raised
        assert stop.requested and stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # Python's own Ctrl-C handler, handed the signal
            stop.now()
        assert signal.getsignal(signal.SIGINT) is before
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_signal_stops_at_once():
    with StepBoundaryStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested


def test_outside_the_main_thread_signals_are_left_alone():
    seen = []

    def work():
        with StepBoundaryStop() as stop:
            seen.append((signal.getsignal(signal.SIGTERM), stop.requested))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [(signal.getsignal(signal.SIGTERM), False)]
