"""DuckDB for the data stages' out-of-core steps (duplicate ids, crop lookups): a connection that
spills to a folder of the artifact being written instead of growing past its memory limit."""

from __future__ import annotations

from pathlib import Path

import duckdb

MEMORY_LIMIT = "1GB"  # DuckDB's share of the 2 GB a data stage may use at 10^6 documents and beyond


def connect(spill: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute("SET temp_directory = ?", [str(spill)])
    return con
