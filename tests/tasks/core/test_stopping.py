"""tasks/core/stopping.py: the first signal raises, a second exits; a signal noted during a step is
acted on at its end, a second one at once. Each check runs in a fresh interpreter, as a command does:
in the test session's process, sending itself signals brought it down (exit 139) once many earlier
tests had run there, whatever handlers it started from."""

import signal
import subprocess
import sys

import pytest
from prefect.exceptions import TerminationSignal

from tasks.core.stopping import stop_signal
from tests.helpers import REPO


def python(script: str) -> subprocess.CompletedProcess:
    # Python's own Ctrl-C handler first, as under a terminal: a test session started in the background by a
    # shell without job control (`(pytest &)`) inherits SIGINT ignored, and Python then installs none.
    return subprocess.run([sys.executable, "-c", "import os, signal, threading, time\n"
                           "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                           "from tasks.core import stopping\nfrom tasks.core.stopping import StepBoundaryStop\n"
                           + script], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_first_signal_raises_a_second_exits_at_once_and_the_handlers_come_back():
    done = python("""
before = {s: signal.getsignal(s) for s in stopping.SIGNALS}
with stopping.stop_on_signals():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    except stopping.Terminated as e:
        print("raised", e.signal.name, isinstance(e, KeyboardInterrupt))
    print("then", signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is stopping._exit_now)
print("back", {s: signal.getsignal(s) for s in stopping.SIGNALS} == before)
with stopping.stop_on_signals():
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
print("still here")
""")
    assert done.stdout.split("\n")[:3] == ["raised SIGTERM True", "then True", "back True"], done.stderr
    assert done.returncode == 130 and "still here" not in done.stdout  # the second signal: gone at once


def test_a_signal_is_taken_at_the_step_boundary_by_the_handler_it_interrupted():
    done = python("""
before = signal.getsignal(signal.SIGINT)
with StepBoundaryStop() as stop:
    os.kill(os.getpid(), signal.SIGINT)  # mid-step: noted, nothing raised
    print("noted", stop.requested, stop.signum == signal.SIGINT)
    try:
        stop.now()
    except KeyboardInterrupt:  # Python's own Ctrl-C handler, handed the signal
        print("raised at the boundary")
    print("restored", signal.getsignal(signal.SIGINT) is before)
""")
    assert done.stdout.split("\n")[:3] == ["noted True True", "raised at the boundary", "restored True"], done.stderr


def test_a_second_signal_during_a_step_stops_at_once():
    done = python("""
with StepBoundaryStop() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        print("not stopped")
    except KeyboardInterrupt:
        print("stopped", stop.requested)
""")
    assert done.stdout.strip() == "stopped True", done.stdout + done.stderr


def test_outside_the_main_thread_signals_are_left_alone():
    done = python("""
seen = []
def work():
    with StepBoundaryStop() as stop:
        seen.append((signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, stop.requested))
thread = threading.Thread(target=work)
thread.start()
thread.join()
print(seen)
""")
    assert done.stdout.strip() == "[(True, False)]", done.stdout + done.stderr


def test_a_signal_not_given_to_the_step_boundary_stop_raises_where_it_lands():
    # Training in a deployment's run gives it SIGINT only: Prefect's own SIGTERM handler must stay.
    done = python("""
def prefect_handler(signum, frame):
    raise SystemExit(f"raised by {signal.Signals(signum).name}, mid-step")
signal.signal(signal.SIGTERM, prefect_handler)
with StepBoundaryStop((signal.SIGINT,)) as stop:
    print(signal.getsignal(signal.SIGTERM) is prefect_handler, signal.getsignal(signal.SIGINT) == stop._note)
    os.kill(os.getpid(), signal.SIGINT)
    print("noted", stop.requested)
    os.kill(os.getpid(), signal.SIGTERM)
    print("not reached")
""")
    assert done.stdout.split("\n")[:2] == ["True True", "noted True"], done.stdout + done.stderr
    assert "raised by SIGTERM, mid-step" in done.stderr and "not reached" not in done.stdout


def test_training_outside_a_deployment_takes_both_signals_at_step_boundaries():
    from tasks.core.stopping import SIGNALS
    from tasks.train import boundary_signals

    assert boundary_signals() == SIGNALS


def raised_within(error: BaseException, within: type[Exception] | None) -> BaseException:
    """`error` as raised, or the `within` error that a library raises while handling it (as torch's checkpoint
    writer raises RuntimeError when a signal handler raises inside its file's write)."""
    try:
        try:
            raise error
        except BaseException:
            if within is None:
                raise
            raise within("unexpected pos")  # noqa: B904 (as the library does: error set as its context)
    except BaseException as e:
        return e


@pytest.mark.parametrize("within", [None, RuntimeError], ids=["as-itself", "inside-a-library-error"])
@pytest.mark.parametrize("stop", [KeyboardInterrupt(), TerminationSignal(signal.SIGTERM)], ids=["ctrl-c", "sigterm"])
def test_a_stop_is_found_as_itself_or_inside_the_error_a_library_made_of_it(stop, within):
    assert stop_signal(raised_within(stop, within)) is stop


def test_a_failure_is_no_stop():
    assert stop_signal(raised_within(ValueError("bad row"), RuntimeError)) is None
    assert stop_signal(RuntimeError("unexpected pos")) is None


def test_a_watched_process_dying_stops_the_command_in_its_main_thread_naming_it():
    """Whatever the main thread waits on (here a sleep; in a run, vLLM's queue or Prefect's API): the death is a
    `Lost` there within a second, `lost()` says what died (a failure it causes is not retried), and what held the
    waiter was set free first."""
    done = python("""
import subprocess
child = subprocess.Popen(["sleep", "60"])
freed = []
with stopping.stop_on_signals():
    start = time.monotonic()
    try:
        with stopping.watched(f"the helper (pid {child.pid})", child.poll, first=lambda: freed.append(stopping.lost())):
            threading.Timer(0.2, child.kill).start()
            time.sleep(30)
    except stopping.Lost as e:
        print("lost", e.what, "|", freed[0], "|", round(time.monotonic() - start) <= 1)
""")
    said = done.stdout.strip().split(" | ")
    assert said[0].startswith("lost the helper (pid ") and said[0].endswith(" died (killed by SIGKILL)"), done.stderr
    assert said[1:] == [said[0].removeprefix("lost "), "True"]


def test_a_wait_that_ends_in_its_own_error_when_the_process_dies_is_the_same_stop():
    done = python("""
import subprocess
child = subprocess.Popen(["sleep", "60"])
with stopping.stop_on_signals():
    try:
        with stopping.watched("the helper", child.poll, every_s=60):  # the watcher would look too late
            child.kill()
            child.wait()
            raise RuntimeError("engine dead")  # what vLLM raises when it notices first
    except stopping.Lost as e:
        print("lost", e.what)
    except RuntimeError:
        try:
            time.sleep(1)  # the stop's signal lands
        except stopping.Lost as e:
            print("lost", e.what)
""")
    assert done.stdout.split("\n")[0] == "lost the helper died (killed by SIGKILL)", done.stdout + done.stderr
