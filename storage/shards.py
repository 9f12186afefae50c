"""Shard pools: rows that are expensive to make (LLM summaries), kept across runs and configs.

A pool is a folder of Parquet shards under `pools/<name>/<key>/`. Each shard is written to a temp
file and renamed into place, so a killed run loses at most the shard it was writing, and a shard
once there is never rewritten. A stage reads what the pool already holds, makes only the missing
rows, adds them as new shards, and then publishes its own artifact from the pool: changing which
rows a stage wants (more documents, another prompt) makes only the new ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """Write to a temp file beside `path`, then rename: readers see the whole file or none."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


class ShardPool:
    def __init__(self, folder: Path):
        self.folder = folder

    def shards(self) -> list[Path]:
        return sorted(self.folder.glob("shard-*.parquet"))

    def read(self) -> pa.Table | None:
        """Every readable shard, oldest first; None while the pool has none. A shard that cannot be
        read is renamed `*.damaged` with a warning: its rows are missing, so they are made again."""
        tables = []
        for shard in self.shards():
            try:
                tables.append(pq.read_table(shard))
            except (pa.ArrowException, OSError) as e:
                with contextlib.suppress(FileNotFoundError):  # another reader set it aside first
                    shard.rename(shard.with_suffix(".damaged"))
                logging.getLogger("embforge.store").warning("%s cannot be read (%s): set aside, its rows are made "
                                                            "again", shard, e)
        return pa.concat_tables(tables, promote_options="default") if tables else None

    def write(self, table: pa.Table) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        # The name sorts by time, so `read` returns rows in the order they were made.
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        final = self.folder / f"shard-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
        write_parquet_atomic(table, final)
        return final
