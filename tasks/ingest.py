"""Ingest: read Parquet / CSV / JSONL files, .txt/.md files (one document each) or a `datasets` dataset into one
documents table. The text column must be there; the id, title, label and split columns are used where the input has
them, and are an error where missing only if the config names them (ids then come from the rows); the log and the
manifest say what was found.

Output `documents.parquet`: doc_id, title, text, label, split (all strings; title, label, split may be null, a blank
title is null), in input order; with `data.strip_mail`, the texts without who wrote them (and with
`data.strip_quotes`, what they quote). The input is read, checked and written in record batches, so memory does not
grow with the corpus; duplicate ids are then found by DuckDB over an id-only side table. Every problem with the
input is an `InputError` naming the file, row and field; a row is the row of its file (CSV: data row after the
header; JSONL: non-blank line), whichever batch it is in.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.base import ArtifactRef, file_digest
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError
from tasks.config.data import DataConfig
from tasks.core import duck
from tasks.core.stage import NoInputs, Stage

SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
TEXT_SUFFIXES = (".txt", ".md")  # in a folder: one document a file
COLUMNS = ["doc_id", "title", "text", "label", "split"]
SCHEMA = pa.schema([(c, pa.string()) for c in COLUMNS])
BATCH_ROWS = 16_384  # rows read, checked and written at a time: ~30 MB of abstracts


def input_files(cfg: DataConfig) -> list[Path]:
    path = Path(cfg.path)
    if not path.exists():
        raise InputError(f"data.path: {path} does not exist")
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise InputError(f"{path}: unsupported file type (use {', '.join(SUFFIXES)}, or a folder of "
                             f"{'/'.join(TEXT_SUFFIXES)} files, one document each)")
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in (*SUFFIXES, *TEXT_SUFFIXES))
    if not files:
        raise InputError(f"data.path: no {', '.join([*SUFFIXES, *TEXT_SUFFIXES])} files in folder {path}")
    return files


def _text(value) -> str | None:
    return None if value is None or (isinstance(value, float) and value != value) else str(value)


def _string_batch(rows: dict[str, list]) -> pa.Table:
    """Python values (CSV cells, JSON values, `datasets` rows) as a table of strings."""
    return pa.table({name: pa.array([_text(v) for v in values], pa.string()) for name, values in rows.items()})


def _utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file, with an InputError at the first line that is not UTF-8."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                # a byte-order mark (what spreadsheet programs write) is not part of the first column's name
                yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}: line {number}: not valid UTF-8 (byte {e.start})") from None


def _batched(rows: Iterable[dict], columns: list[str] | None = None) -> Iterator[pa.Table]:
    """Rows as string tables of BATCH_ROWS; the columns are the given ones (a CSV header) or
    every key of the batch's rows (JSONL)."""
    batch: list[dict] = []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH_ROWS:
            yield _string_batch({c: [r.get(c) for r in batch] for c in columns or _keys(batch)})
            batch = []
    if batch:
        yield _string_batch({c: [r.get(c) for r in batch] for c in columns or _keys(batch)})


def _keys(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(key for row in rows for key in row))


def _csv_batches(path: Path) -> Iterator[pa.Table]:
    reader = csv.reader(line for _, line in _utf8_lines(path))
    try:
        header = next(reader, [])
        rows = ({name: cell or None for name, cell in zip(header, cells)}  # an empty cell is missing
                for cells in reader if cells and _fits(cells, header, path, reader.line_num))  # blank lines skipped
        yield from _batched(rows, header)
    except csv.Error as e:
        raise InputError(f"{path}: line {reader.line_num}: cannot parse CSV: {e}") from None


def _fits(cells: list[str], header: list[str], path: Path, line: int) -> bool:
    if len(cells) > len(header):  # fewer is fine: the missing cells are missing values
        raise InputError(f"{path}: line {line}: {len(cells)} fields, the header has {len(header)}")
    return True


def _jsonl_rows(path: Path) -> Iterator[dict]:
    for number, line in _utf8_lines(path):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}: line {number}: not valid JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}: line {number}: not a JSON object")
            yield row


def _parquet_batches(path: Path) -> Iterator[pa.Table]:
    try:
        batches = pq.ParquetFile(path).iter_batches(BATCH_ROWS)
        for batch in batches:
            yield pa.table({name: _as_strings(batch.column(name), path, name) for name in batch.schema.names})
    except InputError:
        raise
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise InputError(f"{path}: cannot read Parquet: {e}") from None


