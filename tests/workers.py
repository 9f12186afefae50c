"""The suite on pytest-xdist's workers (the README's command runs `-n 2 --dist loadgroup`): one core for
each worker's torch, the tests that share a costly fixture kept on one worker, and the tests that time
something (a stop within seconds) run with no other test beside them."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...; None in a plain pytest run

# Session fixtures that take from seconds to a minute: the tests using one of them go to one worker, so
# that it is set up once (module-scoped fixtures group their module's tests the same way).
SET_UP_ONCE = ("llm_store", "service", "tracked_run", "mlflow_server", "seaweedfs")


def one_thread_per_worker() -> None:
    """Two workers on 2 cores, each letting torch (OpenMP) spin on both, contend: `pytest -n 2` ran slower
    than one process until each worker and what it starts had one thread (docs/results.md#the-test-suite)."""
    if WORKER:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(name, "1")


def slow_first(items: list[pytest.Item]) -> None:
    """On workers, the slow tests first (in their order): a minutes-long test handed out last would leave the
    other worker idle that long. xdist hands out groups first, the larger first, then single tests in this order."""
    if WORKER:
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def group_by_shared_fixture(items: list[pytest.Item]) -> None:
    """An `xdist_group` mark on each test that shares a SET_UP_ONCE or module-scoped fixture with others:
    tests linked through such fixtures (a module's fixture, a session fixture its tests use) form one group."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    links = {}
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = fixtures.name2fixturedefs if fixtures else {}
        names = [n for n in SET_UP_ONCE if n in defs]
        if any(d[-1].scope == "module" for d in defs.values()):
            names.append(item.module.__name__)
        for name in names[1:]:
            parent[root(name)] = root(names[0])
        links[item] = names
    for item, names in links.items():
        if names:
            item.add_marker(pytest.mark.xdist_group(root(names[0])))


class Cores:
    """The machine's cores between the workers: a test holds them shared with the other worker's test, and
    a test marked `alone` (or a part of one, through `alone()`) holds them by itself. A reader-writer lock
    over two files: a waiting `alone` takes the gate first, so tests that keep starting cannot starve it."""

    def __init__(self, folder: Path):
        folder.mkdir(exist_ok=True)
        self.gate, self.cores = open(folder / "gate", "a+"), open(folder / "cores", "a+")
        self.sharing = self.by_itself = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        fcntl.flock(self.cores, fcntl.LOCK_SH)
        fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.sharing = True
        try:
            yield
        finally:
            self.sharing = False
            fcntl.flock(self.cores, fcntl.LOCK_UN)

    @contextmanager
    def alone(self) -> Iterator[None]:
        if self.by_itself:  # a part of a test that already runs alone
            yield
            return
        # Let go of this worker's share first: two workers each holding a share while waiting for the
        # other's would wait for ever.
        fcntl.flock(self.cores, fcntl.LOCK_UN)
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.cores, fcntl.LOCK_EX)
            self.by_itself = True
            yield
        finally:
            self.by_itself = False
            fcntl.flock(self.cores, fcntl.LOCK_SH if self.sharing else fcntl.LOCK_UN)
            fcntl.flock(self.gate, fcntl.LOCK_UN)


# One lock for the workers of one run (xdist gives them the same run id); a plain run needs none.
CORES = Cores(Path(tempfile.gettempdir()) / f"embforge-tests-{os.environ['PYTEST_XDIST_TESTRUNUID']}") \
    if WORKER else None


@contextmanager
def alone() -> Iterator[None]:
    """No other worker's test runs while this block does (a plain run: nothing to wait for)."""
    if CORES is None:
        yield
        return
    with CORES.alone():
        yield


@contextmanager
def holding_cores(item: pytest.Item) -> Iterator[None]:
    """The cores for `item`'s whole run (set-up and teardown too): alone if it is marked so."""
    if CORES is None:
        yield
    elif item.get_closest_marker("alone"):
        with CORES.alone():
            yield
    else:
        with CORES.shared():
            yield
