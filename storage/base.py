"""What every store shares, local or at a URL: artifact references, manifests' names, content
digests and the comparison of stored files with a manifest. storage/store.py (a folder) and
storage/objects.py (an object store) both build on this module, not on each other's internals."""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
WORK = ".work"  # a stage's temporary files inside the artifact being written; removed before publishing
HOST = socket.gethostname()


class DamagedArtifactError(RuntimeError):
    """An artifact's files do not match its manifest: it is never served (not retried either)."""


class StoreUnusable(RuntimeError):
    """A store that cannot be used as it is (read-only, full, unreachable, no credentials): said in
    one line naming the store and what to do, never retried."""


# A disk under a store that is full, read-only or not ours: retrying cannot help.
DISK_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
SPACE = (errno.ENOSPC, errno.EDQUOT)
# How libraries that are not Python say an errno: Rust's io errors (safetensors) "(os error 28)", Arrow's
# "[errno 28]"; DuckDB and C++ streams say only the text of a full disk.
ERRNO_SAID = re.compile(r"\(os error (\d+)\)|\[errno (\d+)\]", re.IGNORECASE)
SPACE_SAID = {os.strerror(code): code for code in SPACE}


def said_errno(error: BaseException) -> int | None:
    """The errno an error carries or says in its message (None: none of a disk's)."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    if found := ERRNO_SAID.search(str(error)):
        return int(found[1] or found[2])
    return next((code for text, code in SPACE_SAID.items() if text in str(error)), None)


def disk_fault(error: BaseException) -> str | None:
    """One line for an error of the disk (what and where, what to do), raised as it is or as the cause of
    another (torch.save's RuntimeError over the OSError of its file); None for any other error."""
    while error is not None and (code := said_errno(error)) not in DISK_FAULTS:
        error = error.__cause__ or error.__context__
    if error is None:
        return None
    where = f": {error.filename}" if isinstance(error, OSError) and error.filename else ""
    advice = ("free space on that disk or choose another store (--store)" if code in SPACE
              else "choose a store this user can write (--store, EMBFORGE_STORE, the config's store)")
    return f"{os.strerror(code)}{where}; {advice}"


@dataclass(frozen=True)
class ArtifactRef:
    """A small, hashable pointer to a finished artifact: what flows pass between tasks."""

    stage: str
    key: str

    @property
    def address(self) -> str:
        """`stage/key`: how run records and the catalog name an artifact."""
        return f"{self.stage}/{self.key}"

    @classmethod
    def parse(cls, address: str) -> ArtifactRef:
        stage, _, key = address.partition("/")
        return cls(stage, key)


def stable_hash(*parts: Any) -> str:
    """Hash JSON-serialisable parts in a way that does not depend on dict order."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def file_digest(path: str | Path) -> str:
    """Content hash of a file, or of every file below a folder (names included). Memoised by the
    files' (name, size, mtime), so a run hashes a large model folder once, not once per stage key."""
    path = Path(path)
    files = files_below(path) if path.is_dir() else [path]
    names = [str(f.relative_to(path)) if path.is_dir() else f.name for f in files]  # a link's own name
    stats = tuple((name, f.stat().st_size, f.stat().st_mtime_ns) for name, f in zip(names, files))
    return _digest(str(path.resolve()), stats)


@functools.lru_cache(maxsize=1024)
def _digest(root: str, stats: tuple[tuple[str, int, int], ...]) -> str:
    base = Path(root)
    h = hashlib.sha256()
    for name, _, _ in stats:
        h.update(name.encode())
        hash_file(h, base / name if base.is_dir() else base)
    return h.hexdigest()[:20]


def hash_file(h, path: Path):
    with open(path, "rb") as fh:
        return hash_stream(h, fh)


def hash_stream(h, fh):
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h


def differences(expected: dict | list, sizes: dict[str, int], digest: Callable[[str], str] | None) -> list[str]:
    """How stored files (name → size; `digest` gives a file's SHA-256) differ from a manifest's
    `files`. Manifests from before sizes were recorded list names only."""
    found = []
    for name, want in (expected.items() if isinstance(expected, dict) else ((n, None) for n in expected)):
        if name not in sizes:
            found.append(f"{name} is missing")
        elif want and sizes[name] != want["size"]:
            found.append(f"{name} is {sizes[name]:,} bytes, expected {want['size']:,}")
        elif want and digest and digest(name) != want["sha256"]:
            found.append(f"{name} has other contents than it was published with (SHA-256 differs)")
    return found


def files_below(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


DEFAULT_STORE = "embforge-store"


def is_url(store: str | Path) -> bool:
    """Whether a store is at a URL (s3://bucket/prefix), not a folder."""
    return "://" in str(store)