def _as_strings(column: pa.Array, path: Path, name: str) -> pa.Array:
    try:
        return pc.cast(column, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise InputError(f"{path}: column {name!r} holds {column.type}, not text") from None


def _text_file_rows(folder: Path, files: list[Path], cfg: DataConfig) -> Iterator[dict]:
    """One row per .txt/.md file with text, under the configured column names: its path in the folder as its id,
    its text, and a Markdown file's first line as its title where that is a `# heading`."""
    columns = cfg.columns
    for path in files:
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not valid UTF-8 (byte {e.start})") from None
        first, _, rest = text.lstrip().partition("\n")
        title = first[2:].strip() if path.suffix.lower() == ".md" and first.startswith("# ") else None
        body = rest if title else text
        if body.strip():  # an empty file adds no document, as an empty table file does
            yield {columns.id: path.relative_to(folder).as_posix(), columns.text: body,
                   **({columns.title: title} if columns.title else {})}


def file_batches(path: Path) -> Iterator[pa.Table]:
    """One input file as tables of string columns, BATCH_ROWS rows at a time."""
    kind = SUFFIXES[path.suffix.lower()]
    if kind == "parquet":
        return _parquet_batches(path)
    return _csv_batches(path) if kind == "csv" else _batched(_jsonl_rows(path))


def _dataset_batches(cfg: DataConfig) -> Iterator[pa.Table]:
    import datasets

    dataset = datasets.load_dataset(cfg.hf_dataset, split=cfg.hf_split, streaming=cfg.streaming)
    for batch in dataset.iter(batch_size=BATCH_ROWS):
        yield _string_batch(batch)


FIELDS = dict(zip(["id", "title", "text", "label", "split"], COLUMNS))  # data.columns' field → embforge's column


def found_columns(batch: pa.Table, cfg: DataConfig, source: str) -> dict[str, str]:
    """data.columns' fields that `batch` has → their column; an InputError for a missing one the config requires."""
    mapping = cfg.columns.model_dump()
    missing = [f"'{col}' (data.columns.{field})" for field, col in mapping.items()
               if col is not None and col not in batch.column_names and cfg.columns.required(field)]
    if missing:
        hint = ("" if cfg.columns.text in batch.column_names else
                "; name the text's column with data.columns.text (`--set data.columns.text=NAME`)")
        raise InputError(f"{source}: column {', '.join(missing)} not found; "
                         f"the file has {', '.join(batch.column_names)}{hint}")
    return {field: col for field, col in mapping.items() if col is not None and col in batch.column_names}


def normalise(batch: pa.Table, first_row: int, cfg: DataConfig, source: str, id_prefix: str = "") -> pa.Table:
    """Map the configured columns of a batch (whose first row is row `first_row` of `source`)
    onto embforge's schema and check the values. Without an id column, a document's id is `id_prefix` + its row."""
    found = found_columns(batch, cfg, source)
    columns = {name: batch[found[field]] if field in found else pa.nulls(batch.num_rows, pa.string())
               for field, name in FIELDS.items()}
    if "id" not in found:
        columns["doc_id"] = pa.array([f"{id_prefix}{first_row + i}" for i in range(batch.num_rows)], pa.string())
    mapping = {**cfg.columns.model_dump(), **found}
    for name, field in (("doc_id", "id"), ("text", "text")):
        empty = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(columns[name]), ""), True)
        if pc.any(empty).as_py():
            bad = pc.indices_nonzero(empty).to_pylist()
            raise InputError(f"{source}: {len(bad)} row(s) with empty {name} (column '{mapping[field]}'), "
                             f"first at row(s) {[first_row + i for i in bad[:5]]}")
    blank = pc.equal(pc.utf8_trim_whitespace(columns["title"]), "")  # no title, as a CSV's empty cell says
    columns["title"] = pc.if_else(pc.fill_null(blank, False), pa.scalar(None, pa.string()), columns["title"])
    return pa.table(columns, schema=SCHEMA)


