"""tasks/core/stopping.py: a signal noted during a step and acted on at its end; a second one at once."""

import os
import signal
import threading

import pytest

from tasks.core.stopping import StepBoundaryStop


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
