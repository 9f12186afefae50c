"""Tokens: a pairs artifact's texts as an encoder's token ids, computed once and stored, so that a training
step only pads them (tasks/encoders/inputs.py). Every epoch, every resume, and every method that trains
the same tokenizer on the same view reads them; tokenizing in the step took 37% of a BERT-base step at
batch 64 on an H200 (docs/results.md).

The key holds what tokenizes: the start model (its files, or the artifact it is in), the max length and the prompt
each text column is read with (`model.prompts`: a query recipe's anchors, the generated queries, and a multi-vector
method's anchors, the query one; every other text the document one).
Inputs: `pairs`; `start` when the encoder is an artifact (a random init, stage 1's model).
Output `tokens.parquet`: the pairs' rows in the same order and row groups, each text column (anchor,
positive[, negative]) as its ids (list<int32>: special tokens in, truncated to max_length, unpadded), with
`word_ids` each id's word as `<column>_words` (NO_WORD on special tokens; RetroMAE's whole-word masking),
and epoch (and GPL's margin) as the pairs have them. The manifest gives each column's length statistics and
the tokenizer's digest, which training checks against the tokenizer it loads.
"""

from __future__ import annotations

import logging

import pyarrow as pa
from pydantic import Field
from sentence_transformers import SentenceTransformer
from tqdm.auto import tqdm

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import Section
from tasks.config.families import FAMILIES
from tasks.config.model import Prompts
from tasks.config.recipes import RECIPES
from tasks.config.training import MethodConfig, TrainConfig
from tasks.core import duck
from tasks.core.progress import StageProgress
from tasks.core.stage import Inputs, Stage
from tasks.encoders.inputs import (
    IDS,
    LABEL_COLUMNS,
    TEXT_COLUMNS,
    model_tokenizer_digest,
    prompted,
    text_chunks,
    tokenize,
    unknown_tokens,
    word_tokenize,
    words_column,
)
from tasks.encoders.models import base_model_identity, model_path, sentence_model

KEPT = ("epoch", *LABEL_COLUMNS)  # the pairs' columns the tokens file keeps as they are


class TokensJob(Section):
    base_model: str | None = Field(description="The tokenizer's model (name or path); None: the `start` input's.")
    max_length: int
    word_ids: bool = Field(False, description="Also each token's word, for whole-word masking (RetroMAE).")
    prompts: dict[str, str] = Field(default_factory=dict, description="A text column's prompt, put before its texts.")

    @classmethod
    def for_method(cls, base_model: str | None, method: MethodConfig, train: TrainConfig,
                   prompts: Prompts | None = None) -> TokensJob:
        recipe, prompts = RECIPES[method.recipe], prompts or Prompts()
        # a multi-vector model's loss reads every recipe's anchors as queries (tasks/methods/objectives.py)
        queries = recipe.needs_queries or FAMILIES[method.family].per_token
        by_column = {column: prompts.for_role(query=queries and column == "anchor") for column in TEXT_COLUMNS}
        return cls(base_model=base_model, max_length=train.max_length, word_ids=recipe.whole_word_masking,
                   prompts={column: prompt for column, prompt in by_column.items() if prompt})


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


def column_tokens(model: SentenceTransformer, texts: list[str], word_ids: bool,
                  ) -> tuple[pa.ChunkedArray, pa.ChunkedArray | None]:
    """(ids, words or None) of `texts`, a chunk at a time: Arrow arrays, never one Python list of them all."""
    ids, words = [], []
    for chunk in text_chunks(texts):
        encoded = (word_tokenize if word_ids else tokenize)(model, chunk, padded=False)
        ids.append(pa.array(encoded["input_ids"], IDS))
        words += [pa.array(encoded["word_ids"], IDS)] if word_ids else []
    return pa.chunked_array(ids, IDS), pa.chunked_array(words, IDS) if word_ids else None


def tokenized(model: SentenceTransformer, rows: pa.Table, word_ids: bool, prompts: dict[str, str] | None = None,
              ) -> pa.Table:
    """A row group of pairs as the tokens file holds it (tokens_schema), each column's texts after its prompt. A
    column equal to the one before it and read with the same prompt (the `same` view's positive) is tokenized
    once."""
    schema, prompts = tokens_schema(rows.schema, word_ids), prompts or {}
    columns = {name: rows[name] for name in schema.names if name in KEPT}
    previous = None
    for name in (n for n in schema.names if n in TEXT_COLUMNS):
        if previous is not None and rows[name].equals(rows[previous]) and prompts.get(name) == prompts.get(previous):
            columns[name] = columns[previous]
            if word_ids:
                columns[words_column(name)] = columns[words_column(previous)]
        else:
            texts = prompted(rows[name].to_pylist(), prompts.get(name, ""))
            columns[name], words = column_tokens(model, texts, word_ids)
            if word_ids:
                columns[words_column(name)] = words
        previous = name
    return pa.table(columns, schema=schema)


def build_tokens(store: ArtifactStore, job: TokensJob, inputs: TokensInputs,
                 out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    model = sentence_model(model_path(store, inputs.start) if inputs.start else job.base_model, job.max_length)
    with store.open_table(inputs.pairs, "pairs") as pairs:
        schema = tokens_schema(pairs.schema_arrow, job.word_ids)
        texts = [c for c in schema.names if c in TEXT_COLUMNS]
        read = [c for c in pairs.schema_arrow.names if c in TEXT_COLUMNS or c in KEPT]  # not doc_id
        with StageProgress(pairs.metadata.num_rows, "rows") as progress, \
                tqdm(total=pairs.metadata.num_rows, desc=progress.label, unit="row", mininterval=5) as bar:
            def groups():
                for g in range(pairs.num_row_groups):
                    table = tokenized(model, pairs.read_row_group(g, columns=read), job.word_ids, job.prompts)
                    progress.advance(table.num_rows)
                    bar.update(table.num_rows)
                    yield table
            rows = out.write_batches("tokens", schema, groups())
    lengths = duck.length_stats(out.folder / "tokens.parquet", texts, job.max_length, out.work,
                                model.tokenizer.unk_token_id)
    out.extra.update(tokenizer=model_tokenizer_digest(model), max_length=job.max_length, lengths=lengths)
    for column, stats in lengths.items():
        log.info("%s: %d rows, %.1f tokens on average, %d at most, %.1f%% at the max length %d", column, rows,
                 stats["mean"], stats["max"], 100 * stats["at_max_length"], job.max_length)
        if said := unknown_tokens(column, stats["unknown"], model.tokenizer):
            log.warning(said)


TOKENS = Stage("tokens", build_tokens, extra_key=base_model_identity)
