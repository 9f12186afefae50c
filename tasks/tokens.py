"""Tokens: a pairs artifact's texts as an encoder's token ids, computed once and stored, so that a training
step only pads them (tasks/encoders/inputs.py). Every epoch, every resume, and every method that trains
the same tokenizer on the same view reads them; recomputing them each step took half of a GPU step.

The key holds what tokenizes: the start model (its files, or the artifact it is in) and the max length.
Inputs: `pairs`; `start` when the encoder is an artifact (a random init, stage 1's model).
Output `tokens.parquet`: the pairs' rows in the same order and row groups, each text column (anchor,
positive[, negative]) as its ids (list<int32>: special tokens in, truncated to max_length, unpadded), with
`word_ids` each id's word as `<column>_words` (-1: a special token; RetroMAE's whole-word masking), and
epoch (and GPL's margin) as the pairs have them. Its manifest gives each column's length statistics.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
from pydantic import Field
from sentence_transformers import SentenceTransformer
from tqdm.auto import tqdm

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import Section
from tasks.config.training import MethodConfig, TrainConfig
from tasks.core import duck
from tasks.core.progress import StageProgress
from tasks.core.stage import Inputs, Stage
from tasks.encoders.inputs import tokenize, word_tokenize
from tasks.encoders.models import model_identity, model_path, sentence_model
from tasks.methods.batches import TEXT_COLUMNS, words_column
from tasks.methods.recipes import RECIPES

CHUNK_TEXTS = 2_048  # texts tokenized at a time (a tokenizer handed 65,536 texts held 3.6 GiB more; 2,048: 114 MiB)
IDS = pa.list_(pa.int32())
KEPT = ("epoch", "margin")  # the pairs' columns the tokens file keeps as they are


class TokensJob(Section):
    base_model: str | None = Field(description="The tokenizer's model (name or path); None: the `start` input's.")
    max_length: int
    word_ids: bool = Field(False, description="Also each token's word, for whole-word masking (RetroMAE).")

    @classmethod
    def for_method(cls, base_model: str | None, method: MethodConfig, train: TrainConfig) -> TokensJob:
        return cls(base_model=base_model, max_length=train.max_length,
                   word_ids=RECIPES[method.recipe].whole_word_masking)


class TokensInputs(Inputs):
    pairs: ArtifactRef
    start: ArtifactRef | None = None  # the init or stage-1 encoder, whose tokenizer it is; else job.base_model


def tokens_schema(pairs: pa.Schema, word_ids: bool) -> pa.Schema:
    """The pairs' columns, each text column as ids (and their words after it)."""
    fields = []
    for field in pairs:
        if field.name in TEXT_COLUMNS:
            fields += [pa.field(field.name, IDS)] + ([pa.field(words_column(field.name), IDS)] if word_ids else [])
        elif field.name in KEPT:
            fields.append(field)
    return pa.schema(fields)


def tokenized(model: SentenceTransformer, rows: pa.Table, schema: pa.Schema, word_ids: bool) -> pa.Table:
    """A row group of pairs as the tokens file holds it."""
    columns = {name: rows[name] for name in schema.names if name in KEPT}
    for name in (n for n in schema.names if n in TEXT_COLUMNS):
        ids, words = [], []
        texts = rows[name].to_pylist()
        for start in range(0, len(texts), CHUNK_TEXTS):
            encoded = (word_tokenize if word_ids else tokenize)(model, texts[start : start + CHUNK_TEXTS], padded=False)
            ids += encoded["input_ids"]
            words += encoded.get("word_ids", [])
        columns[name] = pa.array(ids, IDS)
        if word_ids:
            columns[words_column(name)] = pa.array(words, IDS)
    return pa.table(columns, schema=schema)


def length_stats(path: Path, columns: list[str], max_length: int, spill: Path) -> dict:
    """Per text column, by DuckDB: the mean, median, 95th percentile and longest ids, and the share of texts
    cut at max_length."""
    names = ("mean", "median", "p95", "max", "truncated")
    parts = [f"avg(len({c})), median(len({c})), quantile_cont(len({c}), 0.95), max(len({c})), "
             f"avg((len({c}) >= {max_length})::int)" for c in columns]
    with duck.connect(spill) as con:
        row = con.execute(f"SELECT {', '.join(parts)} FROM read_parquet($path)", {"path": str(path)}).fetchone()
    return {c: {n: round(float(v), 4) for n, v in zip(names, row[5 * i : 5 * i + 5])} for i, c in enumerate(columns)}


def build_tokens(store: ArtifactStore, job: TokensJob, inputs: TokensInputs,
                 out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    model = sentence_model(model_path(store, inputs.start) if inputs.start else job.base_model, job.max_length)
    with store.open_table(inputs.pairs, "pairs") as pairs:
        schema = tokens_schema(pairs.schema_arrow, job.word_ids)
        texts = [c for c in schema.names if c in TEXT_COLUMNS]
        with StageProgress(pairs.metadata.num_rows, "rows") as progress, \
                tqdm(total=pairs.metadata.num_rows, desc=progress.label, unit="row", mininterval=5) as bar:
            def groups():
                for g in range(pairs.num_row_groups):
                    table = tokenized(model, pairs.read_row_group(g), schema, job.word_ids)
                    progress.advance(table.num_rows)
                    bar.update(table.num_rows)
                    yield table
            rows = out.write_batches("tokens", schema, groups())
    out.extra.update(lengths=length_stats(out.folder / "tokens.parquet", texts, job.max_length, out.work))
    for column, stats in out.extra["lengths"].items():
        log.info("%s: %d rows, %.1f tokens on average, %d at most, %.1f%% cut at %d", column, rows, stats["mean"],
                 stats["max"], 100 * stats["truncated"], job.max_length)


TOKENS = Stage("tokens", build_tokens, extra_key=lambda job: model_identity(job.base_model) if job.base_model else None)
