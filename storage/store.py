"""The artifact store: where every stage output lives, and how it gets there safely.

Layout under the store root:

    artifacts/<stage>/<key>/manifest.json   finished artifact (manifest written last)
    artifacts/<stage>/<key>/*.parquet|model  its data
    scratch/<stage>/<key>/                  resumable work in progress (training checkpoints)
    pools/<name>/<key>/shard-*.parquet      rows kept across runs and configs (LLM summaries)
    runs/<run_id>.json                      one record per flow run (stages, registered models)
    runs/<run_id>.changes.parquet           what an evaluate run scored anew, and by how much
                                            scores moved (the nightly summary)
    prefect-cache/                          Prefect's cache records, so deleting the store
                                            also forgets Prefect's cache
    .tmp/                                   artifacts being written; never read

An artifact is written into `.tmp/` and renamed into place in one step, so a directory under
`artifacts/` is always complete: a crash leaves at most a stale temp folder, never a
half-written artifact that a later run could mistake for a finished one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.shards import ShardPool, write_parquet_atomic

MANIFEST = "manifest.json"


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
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    names = [str(f.relative_to(path)) if path.is_dir() else f.name for f in files]  # a link's own name
    stats = tuple((name, f.stat().st_size, f.stat().st_mtime_ns) for name, f in zip(names, files))
    return _digest(str(path.resolve()), stats)


@functools.lru_cache(maxsize=1024)
def _digest(root: str, stats: tuple[tuple[str, int, int], ...]) -> str:
    base = Path(root)
    h = hashlib.sha256()
    for name, _, _ in stats:
        h.update(name.encode())
        with open(base / name if base.is_dir() else base, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:20]


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


DEFAULT_STORE = "embforge-store"


def open_store(flag: str | None, configured: str | None = None) -> ArtifactStore:
    """The store a command or flow uses: the flag (`--store`, a flow's `store`), else EMBFORGE_STORE,
    else the config's `store`, else ./embforge-store."""
    return ArtifactStore(flag or os.environ.get("EMBFORGE_STORE") or configured or DEFAULT_STORE)


class ArtifactStore:
    """Owns every byte embforge writes. Nothing else builds a path into the store."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    # -- finished artifacts -------------------------------------------------
    def path(self, ref: ArtifactRef) -> Path:
        return self.root / "artifacts" / ref.stage / ref.key

    def link(self, source: ArtifactRef, target: ArtifactRef, name: str) -> str:
        """Relative link from `source`'s folder to the file `name` of `target` (report pictures)."""
        return Path(os.path.relpath(self.path(target) / name, self.path(source))).as_posix()

    def exists(self, ref: ArtifactRef) -> bool:
        return (self.path(ref) / MANIFEST).is_file()

    def manifest(self, ref: ArtifactRef) -> dict:
        return json.loads((self.path(ref) / MANIFEST).read_text())

    def read_table(self, ref: ArtifactRef, name: str) -> pa.Table:
        if not self.exists(ref):
            raise FileNotFoundError(f"artifact {ref.address} is not in the store {self.root}")
        return pq.read_table(self.path(ref) / f"{name}.parquet")

    @contextlib.contextmanager
    def writing(self, ref: ArtifactRef, *, config: Any, inputs: list[ArtifactRef], code_version: str,
                libraries: dict[str, str | None], roles: dict[str, Any] | None = None) -> Iterator[ArtifactWriter]:
        """Write an artifact into a temp folder; publish it atomically when the block succeeds."""
        tmp = self.root / ".tmp" / f"{ref.stage}-{ref.key}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        writer = ArtifactWriter(tmp)
        started = time.perf_counter()
        try:
            yield writer
            manifest = {
                "stage": ref.stage,
                "key": ref.key,
                "inputs": [i.key for i in inputs],
                "input_roles": roles or {},
                "config": config,
                "code_version": code_version,
                "libraries": libraries,
                "rows": writer.rows,
                "files": sorted(p.name for p in tmp.iterdir()),
                "extra": writer.extra,
                "created_at": now(),
                "wall_s": round(time.perf_counter() - started, 3),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
            final = self.path(ref)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:
                if not self.exists(ref):  # someone else finished the same key first: keep theirs
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def discard(self, ref: ArtifactRef) -> None:
        """Remove a finished artifact: moved aside in one rename, so it never looks half there."""
        aside = self.root / ".tmp" / f"{ref.stage}-{ref.key}-discarded-{uuid.uuid4().hex[:8]}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.path(ref), aside)
        shutil.rmtree(aside, ignore_errors=True)

    # -- work in progress ---------------------------------------------------
    def scratch(self, ref: ArtifactRef) -> Path:
        """A folder that survives crashes (checkpoints) and is removed once the artifact exists."""
        path = self.root / "scratch" / ref.stage / ref.key
        path.mkdir(parents=True, exist_ok=True)
        return path

    def drop_scratch(self, ref: ArtifactRef) -> None:
        shutil.rmtree(self.root / "scratch" / ref.stage / ref.key, ignore_errors=True)

    def pool(self, name: str, key: str) -> ShardPool:
        """Rows that outlive any one artifact, e.g. summaries per (LLM, sampling settings)."""
        return ShardPool(self.root / "pools" / name / key)

    # -- runs ---------------------------------------------------------------
    @property
    def prefect_cache(self) -> Path:
        return self.root / "prefect-cache"

    def forget_prefect_record(self, key: str) -> None:
        """Drop Prefect's cache record for `key` (Prefect names the record file after the key)."""
        (self.prefect_cache / key).unlink(missing_ok=True)

    def _runs(self) -> Path:
        runs = self.root / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        return runs

    def write_run(self, run_id: str, record: dict) -> None:
        _write_json_atomic(self._runs() / f"{run_id}.json", record)

    def write_run_table(self, run_id: str, name: str, table: pa.Table) -> None:
        write_parquet_atomic(table, self._runs() / f"{run_id}.{name}.parquet")


class ArtifactWriter:
    """Handed to a stage while its artifact is being written."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.rows: dict[str, int] = {}
        self.extra: dict[str, Any] = {}

    def write_table(self, name: str, table: pa.Table) -> None:
        pq.write_table(table, self.folder / f"{name}.parquet")
        self.rows[name] = table.num_rows

    def write_text(self, name: str, text: str) -> None:
        (self.folder / name).write_text(text)
