"""Leases between real processes: one holder at a time, heartbeats, takeover after kill -9 or a stall."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from storage.base import HOST, ArtifactRef
from storage.leases import LeaseLostError, confirm, current_lease, hold
from storage.store import ArtifactStore
from tests.helpers import REPO

REF = ArtifactRef("train", "k")

# Takes REF's lease (ttl argv[2]), says so, holds it argv[3] seconds, then says whether it still holds it.
HOLDER = """
import logging, sys, time
from storage.leases import LeaseLostError, confirm, current_lease, hold
from storage.base import ArtifactRef
from storage.store import ArtifactStore
with hold(ArtifactStore(sys.argv[1]), ArtifactRef("train", "k"), lambda: False, logging.getLogger(),
          ttl=float(sys.argv[2])) as mine:
    print("held", current_lease.get().generation, time.time(), flush=True)
    time.sleep(float(sys.argv[3]))
    try:
        confirm()
        print("kept", time.time(), flush=True)
    except LeaseLostError:
        print("lost", time.time(), flush=True)
"""

# Tries to create generations 0..argv[2]-1 as fast as it can; prints those it won.
TAKER = """
import sys, time
from storage.leases import Lease
from storage.base import ArtifactRef
from storage.store import ArtifactStore
store, start = ArtifactStore(sys.argv[1]), float(sys.argv[3])
time.sleep(max(0, start - time.time()))
print(*[n for n in range(int(sys.argv[2])) if Lease(store, ArtifactRef("train", "k"), 600).take(n)])
"""


def holder(store: ArtifactStore, ttl: float, hold_s: float) -> tuple[subprocess.Popen, list[str]]:
    """A process holding REF's lease, and its first line (`held <generation> <time>`)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.root), str(ttl), str(hold_s)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    return proc, proc.stdout.readline().split()


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path / "store")


def test_a_second_holder_waits_while_heartbeats_keep_the_lease_past_its_ttl(store, caplog):
    proc, held = holder(store, ttl=0.4, hold_s=2.5)  # ~6 ttls: only its beats keep it
    assert held[:2] == ["held", "0"]
    log = logging.getLogger("test")
    with caplog.at_level(logging.INFO, "test"), hold(store, REF, lambda: False, log, ttl=0.4) as mine:
        waited_until = time.time()
        assert mine and current_lease.get().generation == 1  # the holder's own released generation stays
    assert proc.wait() == 0 and proc.stdout.read().split()[0] == "kept"
    assert waited_until - float(held[2]) > 2.5
    assert [r.getMessage() for r in caplog.records] == [f"waiting for {HOST}/{proc.pid} building train/k"]
    # Not published: marked released, so the next taker creates generation 2 (numbers are never reused).
    assert json.loads(store.fs.cat_file(store.location("leases", "train", "k", "1.json")))["released"]


def test_publishing_ends_the_wait_and_removes_the_leases(store):
    proc, _ = holder(store, ttl=0.4, hold_s=30)
    started = time.monotonic()
    with hold(store, REF, lambda: time.monotonic() - started > 1, logging.getLogger("test"), ttl=0.4) as mine:
        assert not mine and current_lease.get() is None
    assert time.monotonic() - started < 3
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait()
    with hold(store, REF, lambda: True, logging.getLogger("test")) as mine:
        assert not mine  # ready: not even a lease is taken
    with hold(store, REF, lambda: False, logging.getLogger("test"), ttl=0.4) as mine:
        assert mine  # the holder died: taken over at once
    published = []
    with hold(store, REF, lambda: bool(published), logging.getLogger("test")) as mine:
        assert mine
        published.append(REF)  # ready on release: the key's folder goes
    assert not store.fs.exists(store.location("leases"))


def test_a_killed_holder_is_taken_over_at_once_a_stalled_one_after_its_ttl(store):
    proc, _ = holder(store, ttl=60, hold_s=60)
    os.killpg(proc.pid, signal.SIGKILL)  # its lease would hold for another minute: gone on this host counts
    proc.wait()
    started = time.monotonic()
    with hold(store, REF, lambda: False, logging.getLogger("test"), ttl=60) as mine:
        assert mine and time.monotonic() - started < 2

    stalled, _ = holder(store, ttl=1, hold_s=2)
    os.killpg(stalled.pid, signal.SIGSTOP)  # alive, but silent
    started = time.monotonic()
    with hold(store, REF, lambda: False, logging.getLogger("test"), ttl=1) as mine:
        assert mine and 1 < time.monotonic() - started < 4
        os.killpg(stalled.pid, signal.SIGCONT)
        assert stalled.wait() == 0 and stalled.stdout.read().split()[0] == "lost"  # its checkpoints stop
        confirm()  # ours is still ours
        assert current_lease.get().held()


def test_of_two_takers_exactly_one_wins_each_generation(store):
    start = str(time.time() + 2)  # both past their imports
    procs = [subprocess.Popen([sys.executable, "-c", TAKER, str(store.root), "300", start], cwd=REPO,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    won = [set(map(int, p.communicate()[0].split())) for p in procs]
    assert not won[0] & won[1] and won[0] | won[1] == set(range(300))
    assert won[0] and won[1]  # they did race


def test_two_waiting_takers_of_an_expired_lease_hold_it_one_after_the_other(store):
    proc, _ = holder(store, ttl=60, hold_s=60)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    takers = [subprocess.Popen([sys.executable, "-c", HOLDER, str(store.root), "1", "1"], cwd=REPO,
                               stdout=subprocess.PIPE, text=True) for _ in range(2)]
    lines = sorted([line.split() for line in p.communicate()[0].splitlines()] for p in takers)
    assert [lines[0][0][1], lines[1][0][1]] == ["1", "2"]  # generation 1 won by one, 2 taken after its release
    assert float(lines[0][1][1]) <= float(lines[1][0][2])  # no overlap
    assert all(taker[1][0] == "kept" for taker in lines)


def test_confirm_outside_a_lease_passes_and_a_lost_lease_raises(store):
    confirm()
    with hold(store, REF, lambda: False, logging.getLogger("test"), ttl=60) as mine:
        assert mine
        store.fs.pipe_file(store.location("leases", "train", "k", "1.json"), b"{}")  # a taker's generation
        with pytest.raises(LeaseLostError):
            confirm()
