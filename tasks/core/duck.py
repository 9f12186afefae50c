"""DuckDB for the data stages' out-of-core steps (duplicate ids, crop lookups, token length statistics): a
connection that spills to a folder of the artifact being written instead of growing past its memory limit."""

from __future__ import annotations

from pathlib import Path

import duckdb

MEMORY_LIMIT = "1GB"  # DuckDB's share of the 2 GB a data stage may use at 10^6 documents and beyond


def connect(spill: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute("SET temp_directory = ?", [str(spill)])
    return con


def length_stats(path: Path, columns: list[str], max_length: int, spill: Path, unknown_id: int | None = None) -> dict:
    """Per token ids column (list<int32>) of a Parquet file: the mean, median, 95th percentile and longest ids,
    the share of texts at max_length (cut there, or exactly that long) and of ids that are `unknown_id`."""
    names = ("mean", "median", "p95", "max", "at_max_length", "unknown")
    unknown = -1 if unknown_id is None else int(unknown_id)  # -1: no id is
    parts = [f"avg(len({c})), median(len({c})), quantile_cont(len({c}), 0.95), max(len({c})), "
             f"avg((len({c}) >= {max_length})::int), "
             f"sum(len(list_filter({c}, lambda i: i = {unknown}))) / sum(len({c}))" for c in columns]
    with connect(spill) as con:
        row = con.execute(f"SELECT {', '.join(parts)} FROM read_parquet($path)", {"path": str(path)}).fetchone()
    return {c: {n: None if v is None else round(float(v), 4) for n, v in zip(names, row[6 * i : 6 * i + 6])}
            for i, c in enumerate(columns)}  # None: no rows
