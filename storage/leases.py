"""Leases: one process at a time builds an artifact, however many runs (or workers of a run) want it.

    leases/<stage>/<key>/<n>.json   generation n of the key's lease: its holder and heartbeat

The current lease is the highest generation. A process takes a free key by creating generation 0 and
an expired or released lease by creating generation n + 1, each an exclusive create (O_EXCL on local
files, a conditional PUT on S3): of two takers exactly one wins, and taking over deletes nothing.

The holder rewrites its own file every ttl/4 (a beat counter). A lease has expired once its file has
not changed for ttl seconds by the waiter's own monotonic clock, or at once when its holder is a
process of this host that is gone (kill -9). Timing from the waiter's side needs no clock shared
between machines (S3's LastModified is the server's clock, a time written in the file the holder's,
and either may be off from ours); the cost is that a waiter on another host takes over a dead
holder's lease ttl seconds after it first looks, however long ago the holder died.

A failed build releases its lease by marking its file released (the number stays taken, so no two
takers can create different "next" generations); a published artifact's lease folder is removed:
whoever takes a lease checks the store again before building, so a lease taken after that finds
the artifact instead of building it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from storage.base import HOST, ArtifactRef, now, process_alive
from storage.store import ArtifactStore

LEASE_S = float(os.environ.get("EMBFORGE_LEASE_S", "60"))
POLL_S = 1.0


class LeaseLostError(RuntimeError):
    """The lease this build held was taken over (the holder stalled past its ttl): it must stop writing."""


# The lease of the artifact this context is building: checkpoint writes confirm it is still theirs.
current_lease: ContextVar[Lease | None] = ContextVar("current_lease", default=None)


class Lease:
    """One key's lease in a store, as seen by one would-be holder."""

    def __init__(self, store: ArtifactStore, ref: ArtifactRef, ttl: float):
        self.store, self.fs, self.ref, self.ttl = store, store.fs, ref, ttl
        self.folder = store.location("leases", ref.stage, ref.key)
        self.holder = dict(host=HOST, pid=os.getpid(), id=uuid.uuid4().hex, ttl=ttl, beat=0)
        self.generation: int | None = None
        self._stopped = threading.Event()
        self._beats: threading.Thread | None = None

    def _path(self, generation: int) -> str:
        return f"{self.folder}/{generation}.json"

    def top(self) -> int | None:
        """The current generation; None when the key has no lease."""
        try:
            names = self.fs.ls(self.folder, detail=False, refresh=True)
        except FileNotFoundError:
            return None
        stems = [n.rsplit("/", 1)[-1].removesuffix(".json") for n in names]
        generations = [int(s) for s in stems if s.isdigit()]
        return max(generations, default=None)

    def read(self, generation: int) -> dict | None:
        """A generation's holder; None while it is being written (or gone)."""
        try:
            found = json.loads(self.fs.cat_file(self._path(generation)))
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def take(self, generation: int) -> bool:
        """Create `generation`: False when another taker created it first."""
        path = self._path(generation)
        self.fs.makedirs(self.folder, exist_ok=True)
        data = json.dumps(self.holder | dict(generation=generation, taken_at=now(), heartbeat_at=now())).encode()
        try:
            with self.fs.open(path, "xb") as fh:  # pipe_file(mode="create") checks, then writes: not exclusive locally
                fh.write(data)
        except FileExistsError:
            return False
        except FileNotFoundError:  # a release removed the folder between makedirs and open
            return False
        except OSError:  # S3 answers a lost conditional PUT with 412 (an OSError, not FileExistsError)
            if self.fs.exists(path):
                return False
            raise
        self.generation = generation
        self._beats = threading.Thread(target=self._beat, name=f"lease-{self.ref.address}", daemon=True)
        self._beats.start()
        return True

    def held(self) -> bool:
        """Whether this holder's generation is still the current one."""
        return self.generation is not None and self.top() == self.generation

    def _beat(self) -> None:
        log = logging.getLogger("embforge.leases")
        while not self._stopped.wait(self.ttl / 4):
            try:
                if not self.held():
                    log.warning("lease on %s was taken over: this process stalled past its %g s", self.ref.address,
                                self.ttl)
                    return
                self.holder["beat"] += 1
                self.fs.pipe_file(self._path(self.generation), json.dumps(
                    self.holder | dict(generation=self.generation, heartbeat_at=now())).encode())
            except OSError as e:  # a store unreachable for a moment must not end the beats: the lease would expire
                log.warning("lease on %s: heartbeat not written: %s", self.ref.address, e)

    def release(self, published: bool) -> None:
        """Stop beating; remove the key's leases once the artifact is published, else mark ours released."""
        self._stopped.set()
        if self._beats:
            self._beats.join()
        try:
            if not self.held():
                return
            if not published:
                self.fs.pipe_file(self._path(self.generation), json.dumps(
                    self.holder | dict(generation=self.generation, released=True, heartbeat_at=now())).encode())
                return
            with contextlib.suppress(OSError):  # a newcomer's lease appeared meanwhile: it finds the artifact
                self.fs.rm(self.folder, recursive=True)
            for parent in (self.store.location("leases", self.ref.stage), self.store.location("leases")):
                with contextlib.suppress(OSError):  # not empty: other keys' leases (S3 has no folders)
                    self.fs.rmdir(parent)
        except OSError as e:  # must not hide the build's own outcome: a lease left behind expires after its ttl
            logging.getLogger("embforge.leases").warning("lease on %s not released (it expires in %g s): %s",
                                                         self.ref.address, self.ttl, e)


