"""The Prefect API a CLI run reports to, and how embforge starts and stops Prefect servers.

Light on purpose (no flows, no models): `embforge run` starts its server before it imports the
flows, so the server boots (5-10 s) while torch, transformers and the stages import (~12 s).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import prefect.context
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, Settings, temporary_settings

from tasks.core.stopping import watched

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None) if sys.platform == "linux" else None  # loaded before a fork, not in its child


def _die_with_parent() -> None:
    """In a server's child before exec: SIGTERM when the process that started it dies, also by SIGKILL
    (the OOM killer, kill -9), which leaves it no chance to stop the server itself."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# A server in a session of its own does not get the signals of the terminal's or a scheduler's process
# group: the run (or served deployments) stops first and still reports to it; the server is stopped last.
SERVER_PROCESS = dict(start_new_session=True, preexec_fn=_die_with_parent if _LIBC else None)


# The Host names a server answers, comma-separated, read by `guarded_app` in the server's process.
HOSTS_ENV = "EMBFORGE_SERVER_HOSTS"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
EVERY_ADDRESS = ("0.0.0.0", "::")


def host_name(address: str) -> str:
    """`address` as a Host header and a URL write it: an IPv6 literal in brackets."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def api_url(host: str, port: int) -> str:
    return f"http://{host_name(host)}:{port}/api"


def served_hosts(host: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The Host names a server bound to `host` answers: that address, the loopback names where it listens
    on loopback (every address includes it), this machine's names where it listens on every address, and
    `extra` (the names remote clients use). A page whose name was re-pointed at this machine (DNS rebinding)
    is same-origin to its browser, but sends its own name as Host: refused."""
    names = [host_name(host), *map(host_name, extra)]
    if host_name(host) in LOOPBACK or host in EVERY_ADDRESS:
        names += LOOPBACK
    if host in EVERY_ADDRESS:
        names += [socket.gethostname(), socket.getfqdn()]
    return list(dict.fromkeys(name.lower() for name in names))


def guarded_app():
    """Prefect's server app (API and UI), answering only the Host names HOSTS_ENV lists (400 before any
    route otherwise): the uvicorn factory every server embforge starts runs."""
    from prefect.server.api.server import create_app
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    return TrustedHostMiddleware(create_app(final=True), allowed_hosts=os.environ[HOSTS_ENV].split(","),
                                 www_redirect=False)


def start_app(sock: socket.socket, env: dict[str, str], log_level: str = "warning", **popen_args) -> subprocess.Popen:
    """`guarded_app` under uvicorn on the bound socket `sock` (handed over: no other process can take the
    port between the check and the start) with `env` (HOSTS_ENV included), started as SERVER_PROCESS says."""
    return subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "flows.api:guarded_app",
                             "--fd", str(sock.fileno()), "--log-level", log_level, "--lifespan", "on"],
                            env=env, pass_fds=(sock.fileno(),), **SERVER_PROCESS,
                            **popen_args)


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"prefect server exited with code {server.returncode}; see its output above")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise RuntimeError(f"prefect server did not answer on {url} within {timeout_s:.0f} s")


def stop(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """Ask a server started in a session of its own to stop, its children too; kill them if they have
    not within `timeout_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _boot() -> tuple[str, subprocess.Popen]:
    """A temporary server on a port the OS picked, bound here and handed over (uvicorn --fd)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        url = api_url("127.0.0.1", sock.getsockname()[1])
        # The settings Prefect gives its own temporary server: no UI, the ephemeral set of services.
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               HOSTS_ENV: ",".join(served_hosts("127.0.0.1"))}
        return url, start_app(sock, env, log_level="error")


def unreachable(settings: Settings) -> None:
    """The run's server died: nothing answers at its port again, so every Prefect client call of this process fails
    at once rather than retrying for minutes, and log lines go to the run's log file only. In place: the task
    runner's threads hold these settings objects. What was queued for the server (log batches, events) fails
    too; the run's one error line says why, so those failures stay off the terminal."""
    for each in (settings, prefect.context.GLOBAL_SETTINGS_CONTEXT.settings):
        each.client.max_retries = 0
        each.logging.to_api.enabled = False
        each.internal.logging_level = "CRITICAL"  # the events worker's failures
    logging.raiseExceptions = False  # Prefect's log worker prints its failures only where the stdlib would
    logging.getLogger("prefect.events.clients").setLevel(logging.CRITICAL)
    forget_queued()


def forget_queued() -> None:
    """Drop the events and log batches queued for a server that died: each would take seconds of reconnecting to
    fail, and Prefect waits for them all at exit. Prefect offers no call for it: its services' queues are read
    directly (pinned Prefect 3.9)."""
    for service in (EventsWorker, APILogWorker):
        for worker in tuple(service._instances.values()):
            with contextlib.suppress(queue.Empty):
                while True:
                    worker._queue.get_nowait()


def prefect_api(attempts: int = 3) -> contextlib.AbstractContextManager[str]:
    """The Prefect API a CLI run reports to: the server PREFECT_API_URL names, else a temporary one
    of this process's own, started now (it boots while the caller imports its flows) and, once
    entered, waited for, used and stopped on exit.

    Prefect's own temporary server picks a random port in 8000-8999 and binds it seconds later: two
    runs started together can pick the same one, and then the loser talks to the winner's server,
    which stops when the winner ends. Here the socket is bound first (port 0: the OS picks a free
    one) and handed to the server, so a run only ever talks to its own server. A start can fail while
    another run's server migrates a shared database (PREFECT_HOME): it is retried. The server is
    started as SERVER_PROCESS says and stopped last."""
    if PREFECT_API_URL.value():
        return contextlib.nullcontext(PREFECT_API_URL.value())
    return _serving(_boot(), attempts)


@contextlib.contextmanager
def _serving(booted: tuple[str, subprocess.Popen], attempts: int) -> Iterator[str]:
    for attempt in range(1, attempts + 1):
        url, server = booted if attempt == 1 else _boot()
        try:
            try:
                wait_healthy(url, server)
            except RuntimeError:
                if attempt == attempts or server.poll() is None:
                    raise
                continue
            saved = os.environ.get("PREFECT_API_URL")
            os.environ["PREFECT_API_URL"] = url  # for the task runners' worker processes
            try:
                with temporary_settings(updates={PREFECT_API_URL: url}) as settings:
                    try:
                        with watched(f"the run's Prefect server (pid {server.pid})", server.poll,
                                     first=lambda: unreachable(settings)):
                            yield url
                    finally:  # logs and events still queued go out before the server stops, however the run ended
                        if server.poll() is None:
                            APILogWorker.drain_all(timeout=10)
                            EventsWorker.drain_all(timeout=10)
                        else:
                            forget_queued()
            finally:
                if saved is None:
                    os.environ.pop("PREFECT_API_URL", None)
                else:
                    os.environ["PREFECT_API_URL"] = saved
            return
        finally:
            stop(server)
