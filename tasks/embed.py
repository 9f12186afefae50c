"""Embed: the embeddings cache. One artifact per (model, text set, max length, layers).

Every evaluation metric reads its vectors from here, so a model is encoded once per text set,
however many metrics, reports or later runs use it. One forward pass gives every requested hidden
layer and all three poolings (mean, CLS, SEP), so the layer-wise curves and a recipe's own pooling
come from the same artifact.

Inputs: the text set's (tasks/encoders/text_sets.py: `documents`, or none with `pairs_path`, or
`held_out_queries`); `model`, the train or init artifact holding the model, if any; `tokens`, the text
set's ids as the text_tokens stage stored them, if any: they are padded, not tokenized again, when the
encoder's tokenizer is the one that made them (else the texts are tokenized, with a warning).
Output `embeddings.parquet`: row, layer, mean, cls, sep, vectors stored as `store_dtype`, and with
`token_vectors` (a multi-vector model's, for MaxSim retrieval) each text's scoring token vectors, `tokens`, read as
a query for held-out queries and as a document otherwise; a sparse model's codes as `indices` and `values` instead
of the poolings (its active codes). It is encoded and written CHUNK_TEXTS texts at a time,
one row group per chunk and layer, so neither encoding nor a reader of one layer holds more than it needs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field
from scipy import sparse

from storage.base import ArtifactRef
from storage.codes import CODES, code_columns, codes_matrix
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError, Precision
from tasks.config.evaluation import Backend, EvaluateConfig, StoreDtype
from tasks.core.stage import Stage
from tasks.encoders import encode, precision
from tasks.encoders.budget import char_budget, over_budget
from tasks.encoders.inputs import Tokens, column_values, tokenizer_digest
from tasks.encoders.models import ModelInputs
from tasks.encoders.text_sets import TextSet, TextSetInputs, read_texts, text_set_identity

CHUNK_TEXTS = 4096  # texts encoded and written at once (all layers and poolings of them in memory)


class EmbedJob(TextSet):
    layers: Literal["last", "all"] = Field("last", description="`all`: every hidden state, 0 = embedding layer.")
    max_length: int
    batch_size: int
    device: str = "auto"
    dtype: Precision = EvaluateConfig.model_fields["dtype"].default
    backend: Backend = EvaluateConfig.model_fields["backend"].default
    store_dtype: StoreDtype = Field("float32", description="Vectors stored as float32 or float16 (read back "
                                    "as float32).")
    token_vectors: bool = Field(False, description="Also keep each text's token vectors (a multi-vector model's: "
                                "what MaxSim retrieval reads).")


TOKENS = "tokens"  # the column of a text's token vectors


def embeddings_schema(dim: int, dtype: StoreDtype, tokens: bool = False, codes: bool = False) -> pa.Schema:
    """One vector a text under each pooling, with `tokens` its token vectors too; with `codes`, a sparse model's one
    vector as its active codes instead (a SPLADE model's 30,522 term weights a text are mostly zero)."""
    value = pa.from_numpy_dtype(np.dtype(dtype))
    vector = pa.list_(value, dim)
    stored = [(CODES[0], pa.list_(pa.int32())), (CODES[1], pa.list_(value))] if codes else \
        [*((p, vector) for p in encode.POOLINGS), *([(TOKENS, pa.list_(vector))] if tokens else [])]
    return pa.schema([("row", pa.int32()), ("layer", pa.int16()), *stored])


def counted(chunks: Iterator[tuple], counts: list[int]) -> Iterator[tuple]:
    """`chunks` as they come, each text's count of token vectors (a chunk's third item) added to `counts`."""
    for chunk in chunks:
        counts.extend(len(t) for t in chunk[2])
        yield chunk


def embedding_tables(chunks: Iterator[tuple[np.ndarray, ...]], layers: list[int],
                     schema: pa.Schema) -> Iterator[pa.Table]:
    """One table per chunk and layer: a reader of one layer skips the other row groups. A chunk's third item, where
    there is one, is each text's token vectors (one layer)."""
    dtype = schema.field("mean").type.value_type.to_pandas_dtype()
    for positions, emb, *tokens in chunks:
        for i, layer in enumerate(layers):
            columns = {p: pa.FixedSizeListArray.from_arrays(pa.array(emb[i, j].astype(dtype).reshape(-1)),
                                                             emb.shape[-1])
                       for j, p in enumerate(encode.POOLINGS)}
            if tokens:  # (tokens_i, dim) each: one list of vectors a text
                flat = np.concatenate(tokens[0]).astype(dtype)
                vectors = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), emb.shape[-1])
                offsets = np.concatenate([[0], np.cumsum([len(t) for t in tokens[0]])]).astype(np.int32)
                columns[TOKENS] = pa.ListArray.from_arrays(pa.array(offsets), vectors)
            yield pa.table({"row": positions.astype(np.int32), "layer": np.full(len(positions), layer, np.int16),
                            **columns}, schema=schema)


