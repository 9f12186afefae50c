"""The artifact store: where every stage output lives, and how it gets there safely.

Layout under the store root:

    artifacts/<stage>/<key>/manifest.json   finished artifact (manifest written last)
    artifacts/<stage>/<key>/*.parquet|model  its data
    scratch/<stage>/<key>/                  resumable work in progress (training checkpoints)
    pools/<name>/<key>/shard-*.parquet      rows kept across runs and configs (LLM summaries)
    runs/<run_id>.json                      one record per flow run (stages, registered models)
    runs/<run_id>.changes.parquet           what an evaluate run scored anew, and by how much
                                            scores moved (the nightly summary)
    logs/run-<time>-<pid>.log               the full log of an `embforge run`, tracebacks included
    damaged/<stage>/<key>-<time>/           artifacts that failed a check, set aside for a look
                                            (the next run rebuilds them; safe to delete)
    .tmp/<stage>-<key>.<host>.<pid>.<id>/   artifacts being written; never read

A store at a URL (`s3://bucket/prefix`) has the same layout, with a local working copy; it
publishes by creating the manifest last with an exclusive PUT instead of a rename (storage/objects.py).

The store is self-contained: whether a stage is cached is decided from the store alone (Prefect
keeps no result files anywhere), so a store copied to another machine or opened with another
PREFECT_HOME gives the same all-cached rerun.

An artifact is written into `.tmp/`, its files and manifest are fsynced, and the folder is renamed
into place in one step (then the parent is fsynced), so a directory under `artifacts/` is always
complete: a crash or power cut leaves at most a temp folder, which the next run removes once its
process is gone. The manifest records every file's size and SHA-256: every read checks sizes,
`embforge verify` checks digests, and an artifact that fails is set aside and rebuilt, never served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from storage.base import (
    HOST,
    MANIFEST,
    WORK,
    ArtifactRef,
    DamagedArtifactError,
    StoreUnusable,
    differences,
    disk_fault,
    files_below,
    hash_file,
    is_url,
    now,
    process_alive,
    stable_hash,
)
from storage.shards import ShardPool, parquet_bytes


def _fsync(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in files_below(path)) if path.is_dir() else path.stat().st_size


class ArtifactStore:
    """Owns every byte embforge writes. Nothing else builds a path into the store. This is a store
    in a folder; `storage.stores.store_at` opens a URL (`s3://bucket/prefix`) as an object store
    with a local working copy (storage/objects.py)."""

    remote = False

    def __init__(self, root: str | Path):
        if is_url(root):
            raise ValueError(f"{root} is a URL: open it with storage.stores.store_at")
        self.root = Path(root).resolve()
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(f"store {root} is a file, not a folder")
        self.url = str(self.root)  # the store's address, what tasks are handed to open it again
        self.fs: fsspec.AbstractFileSystem = fsspec.filesystem("file")

    def location(self, *parts: str) -> str:
        """The fsspec path of a file in the store (`location("leases", "x.json")`)."""
        return "/".join([self.url.rstrip("/"), *parts])

    def glob(self, *parts: str) -> list[str]:
        """Locations in the store matching a pattern (`glob("runs", "*.json")`), sorted; through linked
        folders too, which `problems` then reports."""
        return sorted(str(p) for p in self.root.glob("/".join(parts)))

    def cat(self, locations: list[str]) -> dict[str, bytes | Exception]:
        """Several files' bytes at once (an object store fetches them concurrently), or why not."""
        found = self.fs.cat(locations, on_error="return") if locations else {}
        return {loc: found.get(self.fs._strip_protocol(loc), FileNotFoundError(loc)) for loc in locations}

    def _put(self, location: str, data: bytes) -> None:
        """Replace a file whole: written beside it and renamed, so readers see the old or the new one."""
        path = Path(location)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def upload(self, path: Path) -> None:
        """Copy a file of the working copy (a log) to the store: an object store's job; a local store is its own."""

    def check_reachable(self) -> None:
        """Before a command reads the store: a folder is there or not (each command says which)."""

    def check_writable(self) -> None:
        """Before a run: a store that cannot be written fails here, in one line, not in a stage."""
        probe = self.root / f".probe.{HOST}.{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"embforge")
            probe.unlink()
        except OSError as e:
            raise StoreUnusable(f"store {self.root}: {disk_fault(e) or e}") from None

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

    def readable_manifest(self, ref: ArtifactRef) -> dict | None:
        """The manifest, or None when there is none or it cannot be read (`problems` says why)."""
        try:
            manifest = self.manifest(ref)
        except (OSError, ValueError):
            return None
        return manifest if isinstance(manifest, dict) else None

    def files_digest(self, ref: ArtifactRef) -> str:
        """Which bytes an artifact holds (its files' names, sizes and SHA-256, from its manifest)."""
        return stable_hash(self.published_files(ref))

    def changed_inputs(self, ref: ArtifactRef) -> list[str]:
        """The inputs whose files are not the ones the artifact was built from (rebuilt since with other
        bytes): the artifact is stale."""
        built_from = (self.readable_manifest(ref) or {}).get("input_files") or {}
        now = {address: self.published_files(ArtifactRef.parse(address)) for address in built_from}
        return [address for address, digest in built_from.items()
                if now[address] is not None and stable_hash(now[address]) != digest]  # None: not there (yet)

    def published_files(self, ref: ArtifactRef) -> dict | None:
        """name → size and SHA-256 the stored artifact was published with; None without a readable manifest."""
        files = (self.readable_manifest(ref) or {}).get("files")
        return files if isinstance(files, dict) else None

    def problems(self, ref: ArtifactRef, digests: bool = False) -> list[str]:
        """How the artifact's files differ from its manifest (sizes; SHA-256 too with `digests`):
        empty when it can be trusted. Manifests from before sizes were recorded list names only."""
        try:
            expected = self.manifest(ref)["files"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return [f"{MANIFEST} cannot be read ({e})"]
        folder = self.path(ref)
        sizes = {name: (folder / name).stat().st_size for name in expected if (folder / name).exists()}
        return self.links_outside(ref) + differences(
            expected, sizes, (lambda name: hash_file(hashlib.sha256(), folder / name).hexdigest()) if digests else None)

    def links_outside(self, ref: ArtifactRef) -> list[str]:
        """Symbolic links in the artifact (its folder too) to a place outside the store: what they point at
        is not what was published, and may be anything on the machine."""
        folder = self.path(ref)
        return [f"{path.relative_to(folder).as_posix() if path != folder else 'its folder'} is a link to "
                f"{os.readlink(path)}, outside the store" for path in [folder, *sorted(folder.rglob("*"))]
                if path.is_symlink() and not Path(os.path.realpath(path)).is_relative_to(self.root)]

    def check(self, ref: ArtifactRef) -> None:
        """Raise unless the artifact is there with the sizes its manifest records: what every read does."""
        if not self.exists(ref):
            raise FileNotFoundError(f"artifact {ref.address} is not in the store {self.root}")
        if found := self.problems(ref):
            raise DamagedArtifactError(f"{ref.address}: {'; '.join(found)}; rerun the flow that made it to "
                                       "rebuild it")

    def read_table(self, ref: ArtifactRef, name: str, columns: list[str] | None = None,
                   filters: list[tuple] | None = None) -> pa.Table:
        """The table, or some of its columns and the rows matching `filters` (pyarrow's: row groups
        whose statistics rule them out are not read)."""
        return pq.read_table(self.table_path(ref, name), columns=columns, filters=filters)

    def table_path(self, ref: ArtifactRef, name: str) -> Path:
        """A checked artifact's table file, for reading by row group or by DuckDB (tables larger than memory)."""
        self.check(ref)
        return self.path(ref) / f"{name}.parquet"

    def open_table(self, ref: ArtifactRef, name: str) -> pq.ParquetFile:
        """The table's file, to read a row group at a time (close it after)."""
        return pq.ParquetFile(self.table_path(ref, name))

    def _temp(self, ref: ArtifactRef, what: str = "") -> Path:
        """A new folder under .tmp/ named after its owner (host, process), so leftovers can be told apart."""
        path = self.root / ".tmp" / f"{ref.stage}-{ref.key}{what}.{HOST}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        for attempt in range(3):
            try:
                path.mkdir(parents=True)
                break
            except FileNotFoundError:  # another run removed the empty .tmp/ between our two mkdirs
                if attempt == 2:
                    raise
        return path

    def _tidy_temp(self) -> None:
        with contextlib.suppress(OSError):  # not empty: another process is writing
            (self.root / ".tmp").rmdir()

    @contextlib.contextmanager
    def writing(self, ref: ArtifactRef, *, config: Any, inputs: list[ArtifactRef], code_version: str,
                libraries: dict[str, str | None], roles: dict[str, Any] | None = None) -> Iterator[ArtifactWriter]:
        """Write an artifact into a temp folder; publish it atomically and durably when the block succeeds."""
        built_from = {i.address: self.files_digest(i) for i in inputs}  # before the build reads them
        tmp = self._temp(ref)
        writer = ArtifactWriter(tmp)
        started = time.perf_counter()
        try:
            yield writer
            shutil.rmtree(writer.folder / WORK, ignore_errors=True)
            files = files_below(tmp)
            manifest = {
                "stage": ref.stage,
                "key": ref.key,
                "inputs": [i.key for i in inputs],
                "input_files": built_from,
                "input_roles": roles or {},
                "config": config,
                "code_version": code_version,
                "libraries": libraries,
                "rows": writer.rows,
                "files": {p.relative_to(tmp).as_posix(): {"size": p.stat().st_size,
                                                           "sha256": hash_file(hashlib.sha256(), p).hexdigest()}
                          for p in files},
                "extra": writer.extra,
                "created_at": now(),
                "wall_s": round(time.perf_counter() - started, 3),
            }
            self._publish(ref, tmp, manifest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            self._tidy_temp()

    def _publish(self, ref: ArtifactRef, tmp: Path, manifest: dict) -> None:
        """Make the written folder the artifact: durably on disk first, then renamed into place."""
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
        for path in [*files_below(tmp), *(p for p in tmp.rglob("*") if p.is_dir()), tmp]:  # every folder's entries too
            _fsync(path)
        final = self.path(ref)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists() and not self.exists(ref):  # a folder without manifest was never finished
            aside = self.set_aside(ref, "it has no manifest")
            logging.getLogger("embforge.store").warning("%s had files but no manifest: set aside to %s",
                                                        ref.address, aside)
        try:
            os.rename(tmp, final)
        except OSError:
            if not self.exists(ref):  # someone else finished the same key first: keep theirs
                raise
        _fsync(final.parent)

    def discard(self, ref: ArtifactRef) -> None:
        """Remove a finished artifact: moved aside in one rename, so it never looks half there."""
        aside = self._temp(ref, "-discarded")
        with contextlib.suppress(FileNotFoundError):  # another run discarded it first
            os.replace(self.path(ref), aside)
        shutil.rmtree(aside, ignore_errors=True)
        self._tidy_temp()

    def set_aside(self, ref: ArtifactRef, why: str) -> Path | str | None:
        """Move an artifact that cannot be trusted to damaged/ (kept for a look), with a note saying why."""
        aside = self.root / "damaged" / ref.stage / f"{ref.key}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(self.path(ref), aside)
        except FileNotFoundError:  # another run set it aside first
            return None
        (aside / "DAMAGED.txt").write_text(f"{why}\n")
        return aside

    def clear_leftovers(self) -> tuple[int, int]:
        """Remove temp folders whose writer is gone (a killed run's): returns (folders, bytes) freed.
        A folder of another machine's process is left alone: we cannot tell whether it still runs."""
        freed = [0, 0]
        for path in (self.root / ".tmp").glob("*"):
            owner, pid, _ = path.name.rsplit(".", 2) if path.name.count(".") >= 2 else ("", "", "")
            # <stage>-<key>[-discarded].<host>.<pid>.<id>; the host name may hold dots itself
            if not (owner.endswith(f".{HOST}") and pid.isdigit()) or process_alive(int(pid)):
                continue
            claimed = path.with_name(f"{path.name}.freeing-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(path, claimed)  # another run clearing the same leftover at once gets here first
            except FileNotFoundError:
                continue
            size = _size(claimed)
            shutil.rmtree(claimed, ignore_errors=True) if claimed.is_dir() else claimed.unlink(missing_ok=True)
            freed[0] += 1
            freed[1] += size
        self._tidy_temp()
        return freed[0], freed[1]

    def artifacts(self, stage: str | None = None) -> list[ArtifactRef]:
        """Every finished artifact (of one stage)."""
        return [ArtifactRef(*location.split("/")[-3:-1]) for location in self.glob("artifacts", stage or "*", "*",
                                                                                   MANIFEST)]

    def artifact_files(self, name: str, manifests: dict[str, dict]) -> list[str]:
        """Where every finished artifact keeps its file `name` (the catalog's metrics, summaries);
        `manifests` (location → manifest) are the ones the caller read: an object store's need them."""
        return self.glob("artifacts", "*", "*", name)

    # -- work in progress ---------------------------------------------------
    def scratch(self, ref: ArtifactRef) -> Path:
        """A folder that survives crashes (checkpoints) and is removed once the artifact exists."""
        path = self.root / "scratch" / ref.stage / ref.key
        path.mkdir(parents=True, exist_ok=True)
        return path

    def save_scratch(self, ref: ArtifactRef) -> None:
        """Copy the scratch folder to the store after a checkpoint: a local store's scratch is in it already."""

    def drop_scratch(self, ref: ArtifactRef) -> None:
        folder = self.root / "scratch" / ref.stage / ref.key
        shutil.rmtree(folder, ignore_errors=True)
        for parent in (folder.parent, folder.parent.parent):
            with contextlib.suppress(OSError):  # not empty: other work in progress
                parent.rmdir()

    def pool(self, name: str, key: str) -> ShardPool:
        """Rows that outlive any one artifact, e.g. summaries per (LLM, sampling settings)."""
        return ShardPool(self.fs, self.root / "pools" / name / key, self._put)

    # -- runs ---------------------------------------------------------------
    def write_run(self, run_id: str, record: dict) -> None:
        self._put(self.location("runs", f"{run_id}.json"), json.dumps(record, indent=2, default=str).encode())

    def log_file(self, command: str) -> Path:
        """Where a command run writes its full log (tracebacks included): logs/<command>-<time>-<pid>.log."""
        return self.root / "logs" / f"{command}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{os.getpid()}.log"

    def write_run_table(self, run_id: str, name: str, table: pa.Table) -> None:
        self._put(self.location("runs", f"{run_id}.{name}.parquet"), parquet_bytes(table))


class ArtifactWriter:
    """Handed to a stage while its artifact is being written."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.rows: dict[str, int] = {}
        self.extra: dict[str, Any] = {}

    @property
    def work(self) -> Path:
        """A folder for temporary files (side tables, DuckDB's spill), removed before the artifact
        is published and with it if the build fails."""
        path = self.folder / WORK
        path.mkdir(exist_ok=True)
        return path

    def write_table(self, name: str, table: pa.Table) -> None:
        self.write_batches(name, table.schema, [table])

    def write_batches(self, name: str, schema: pa.Schema, batches: Iterable[pa.Table | pa.RecordBatch]) -> int:
        """Write `name`.parquet one row group per batch as the batches are produced, so a table
        larger than memory streams through; returns the rows written."""
        rows = 0
        with pq.ParquetWriter(self.folder / f"{name}.parquet", schema) as writer:
            for batch in batches:
                writer.write(batch)
                rows += batch.num_rows
        self.rows[name] = rows
        return rows

    def write_text(self, name: str, text: str) -> None:
        (self.folder / name).write_text(text)
