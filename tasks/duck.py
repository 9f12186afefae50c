"""DuckDB for the data stages' out-of-core steps (duplicate ids, crop lookups): a connection that
spills to the artifact's scratch folder instead of growing past its memory limit."""

from __future__ import annotations

from pathlib import Path

import duckdb

MEMORY_LIMIT = "1GB"  # DuckDB's share of the 2 GB a data stage may use at 10^6 documents and beyond


def connect(spill: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute("SET temp_directory = ?", [str(spill)])
    con.execute("SET preserve_insertion_order = false")  # every query that needs an order says it
    return con
