"""Embed: the embeddings cache. One artifact per (model, text set, max length, layers).

Every evaluation metric reads its vectors from here, so a model is encoded once per text set,
however many metrics, reports or later runs use it. One forward pass gives every requested hidden
layer and all three poolings (mean, CLS, SEP), so the layer-wise curves and a recipe's own pooling
come from the same artifact.

Inputs: `documents` (text set = its `text` column), or none with `pairs_path` (text set =
sentence1 rows then sentence2 rows of that file), or `held_out_queries` (a queries artifact: text
set = its usable held-out queries, docs/gpl.md); `model`, the train or init artifact holding the
model, if any. Output `embeddings.parquet`: row, layer, mean, cls, sep, vectors stored as
`store_dtype`. It is encoded and written CHUNK_TEXTS texts at a time, one row group per chunk
and layer, so neither encoding nor a reader of one layer holds more than it needs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from storage.base import ArtifactRef, file_digest
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import Precision, Section
from tasks.config.evaluation import Backend, EvaluateConfig, StoreDtype
from tasks.config.queries import HELD_OUT
from tasks.core import eval_sets
from tasks.core.stage import Stage
from tasks.encoders import encode
from tasks.encoders.budget import char_budget, over_budget
from tasks.encoders.models import ModelInputs, model_identity

CHUNK_TEXTS = 4096  # texts encoded and written at once (all layers and poolings of them in memory)


class EmbedJob(Section):
    model: str | None = Field(None, description="External model (name or path); None when the inputs "
                              "carry a train or init artifact.")
    pairs_path: str | None = Field(None, description="Embed the sentences of this pairs file instead of "
                                   "the documents.")
    split: str | None = Field(None, description="With `pairs_path`: rows of this split only.")
    layers: Literal["last", "all"] = Field("last", description="`all`: every hidden state, 0 = embedding layer.")
    max_length: int
    batch_size: int
    device: str = "auto"
    dtype: Precision = EvaluateConfig.model_fields["dtype"].default
    backend: Backend = EvaluateConfig.model_fields["backend"].default
    store_dtype: StoreDtype = Field("float32", description="Vectors stored as float32 or float16 (read back "
                                    "as float32).")


def embeddings_schema(dim: int, dtype: StoreDtype) -> pa.Schema:
    vector = pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), dim)
    return pa.schema([("row", pa.int32()), ("layer", pa.int16()), *((p, vector) for p in encode.POOLINGS)])


def embedding_tables(chunks: Iterator[tuple[np.ndarray, np.ndarray]], layers: list[int],
                     schema: pa.Schema) -> Iterator[pa.Table]:
    """One table per chunk and layer: a reader of one layer skips the other row groups."""
    dtype = schema.field("mean").type.value_type.to_pandas_dtype()
    for positions, emb in chunks:
        for i, layer in enumerate(layers):
            columns = {p: pa.FixedSizeListArray.from_arrays(pa.array(emb[i, j].astype(dtype).reshape(-1)),
                                                             emb.shape[-1])
                       for j, p in enumerate(encode.POOLINGS)}
            yield pa.table({"row": positions.astype(np.int32), "layer": np.full(len(positions), layer, np.int16),
                            **columns}, schema=schema)


class EmbedInputs(ModelInputs):
    documents: ArtifactRef | None = None  # None: the texts of job.pairs_path, or of the held-out queries
    held_out_queries: ArtifactRef | None = None  # a queries artifact: its held-out ok queries are the text set


def build_embeddings(store: ArtifactStore, job: EmbedJob, inputs: EmbedInputs,
                     out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    if job.pairs_path:
        pairs = eval_sets.read_pairs(job.pairs_path, job.split)
        texts = pairs["sentence1"].tolist() + pairs["sentence2"].tolist()
    elif inputs.held_out_queries:
        texts = held_out_queries(store, inputs.held_out_queries)["query"].to_pylist()
    else:
        texts = store.read_table(inputs.documents, "documents", columns=["text"])["text"].to_pylist()
    encoder = encode.PooledEncoder(inputs.model_location(store, job.model), job.device, dtype=job.dtype,
                                   backend=job.backend)
    layers = list(range(encoder.n_layers + 1)) if job.layers == "all" else [encoder.n_layers]
    log.info("%d texts, %d layer(s), max length %d", len(texts), len(layers), job.max_length)
    if cut := over_budget(texts, job.max_length):  # the encoder cuts each batch's texts
        log.info("%d text(s) over %s characters cut to that before tokenizing", cut, f"{char_budget(job.max_length):,}")
    chunks = encoder.encode_chunks(texts, job.max_length, job.batch_size, layers, CHUNK_TEXTS)
    schema = embeddings_schema(encoder.dim, job.store_dtype)
    out.write_batches("embeddings", schema, embedding_tables(chunks, layers, schema))
    out.extra.update(texts=len(texts), layers=layers, dim=encoder.dim, cut=cut)


def held_out_queries(store: ArtifactStore, ref: ArtifactRef) -> pa.Table:
    """The usable held-out queries (never trained on) of a queries artifact, in its order: the in-domain
    retrieval evaluation's queries (query) and their one relevant document (doc_id)."""
    table = store.read_table(ref, "queries", columns=["query_id", "doc_id", "split", "query", "status"])
    return table.filter(pc.and_(pc.equal(table["split"], HELD_OUT), pc.equal(table["status"], "ok")))


class EmbeddedDocumentsInputs(ModelInputs):
    """What a scoring stage reads: the documents, their embed artifact and (if embforge made it) the model."""

    documents: ArtifactRef
    embeddings: ArtifactRef


def read_embeddings(store: ArtifactStore, ref: ArtifactRef, pooling: str, layer: int | None = None) -> np.ndarray:
    """The float32 (texts × dim) matrix of one layer (default: the last) and pooling, in text order,
    whatever dtype the artifact stores; only that layer's row groups and that column are read."""
    layer = max(embedded_layers(store, ref)) if layer is None else layer
    table = store.read_table(ref, "embeddings", columns=["row", pooling], filters=[("layer", "=", layer)])
    out = np.empty((table.num_rows, table.schema.field(pooling).type.list_size), dtype=np.float32)
    for batch in table.to_batches():  # rows are stored in encoding order (longest text first)
        out[batch["row"].to_numpy()] = batch[pooling].flatten().to_numpy().reshape(batch.num_rows, -1)
    return out


def embedded_layers(store: ArtifactStore, ref: ArtifactRef) -> list[int]:
    return store.manifest(ref)["extra"]["layers"]


def _key_material(job: EmbedJob) -> list:
    return [model_identity(job.model) if job.model else None,
            file_digest(job.pairs_path) if job.pairs_path else None]


EMBED = Stage("embed", build_embeddings, extra_key=_key_material, gpu=True)
