"""Ingest: read Parquet / CSV / JSONL files (or a `datasets` dataset) into one documents table.

Output `documents.parquet`: doc_id, title, text, label, split (all strings; title, label, split
may be null). Every problem with the input is an `InputError` naming the file, row and field.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pandas as pd
import pyarrow as pa

from storage.store import ArtifactRef, ArtifactStore, ArtifactWriter, file_digest
from tasks.config import DataConfig, InputError
from tasks.stage import NoInputs, Stage

SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
COLUMNS = ["doc_id", "title", "text", "label", "split"]


def input_files(cfg: DataConfig) -> list[Path]:
    path = Path(cfg.path)
    if not path.exists():
        raise InputError(f"data.path: {path} does not exist")
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise InputError(f"{path}: unsupported file type (use {', '.join(SUFFIXES)})")
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    if not files:
        raise InputError(f"data.path: no {', '.join(SUFFIXES)} files in folder {path}")
    return files


def _decode_utf8(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line}: not valid UTF-8 (byte {e.start})") from None


def read_file(path: Path) -> pd.DataFrame:
    kind = SUFFIXES[path.suffix.lower()]
    if kind == "parquet":
        try:
            return pd.read_parquet(path)
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise InputError(f"{path}: cannot read Parquet: {e}") from None
    text = _decode_utf8(path)
    if kind == "csv":
        try:
            return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
        except pd.errors.EmptyDataError:  # not even a header: no rows
            return pd.DataFrame()
        except pd.errors.ParserError as e:
            raise InputError(f"{path}: cannot parse CSV: {e}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise InputError(f"{path}: line {n}: not valid JSON: {e.msg}") from None
    return pd.DataFrame(rows)


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


def normalise(frame: pd.DataFrame, cfg: DataConfig, source: str) -> pd.DataFrame:
    """Map the configured columns onto embforge's schema and validate the values."""
    mapping = cfg.columns.model_dump()
    missing = [f"'{col}' (data.columns.{field})" for field, col in mapping.items()
               if col is not None and col not in frame.columns]
    if missing:
        raise InputError(f"{source}: column {', '.join(missing)} not found; "
                         f"the file has {', '.join(map(str, frame.columns))}")
    out = pd.DataFrame(index=frame.index)
    for field, name in zip(["id", "title", "text", "label", "split"], COLUMNS):
        col = mapping[field]
        if col is None:
            out[name] = None
            continue
        out[name] = frame[col].map(lambda v: None if pd.isna(v) else str(v))
    for name in ("doc_id", "text"):
        bad = out[name].isna() | (out[name].str.strip() == "")
        if bad.any():
            rows = [int(i) + 1 for i in out.index[bad][:5]]
            raise InputError(f"{source}: {int(bad.sum())} row(s) with empty {name} "
                             f"(column '{mapping['id' if name == 'doc_id' else 'text']}'), "
                             f"first at row(s) {rows}")
    return out


def load_documents(cfg: DataConfig) -> pd.DataFrame:
    """Read and validate all input documents into one frame with embforge's columns."""
    if cfg.hf_dataset:
        import datasets

        source = f"dataset {cfg.hf_dataset}[{cfg.hf_split}]"
        docs = normalise(datasets.load_dataset(cfg.hf_dataset, split=cfg.hf_split).to_pandas(), cfg, source)
        docs["_where"] = [f"{source} row {i}" for i in range(1, len(docs) + 1)]
    else:
        files = input_files(cfg)
        source = cfg.path if len(files) == 1 else f"{cfg.path} ({len(files)} files)"
        parts = []
        for f in files:
            frame = read_file(f)
            if len(frame) == 0:  # adds no document (and may have no columns to check)
                continue
            part = normalise(frame, cfg, str(f))
            parts.append(part.assign(_where=[f"{f} row {i}" for i in range(1, len(part) + 1)]))
        docs = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    # Refused here: an empty documents artifact would fail much later, as a puzzle about crops.
    if docs.empty:
        raise InputError(f"{source}: 0 rows, no documents to ingest")
    dup = docs["doc_id"].duplicated(keep=False)
    if dup.any():
        first = docs.loc[dup, "doc_id"].iloc[0]
        where = docs.loc[docs["doc_id"] == first, "_where"].tolist()[:3]
        raise InputError(f"duplicate doc_id '{first}' ({int(dup.sum())} rows share ids): {', '.join(where)}")
    docs = docs.drop(columns="_where").astype(object)
    docs = docs.where(docs.notna(), None)  # missing values are None, whatever the input format said
    return docs.head(cfg.limit) if cfg.limit else docs


def _data_digest(cfg: DataConfig) -> str | None:
    # Local files are keyed by content, so editing the corpus in place invalidates the cache;
    # a Hub dataset is keyed by its name.
    local = cfg.path or cfg.hf_dataset
    return file_digest(local) if Path(local).exists() else None


def build_documents(store: ArtifactStore, cfg: DataConfig, inputs: NoInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs = load_documents(cfg)
    schema = pa.schema([(c, pa.string()) for c in COLUMNS])
    out.write_table("documents", pa.Table.from_pandas(docs[COLUMNS], schema=schema, preserve_index=False))
    out.extra.update(dataset=cfg.display_name, labelled=int(docs["label"].notna().sum()))
    log.info("%d documents (%d labelled) from %s", len(docs), out.extra["labelled"], cfg.display_name)


INGEST = Stage("ingest", build_documents, extra_key=_data_digest)
