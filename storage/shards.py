"""Shard pools: rows that are expensive to make (LLM summaries), kept across runs and configs.

A pool is a folder of Parquet shards under `pools/<name>/<key>/`. Each shard is put whole (a temp
file renamed into place; on an object store one PUT), so a killed run loses at most the shard it was
writing, and a shard once there is never rewritten. A stage reads what the pool already holds, makes
only the missing rows, adds them as new shards, and then publishes its own artifact from the pool:
changing which rows a stage wants (more documents, another prompt) makes only the new ones.
"""

from __future__ import annotations

import contextlib
import io
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


class ShardPool:
    """Shards in `folder` of `fs` (a Path on a local store, a URL on an object store); `put(location, data)`
    writes one whole."""

    def __init__(self, fs: fsspec.AbstractFileSystem, folder: Path | str, put: Callable[[str, bytes], None]):
        self.fs, self.folder, self.put = fs, folder, put
        self._at = Path if isinstance(folder, Path) else fs.unstrip_protocol  # what `shards` hands back

    def shards(self) -> list[Path | str]:
        return [self._at(p) for p in sorted(self.fs.glob(f"{self.folder}/shard-*.parquet"))]

    def read(self) -> pa.Table | None:
        """Every readable shard, oldest first; None while the pool has none. A shard that cannot be
        read is renamed `*.damaged` with a warning: its rows are missing, so they are made again."""
        tables = []
        for shard in self.shards():
            try:
                with self.fs.open(shard, "rb") as fh:
                    tables.append(pq.read_table(fh))
            except (pa.ArrowException, OSError) as e:
                with contextlib.suppress(FileNotFoundError):  # another reader set it aside first
                    self.fs.mv(str(shard), str(shard).removesuffix(".parquet") + ".damaged")
                logging.getLogger("embforge.store").warning("%s cannot be read (%s): set aside, its rows are made "
                                                            "again", shard, e)
        return pa.concat_tables(tables, promote_options="default") if tables else None

    def write(self, table: pa.Table) -> Path | str:
        # The name sorts by time, so `read` returns rows in the order they were made.
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        final = f"{self.folder}/shard-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
        self.put(final, parquet_bytes(table))
        return self._at(final)