def code_tables(chunks: Iterator[tuple[np.ndarray, sparse.csr_matrix]], layer: int,
                schema: pa.Schema) -> Iterator[pa.Table]:
    """One table per chunk of a sparse model's codes: each text's active codes and their weights."""
    dtype = schema.field(CODES[1]).type.value_type.to_pandas_dtype()
    for positions, codes in chunks:
        yield pa.table({"row": positions.astype(np.int32), "layer": np.full(len(positions), layer, np.int16),
                        **code_columns(codes, dtype)}, schema=schema)


class EmbedInputs(TextSetInputs):
    tokens: ArtifactRef | None = None  # the text set's ids (a text_tokens artifact)


def build_embeddings(store: ArtifactStore, job: EmbedJob, inputs: EmbedInputs,
                     out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    encoder = encode.encoder_at(inputs.model_location(store, job.model), job.device, dtype=job.dtype,
                                backend=job.backend)
    stored = stored_ids(store, inputs.tokens, tokenizer_digest(encoder.tokenizer, job.max_length), log) \
        if encoder.tokenizer else None  # a static model tokenizes its texts itself
    if stored is None:
        texts = read_texts(store, job, inputs)
        cut = over_budget(texts, job.max_length)  # the encoder cuts each batch's texts
    else:
        texts, cut = stored  # cut before they were tokenized
    layers = list(range(encoder.n_layers + 1)) if job.layers == "all" else [encoder.n_layers]
    computed = precision.dtype_name(encoder.dtype) if encoder.dtype else None  # `auto` resolved on this machine
    log.info("%d texts%s, %d layer(s), max length %d%s", len(texts), "" if stored is None else " (stored ids)",
             len(layers), job.max_length, f", in {computed}" if computed else "")
    if cut:
        log.info("%d text(s) over %s characters cut to that before tokenizing", cut, f"{char_budget(job.max_length):,}")
    if job.token_vectors:
        if not encoder.token_mean:
            raise InputError(f"{inputs.model_name(job.model)}: token vectors are a multi-vector model's; this one has "
                             "one vector a text")
        task = "query" if inputs.held_out_queries else "document"
        chunks = counted(encoder.token_chunks(texts, job.max_length, job.batch_size, CHUNK_TEXTS, task), kept := [])
    codes = encoder.family == "sparse"
    schema = embeddings_schema(encoder.dim, job.store_dtype, job.token_vectors, codes)
    if codes:
        encoder.last_layer_only(layers)
        tables = code_tables(encoder.sparse_chunks(texts, job.max_length, job.batch_size, CHUNK_TEXTS), layers[0],
                             schema)
    else:
        if not job.token_vectors:
            chunks = encoder.encode_chunks(texts, job.max_length, job.batch_size, layers, CHUNK_TEXTS)
        tables = embedding_tables(chunks, layers, schema)
    out.write_batches("embeddings", schema, tables)
    out.extra.update(texts=len(texts), layers=layers, dim=encoder.dim, cut=cut, computed_in=computed,
                     token_mean=encoder.token_mean, similarity=encoder.similarity, family=encoder.family)
    if job.token_vectors:  # what an index of them holds a text (tasks/evaluate.py's serving costs)
        out.extra["tokens_per_text"] = float(np.mean(kept)) if kept else 0.0


def stored_ids(store: ArtifactStore, tokens: ArtifactRef | None, digest: str,
               log: logging.Logger) -> tuple[list[Tokens], int] | None:
    """The ids of a text_tokens artifact and how many of its texts were cut, if there is one and the encoder's
    tokenizer (`digest`) made them."""
    if tokens is None:
        return None
    made = store.manifest(tokens)["extra"]
    if made["tokenizer"] != digest:
        log.warning("%s: its ids were made by another tokenizer or max length than the encoder's; the texts are "
                    "tokenized instead", tokens.address)
        return None
    return column_values(store.read_table(tokens, "tokens"), "text"), made["cut"]


class EmbeddedDocumentsInputs(ModelInputs):
    """What a scoring stage reads: the documents, their embed artifact and (if embforge made it) the model."""

    documents: ArtifactRef
    embeddings: ArtifactRef


def read_embeddings(store: ArtifactStore, ref: ArtifactRef, pooling: str, layer: int | None = None) -> np.ndarray:
    """The float32 (texts × dim) matrix of one layer (default: the last) and pooling, in text order,
    whatever dtype the artifact stores; only that layer's row groups and that column are read. A sparse model's codes
    (its one vector, whatever the pooling) come with their zeros."""
    layer = max(embedded_layers(store, ref)) if layer is None else layer
    if stores_codes(store, ref):
        return read_codes(store, ref).toarray()
    table = store.read_table(ref, "embeddings", columns=["row", pooling], filters=[("layer", "=", layer)])
    out = np.empty((table.num_rows, table.schema.field(pooling).type.list_size), dtype=np.float32)
    for batch in table.to_batches():  # rows are stored in encoding order (longest text first)
        out[batch["row"].to_numpy()] = batch[pooling].flatten().to_numpy().reshape(batch.num_rows, -1)
    return out


def read_vectors(store: ArtifactStore, ref: ArtifactRef, pooling: str, layer: int | None = None
                 ) -> np.ndarray | sparse.csr_matrix:
    """One vector a text as its model scores it: a sparse model's codes kept sparse (read_codes), else read_embeddings'
    dense rows."""
    return read_codes(store, ref) if stores_codes(store, ref) else read_embeddings(store, ref, pooling, layer)


def stores_codes(store: ArtifactStore, ref: ArtifactRef) -> bool:
    """Whether an embed artifact holds a sparse model's codes (its `indices` and `values`), by its file's schema: one
    made before the embed stage stored them so holds the codes under each pooling, as a dense model's vectors."""
    with store.open_table(ref, "embeddings") as table:
        return CODES[0] in table.schema_arrow.names


def read_codes(store: ArtifactStore, ref: ArtifactRef) -> sparse.csr_matrix:
    """A sparse model's codes as a float32 (texts × dim) sparse matrix, in text order."""
    table = store.read_table(ref, "embeddings", columns=["row", *CODES])
    return codes_matrix(table, store.manifest(ref)["extra"]["dim"], table["row"].combine_chunks().to_numpy())


def read_token_vectors(store: ArtifactStore, ref: ArtifactRef) -> list[np.ndarray]:
    """Each text's float32 (tokens × dim) token vectors, in text order (an artifact made with `token_vectors`)."""
    table = store.read_table(ref, "embeddings", columns=["row", TOKENS])
    out: list[np.ndarray] = [np.empty(0)] * table.num_rows
    for batch in table.to_batches():
        column = batch[TOKENS]
        dim = column.type.value_type.list_size
        flat = column.flatten().flatten().to_numpy().astype(np.float32).reshape(-1, dim)
        offsets = column.offsets.to_numpy() - column.offsets[0].as_py()
        for row, start, end in zip(batch["row"].to_numpy(), offsets[:-1], offsets[1:]):
            out[row] = flat[start:end]
    return out


def embedded_layers(store: ArtifactStore, ref: ArtifactRef) -> list[int]:
    return store.manifest(ref)["extra"]["layers"]


EMBED = Stage("embed", build_embeddings, extra_key=text_set_identity, gpu=True)