def document_batches(cfg: DataConfig) -> Iterator[tuple[str, int, pa.Table]]:
    """(source, its row number of the batch's first row, checked batch) for every input batch with rows."""
    if cfg.hf_dataset:
        named = [(_dataset_name(cfg), _dataset_batches(cfg), "")]
    else:
        files, folder = input_files(cfg), Path(cfg.path)
        texts = [path for path in files if path.suffix.lower() in TEXT_SUFFIXES]
        # (source, its batches, the prefix of ids made from rows: a file's path in a folder of several)
        named = [(str(path), file_batches(path), f"{path.relative_to(folder).as_posix()}:" if folder.is_dir() else "")
                 for path in files if path not in texts]
        if texts:
            named.append((f"{folder} ({len(texts)} text files)", _batched(_text_file_rows(folder, texts, cfg)), ""))
    for source, batches, id_prefix in named:
        first_row = 1
        for batch in batches:
            if batch.num_rows:  # an empty file adds no document (and may have no columns to check)
                yield source, first_row, normalise(batch, first_row, cfg, source, id_prefix)
            first_row += batch.num_rows


def _dataset_name(cfg: DataConfig) -> str:
    return f"dataset {cfg.hf_dataset}[{cfg.hf_split}]"


def source_name(cfg: DataConfig) -> str:
    """How errors about the whole input name it."""
    if cfg.hf_dataset:
        return _dataset_name(cfg)
    files = input_files(cfg)
    return cfg.path if len(files) == 1 else f"{cfg.path} ({len(files)} files)"


IDS = pa.schema([("doc_id", pa.string()), ("source", pa.int32()), ("row", pa.int64()), ("seq", pa.int64())])


def first_duplicate(ids: Path, sources: list[str], spill: Path) -> str | None:
    """The error for the first row whose id another row has too (None: ids are unique), found by
    DuckDB over the id-only table, so no set of every id is held in memory."""
    con = duck.connect(spill)
    shared, doc = con.execute("""
        WITH dup AS (SELECT doc_id, count(*) AS n, min(seq) AS first FROM read_parquet($ids)
                     GROUP BY doc_id HAVING count(*) > 1)
        SELECT (SELECT sum(n) FROM dup), (SELECT doc_id FROM dup ORDER BY first LIMIT 1)""",
                              {"ids": str(ids)}).fetchone()
    if doc is None:
        return None
    rows = con.execute("SELECT source, row FROM read_parquet($ids) WHERE doc_id = $doc ORDER BY seq LIMIT 3",
                       {"ids": str(ids), "doc": doc}).fetchall()
    return f"duplicate doc_id '{doc}' ({shared} rows share ids): " + ", ".join(f"{sources[s]} row {r}" for s, r in rows)


def _data_digest(cfg: DataConfig) -> str | None:
    # Local files are keyed by content, so editing the corpus in place invalidates the cache;
    # a Hub dataset is keyed by its name.
    return file_digest(cfg.local) if cfg.local else None


# Mail and forum posts (20 Newsgroups, list archives) say who wrote them; a model groups them by that as much as by
# topic (docs/select.md, 20 Newsgroups): `data.strip_mail` removes it. What they quote is mostly topic, and kept.
ATTRIBUTION_END = r"(writes|wrote|says|said)\s*:[ \t]*"  # (not before a \r\n: the rule as measured)
ATTRIBUTION = re.compile(r"(^|\n)[^\n]*" + ATTRIBUTION_END + r"(?=\n|$)", re.I)
QUOTED = (">", "|", ":")
ADDRESS = re.compile(r"\S+@\S+")
MAIL_SHARE = 0.1  # documents with an attribution line from which the log suggests `data.strip_mail`


def strip_mail(text: str, quotes: bool = False, senders: bool = True) -> str:
    """The text without attribution lines and e-mail addresses (`senders`) and with `quotes` without quoted lines, its
    whitespace made single spaces (the text as it is where nothing would be left)."""
    kept = ATTRIBUTION.sub("\n", text) if senders else text
    if quotes:
        kept = "\n".join(line for line in kept.splitlines() if not line.lstrip().startswith(QUOTED))
    return re.sub(r"\s+", " ", ADDRESS.sub(" ", kept) if senders else kept).strip() or text


def attributed(texts: pa.ChunkedArray) -> int:
    """How many of the texts carry an attribution line, by Arrow's RE2 (far quicker than Python's `re`: every corpus is
    counted; its `\\s` is ASCII whitespace alone, a difference only the count can show)."""
    return pc.sum(pc.match_substring_regex(texts, f"(?i){ATTRIBUTION_END}(\n|$)")).as_py() or 0


NUMBER = r"^\s*[-+]?[0-9]+([.,][0-9]+)?\s*$"
MIN_DOCUMENTS = 2