@contextlib.contextmanager
def hold(store: ArtifactStore, ref: ArtifactRef, ready: Callable[[], bool],
         log: logging.Logger | logging.LoggerAdapter, ttl: float | None = None) -> Iterator[bool]:
    """Take `ref`'s lease, waiting while another process holds it: yields True when this process holds
    it (and must build), False when `ready()` (the artifact was published) came true while waiting."""
    lease = Lease(store, ref, ttl or LEASE_S)
    if not _acquire(lease, ready, log):
        yield False
        return
    token = current_lease.set(lease)
    try:
        yield True
    finally:
        current_lease.reset(token)
        lease.release(published=ready())


def _acquire(lease: Lease, ready: Callable[[], bool], log: logging.Logger | logging.LoggerAdapter) -> bool:
    """Poll until the lease is ours (True) or the artifact is ready (False)."""
    seen, since, told = None, time.monotonic(), set()
    while not ready():
        top = lease.top()
        if top is None:
            if lease.take(0):
                return True
            continue
        holder = lease.read(top) or {}  # {} while being written, or left empty by a holder killed right then
        if (top, holder) != seen:  # a beat, or a new holder: its ttl counts from now
            seen, since = (top, holder), time.monotonic()
        if _expired(holder, time.monotonic() - since, lease.ttl):
            if lease.take(top + 1):
                return True
            continue
        who = f"{holder.get('host')}/{holder.get('pid')}"
        if holder and who not in told:
            told.add(who)
            log.info("waiting for %s building %s", who, lease.ref.address)
        time.sleep(min(POLL_S, lease.ttl / 4))
    return False


def _expired(holder: dict, unchanged_s: float, ttl: float) -> bool:
    """Whether a lease is free to take: released, its holder a gone process of this host, or silent past its ttl."""
    pid = holder.get("pid")
    return bool(holder.get("released") or (holder.get("host") == HOST and isinstance(pid, int)
                                           and not process_alive(pid))
                or unchanged_s > holder.get("ttl", ttl))


def confirm() -> None:
    """Raise LeaseLostError when the lease this build holds is no longer its own (call before writing
    state another process could be writing too: training checkpoints)."""
    lease = current_lease.get()
    if lease and not lease.held():
        raise LeaseLostError(f"the lease on {lease.ref.address} was taken over by another process; stopping "
                             "before writing to its scratch folder")
