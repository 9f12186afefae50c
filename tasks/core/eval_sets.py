"""User tables read beside the corpus: the evaluation sets (STS pairs, MTEB local tasks) as
Parquet files with required columns, each problem an `InputError` naming the file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tasks.config.base import InputError


def read_table(path: str | Path, columns: list[str]) -> pd.DataFrame:
    """A Parquet file that must have `columns` (evaluation sets: STS pairs, MTEB local tasks)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    table = pd.read_parquet(path)
    for column in columns:
        if column not in table.columns:
            raise InputError(f"{path}: missing column {column!r} (columns: {', '.join(table.columns)})")
    return table.reset_index(drop=True)


def rows_of_split(table: pd.DataFrame, split: str | None, path: str) -> pd.DataFrame:
    rows = table if split is None else table[table["split"] == split]
    if rows.empty:
        raise InputError(f"{path}: no rows" + (f" with split {split!r}" if split else ""))
    return rows


def read_pairs(path: str, split: str | None = None, limit: int | None = None) -> pd.DataFrame:
    """A pairs table (sentence1, sentence2, score): the rows of `split` (None: all), the first `limit`."""
    pairs = read_table(path, ["sentence1", "sentence2", "score"] + (["split"] if split else []))
    return rows_of_split(pairs, split, path).iloc[:limit].reset_index(drop=True)