class Texts:
    """What a run needs of the corpus's texts, seen batch by batch: two that differ, and some that are not numbers."""

    def __init__(self):
        self.first: str | None = None
        self.varied = False
        self.numbers_only = True

    def see(self, texts: pa.ChunkedArray) -> None:
        self.first = self.first if self.first is not None else texts[0].as_py()
        self.varied = self.varied or pc.any(pc.not_equal(texts, self.first)).as_py()
        self.numbers_only = self.numbers_only and pc.all(pc.match_substring_regex(texts, NUMBER)).as_py()

    def problem(self, rows: int, cfg: DataConfig) -> str | None:
        """Why these texts cannot make a run (None: they can)."""
        if self.numbers_only:
            return (f"column '{cfg.columns.text}' (data.columns.text) holds only numbers (the first: {self.first!r}), "
                    "not text: is it the text column?")
        if rows < MIN_DOCUMENTS:
            return (f"{rows} document; a run needs at least {MIN_DOCUMENTS} (a batch's in-batch negatives, the "
                    "evaluation's pairs of documents)")
        if not self.varied:
            return f"all {rows} documents have the same text; a run needs at least {MIN_DOCUMENTS} different texts"
        return None


def build_documents(store: ArtifactStore, cfg: DataConfig, inputs: NoInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    work = out.work
    sources: list[str] = []
    labelled = titled = with_attribution = 0
    texts = Texts()

    def checked_batches(ids: pq.ParquetWriter) -> Iterator[pa.Table]:
        nonlocal labelled, titled, with_attribution
        written = 0
        for source, first_row, batch in document_batches(cfg):
            batch = batch.slice(0, cfg.limit - written) if cfg.limit else batch  # `limit`: the first N only
            if source not in sources[-1:]:
                sources.append(source)
            ids.write(pa.table({"doc_id": batch["doc_id"], "source": pa.array([len(sources) - 1] * batch.num_rows,
                                pa.int32()), "row": pa.array(range(first_row, first_row + batch.num_rows), pa.int64()),
                                "seq": pa.array(range(written, written + batch.num_rows), pa.int64())}, schema=IDS))
            labelled += batch.num_rows - batch["label"].null_count
            titled += batch.num_rows - batch["title"].null_count
            with_attribution += attributed(batch["text"])
            if cfg.strip_mail:
                batch = batch.set_column(COLUMNS.index("text"), "text",
                                         pa.array([strip_mail(t, cfg.strip_quotes) for t in batch["text"].to_pylist()],
                                                  pa.string()))
            texts.see(batch["text"])
            written += batch.num_rows
            yield batch
            if cfg.limit and written >= cfg.limit:
                return

    with pq.ParquetWriter(work / "ids.parquet", IDS) as ids:
        rows = out.write_batches("documents", SCHEMA, checked_batches(ids))
    # Refused here: an empty documents artifact would fail much later, as a puzzle about crops.
    if rows == 0:
        raise InputError(f"{source_name(cfg)}: 0 rows, no documents to ingest")
    if problem := texts.problem(rows, cfg):
        raise InputError(f"{source_name(cfg)}: {problem}")
    if problem := first_duplicate(work / "ids.parquet", sources, work):
        raise InputError(problem)
    out.extra.update(dataset=cfg.display_name, labelled=labelled, titled=titled, attributed=with_attribution)
    allows = [kind for kind, n in (("labels", labelled), ("titles", titled)) if n]
    log.info("%d documents from %s: %d with a title, %d with a label (%s)", rows, cfg.display_name, titled, labelled,
             f"a yardstick can be made of their {' or '.join(allows)}" if allows else
             "no titles or labels: a yardstick can be made of the texts alone (their clusters, an LLM's queries) or of "
             "your queries, `--qrels`")
    if cfg.strip_mail:
        log.info("who wrote stripped (data.strip_mail%s): %d of them had an attribution line",
                 ", and quoted lines: data.strip_quotes" if cfg.strip_quotes else "", with_attribution)
    elif with_attribution >= MAIL_SHARE * rows:
        log.warning("%d of the %d documents carry a mail or forum attribution line (`... writes:`): a model may group "
                    "them by who wrote rather than by topic; `--set data.strip_mail=true` removes attribution lines "
                    "and e-mail addresses",
                    with_attribution, rows)


INGEST = Stage("ingest", build_documents, extra_key=_data_digest)
